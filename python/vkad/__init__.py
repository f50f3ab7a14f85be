"""vkad from Python: automatically differentiated compute kernels on Vulkan.

    import numpy as np, vkad
    s = vkad.Session()                                  # a GPU if there is one, else lavapipe
    kb = vkad.KernelBuilder("square")
    x = kb.ndarray("x", vkad.f32, 1, grad=True)
    y = kb.ndarray("y", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        y[i] = x[i] * x[i]
    square = s.differentiate(kb)                        # forward + adjoint
    xs = s.ndarray(np.arange(4, dtype=np.float32)); ys = s.empty(4, vkad.f32)
    with s.tape() as t:                                 # reuse t: `with t:` each iteration
        s.launch(square, xs, ys)                        # asynchronous
    t.backward(seed={ys: 1.0})
    print(t.grad(xs).numpy())                           # [0, 2, 4, 6]

Everything that fails raises a vkad.Error subclass carrying vkad's message.
"""
from __future__ import annotations

import contextlib as _contextlib
import operator as _operator
import weakref as _weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as _np

from . import _vkad
from ._vkad import (BoundLaunch, DType, Differentiated, Graph, Kernel, LoopIndex, LoopRecord,
                    NdArray)
from .errors import (Error, InvalidArgumentError, NotFoundError, FailedPreconditionError,
                     OutOfDeviceMemoryError, OutOfHostMemoryError, DeviceLostError,
                     UnsupportedError, NoDeviceError, TimeoutError, DeviceError, VulkanError,
                     InternalError, ERRORS as _ERRORS)
from .builder import (KernelBuilder, Value, Scalar, Array, Dim, Local, sqrt, rsqrt, exp, log,
                      sin, cos, tan, tanh, asin, acos, abs, floor, ceil, pow, atan2, min, max,
                      eq, ne, select, cast)
from .matrix import Vector, Matrix, polar_decompose
from .tape import Tape
from .frontend import as_builder as _as_builder, KernelFunction
from .devices import Device, devices, device_for_cuda, cuda_uuids, normalize_uuid

_vkad._set_errors(Error, {e.code: e for e in _ERRORS})

__version__: str = _vkad.__version__  # the file VERSION, through the build

f32, f64, i32, u32, i64 = DType.f32, DType.f64, DType.i32, DType.u32, DType.i64
bool_ = DType.bool

_NUMPY = {"float32": f32, "float64": f64, "int32": i32, "uint32": u32, "int64": i64, "bool": bool_}
_TO_NUMPY = {v: k for k, v in _NUMPY.items()}

DTypeLike = Union[DType, str, type, _np.dtype]


def as_dtype(dtype: DTypeLike) -> DType:
    """A vkad DType from a DType, its name ("f32"), or a numpy dtype (np.float32)."""
    if isinstance(dtype, DType):
        return dtype
    if dtype is None:  # numpy reads None as float64; vkad wants the dtype said
        raise InvalidArgumentError("dtype None: give one of f32, f64, i32, u32, i64, bool")
    if isinstance(dtype, str) and dtype in DType.__members__:
        return DType[dtype]
    try:
        name = _np.dtype(dtype).name
    except TypeError:
        name = None
    if name in _NUMPY:
        return _NUMPY[name]
    raise InvalidArgumentError(f"dtype {dtype!r}: vkad holds f32, f64, i32, u32, i64 and bool")


def numpy_dtype(dtype: DTypeLike) -> _np.dtype:
    """The numpy dtype of a vkad dtype (bool arrays are bool on the host, u32 on the device)."""
    return _np.dtype(_TO_NUMPY[as_dtype(dtype)])


def _no_rank_0(shape: Any, name: str) -> None:
    # vkad arrays have rank 1 to 8; the builder's rank-0 parameter (a scalar result such as a
    # loss) takes a shape (1,) array, so say that rather than the runtime's "shape () is empty".
    if shape == () or (isinstance(shape, (list, tuple)) and len(shape) == 0):
        raise InvalidArgumentError(
            f"ndarray '{name}': shape (): vkad arrays have rank 1 to 8; hold a scalar (a rank-0 "
            "kernel parameter, kb.ndarray(name, dtype, 0), indexed x[None]) in shape (1,)")


def _ir(kernel: Union[str, KernelBuilder]) -> str:
    kernel = _as_builder(kernel)  # a @vkad.kernel: its lowered KernelBuilder
    return kernel.finish() if isinstance(kernel, KernelBuilder) else kernel


