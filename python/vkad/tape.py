"""Tape: records forward launches of differentiated kernels and replays their adjoints, with
gradient storage that lives across iterations (vkad::Tape's behaviour and messages, api/tape.h).

    t = s.tape()                                         # once
    for it in range(iterations):
        with t:                                          # a new recording; gradients are kept
            s.launch(sim, steps, dt, p0, v0, target, loss)   # recorded (and launched)
        t.backward(seed={loss: 1.0})                     # adjoints, in reverse launch order
        s.launch(update, lr, v0, t.grad(v0))

backward() zeroes the gradient of every differentiated array argument of the recording (in one
s.zero_many: one barrier pair for all), seeds the given outputs (a number fills, an array
uploads) and launches each recorded forward's adjoint with the forward's own arguments and the
gradient arrays, last launch first. Nothing waits. A gradient is `array.grad` when the caller
set one (s.ndarray(x, grad=True), s.empty(..., grad=True), or `a.grad = g`), else an array
the tape makes (same dtype and shape) the first time a backward needs it and keeps while the
array lives: after the first iteration backward allocates and frees nothing. The gradient of an
array that was freed or collected is dropped at the next recording or backward.

As in reverse mode generally, the replay reads the forward's inputs as they are when the
adjoints run: a launch recorded later must not overwrite an input of an earlier one (keep each
step's state: an array with a time axis written at f + 1 and read at f, or an array per step;
README.md, "Tapes and memory"). Session.launch refuses such a launch inside `with t:` before it
runs (InvalidArgumentError naming both launches, the array and the row), with vkad::Tape's own
check and message (api/tape_hazards.h); rows given by scalar arguments are compared, so the
time axis is accepted.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Tuple

import numpy as _np

from ._vkad import DType, NdArray, _TapeHazards
from .errors import Error, InvalidArgumentError

if TYPE_CHECKING:
    from . import Session

_F32_MAX = float(_np.finfo(_np.float32).max)


class Tape:
    def __init__(self, session: "Session"):
        self.session = session
        # (kernel, args) as launched since the recording began; the tuples keep the arrays alive.
        self.launches: List[Tuple[Any, tuple]] = []
        # handle -> (weak reference to the array, the gradient the tape made for it)
        self._grads: Dict[int, Tuple[weakref.ref, NdArray]] = {}
        # What the recording read and wrote; the binding's launch checks and updates it.
        self._hazards = _TapeHazards()

    def __enter__(self) -> "Tape":
        if self.session._recording is not None:
            raise InvalidArgumentError("tape: this session is already recording on another tape")
        self.reset()
        self.session._recording = self
        self.session._set_tape(self.launches, self._hazards)
        return self

    def __exit__(self, *exc) -> None:
        self.session._set_tape(None, None)
        self.session._recording = None

    def reset(self) -> None:
        """Forgets the recorded launches (`with t:` does it); keeps the gradients, except those
        of arrays freed or collected meanwhile."""
        self.launches.clear()  # the same list object: the binding appends to it
        self._hazards.reset()
        self._prune()

    def _prune(self) -> None:
        dead = [h for h, (ref, _) in self._grads.items()
                if ref() is None or ref().freed]
        for h in dead:
            del self._grads[h]  # the gradient is freed when collected

    @staticmethod
    def _forward(kernel):
        return getattr(kernel, "forward", kernel)  # a Differentiated launches its forward

    def _differentiated(self) -> Dict[int, NdArray]:
        needed: Dict[int, NdArray] = {}
        for kernel, args in self.launches:
            for p, _ in self._forward(kernel).gradients:
                needed.setdefault(args[p].handle, args[p])
        return needed

    def _gradient(self, array: NdArray) -> NdArray:
        if array.grad is not None:
            return array.grad
        entry = self._grads.get(array.handle)
        if entry is None:
            name = (array.name or "array") + "_grad"
            g = self.session.empty(array.shape, array.dtype, name)
            self._grads[array.handle] = (weakref.ref(array), g)
            return g
        return entry[1]

    def backward(self, seed: Mapping[NdArray, Any]) -> None:
        """Computes gradients of the recorded launches, given d(objective)/d(output) per seeded
        output array (a number for every element, or an array of the output's shape)."""
        from . import numpy_dtype

        s = self.session
        if s._recording is self:
            raise InvalidArgumentError("tape.backward: call it after the `with` block closes")
        if not self.launches:
            raise InvalidArgumentError("tape.backward: no launch of a differentiated kernel "
                                       "was recorded")
        needed = self._differentiated()
        hosts = {}
        for out, value in seed.items():  # checked before anything is made or recorded
            if not isinstance(out, NdArray) or out.handle not in needed:
                raise InvalidArgumentError(
                    f"tape.backward: seed for {out!r}, which is not a differentiated (grad) "
                    "argument of any recorded launch")
            if isinstance(value, (int, float, _np.number)):
                v = float(value)
                if out.dtype == DType.f32 and _np.isfinite(v) and abs(v) > _F32_MAX:
                    raise InvalidArgumentError(
                        f"tape.backward: seed for {out!r}: value {v:.9g} does not fit f32")
                continue
            host = _np.ascontiguousarray(value, dtype=numpy_dtype(out.dtype))
            if host.shape != tuple(out.shape):
                raise InvalidArgumentError(
                    f"tape.backward: seed for {out!r}: {host.nbytes} bytes given, the array "
                    f"holds {out.nbytes} (shape {host.shape} given, the array's is "
                    f"{tuple(out.shape)})")
            hosts[out.handle] = host
        self._prune()
        grads = {h: self._gradient(a) for h, a in needed.items()}
        unique = list({g.handle: g for g in grads.values()}.values())
        s.zero_many(unique)
        for out, value in seed.items():
            g = grads[out.handle]
            if out.handle in hosts:
                g.upload(hosts[out.handle])
            else:
                s.fill(g, float(value))
        for i in range(len(self.launches) - 1, -1, -1):
            kernel, args = self.launches[i]
            fwd = self._forward(kernel)
            try:
                s.launch(fwd.adjoint, *args, *(grads[args[p].handle] for p, _ in fwd.gradients))
            except Error as e:
                raise type(e)(f"tape.backward: adjoint of launch {i}: {e}") from None

    def grad(self, array: NdArray) -> NdArray:
        """The gradient array of `array`: `array.grad` when set, else the one a backward made
        (it lives while the tape and `array` do)."""
        if getattr(array, "grad", None) is not None:
            return array.grad
        entry = self._grads.get(getattr(array, "handle", None))
        if entry is None or entry[0]() is None or array.freed:
            raise InvalidArgumentError(
                f"tape.grad: {array!r} is not a differentiated (grad) argument of any "
                "recorded launch, or backward() has not run")
        return entry[1]
