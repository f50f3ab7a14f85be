"""Tape: records forward launches of differentiated kernels and replays their adjoints.

    with s.tape() as t:
        s.launch(sim, steps, dt, p0, v0, target, loss)   # recorded (and launched)
    t.backward(seed={loss: 1.0})                         # adjoints, in reverse launch order
    s.launch(update, lr, v0, t.grad(v0))

backward() creates one gradient array per differentiated array argument (same dtype and
shape), zeroes them all on the device, seeds the given outputs (a number fills, an array
uploads) and launches each recorded forward's adjoint with the forward's own arguments and
the gradient arrays, last launch first. Nothing waits. As in reverse mode generally, the
replay reads the forward's inputs as they are when the adjoints run: a launch recorded later
must not overwrite an input of an earlier one (use separate arrays per step).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Tuple

import numpy as _np

from ._vkad import NdArray
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from . import Session


class Tape:
    def __init__(self, session: "Session"):
        self.session = session
        self.launches: List[Tuple[Any, tuple]] = []  # (kernel, args) as launched
        self._grads: Dict[int, Tuple[NdArray, NdArray]] = {}  # handle -> (array, gradient)

    def __enter__(self) -> "Tape":
        if self.session._recording is not None:
            raise InvalidArgumentError("tape: this session is already recording on another tape")
        self.session._recording = self
        self.session._set_tape(self.launches)
        return self

    def __exit__(self, *exc) -> None:
        self.session._set_tape(None)
        self.session._recording = None

    @staticmethod
    def _forward(kernel):
        return getattr(kernel, "forward", kernel)  # a Differentiated launches its forward

    def backward(self, seed: Mapping[NdArray, Any]) -> None:
        """Computes gradients of the recorded launches, given d(objective)/d(output) per seeded
        output array (a number for every element, or an array of the output's shape)."""
        from . import numpy_dtype

        s = self.session
        if self.session._recording is self:
            raise InvalidArgumentError("tape.backward: call it after the `with` block closes")
        if not self.launches:
            raise InvalidArgumentError("tape.backward: no launch of a differentiated kernel "
                                       "was recorded")
        needed = {}
        for kernel, args in self.launches:
            for p, _ in self._forward(kernel).gradients:
                needed[args[p].handle] = args[p]
        for out in seed:  # checked before anything is created or recorded
            if out.handle not in needed:
                raise InvalidArgumentError(
                    f"tape.backward: seed for {out!r}, which is not a differentiated (grad) "
                    "argument of any recorded launch")
        for array in needed.values():
            self._ensure(array)
        for a, g in self._grads.values():
            s.zero(g)
        for out, value in seed.items():
            g = self._grads[out.handle][1]
            if isinstance(value, (int, float)):
                s.fill(g, float(value))
            else:
                g.upload(_np.ascontiguousarray(value, dtype=numpy_dtype(g.dtype)))
        for kernel, args in reversed(self.launches):
            fwd = self._forward(kernel)
            grads = [self._grads[args[p].handle][1] for p, _ in fwd.gradients]
            s.launch(fwd.adjoint, *args, *grads)

    def grad(self, array: NdArray) -> NdArray:
        """The gradient array of `array` (after backward())."""
        if array.handle not in self._grads:
            raise InvalidArgumentError(
                f"tape.grad: {array!r} is not a differentiated (grad) argument of any "
                "recorded launch, or backward() has not run")
        return self._grads[array.handle][1]

    def _ensure(self, array: NdArray) -> None:
        if array.handle not in self._grads:
            name = (array.name or "array") + "_grad"
            g = self.session.empty(array.shape, array.dtype, name)
            self._grads[array.handle] = (array, g)