def _elements(kernel: Union[str, KernelBuilder]) -> List[Tuple[int, ...]]:
    # A KernelBuilder's element shapes, per parameter, which a launch checks; IR text has none.
    kernel = _as_builder(kernel)
    return list(kernel._elements) if isinstance(kernel, KernelBuilder) else []


def _loop_count(start: int, stop: int) -> None:
    # A loop's iterations are counted in 32 bits (Session::launch_loop), its index in i32.
    if stop - start > 0xFFFFFFFF:
        raise InvalidArgumentError(f"Session.loop: range({start}, {stop}) has {stop - start} "
                                   "iterations; at most 2^32 - 1")


class Session(_vkad.Session):
    """A device, the kernels compiled for it and its ndarrays (vkad::Session).

    device: None (a discrete GPU first, lavapipe last; VKAD_DEVICE when set), a device index,
    a device UUID (vkad.devices(); nvidia-smi's "GPU-..." form too), or a substring of its
    name. validation: the Khronos validation layer (also
    VKAD_VALIDATION=1). retirement_depth: submissions in flight before the host waits.
    spare_memory_blocks: empty 64 MiB device-memory blocks kept per memory type after their
    last array is freed (0 gives every empty block back at once).
    cache_dir: the on-disk kernel and pipeline caches (docs/caches.md): None =
    automatic (VKAD_CACHE=0 off, else VKAD_CACHE_DIR, else $XDG_CACHE_HOME/vkad, else
    ~/.cache/vkad), "" = off, else that directory.
    specialize_shapes: besides its generic pipeline, a kernel gets one per set of array shapes
    it is launched with, its extents constants the driver folds (docs/caches.md, "Kernels
    specialized to their shapes"): made on a thread while the shape's first launch runs the generic
    one (prepare() makes it at once), at most 8 per task. False: the generic pipeline for every
    shape (VKAD_SPECIALIZE_SHAPES=0 does that for every session).
    check_finite: a debug mode (docs/debugging.md): every float value a kernel, forward or
    adjoint, stores or atomically adds into an array is checked, and the first NaN or infinity
    of a launch is a vkad.DeviceError at the next synchronize / read, naming the kernel, the
    task and the statement (VKAD_CHECK_FINITE=1 turns it on for every session).

    launch(kernel, *args) is asynchronous: ndarrays for array parameters, Python (or numpy)
    numbers converted to each scalar parameter's dtype. Blocking points: NdArray.numpy(),
    synchronize(), close(); they release the GIL while they wait.
    """

    def __init__(self, device: Union[None, int, str] = None, validation: bool = False,
                 retirement_depth: int = 3, spare_memory_blocks: int = 1,
                 cache_dir: Optional[str] = None, specialize_shapes: bool = True,
                 check_finite: bool = False):
        super().__init__(device, validation, retirement_depth, spare_memory_blocks, cache_dir,
                         specialize_shapes, check_finite)
        self._recording: Optional[Tape] = None
        _OPEN_SESSIONS.add(self)

    def close(self) -> None:
        """Waits for this session's work and frees the device. Arrays still held by DLPack
        consumers keep it (memory and device) until the last of them is released."""
        _OPEN_SESSIONS.discard(self)
        super().close()

    def from_dlpack(self, x: Any, *, copy: Optional[bool] = None, name: str = "") -> NdArray:
        """A new array of this session holding a copy of `x` (anything with `__dlpack__`, or a
        DLPack capsule); see vkad.from_dlpack."""
        return from_dlpack(x, self, copy=copy, name=name)

    def compile(self, kernel: Union[str, KernelBuilder]) -> Kernel:
        """Compiles a kernel from IR text, a KernelBuilder or a @vkad.kernel function (cached
        per session; an error names the Python line of the statement it quotes)."""
        if isinstance(kernel, KernelFunction):
            return kernel.compile(self)
        return super().compile(_ir(kernel), _elements(kernel))

    def jvp(self, kernel: Union[str, KernelBuilder]) -> Kernel:
        """Compiles a kernel's forward-mode (tangent) kernel: its parameters, then `<name>_dot`
        per parameter marked grad (a scalar's a scalar: the input direction; an ndarray's an
        ndarray of its shape). Launched with the directions in the inputs' `_dot` arrays, it
        writes the outputs and J * direction into theirs (added onto what they hold where the
        forward adds)."""
        if isinstance(kernel, KernelFunction):
            return kernel.jvp(self)
        return super().jvp(_ir(kernel), _elements(kernel))

    def differentiate(self, kernel: Union[str, KernelBuilder]) -> Differentiated:
        """Compiles a kernel and its adjoint; raises InvalidArgumentError when no parameter
        is marked grad."""
        if isinstance(kernel, KernelFunction):
            return kernel.differentiate(self)
        return super().differentiate(_ir(kernel), _elements(kernel))

    def ndarray(self, array: Any, dtype: Optional[DTypeLike] = None, name: str = "",
                grad: bool = False) -> NdArray:
        """A device array holding a copy of `array` (a numpy array, or anything np.asarray
        takes; `dtype` converts first). Uploads straight from a C-contiguous numpy buffer.
        grad=True attaches a zeroed gradient array as `.grad` (a Tape uses it)."""
        host = _np.asarray(array) if dtype is None else _np.asarray(array, numpy_dtype(dtype))
        _no_rank_0(host.shape, name)
        if host.dtype.name not in _NUMPY:
            raise InvalidArgumentError(f"ndarray '{name}': numpy dtype {host.dtype.name} is not "
                                       "one vkad holds (float32, float64, int32, uint32, int64, "
                                       "bool)")
        a = self._from_numpy(host, name)
        if grad:
            self._attach_grad(a)
        return a

    def empty(self, shape: Union[int, Sequence[int]], dtype: DTypeLike = DType.f32,
              name: str = "", grad: bool = False) -> NdArray:
        """A device array whose contents are undefined until written. grad=True attaches a
        zeroed gradient array as `.grad` (a Tape uses it)."""
        _no_rank_0(shape, name)
        a = super().empty(shape, as_dtype(dtype), name)
        if grad:
            self._attach_grad(a)
        return a

    def zeros(self, shape: Union[int, Sequence[int]], dtype: DTypeLike = DType.f32,
              name: str = "", grad: bool = False) -> NdArray:
        """A device array set to zero on the device (recorded, no wait); grad=True attaches a
        zeroed gradient array as `.grad`."""
        _no_rank_0(shape, name)
        a = super().empty(shape, as_dtype(dtype), name)
        if grad:
            a.grad = super().empty(shape, as_dtype(dtype), name + "_grad" if name else "")
            self.zero_many([a, a.grad])
        else:
            self.zero(a)
        return a

    def _attach_grad(self, a: NdArray) -> None:
        a.grad = super().empty(a.shape, a.dtype, a.name + "_grad" if a.name else "")
        self.zero(a.grad)

    @_contextlib.contextmanager
    def capture(self, name: str = "", background: bool = False,
                run: bool = False) -> Iterator[Graph]:
        """`with s.capture() as g:` captures the launches (and zero / fill / zero_many, and copy
        as a launch of a copy kernel) of the block instead of running them; `s.replay(g)` then runs them all with one call, and
        `s.replay(g, updates=[(launch, param, value)])` with scalar arguments replaced (kept for
        later replays). Arrays are bound by reference. Inside the block flush() submits nothing
        and uploads, readbacks and synchronize() raise FailedPreconditionError. A tape's
        forward launches and backward() can be captured: replaying them is a training step.

        background=True: the graph's rework (scheduling, fusion, their kernels' compiles) runs
        on a thread of its own instead of at the end of the block; replays run the launches as
        captured until it is done, then the reworked graph (installed by the first replay that
        finds it done, or by finish_rework(g)). Same results; the first iteration of a training
        loop costs its recording and one plain replay.

        run=True: the block's launches also run, in order, as they would have without the
        capture (a thread records them in pieces and the device runs each while the block goes
        on): a training loop's first iteration is its capture, with no replay after it. The
        block's end returns once everything is submitted."""
        g = self._begin_capture(name, background, run)
        try:
            yield g
        finally:
            self._end_capture()

    def loop(self, start: int, stop: int, body: Callable[[LoopIndex], Any]) -> None:
        """A step loop: the launches of `body(t)` for t in range(start, stop), in order -- the
        results of `for t in range(start, stop): body(t)` -- said as one (docs/graphs.md, "Step
        loops").

            def step(t):                  # DiffTaichi's substep, t symbolic
                center(t - 1); nn1(t - 1); nn2(t - 1); springs(t - 1); advance(t)
            s.loop(1, steps, step)

        `body` runs once, with `t` a LoopIndex: pass t (t + 1, t - 1, ...) to kernels' i32
        scalars, which then step by one per iteration; anything that needs t's value (int(t),
        t * 2, an `if` on it) raises, and so does anything in the body but a launch (zero, fill,
        copy, upload, read back, capture, bind, compile: do them before or after). A launch
        without t repeats as given. Where every launch of the body may run in a resident kernel
        (small 1-d ranges that do not step, "Resident step loops") the loop is one launch of a
        rolled kernel -- compiled at the first loop of its shape and kept -- else the launches
        one by one; stats()["rolled_loops"] counts the former. A tape records the loop as one
        entry (a LoopRecord) and backward runs its adjoints as one loop too; the tape's check
        runs per iteration, before anything runs. Inside a checkpointing tape
        (checkpoint_every, memory_budget) the body runs per iteration as a plain loop. A loop inside a capture
        is captured as launched (one launch when rolled: replay updates cannot change its
        scalars)."""
        start, stop = _operator.index(start), _operator.index(stop)
        rec = self._recording
        if rec is not None and (rec.checkpoint_every or rec.memory_budget):
            for t in range(start, stop):
                body(t)
            return
        self._trace_loop(start, stop, body, self._loop_end)

    def prepare_loop(self, start: int, stop: int, body: Callable[[LoopIndex], Any]) -> bool:
        """What `loop(start, stop, body)` will need, made now and nothing launched: its
        resident kernel rolled, compiled (or read from the disk cache), registered and its
        pipelines made -- and its adjoint loop's, where the body launches differentiated kernels
        and every gradient array is set (`array.grad`) -- so that the first loop, and the first
        backward of a tape that records it, pay only their launches. As Session.prepare for one
        kernel: call it where a pause is acceptable (after building a simulation, before the
        timed loop). `body` is traced as by loop() (the same rules; a tape is not told).
        A loop too wide to roll gets the graph rework's plan of its launches instead (and its
        adjoint's): the loop with these very arguments then launches that plan from its first
        run (stats()["reworked_loops"]; one resting on a zeroed gradient only inside a capture
        that shows the zeroing). Returns whether the loop will run as one resident kernel."""
        return bool(self._trace_loop(_operator.index(start), _operator.index(stop), body,
                                     self._loop_prepare))

    def _trace_loop(self, start: int, stop: int, body: Callable[[LoopIndex], Any],
                    finish: Callable[[int], Any]) -> Any:
        # loop's and prepare_loop's trace: body(t) once with the symbolic index, then `finish`
        # (_loop_end / _loop_prepare) with the count; the trace dropped on any exception.
        if stop <= start:
            return None
        _loop_count(start, stop)
        t = self._loop_begin(start)
        try:
            body(t)
            return finish(stop - start)
        except BaseException:
            self._loop_abort()  # (nothing once `finish` took the trace)
            raise

    def tape(self) -> Tape:
        """`with s.tape() as t:` records launches of differentiated kernels; t.backward()
        replays their adjoints in reverse order. Keep the tape and enter it again (`with t:`)
        every iteration: its gradient arrays are reused, so a steady-state iteration allocates
        nothing."""
        return Tape(self)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_OPEN_SESSIONS: "_weakref.WeakSet[Session]" = _weakref.WeakSet()


