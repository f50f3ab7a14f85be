"""Tape: records forward launches of differentiated kernels and runs their adjoints, with
gradient storage that lives across iterations. The tape is vkad::Tape (api/tape.h), bound as
vkad._Tape: its check of each launch, its backward, checkpointing and messages are the C++
tape's (and the C API's). This class adds what is Python's own: the `with t:` protocol, the
recorded launches' Python objects kept alive until the next recording, seeds given as numbers,
numpy arrays or NdArrays, `array.grad` as an array's gradient, and gradients as NdArrays.

    t = s.tape()                                         # once
    for it in range(iterations):
        with t:                                          # a new recording; gradients are kept
            s.launch(sim, steps, dt, p0, v0, target, loss)   # recorded (and launched)
        t.backward(seed={loss: 1.0})                     # adjoints, in reverse launch order
        s.launch(update, lr, v0, t.grad(v0))

backward() zeroes the gradient of every differentiated array argument of the recording (one
barrier pair for all), seeds the given outputs (a number fills, an array uploads) and launches
each recorded forward's adjoint with the forward's own arguments and the gradient arrays, last
launch first. Nothing waits. A gradient is `array.grad` when the caller set one
(s.ndarray(x, grad=True), s.empty(..., grad=True), or `a.grad = g`), else an array the tape
makes (same dtype and shape) the first time a backward needs it and keeps while the array
lives: after the first iteration backward allocates and frees nothing. The gradient of an array
that was freed or collected is freed at the next recording or backward. t.grad(x) views a
gradient the tape made: the view keeps the tape alive, and the tape frees the array (a view
launched on its own tape is a cycle the garbage collector frees with the tape).

As in reverse mode generally, the adjoints read the forward's inputs as they are when they run:
a launch recorded later must not overwrite an input of an earlier one (keep each step's state:
an array with a time axis written at f + 1 and read at f, or an array per step; docs/tape.md).
Session.launch refuses such a launch inside `with t:` before it runs (InvalidArgumentError
naming both launches, the array and the row: vkad::Tape::launch's check, api/tape_hazards.h);
rows given by scalar arguments are compared, so the time axis is accepted. A launch that passes
one array for a parameter it writes and another it reads (in place: `s.launch(k, x, x)` for
`b[i] = sin(a[i])`) is refused the same way, with the checkpointed tape too: its adjoint would
read what the launch wrote; pass a separate output.

A differentiated scalar parameter (an f32 / f64 scalar marked grad) has its gradient in
`t.grad(kernel, "a")`: a shape (1,) array holding d(objective)/d(a) summed over every launch of
that kernel in the recording (the gradient with respect to a value every launch is given).

A Session.loop recorded on the tape is one entry of `t.launches` (a vkad.LoopRecord: its
differentiated launches and iterations; docs/graphs.md, "Step loops") and vkad::Tape::
launch_loop's: the check above runs for every iteration before the loop runs, and backward runs
the loop's adjoints as one loop, from its last iteration down.

Checkpointing across launches (`t.checkpoint_every = K`, vkad::Tape::set_checkpoint_every):
the recording may reuse state arrays (a ring). Before each recorded launch the tape copies what
it writes, the first time its segment of K launches writes it; backward runs the segments last
first (their start state copied back, their launches again each into a copy of what it
writes, then each adjoint -- a clearing one -- on the versions its launch saw) and leaves the
arrays as the forward did. Memory: a copy of each written array per segment and per launch of a
segment, plus one; compute: the forward twice. Inside a graph capture the copies are launches
of copy kernels (vkad::Session::copy), so a checkpointed iteration is captured and replayed like
any other (Graph.launch_names shows them as None).

A memory budget instead of K (`t.memory_budget = bytes`, vkad::Tape::set_memory_budget): the
copies stay within the budget and backward runs the forward again the fewest times that allows
(several levels of checkpoints where two do not fit); `t.checkpoint_plan()` says what backward
will run -- levels, segments, peak bytes, how many times each launch runs -- and a budget below
what the recording needs is refused, naming the least bytes that would do (docs/tape.md).
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Dict, List, Mapping

import numpy as _np

from ._vkad import NdArray, _Tape
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from . import Session


def _count(what: str, value: Any, bits: int) -> int:
    """`value` as an unsigned integer of `bits` bits, or InvalidArgumentError naming `what`.
    operator.index: an int (or numpy integer), never "3" or 2.5 silently turned into one."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{what}: {value!r} is not an integer") from None
    if value < 0:
        raise InvalidArgumentError(f"{what}: {value} is negative")
    if value >= 2 ** bits:
        raise InvalidArgumentError(f"{what}: {value} is out of range")
    return value


