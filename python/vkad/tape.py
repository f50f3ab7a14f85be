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
docs/tape.md). Session.launch refuses such a launch inside `with t:` before it
runs (InvalidArgumentError naming both launches, the array and the row), with vkad::Tape's own
check and message (api/tape_hazards.h); rows given by scalar arguments are compared, so the
time axis is accepted. A launch that passes one array for a parameter it writes and another
it reads (in place: `s.launch(k, x, x)` for `b[i] = sin(a[i])`) is refused the same way, with
the checkpointed tape too: its adjoint would read what the launch wrote; pass a separate output.

A differentiated scalar parameter (an f32 / f64 scalar marked grad) has its gradient in
`t.grad(kernel, "a")`: a shape (1,) array holding d(objective)/d(a) summed over every launch of
that kernel in the recording (the gradient with respect to a value every launch is given).

A Session.loop recorded on the tape is one entry of `t.launches` (a vkad.LoopRecord: its
differentiated launches and iterations; docs/graphs.md, "Step loops"): the check above runs for
every iteration before the loop runs, and backward runs the loop's adjoints as one loop, from its
last iteration down.

Checkpointing across launches (`t.checkpoint_every = K`, vkad::Tape::set_checkpoint_every):
the recording may reuse state arrays (a ring). Before each recorded launch the tape copies what
it writes, the first time its segment of K launches writes it; backward runs the segments last
first (their start state copied back, their launches again with a copy of what each writes,
then each adjoint -- a clearing one -- after putting back what its launch wrote) and leaves the
arrays as the forward did. Memory: a copy of each written array per segment and per launch of a
segment, plus one; compute: the forward twice. Not inside a graph capture (copies are not
captured).
"""
from __future__ import annotations

import operator
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Tuple

import numpy as _np

from ._vkad import DType, NdArray, _TapeHazards
from .errors import Error, FailedPreconditionError, InvalidArgumentError

if TYPE_CHECKING:
    from . import Session

_F32_MAX = float(_np.finfo(_np.float32).max)


class Tape:
    def __init__(self, session: "Session"):
        self.session = session
        # (kernel, args) as launched since the recording began, or a LoopRecord per Session.loop;
        # they keep the arrays alive.
        self.launches: List[Any] = []
        # handle -> (weak reference to the array, the gradient the tape made for it)
        self._grads: Dict[int, Tuple[weakref.ref, NdArray]] = {}
        # (forward kernel, parameter index) -> the 1-element gradient of a differentiated scalar
        # parameter (f32 / f64 `grad`), summed over every recorded launch of that kernel.
        self._scalar_grads: Dict[Tuple[Any, int], NdArray] = {}
        # What the recording read and wrote; the binding's launch checks and updates it.
        self._hazards = _TapeHazards()
        self._checkpoint_every = 0
        # Checkpointing: per segment, the arrays copied at its start; the copies, by (kind,
        # slot, array handle) -> (weak reference to the array, its copy), kept across recordings.
        self._segment_arrays: List[List[NdArray]] = []
        self._copies: Dict[Tuple[str, int, int], Tuple[weakref.ref, NdArray]] = {}

    @property
    def checkpoint_every(self) -> int:
        """Launches per checkpointing segment; 0 (the default) is off."""
        return self._checkpoint_every

    @property
    def keeps_intermediate_gradients(self) -> bool:
        """What a gradient holds after backward where the recording wrote the array (vkad::
        Tape::keeps_intermediate_gradients). True (no checkpointing): t.grad(x) at an element a
        recorded launch stored is d(objective)/d(the value stored there), e.g. dL/dx[t] on a
        time axis. False (checkpoint_every > 0): each store's adjoint consumes its seed, so
        gradients are with respect to the arrays as the recording found them -- 0 where a launch
        overwrote the element; inputs' gradients are the same either way."""
        return self._checkpoint_every == 0

    @checkpoint_every.setter
    def checkpoint_every(self, k: int) -> None:
        if self.launches:
            raise FailedPreconditionError(
                f"tape.set_checkpoint_every: {len(self.launches)} launches are recorded; set it "
                "before a recording (or after reset())")
        # operator.index: an int (or numpy integer), never "3" or 2.5 silently turned into one.
        try:
            if isinstance(k, bool):
                raise TypeError
            k = operator.index(k)
        except TypeError:
            raise InvalidArgumentError(
                f"tape.checkpoint_every: {k!r} is not an integer") from None
        if k < 0:
            raise InvalidArgumentError(f"tape.checkpoint_every: {k} is negative")
        self._checkpoint_every = k

    def _copy_slot(self, kind: str, slot: int, array: NdArray) -> NdArray:
        key = (kind, slot, array.handle)
        entry = self._copies.get(key)
        if entry is None:
            c = self.session.empty(array.shape, array.dtype, f"tape checkpoint of {array.name}")
            self._copies[key] = (weakref.ref(array), c)
            return c
        return entry[1]

    @staticmethod
    def _written(kernel, args) -> List[NdArray]:
        fwd = Tape._forward(kernel)
        return [args[p] for p in fwd._written_params]

    def _before_launch(self, kernel, args) -> None:
        # Called by the binding before a recorded launch runs: the segment's first copy of each
        # array the launch writes.
        segment = len(self.launches) // self._checkpoint_every
        while len(self._segment_arrays) <= segment:
            self._segment_arrays.append([])
        at_start = self._segment_arrays[segment]
        for a in self._written(kernel, args):
            if any(b.handle == a.handle for b in at_start):
                continue
            self.session.copy(a, self._copy_slot("segment", segment, a))
            at_start.append(a)

    def __enter__(self) -> "Tape":
        if self.session._recording is not None:
            raise InvalidArgumentError("tape: this session is already recording on another tape")
        self.reset()
        self.session._recording = self
        if self._checkpoint_every:
            self.session._set_tape(self.launches, None, self._before_launch)
        else:
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
        self._segment_arrays = []
        self._prune()

    def _prune(self) -> None:
        dead = [h for h, (ref, _) in self._grads.items()
                if ref() is None or ref().freed]
        for h in dead:
            del self._grads[h]  # the gradient is freed when collected
        for key in [k for k, (ref, _) in self._copies.items() if ref() is None or ref().freed]:
            del self._copies[key]

    @staticmethod
    def _forward(kernel):
        return getattr(kernel, "forward", kernel)  # a Differentiated launches its forward

    def _differentiated(self) -> Dict[int, NdArray]:
        # In the binding: a loop over ~10^4 launches here took as long as their adjoints.
        return self.session._tape_differentiated(self.launches)

    def _gradient(self, array: NdArray) -> NdArray:
        if array.grad is not None:
            return array.grad
        entry = self._grads.get(array.handle)
        if entry is None:
            name = (array.name or "array") + "_grad"
            # Pooled: a new tape per iteration reuses the previous tapes' freed gradients
            # instead of making Vulkan buffers anew (Runtime::create_ndarray's `pooled`).
            g = self.session._empty_pooled(array.shape, array.dtype, name)
            self._grads[array.handle] = (weakref.ref(array), g)
            return g
        return entry[1]

    def _scalar_gradient(self, forward, param: int) -> NdArray:
        g = self._scalar_grads.get((forward, param))
        if g is None:
            name, dtype, _ = forward.params[param]
            g = self.session.empty((1,), dtype, f"{forward.name}.{name}_grad")
            self._scalar_grads[(forward, param)] = g
        return g

    def backward(self, seed: Mapping[NdArray, Any]) -> None:
        """Computes gradients of the recorded launches, given d(objective)/d(output) per seeded
        output array (a number for every element, or an array of the output's shape)."""
        from . import numpy_dtype

        s = self.session
        if s._recording is self:
            raise InvalidArgumentError("tape.backward: call it after the `with` block closes")
        if self._hazards.broken:
            raise FailedPreconditionError(f"tape.backward: {self._hazards.broken}; record the "
                                          "iteration again (`with tape:`)")
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
        grads = {h: self._scalar_gradient(*h) if isinstance(h, tuple) else self._gradient(a)
                 for h, a in needed.items()}
        unique = list({g.handle: g for g in grads.values()}.values())
        s.zero_many(unique)
        for out, value in seed.items():
            g = grads[out.handle]
            if out.handle in hosts:
                g.upload(hosts[out.handle])
            else:
                s.fill(g, float(value))
        if self._checkpoint_every:
            self._checkpointed_backward(grads)
            return
        # The adjoints, last launch first, in the binding (Session._launch_adjoints: the same
        # launches and errors as a loop of _adjoint here, at half the cost a launch).
        s._launch_adjoints(self.launches, grads)

    def _adjoint(self, i: int, grads, clearing: bool, plans: Dict[int, tuple]) -> None:
        # Per kernel once (`plans`, by id: the recorded launches keep the kernels alive), the
        # adjoint and the parameters whose gradients it takes: a backward launches ~10^4 of
        # them, and reading them off the kernel each time was most of its Python time.
        kernel, args = self.launches[i]
        plan = plans.get(id(kernel))
        if plan is None:
            fwd = self._forward(kernel)
            adj = self.session._clearing_adjoint(fwd) if clearing else fwd.adjoint
            plan = plans[id(kernel)] = (fwd, adj, [p for p, _ in fwd.gradients])
        fwd, adj, params = plan
        try:
            self.session.launch(adj, *args, *[
                grads[args[p].handle] if isinstance(args[p], NdArray) else grads[(fwd, p)]
                for p in params])
        except Error as e:
            raise type(e)(f"tape.backward: adjoint of launch {i}: {e}") from None

    def _checkpointed_backward(self, grads) -> None:
        s, k, n = self.session, self._checkpoint_every, len(self.launches)
        plans: Dict[int, tuple] = {}
        every: Dict[int, NdArray] = {}
        for seg in self._segment_arrays:
            for a in seg:
                every.setdefault(a.handle, a)
        for a in every.values():  # the end state, put back at the end
            s.copy(a, self._copy_slot("end", 0, a))
        for segment in range((n + k - 1) // k - 1, -1, -1):
            first, last = segment * k, min(n, segment * k + k)
            for a in self._segment_arrays[segment]:
                s.copy(self._copy_slot("segment", segment, a), a)
            for j in range(first, last):
                kernel, args = self.launches[j]
                for a in self._written(kernel, args):
                    s.copy(a, self._copy_slot("launch", j - first, a))
                try:
                    s.launch(self._forward(kernel), *args)
                except Error as e:
                    raise type(e)(f"tape.backward: forward of launch {j} again: {e}") from None
            for j in range(last - 1, first - 1, -1):
                kernel, args = self.launches[j]
                for a in self._written(kernel, args):
                    s.copy(self._copy_slot("launch", j - first, a), a)
                self._adjoint(j, grads, True, plans)
        for a in every.values():
            s.copy(self._copy_slot("end", 0, a), a)

    def grad(self, array: Any, param: Any = None) -> NdArray:
        """The gradient array of `array`: `array.grad` when set, else the one a backward made
        (it lives while the tape and `array` do).

        t.grad(kernel, param), with a differentiated kernel (or its forward) and a scalar
        parameter's name or index (an f32 / f64 scalar marked grad): that parameter's gradient,
        a shape (1,) array holding d(objective)/d(value) summed over every launch of the kernel
        the recording holds -- the gradient with respect to the value when every launch is
        passed the same one (a physical constant, a learning parameter)."""
        if param is not None:
            return self._scalar_grad_of(array, param)
        if getattr(array, "grad", None) is not None:
            return array.grad
        entry = self._grads.get(getattr(array, "handle", None))
        if entry is None or entry[0]() is None or array.freed:
            raise InvalidArgumentError(
                f"tape.grad: {array!r} is not a differentiated (grad) argument of any "
                "recorded launch, or backward() has not run")
        return entry[1]

    def _scalar_grad_of(self, kernel: Any, param: Any) -> NdArray:
        fwd = self._forward(kernel)
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
        g = self._scalar_grads.get((fwd, index))
        if g is None:
            raise InvalidArgumentError(
                f"tape.grad: no launch of '{fwd.name}' was recorded before backward(), so "
                f"scalar '{names[index]}' has no gradient")
        return g