def _session_device(a: NdArray) -> str:
    """The device name of the open session that owns `a` ("another session" if none is open)."""
    for s in list(_OPEN_SESSIONS):
        if s._owns(a):
            return s.device_name
    return "another session"

_KDL_CUDA = 2


def from_dlpack(x: Any, session: Optional[Session] = None, *, copy: Optional[bool] = None,
                name: str = "") -> NdArray:
    """A vkad array from a DLPack producer (numpy, torch, CuPy, JAX arrays; any object with
    `__dlpack__` and `__dlpack_device__`) or a DLPack capsule.

    A vkad array of `session` (or with no session given) is returned as is (copy=True: a copy
    on the device); one of another session is copied into `session` through the host
    (copy=False raises, naming both devices). Anything else is copied
    once into a new array of `session` (None: the one open Session, an error if there are
    several): host memory (kDLCPU) is uploaded; CUDA memory (kDLCUDA, on an NVIDIA GPU vkad
    shares memory with) is copied on the device (cuMemcpyDtoD into the new array, after the
    producer's work on its current stream) and waited for on the host, so the array is ready
    for vkad's next launch. vkad arrays own their device memory, so importing never aliases
    another library's allocation: copy=False raises. The tensor must be C-contiguous, of rank
    1 to 8, of a dtype vkad holds (float32, float64, int32, uint32, int64, bool). A capsule is
    consumed: passing it again raises. docs/interop.md, "Sharing arrays with PyTorch, JAX and
    numpy".
    """
    if isinstance(x, NdArray):
        if session is not None and not session._owns(x):
            # Another session's array (maybe another device): imported like any other
            # producer's, through the host, since sessions share no memory.
            if copy is False:
                raise InvalidArgumentError(
                    f"from_dlpack(copy=False): ndarray '{x.name}' belongs to another session "
                    f"(on '{_session_device(x)}'); importing it into the session on "
                    f"'{session.device_name}' needs a copy")
            return session.ndarray(x.numpy(), name=name or x.name)
        if not copy:
            return x
        s = session
        if s is None:
            raise InvalidArgumentError("from_dlpack(copy=True) of a vkad array: give the session")
        y = s.empty(x.shape, x.dtype, name)
        s.copy(x, y)
        return y
    s = session
    if s is None:
        open_now = list(_OPEN_SESSIONS)
        if len(open_now) != 1:
            raise InvalidArgumentError(
                f"from_dlpack: {len(open_now)} vkad Sessions are open; say which one holds the "
                "array: vkad.from_dlpack(x, session) or session.from_dlpack(x)")
        s = open_now[0]
    if copy is False:
        raise InvalidArgumentError(
            "from_dlpack(copy=False): a vkad array owns its device memory, so importing "
            f"{type(x).__name__} needs a copy (vkad arrays export without one: "
            "torch.from_dlpack(vkad_array))")
    if type(x).__name__ == "PyCapsule":
        return s._from_dlpack_capsule(x, name)
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise InvalidArgumentError(
            f"from_dlpack: {type(x).__name__} is not a DLPack producer (no __dlpack__ / "
            "__dlpack_device__)")
    device_type, _ = x.__dlpack_device__()
    # CUDA: ask the producer to order its work before the legacy default stream, on which the
    # copy runs. Host memory: no stream (the array API's rule for CPU).
    stream = 1 if int(device_type) == _KDL_CUDA else None
    try:
        capsule = x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0 (numpy < 2.1, torch < 2.3)
        capsule = x.__dlpack__(stream=stream)
    return s._from_dlpack_capsule(capsule, name)


