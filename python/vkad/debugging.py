"""Debugging differentiable programs (docs/debugging.md): vkad.gradcheck, reverse-mode gradients
against central finite differences, and vkad.jacobian, whole Jacobians of small programs.

    @vkad.kernel
    def f(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
        for i in range(x.shape[0]):
            y[i] = vkad.sin(x[i]) * x[i]

    x = np.linspace(-1, 1, 16, dtype=np.float32)
    r = vkad.gradcheck(f, [x, np.zeros(16, np.float32)])   # raises vkad.GradcheckError if wrong
    print(r)                                               # the worst element per input
    J = vkad.jacobian(f, [x, np.zeros(16, np.float32)])    # (16, 16): dy/dx, output axes first

What is checked. The program runs from the given inputs; its outputs o (a kernel's written
grad arrays, or the arrays a callable returns) are reduced to one scalar objective
L = sum_o <w_o, o> with random weights w (|w| in [0.5, 1.5], random signs, from `seed`), so
every output element counts and no two can cancel by symmetry. Reverse mode gives dL/dx for
every element of every checked input at once (one tape, one backward seeded with w); central
differences give each element's dL/dx_e from forward runs at x_e +- h, every array uploaded
afresh before each run (a kernel that stores into or accumulates into an array starts from the
given value every time).

Precision and tolerances (for one element, h its step):

    D(h) = (L(x + h) - L(x - h)) / (x+h - x-h)     x+-h rounded to the input's dtype, and the
                                                   difference of the rounded values divides
    D(h) = L'(x) + h^2 L'''(x) / 6 + O(h^4)        truncation
    |L computed - L| <= c u S                      S = sum |w_o o| over the output elements
                                                   the perturbation changed; c = 32 roundings
    |D(h) - L'(x)| <= h^2 |L'''| / 6 + R,          R = 2 c u S / (x+h - x-h)

u is the unit roundoff of the program (2^-24 when any float parameter, input or output is f32,
else 2^-53). The step balancing the two terms is h ~ cbrt(u) max(1, |x|) -- 2^-8 max(1, |x|)
in f32, 4.8e-6 max(1, |x|) in f64 -- which is the default (`eps` replaces cbrt(u)). The
truncation term is not guessed: each element is also run at x +- 2h, and since D(2h) - D(h) =
h^2 L''' / 2 + O(h^4), the numeric gradient is Richardson's N = D(h) + (D(h) - D(2h)) / 3,
whose error is O(h^4) plus at most 1.5 R of rounding, and T = |D(2h) - D(h)| / 3 (the term
removed) stays in the tolerance, so that a point near a kink or a branch, where the expansion
fails and differences mean little, is not called wrong. The element passes when

    |analytic - N| <= 2 R + 2 T + rtol |N|,        rtol = 2^14 u

(rtol, 9.8e-4 in f32 and 1.8e-12 in f64, covers the rounding of the reverse-mode gradient
itself). S counts only outputs whose value changed, because the outputs a perturbation does not
reach are bit-identical between the two runs and cancel exactly (summation orders that vary
between runs, such as atomic adds on a GPU, make outputs change, and so count); the differences
are summed in f64 on the host, output by output, so the host adds no rounding of L itself.
Where nothing changed, S is the sum over every output at the given inputs. `atol=` replaces
2 R + 2 T by a fixed number, `rtol=` the third term's factor. Each element costs 4 forward
runs.

f32 kernels are checked in f32 unless `precision="f64"`: a `@vkad.kernel` whose parameters are
f32 is then lowered again with every f32 parameter f64 (its float literals f64 too) and that
kernel is checked in f64, where the device has f64 (`session.capabilities["float64"]`; else the
f32 kernel, `result.precision` saying so). That checks the derivative the kernel's code
defines, not its f32 rounding.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as _np

from ._vkad import DType, Differentiated, Kernel, NdArray
from .builder import KernelBuilder
from .errors import Error, FailedPreconditionError, InvalidArgumentError
from .frontend import ArrayType, KernelFunction, ScalarType, default_session
from . import numpy_dtype  # defined before vkad/__init__.py imports this module

_FLOATS = (DType.f32, DType.f64)
_UNIT = {DType.f32: 2.0 ** -24, DType.f64: 2.0 ** -53}
ROUNDINGS = 32       # c: roundings per output element the rounding term allows
RTOL_ULPS = 2 ** 14  # rtol = RTOL_ULPS * u
MAX_ELEMENTS = 10_000


class GradcheckError(Error, AssertionError):
    """vkad.gradcheck found an element whose reverse-mode gradient and central difference
    differ by more than the tolerance; `result` is the GradcheckResult (every input's worst
    element). An AssertionError too, so a test that calls gradcheck fails as an assert does."""
    code = "gradcheck failed"

    def __init__(self, message: str, result: "GradcheckResult" = None):
        super().__init__(message)
        self.result = result


class InputCheck:
    """One checked input: its gradients by reverse mode (`analytic`) and by central differences
    (`numeric`), the tolerance per element (`tol`), and its worst element: `index` (a tuple; ()
    for a scalar), `analytic_at`, `numeric_at`, `abs_err`, `rel_err`, `tol_at`. `passed`: every
    element within its tolerance (and finite)."""

    def __init__(self, name: str, analytic: _np.ndarray, numeric: _np.ndarray,
                 tol: _np.ndarray, step: _np.ndarray):
        self.name = name
        self.analytic, self.numeric, self.tol, self.step = analytic, numeric, tol, step
        diff = _np.abs(analytic - numeric)
        bad = ~_np.isfinite(diff) | ~_np.isfinite(tol)
        with _np.errstate(divide="ignore", invalid="ignore"):
            ratio = _np.where(diff == 0, 0.0, diff / tol)
        ratio = _np.where(bad, _np.inf, ratio)
        self.elements = int(analytic.size)
        flat = int(_np.argmax(ratio)) if ratio.size else 0
        index = _np.unravel_index(flat, analytic.shape) if analytic.shape else ()
        self.index: Tuple[int, ...] = tuple(int(i) for i in index)
        self.analytic_at = float(analytic[self.index])
        self.numeric_at = float(numeric[self.index])
        self.tol_at = float(tol[self.index])
        self.abs_err = float(diff[self.index])
        scale = abs(self.numeric_at)
        self.rel_err = self.abs_err / scale if scale > 0 else (0.0 if self.abs_err == 0
                                                               else math.inf)
        self.failures = int(_np.count_nonzero(ratio > 1))
        self.passed = self.failures == 0

    def __repr__(self) -> str:
        return (f"<InputCheck {self.name}: {'ok' if self.passed else 'FAILED'}, worst "
                f"{self.index}: {self.analytic_at:.9g} vs {self.numeric_at:.9g}>")


class GradcheckResult:
    """What vkad.gradcheck found: true when every checked element passed. `inputs`: an
    InputCheck per checked input; `outputs`: the names of the outputs the objective sums;
    `precision`: "f32" or "f64"; `runs`: the forward runs made; `note`: why the precision is
    not the one asked for, else ""."""

    def __init__(self, inputs: List[InputCheck], outputs: List[str], precision: str,
                 eps: float, runs: int, note: str = ""):
        self.inputs, self.outputs, self.precision = inputs, outputs, precision
        self.eps, self.runs, self.note = eps, runs, note
        self.passed = all(c.passed for c in inputs)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def worst(self) -> InputCheck:
        """The input whose worst element is furthest past (or nearest to) its tolerance."""
        def key(c):
            if c.abs_err == 0:
                return 0.0
            return c.abs_err / c.tol_at if c.tol_at > 0 else math.inf
        return max(self.inputs, key=key)

    def __str__(self) -> str:
        n = sum(c.elements for c in self.inputs)
        head = (f"gradcheck {'passed' if self.passed else 'FAILED'}: {len(self.inputs)} "
                f"input{'s' * (len(self.inputs) != 1)}, {n} element{'s' * (n != 1)}, "
                f"{self.precision}, step {self.eps:.3g} max(1, |x|), {self.runs} forward runs; "
                f"objective sum <w, o> over {', '.join(self.outputs)}")
        if self.note:
            head += f"\n  ({self.note})"
        rows = [("input", "worst at", "analytic", "numeric", "abs err", "rel err", "tolerance",
                 "")]
        for c in self.inputs:
            rows.append((c.name, str(c.index), f"{c.analytic_at:.9g}", f"{c.numeric_at:.9g}",
                         f"{c.abs_err:.3g}", f"{c.rel_err:.3g}", f"{c.tol_at:.3g}",
                         "ok" if c.passed else f"FAILED ({c.failures} of {c.elements})"))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join([head] + lines)

    def __repr__(self) -> str:
        return f"<GradcheckResult {'passed' if self.passed else 'FAILED'}>"


# --- the program: a differentiated kernel with its arguments, or a callable ---------------------

class _Slot:
    """One input: its key (a parameter name, or a position of the callable's inputs), its value
    (numpy array or number), and, for a device array, the array it is uploaded into."""

    def __init__(self, key, label: str, value, dtype: Optional[DType], array: bool):
        self.key, self.label, self.value, self.dtype, self.array = key, label, value, dtype, array
        self.device: Optional[NdArray] = None


def _host(value, dtype: DType, label: str) -> _np.ndarray:
    if isinstance(value, NdArray):
        value = value.numpy()
    try:
        a = _np.array(value, dtype=numpy_dtype(dtype).type, copy=True)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{label}: {type(value).__name__} is not an array of "
                                   f"{dtype.name}: {e}") from None
    return a.reshape(1) if a.ndim == 0 else a


def _number(value, dtype: DType, label: str):
    if isinstance(value, NdArray):
        value = value.numpy()
    if isinstance(value, _np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if not isinstance(value, (int, float, bool, _np.number, _np.bool_)):
        raise InvalidArgumentError(f"{label} is a {dtype.name} scalar, got "
                                   f"{type(value).__name__}")
    v = value.item() if isinstance(value, (_np.number, _np.bool_)) else value
    if dtype in _FLOATS:
        return float(numpy_dtype(dtype).type(v))
    if isinstance(v, float):
        raise InvalidArgumentError(f"{label} is a {dtype.name} scalar, got the float {v!r}")
    return int(v)


def _round(v: float, dtype: DType) -> float:
    return float(numpy_dtype(dtype).type(v))


_TWINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _f64_twin(kfn: KernelFunction) -> KernelFunction:
    """The @vkad.kernel lowered again with every f32 parameter f64 (and f64 float literals)."""
    twin = _TWINS.get(kfn)
    if twin is None:
        twin = KernelFunction(kfn.fn, DType.f64, kfn.name)
        anns = []
        for a in twin.annotations:
            if isinstance(a, ArrayType) and a.dtype == DType.f32:
                a = ArrayType(DType.f64, a.ndim, a.grad, a.readonly, a.element)
            elif isinstance(a, ScalarType) and a.dtype == DType.f32:
                a = ScalarType(DType.f64, a.grad)
            anns.append(a)
        twin.annotations = anns
        try:
            twin.ir()
        except Error as e:
            raise InvalidArgumentError(
                f"gradcheck(precision='f64'): @vkad.kernel '{kfn.name}' does not lower with its "
                f"f32 parameters made f64 (a cast or annotation in its body names f32?): {e}"
            ) from None
        _TWINS[kfn] = twin
    return twin


class _Program:
    def __init__(self, fn, inputs: Sequence[Any], session, outputs, wrt, precision, what: str):
        if not isinstance(inputs, (list, tuple)):
            raise InvalidArgumentError(f"{what}: inputs is a list of the arguments (numpy "
                                       f"arrays and numbers), got {type(inputs).__name__}")
        self.what = what
        self.note = ""
        if precision not in (None, "f64"):
            raise InvalidArgumentError(f"{what}: precision is None (the kernel as written) or "
                                       f"'f64', got {precision!r}")
        is_kernel = isinstance(fn, (Differentiated, Kernel, KernelFunction, KernelBuilder, str))
        if session is None:
            session = default_session()
        self.session = session
        if session._recording is not None:
            raise FailedPreconditionError(f"{what}: the session is recording on a tape; call it "
                                          "outside `with t:`")
        if is_kernel:
            self._init_kernel(fn, inputs, outputs, wrt, precision)
        elif callable(fn):
            if precision is not None:
                raise InvalidArgumentError(
                    f"{what}: precision='f64' re-lowers a @vkad.kernel; a function's kernels "
                    "run as it launches them (give it f64 arrays for f64 kernels)")
            if outputs is not None:
                raise InvalidArgumentError(f"{what}: outputs= names a kernel's parameters; a "
                                           "function's outputs are the arrays it returns")
            self._init_callable(fn, inputs, wrt)
        else:
            raise InvalidArgumentError(
                f"{what}: {type(fn).__name__} is neither a differentiable kernel (a "
                "vkad.Differentiated, a @vkad.kernel, a KernelBuilder or IR text) nor a function "
                "fn(session, *arrays) returning its output arrays")

    # --- a kernel: every launch argument given, the written grad arrays are the outputs ---
    def _init_kernel(self, fn, inputs, outputs, wrt, precision):
        s, what = self.session, self.what
        if precision == "f64" and not isinstance(fn, KernelFunction):
            raise InvalidArgumentError(
                f"{what}: precision='f64' re-lowers a @vkad.kernel; {type(fn).__name__} "
                "cannot be lowered again (differentiate an f64 version of it yourself)")
        if isinstance(fn, KernelFunction):
            if precision == "f64" and any(a.dtype == DType.f32 for a in fn.annotations):
                if s.capabilities.get("float64"):
                    fn = _f64_twin(fn)
                else:
                    self.note = f"precision='f64' asked for; '{s.device_name}' has no f64"
            d = fn.differentiate(s)
        elif isinstance(fn, (Differentiated, Kernel)):
            d = fn
        else:
            d = s.differentiate(fn)
        fwd = getattr(d, "forward", d)
        if fwd.adjoint is None:
            raise InvalidArgumentError(f"{what}: kernel '{fwd.name}' is not differentiated "
                                       "(s.differentiate(kernel) makes it)")
        self.kernel, self.forward = d, fwd
        params = fwd.params
        if len(inputs) != len(params):
            raise InvalidArgumentError(
                f"{what}: {len(inputs)} inputs given, kernel '{fwd.name}' takes {len(params)} "
                f"(the launch arguments in order): {fwd.signature}")
        arrays, written = set(fwd._array_params), set(fwd._written_params)
        grads = [p for p, _ in fwd.gradients]
        names = [p[0] for p in params]
        self.slots = []
        for i, ((name, dtype, _), v) in enumerate(zip(params, inputs)):
            label = f"{what}: argument {i} ('{name}')"
            if i in arrays:
                slot = _Slot(name, name, _host(v, dtype, label), dtype, True)
                slot.device = s.ndarray(slot.value, name=name)
            else:
                slot = _Slot(name, name, _number(v, dtype, label), dtype, False)
            self.slots.append(slot)

        def index_of(k, kind):
            if isinstance(k, str) and k in names:
                return names.index(k)
            if isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(names):
                return k
            raise InvalidArgumentError(f"{what}: {kind} {k!r} is not a parameter of kernel "
                                       f"'{fwd.name}' ({', '.join(names)})")

        if outputs is None:
            self.outputs = [p for p in grads if p in written]
            if not self.outputs:
                raise InvalidArgumentError(f"{what}: kernel '{fwd.name}' writes no "
                                           "differentiated (grad) array: nothing to check")
        else:
            self.outputs = [index_of(k, "output") for k in _listed(outputs)]
            for p in self.outputs:
                if p not in grads or p not in written:
                    raise InvalidArgumentError(
                        f"{what}: output '{names[p]}' is not a differentiated (grad) array the "
                        f"kernel writes")
        if wrt is None:
            self.wrt = [p for p in grads if p not in written]
            if not self.wrt:
                raise InvalidArgumentError(
                    f"{what}: kernel '{fwd.name}' has no differentiated input it does not also "
                    "write: nothing to check")
        else:
            self.wrt = [index_of(k, "wrt") for k in _listed(wrt)]
            for p in self.wrt:
                if p not in grads:
                    raise InvalidArgumentError(f"{what}: '{names[p]}' is not a differentiated "
                                               "(grad) parameter")
                if p in written:
                    raise InvalidArgumentError(
                        f"{what}: '{names[p]}' is written by the kernel: reverse mode gives the "
                        "gradient of the value stored there, differences that of the value it "
                        "starts with; check it through a function that copies an input into it")
        self.output_labels = [names[p] for p in self.outputs]
        self.dtypes = [sl.dtype for sl in self.slots if sl.dtype in _FLOATS]

    # --- a function fn(session, *args) returning its outputs, launching on a tape ---
    def _init_callable(self, fn, inputs, wrt):
        s, what = self.session, self.what
        self.fn, self.kernel = fn, None
        self.slots = []
        floats = []
        for i, v in enumerate(inputs):
            if isinstance(v, NdArray):
                v = v.numpy()
            if isinstance(v, _np.ndarray) or isinstance(v, (list, tuple)):
                a = _np.array(v, copy=True)
                if a.dtype == _np.float16 or a.dtype.kind not in "fiub":
                    raise InvalidArgumentError(f"{what}: input {i}: numpy dtype {a.dtype} is "
                                               "not one vkad holds")
                a = a.reshape(1) if a.ndim == 0 else a
                from . import as_dtype
                dt = as_dtype(a.dtype)
                slot = _Slot(i, f"input {i}", a, dt, True)
                slot.device = s.ndarray(a, name=f"input{i}", grad=dt in _FLOATS)
                if dt in _FLOATS:
                    floats.append(i)
            else:
                slot = _Slot(i, f"input {i}", v, None, False)
            self.slots.append(slot)
        if wrt is None:
            self.wrt = floats
            if not self.wrt:
                raise InvalidArgumentError(f"{what}: no input is a float array: nothing to "
                                           "check")
        else:
            self.wrt = list(_listed(wrt))
            for k in self.wrt:
                if k not in floats:
                    raise InvalidArgumentError(f"{what}: wrt {k!r} is not the position of a "
                                               "float array among the inputs")
        self.outputs = None
        self.output_labels = None
        self.dtypes = [sl.dtype for sl in self.slots if sl.dtype in _FLOATS]

    # --- running ---
    def run(self, values: Sequence[Any]) -> List[NdArray]:
        """Uploads every array's value and runs the program (recorded when a tape records);
        returns the output arrays."""
        args = []
        for sl, v in zip(self.slots, values):
            if sl.array:
                sl.device.upload(v)
                args.append(sl.device)
            else:
                args.append(v)
        if self.kernel is not None:
            self.session.launch(self.kernel, *args)
            return [args[p] for p in self.outputs]
        outs = self.fn(self.session, *args)
        outs = [outs] if isinstance(outs, NdArray) else list(outs) if isinstance(
            outs, (list, tuple)) else None
        if not outs or not all(isinstance(o, NdArray) and o.dtype in _FLOATS for o in outs):
            raise InvalidArgumentError(f"{self.what}: the function returns its outputs: a "
                                       "float vkad array or a list / tuple of them")
        if self.output_labels is None:
            self.output_labels = [f"output {k}" for k in range(len(outs))]
            self.out_dtypes = [o.dtype for o in outs]
        return outs

    def values(self) -> List[Any]:
        return [sl.value for sl in self.slots]

    @property
    def unit(self) -> float:
        dts = list(self.dtypes) + list(getattr(self, "out_dtypes", []))
        return _UNIT[DType.f32] if DType.f32 in dts else _UNIT[DType.f64]

    def elements(self) -> int:
        return sum(self.slots[j].value.size if self.slots[j].array else 1 for j in self.wrt)

    def taped(self, values):
        """One recorded run: the tape and the output arrays."""
        t = self.session.tape()
        with t:
            outs = self.run(values)
        return t, outs

    def gradient(self, t, j) -> _np.ndarray:
        sl = self.slots[j]
        if sl.array:
            return t.grad(sl.device).numpy().astype(_np.float64)
        return t.grad(self.kernel, sl.key).numpy().astype(_np.float64).reshape(())

    def backward(self, t, outs, seeds):
        try:
            t.backward(seed=dict(zip(outs, seeds)))
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{self.what}: {e} (an output must be a differentiated "
                                       "array a recorded launch writes)") from None


def _listed(x):
    return [x] if isinstance(x, (str, int)) else list(x)


def _check_size(prog: _Program, max_elements: Optional[int], what: str, per: str) -> None:
    cap = MAX_ELEMENTS if max_elements is None else int(max_elements)
    n = prog.elements()
    if n > cap:
        raise InvalidArgumentError(
            f"{what}: {n} input elements to {per} exceed max_elements={cap} (gradcheck and "
            "jacobian are for small programs); pass max_elements= to allow it, or wrt= fewer "
            "inputs")


def gradcheck(fn, inputs: Sequence[Any], *, session=None, outputs=None, wrt=None,
              eps: Optional[float] = None, atol: Optional[float] = None,
              rtol: Optional[float] = None, seed: int = 0, raise_exception: bool = True,
              precision: Optional[str] = None,
              max_elements: Optional[int] = None) -> GradcheckResult:
    """Compares reverse-mode gradients with central finite differences (module docstring: the
    objective, the step and the tolerances).

    fn: a differentiable kernel -- a vkad.Differentiated (or its forward), a @vkad.kernel, a
    KernelBuilder or IR text with grad parameters -- with `inputs` its launch arguments in order
    (numpy arrays, or anything np.array takes, for array parameters; numbers for scalars); or a
    function `fn(session, *args) -> output array(s)` launching kernels on `session`, with
    `inputs` its arguments after the session (numpy arrays become device arrays, float ones with
    a gradient attached; anything else is passed as is). The function is run on a tape for the
    gradients and plainly for the differences.

    Kernels: the outputs are the grad arrays the kernel writes (`outputs=`: names or indices),
    the checked inputs every grad parameter it does not write, f32 / f64 scalars included
    (`wrt=`). Functions: the outputs are the arrays it returns, the checked inputs every float
    array input (`wrt=`: positions). Every array starts from its given value at every run.

    eps: the step relative to max(1, |x|) (default cbrt(u)); atol, rtol: fixed tolerances in
    place of the derived ones; seed: the weights' random seed; precision: None (the kernel as
    written) or "f64" (an f32 @vkad.kernel re-lowered in f64 where the device has f64);
    max_elements: the most input elements to perturb (default 10,000: 4 forward runs each).
    Returns a GradcheckResult (true when every element passed); with raise_exception (the
    default) a failure raises vkad.GradcheckError naming the input, the element and both values.
    """
    what = "gradcheck"
    prog = _Program(fn, inputs, session, outputs, wrt, precision, what)
    _check_size(prog, max_elements, what, "perturb (4 forward runs each)")
    base = prog.values()
    outs = prog.run(base)
    base_out = [o.numpy().astype(_np.float64) for o in outs]
    rng = _np.random.default_rng(seed)
    weights, seeds = [], []
    for o, host in zip(outs, base_out):
        w = rng.uniform(0.5, 1.5, host.shape) * rng.choice([-1.0, 1.0], host.shape)
        w = w.astype(numpy_dtype(o.dtype))  # the seed as the device holds it, the same for both sides
        seeds.append(w)
        weights.append(w.astype(_np.float64))
    u = prog.unit
    step = float(eps) if eps is not None else u ** (1.0 / 3.0)
    if not step > 0:
        raise InvalidArgumentError(f"{what}: eps {eps!r} is not positive")
    whole = float(sum(_np.sum(_np.abs(w * h)) for w, h in zip(weights, base_out)))

    t, touts = prog.taped(base)
    prog.backward(t, touts, seeds)
    analytic = {j: prog.gradient(t, j) for j in prog.wrt}
    del t, touts

    runs = 1
    rt = RTOL_ULPS * u if rtol is None else float(rtol)

    def objective_change(vp, vm):
        nonlocal runs
        op = [o.numpy().astype(_np.float64) for o in prog.run(vp)]
        om = [o.numpy().astype(_np.float64) for o in prog.run(vm)]
        runs += 2
        dL, scale = 0.0, 0.0
        for w, a, b in zip(weights, op, om):
            diff = a - b
            dL += float(_np.sum(w * diff))  # unchanged outputs add exactly 0
            changed = diff != 0
            if changed.any():  # (a NaN difference counts as changed: its tolerance is NaN)
                scale += float(_np.sum(_np.abs(w[changed]) * _np.maximum(_np.abs(a[changed]),
                                                                        _np.abs(b[changed]))))
        return dL, scale

    checks = []
    for j in prog.wrt:
        sl = prog.slots[j]
        shape = sl.value.shape if sl.array else ()
        numeric = _np.zeros(shape)
        tol = _np.zeros(shape)
        steps = _np.zeros(shape)
        dt = sl.dtype
        for e in _np.ndindex(*shape):
            x0 = float(sl.value[e]) if sl.array else float(sl.value)
            h = step * max(1.0, abs(x0))
            d = []
            for m in (1, 2):
                xp, xm = _round(x0 + m * h, dt), _round(x0 - m * h, dt)
                vp, vm = list(base), list(base)
                if sl.array:
                    vp[j] = sl.value.copy()
                    vp[j][e] = xp
                    vm[j] = sl.value.copy()
                    vm[j][e] = xm
                else:
                    vp[j], vm[j] = xp, xm
                dL, scale = objective_change(vp, vm)
                d.append((dL / (xp - xm), scale if scale > 0 else whole, xp - xm))
            (d1, scale, dx), (d2, _, _) = d
            n_e = d1 + (d1 - d2) / 3.0  # Richardson: the h^2 term removed
            numeric[e] = n_e
            steps[e] = h
            if atol is None:
                rounding = 2 * ROUNDINGS * u * scale / dx  # D(h)'s; n_e's is at most 1.5 times
                tol[e] = 2.0 * rounding + 2.0 * abs(d2 - d1) / 3.0 + rt * abs(n_e)
            else:
                tol[e] = float(atol) + rt * abs(n_e)
        checks.append(InputCheck(sl.label, analytic[j].reshape(shape), numeric, tol, steps))

    result = GradcheckResult(checks, prog.output_labels,
                             "f32" if u == _UNIT[DType.f32] else "f64", step, runs, prog.note)
    if not result.passed and raise_exception:
        c = next(c for c in checks if not c.passed)
        raise GradcheckError(
            f"gradcheck: input '{c.name}' element {c.index}: reverse mode gives "
            f"{c.analytic_at:.9g}, central differences {c.numeric_at:.9g} (|difference| "
            f"{c.abs_err:.3g} > tolerance {c.tol_at:.3g}; {c.failures} of {c.elements} elements "
            f"fail)\n{result}", result)
    return result


def jacobian(fn, inputs: Sequence[Any], *, session=None, outputs=None, wrt=None,
             max_elements: Optional[int] = None) -> Union[_np.ndarray, Dict[Tuple[Any, Any],
                                                                             _np.ndarray]]:
    """The Jacobian d(outputs)/d(inputs) of a small program by reverse mode: one recorded run,
    then one backward per output element seeded with a one-hot (other outputs seeded 0).

    fn, inputs, session, outputs, wrt: as vkad.gradcheck. The block for output o and input x
    is a float64 array of shape o.shape + x.shape (a scalar input adds no axis; a rank-0
    parameter, held in shape (1,), keeps its axis of 1): J[k..., e...] = d o[k...] / d x[e...].
    One output and one input: that array; else a dict {(output key, input key): array}, the
    keys a kernel's parameter names, or a function's positions (of its returned arrays and of
    its inputs). max_elements: the most output elements (backwards), default 10,000."""
    what = "jacobian"
    prog = _Program(fn, inputs, session, outputs, wrt, None, what)
    t, outs = prog.taped(prog.values())
    n = sum(int(_np.prod(o.shape)) for o in outs)
    cap = MAX_ELEMENTS if max_elements is None else int(max_elements)
    if n > cap:
        raise InvalidArgumentError(
            f"{what}: {n} output elements (a backward each) exceed max_elements={cap} (jacobian "
            "is for small programs); pass max_elements= to allow it")
    okeys = ([prog.slots[p].key for p in prog.outputs] if prog.kernel is not None
             else list(range(len(outs))))
    result: Dict[Tuple[Any, Any], _np.ndarray] = {}
    for k, o in enumerate(outs):
        oshape = tuple(o.shape)
        blocks = {}
        for j in prog.wrt:
            sl = prog.slots[j]
            blocks[j] = _np.zeros(oshape + (sl.value.shape if sl.array else ()))
        for e in _np.ndindex(*oshape):
            one = _np.zeros(oshape, numpy_dtype(o.dtype))
            one[e] = 1
            prog.backward(t, [o], [one])
            for j in prog.wrt:
                blocks[j][e] = prog.gradient(t, j)
        for j in prog.wrt:
            result[(okeys[k], prog.slots[j].key)] = blocks[j]
    if len(result) == 1:
        return next(iter(result.values()))
    return result


__all__ = ["gradcheck", "jacobian", "GradcheckError", "GradcheckResult", "InputCheck"]


class profile:
    """A timeline of what runs inside the block (docs/debugging.md, "Timeline"):

        with vkad.profile("trace.json") as p:      # session= picks one; default_session()
            train_step()
        print(p.summary())                          # device time per kernel
        # trace.json opens in ui.perfetto.dev or chrome://tracing

    Every launch (forward and adjoint kernels, a replayed graph's launches named by kernel and
    graph), fill, copy and upload in the block is timed on the device with timestamp queries;
    submissions and waits are host spans. Entering waits for the device once (to align the
    clocks). A device without timestamp queries gives host spans only (`timeline.gpu_timestamps`
    is False). A timestamp costs the device about a third of a dependent dispatch, so of a
    graph's replays the first and every `replay_sample`-th after it are timed launch by launch and
    the others as one event each ("replay 'g'"; replay_sample=1 times every replay: a program
    bound by its dispatches then runs ~1.5x slower). After the block, `p.timeline` is the
    vkad.Timeline (events, kernels(), summary(),
    save(path)); `path` (optional) receives its Chrome trace JSON, `print_summary=True` prints
    the summary. Nothing is timed outside such a block."""

    def __init__(self, path=None, session=None, max_events=1_000_000, print_summary=False,
                 replay_sample=16):
        self.path = path
        self._session = session
        self.max_events = int(max_events)
        self.replay_sample = int(replay_sample)
        self.print_summary = print_summary
        self.timeline = None
        self.session = None

    def __enter__(self):
        from .frontend import default_session
        self.session = self._session if self._session is not None else default_session()
        self.session.begin_timeline(self.max_events, self.replay_sample)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            # The block's error is the one to see; the timeline is ended all the same, so the
            # session can record another.
            try:
                self.timeline = self.session.end_timeline()
            except Exception:  # noqa: BLE001 - secondary to the error raised in the block
                pass
            return False
        self.timeline = self.session.end_timeline()
        if self.path is not None:
            self.timeline.save(str(self.path))
        if self.print_summary:
            print(self.timeline.summary())
        return False

    def summary(self):
        """The per-kernel table of the finished timeline."""
        if self.timeline is None:
            raise RuntimeError("vkad.profile: summary() after the with-block ends")
        return self.timeline.summary()

    @property
    def events(self):
        if self.timeline is None:
            raise RuntimeError("vkad.profile: events after the with-block ends")
        return self.timeline.events