class Tape:
    def __init__(self, session: "Session"):
        self.session = session
        self._tape = _Tape(session)
        # The views of the tape's gradients handed out, by array handle (or (forward kernel,
        # parameter) for a scalar's): t.grad(x) is the same object while the gradient is.
        self._grads: Dict[Any, NdArray] = {}

    @property
    def launches(self) -> List[Any]:
        """(kernel, args) per launch recorded since the recording began, or a LoopRecord per
        Session.loop; they keep the recorded kernels and arrays alive."""
        return self._tape.launches

    @property
    def checkpoint_every(self) -> int:
        """Launches per checkpointing segment; 0 (the default) is off."""
        return self._tape.checkpoint_every

    @checkpoint_every.setter
    def checkpoint_every(self, k: int) -> None:
        self._tape.checkpoint_every = _count("tape.checkpoint_every", k, 32)

    @property
    def memory_budget(self) -> int:
        """Device bytes the checkpoint copies may hold; 0 (the default) is off. Setting it turns
        checkpoint_every off (and setting checkpoint_every turns it off)."""
        return self._tape.memory_budget

    @memory_budget.setter
    def memory_budget(self, nbytes: int) -> None:
        self._tape.memory_budget = _count("tape.memory_budget", nbytes, 64)

    def checkpoint_plan(self) -> Dict[str, Any]:
        """The schedule backward runs for the recording so far (vkad::Tape::checkpoint_plan): a
        dict of `launches`, `segments` (launches per segment per level, outermost first, the
        last 1), `levels`, `recompute` (times each launch runs), `peak_bytes`, `min_bytes`,
        `state_bytes` and `text`. FailedPreconditionError without checkpointing or a recording;
        InvalidArgumentError, naming the least bytes, where the budget fits no schedule."""
        return self._tape.checkpoint_plan()

    @property
    def checkpoint_bytes(self) -> int:
        """Device bytes the tape's checkpoint copies hold now."""
        return self._tape.checkpoint_bytes

    @property
    def keeps_intermediate_gradients(self) -> bool:
        """What a gradient holds after backward where the recording wrote the array (vkad::
        Tape::keeps_intermediate_gradients). True (no checkpointing): t.grad(x) at an element a
        recorded launch stored is d(objective)/d(the value stored there), e.g. dL/dx[t] on a
        time axis. False (checkpoint_every > 0): each store's adjoint consumes its seed, so
        gradients are with respect to the arrays as the recording found them -- 0 where a launch
        overwrote the element; inputs' gradients are the same either way."""
        return self.checkpoint_every == 0 and self.memory_budget == 0

    def __enter__(self) -> "Tape":
        if self.session._recording is not None:
            raise InvalidArgumentError("tape: this session is already recording on another tape")
        self._tape.begin()
        self._prune()
        self.session._recording = self
        return self

    def __exit__(self, *exc) -> None:
        self._tape.end()
        self.session._recording = None

    def reset(self) -> None:
        """Forgets the recorded launches (`with t:` does it); keeps the gradients, except those
        of arrays freed or collected meanwhile."""
        self._tape.reset()
        self._prune()

    def _prune(self) -> None:
        self._grads = {h: g for h, g in self._grads.items()
                       if isinstance(h, tuple) or self._tape.has_grad(h)}

    def backward(self, seed: Mapping[NdArray, Any]) -> None:
        """Computes gradients of the recorded launches, given d(objective)/d(output) per seeded
        output array (a number for every element, or an array of the output's shape)."""
        from . import numpy_dtype

        if self.session._recording is self:
            raise InvalidArgumentError("tape.backward: call it after the `with` block closes")
        seeds = []
        for out, value in seed.items():
            if not isinstance(out, NdArray):
                raise InvalidArgumentError(
                    f"tape.backward: seed for {out!r}, which is not a differentiated (grad) "
                    "argument of any recorded launch")
            if isinstance(value, (int, float, _np.number)):
                seeds.append((out, float(value)))
                continue
            if isinstance(value, NdArray):
                value = value.numpy()
            host = _np.ascontiguousarray(value, dtype=numpy_dtype(out.dtype))
            if host.shape != tuple(out.shape):
                raise InvalidArgumentError(
                    f"tape.backward: seed for {out!r}: {host.nbytes} bytes given, the array "
                    f"holds {out.nbytes} (shape {host.shape} given, the array's is "
                    f"{tuple(out.shape)})")
            seeds.append((out, host))
        self._tape.backward(seeds)

    def grad(self, array: Any, param: Any = None) -> NdArray:
        """The gradient array of `array`: `array.grad` when set, else the one a backward made
        (it lives while the tape and `array` do; the tape frees it).

        t.grad(kernel, param), with a differentiated kernel (or its forward) and a scalar
        parameter's name or index (an f32 / f64 scalar marked grad): that parameter's gradient,
        a shape (1,) array holding d(objective)/d(value) summed over every launch of the kernel
        the recording holds -- the gradient with respect to the value when every launch is
        passed the same one (a physical constant, a learning parameter)."""
        if param is not None:
            return self._scalar_grad_of(array, param)
        if getattr(array, "grad", None) is not None:
            return array.grad
        if not isinstance(array, NdArray):
            raise InvalidArgumentError(
                f"tape.grad: {array!r} is not a differentiated (grad) argument of any "
                "recorded launch, or backward() has not run")
        g = self._tape.grad(array)
        kept = self._grads.get(array.handle)
        if kept is not None and kept.handle == g.handle:
            return kept
        self._grads[array.handle] = g
        return g

    def _scalar_grad_of(self, kernel: Any, param: Any) -> NdArray:
        fwd = getattr(kernel, "forward", kernel)  # a Differentiated stands for its forward
        names = [p[0] for p in fwd.params]
        index = names.index(param) if isinstance(param, str) and param in names else param
        if not isinstance(index, int) or not 0 <= index < len(names):
            raise InvalidArgumentError(
                f"tape.grad: kernel '{fwd.name}' has no parameter {param!r} (its parameters: "
                f"{', '.join(names)})")
        if index not in [p for p, _ in fwd.gradients] or index in fwd._array_params:
            raise InvalidArgumentError(
                f"tape.grad: parameter '{names[index]}' of kernel '{fwd.name}' is not a "
                "differentiated (grad) scalar; an array's gradient is t.grad(array)")
        try:
            g = self._tape.scalar_grad(fwd, index)
        except InvalidArgumentError:
            # vkad::Tape::scalar_grad's refusal where the parameter is one: no backward ran
            # over a launch of the kernel. Said in the kernel's and parameter's names.
            raise InvalidArgumentError(
                f"tape.grad: no launch of '{fwd.name}' was recorded before backward(), so "
                f"scalar '{names[index]}' has no gradient") from None
        kept = self._grads.get((fwd, index))
        if kept is not None and kept.handle == g.handle:
            return kept
        self._grads[(fwd, index)] = g
        return g