# Kernels written as Python functions (docs/kernels.md)
from .frontend import (kernel, func, array, scalar, vec, mat, static, ndrange,  # noqa: E402
                       max_trip, atomic_add, atomic_sub, default_session, set_default_session,
                       KernelFunction)
# Gradients against central differences, Jacobians (docs/debugging.md)
from .debugging import gradcheck, jacobian, GradcheckError, GradcheckResult, profile  # noqa: E402
from ._vkad import Timeline  # noqa: E402

__all__ = ["Session", "from_dlpack", "Tape", "Graph", "BoundLaunch", "LoopIndex", "LoopRecord", "DType", "Kernel", "NdArray", "Differentiated", "KernelBuilder",
           "Value", "Scalar", "Array", "Dim", "Local", "f32", "f64", "i32", "u32", "i64", "bool_",
           "as_dtype", "numpy_dtype", "Error", "InvalidArgumentError", "NotFoundError",
           "FailedPreconditionError", "OutOfDeviceMemoryError", "OutOfHostMemoryError",
           "DeviceLostError", "UnsupportedError", "NoDeviceError", "TimeoutError", "DeviceError",
           "VulkanError", "InternalError", "sqrt", "rsqrt", "exp", "log", "sin", "cos", "tan",
           "tanh", "asin", "acos", "abs", "floor", "ceil", "pow", "atan2", "min", "max", "eq", "ne",
           "select", "cast", "Vector", "Matrix", "polar_decompose", "kernel", "func", "array",
           "scalar", "vec", "mat", "static", "ndrange", "max_trip", "atomic_add", "atomic_sub",
           "default_session", "set_default_session", "KernelFunction", "gradcheck", "jacobian",
           "GradcheckError", "GradcheckResult", "profile", "Timeline"]
