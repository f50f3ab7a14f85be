"""A Pythonic kernel builder that prints vkad's IR text form (ir/text.h).

    kb = vkad.KernelBuilder("saxpy")
    a = kb.scalar("a", vkad.f32)
    x = kb.ndarray("x", vkad.f32, 1, grad=True)
    y = kb.ndarray("y", vkad.f32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        y[i] = a * x[i] + y[i]
    k = session.compile(kb)

Values are typed SSA names; operators and the math functions append statements to the block
being built. A Python number beside a Value becomes a constant of the Value's type. Types are
checked here, at the operator, so a mistake raises TypeError where it is written; everything
else (scoping, parameters, loops) is checked by vkad's verifier when the kernel is compiled,
which names the statement. Locals (`kb.local`) are the only mutable state.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from ._vkad import DType

_FLOATS = (DType.f32, DType.f64)
_INTS = (DType.i32, DType.u32, DType.i64)

Number = Union[int, float, bool]


def _tname(t: DType) -> str:
    return t.name


def _literal(v: Number, t: DType) -> str:
    if t == DType.bool:
        return "true" if v else "false"
    if t in _INTS:
        if isinstance(v, float) and not v.is_integer():
            raise TypeError(f"constant {v!r} is not an integer, but the other operand is {t.name}")
        return str(int(v))
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return repr(f)


class _Block(list):
    """Statements: text lines and nested (header, body, else_body) triples."""


class _Operators:
    """Arithmetic, comparisons and logic, for Values and what reads as one (scalar
    parameters, extents, locals)."""

    __slots__ = ()

    def __bool__(self):
        raise TypeError("a vkad Value has no truth value while the kernel is built: "
                        "use kb.if_(cond) or vkad.select(cond, a, b), and & | ~ for and/or/not")

    __hash__ = object.__hash__

    # arithmetic
    def __add__(self, o): return _arith("add", self, o)
    def __radd__(self, o): return _arith("add", o, self)
    def __sub__(self, o): return _arith("sub", self, o)
    def __rsub__(self, o): return _arith("sub", o, self)
    def __mul__(self, o): return _arith("mul", self, o)
    def __rmul__(self, o): return _arith("mul", o, self)
    def __truediv__(self, o): return _arith("div", self, o)
    def __rtruediv__(self, o): return _arith("div", o, self)
    def __floordiv__(self, o): return _arith("floordiv", self, o)
    def __rfloordiv__(self, o): return _arith("floordiv", o, self)
    def __mod__(self, o): return _arith("mod", self, o)
    def __rmod__(self, o): return _arith("mod", o, self)
    def __pow__(self, o): return _power(self, o)
    def __rpow__(self, o): return _arith("pow", o, self)
    def __neg__(self): return _unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _unary("abs", self)
    # comparisons (bool results)
    def __lt__(self, o): return _binary("lt", self, o, DType.bool)
    def __le__(self, o): return _binary("le", self, o, DType.bool)
    def __gt__(self, o): return _binary("gt", self, o, DType.bool)
    def __ge__(self, o): return _binary("ge", self, o, DType.bool)
    def __eq__(self, o): return _binary("eq", self, o, DType.bool)  # type: ignore[override]
    def __ne__(self, o): return _binary("ne", self, o, DType.bool)  # type: ignore[override]
    # logic on bools
    def __and__(self, o): return _binary("and", self, o)
    def __rand__(self, o): return _binary("and", o, self)
    def __or__(self, o): return _binary("or", self, o)
    def __ror__(self, o): return _binary("or", o, self)
    def __invert__(self): return _unary("not", self)


class Value(_Operators):
    """An SSA value of a kernel being built."""

    __slots__ = ("kb", "id", "dtype")

    def __init__(self, kb: "KernelBuilder", id: int, dtype: DType):
        self.kb, self.id, self.dtype = kb, id, dtype

    def __repr__(self) -> str:
        return f"Value(%{self.id}: {self.dtype.name})"

    def cast(self, dtype: DType) -> "Value":
        return cast(self, dtype)


class Scalar(_Operators):
    """A scalar parameter: a task bound, or a Value (an `arg` statement) where it is used."""

    def __init__(self, kb: "KernelBuilder", name: str, dtype: DType):
        self.kb, self.name, self.dtype = kb, name, dtype

    @property
    def value(self) -> Value:
        return self.kb._emit(f"arg {self.name}", self.dtype)

    def _bound(self) -> str:
        return self.name


class Dim(_Operators):
    """Extent `dim` of an ndarray parameter: a task bound, or an i32 Value inside a body."""

    def __init__(self, array: "Array", dim: int):
        self.array, self.dim = array, dim

    @property
    def value(self) -> Value:
        return self.array.kb._emit(f"shape {self.array.name} {self.dim}", DType.i32)

    def _bound(self) -> str:
        return f"shape({self.array.name}, {self.dim})"


class _Shape:
    def __init__(self, array: "Array"):
        self.array = array

    def __getitem__(self, d: int) -> Dim:
        if not 0 <= d < self.array.rank:
            raise IndexError(f"ndarray '{self.array.name}' has rank {self.array.rank}, no dim {d}")
        return Dim(self.array, d)

    def __len__(self) -> int:
        return self.array.rank


class Array:
    """An ndarray parameter: `x[i, j]` loads, `x[i, j] = v` stores, `x.atomic_add((i,), v)`.

    With `element` (kb.ndarray(..., element=(2,)) or (2, 2)), the trailing axes hold each
    element's components: `x[t, p]` on a (T, P, 2) array loads a Vector, `F[t, p]` on a
    (T, P, 2, 2) one a Matrix, and stores and atomic_add take one; `x[t, p, 0]` is still the
    scalar and `F[t, p, 1]` row 1. A rank-0 array (`kb.ndarray("loss", f32, 0)`) is one scalar,
    held on the device in a shape (1,) array (vkad arrays have rank 1 to 8): `loss[None]` (or
    `loss[()]`) is that scalar, Taichi's spelling."""

    def __init__(self, kb: "KernelBuilder", name: str, dtype: DType, rank: int,
                 element: Tuple[int, ...] = ()):
        self.kb, self.name, self.dtype = kb, name, dtype
        self.index_rank = rank  # indices that pick an element
        self.element = element  # the shape of an element's components (trailing axes)
        # the device array's axes (what x.shape counts): a scalar rank-0 array has one
        self.rank = (rank + len(element)) or 1
        self.shape = _Shape(self)

    def _where(self) -> str:
        return f"ndarray '{self.name}'"

    def _resolve(self, idx) -> Tuple[List[str], Tuple[int, ...]]:
        """The index operands (`%id` strings) of `x[idx]`, and the component shape it leaves."""
        if idx is None:
            idx = ()
        idx = idx if isinstance(idx, tuple) else (idx,)
        flat = []
        for i in idx:  # a Vector of integers indexes as its components (grid[base + offset])
            flat.extend(i.flat if _is_tensor(i) else (i,))
        n, lo, hi = len(flat), self.index_rank, self.index_rank + len(self.element)
        if not lo <= n <= hi:
            if not self.element and self.index_rank:
                raise IndexError(f"ndarray '{self.name}' has rank {self.rank}, indexed with {n}")
            if not self.element:
                raise IndexError(f"ndarray '{self.name}' has rank 0 (one scalar): index it "
                                 f"as {self.name}[None], got {n} indices")
            raise IndexError(f"ndarray '{self.name}' takes {lo} indices (then up to "
                             f"{len(self.element)} component indices; its elements are "
                             f"{'x'.join(map(str, self.element))}), indexed with {n}")
        ops = [f"%{self.kb._as_value(i, DType.i32).id}" for i in flat]
        if not self.index_rank and not self.element:
            ops = [f"%{self.kb.i32(0).id}"]  # the rank-0 scalar lives at [0]
        return ops, self.element[n - lo:]

    def _at(self, ops: List[str], comp: Tuple[int, ...]) -> str:
        return ", ".join(ops + [f"%{self.kb.i32(c).id}" for c in comp])

    def __getitem__(self, idx):
        ops, tail = self._resolve(idx)
        if not tail:
            return self.kb._emit(f"load {self.name}[{self._at(ops, ())}]", self.dtype)
        flat = [self.kb._emit(f"load {self.name}[{self._at(ops, c)}]", self.dtype)
                for c in _components(tail)]
        return _Tensor._make(tail, flat, self.dtype)

    def _write(self, op: str, idx, v) -> None:
        ops, tail = self._resolve(idx)
        what = f"{op} into '{self.name}'"
        if not tail:
            if _is_tensor(v):
                raise TypeError(f"{what}: the element is a scalar, got a {v!r}")
            v = self.kb._as_value(v, self.dtype)
            _same(self.dtype, v.dtype, what)
            self.kb._line(f"{op} {self.name}[{self._at(ops, ())}], %{v.id}")
            return
        if not isinstance(v, _Tensor) or v.shape != tail:
            shape = _shape_name(tail)
            got = repr(v) if isinstance(v, _Tensor) else type(v).__name__
            raise TypeError(f"{what}: the element is a {shape} {tail}, got {got}")
        if v.dtype is not None:
            _same(self.dtype, v.dtype, what)
        for c, comp in zip(_components(tail), v.flat):
            val = self.kb._as_value(comp, self.dtype)
            self.kb._line(f"{op} {self.name}[{self._at(ops, c)}], %{val.id}")

    def __setitem__(self, idx, v) -> None:
        self._write("store", idx, v)

    def atomic_add(self, idx, v) -> None:
        """x[idx] += v atomically (a Vector / Matrix componentwise)."""
        self._write("atomic_add", idx, v)


def _is_tensor(v) -> bool:
    return isinstance(v, _Tensor)


def _components(shape: Tuple[int, ...]) -> List[Tuple[int, ...]]:
    """Row-major component indices of an element shape: (2,) -> (0,), (1,)."""
    out: List[Tuple[int, ...]] = [()]
    for e in shape:
        out = [c + (k,) for c in out for k in range(e)]
    return out


class Local(_Operators):
    """A mutable local: `.value` (or load()/store()), and `+=`, `-=`, `*=`."""

    def __init__(self, kb: "KernelBuilder", id: int, dtype: DType):
        self.kb, self.id, self.dtype = kb, id, dtype

    def load(self) -> Value:
        return self.kb._emit(f"load_local %{self.id}", self.dtype)

    def store(self, v) -> None:
        v = self.kb._as_value(v, self.dtype)
        _same(self.dtype, v.dtype, "store into a local")
        self.kb._line(f"store_local %{self.id}, %{v.id}")

    value = property(load, store)

    def __iadd__(self, v): self.store(self.load() + v); return self
    def __isub__(self, v): self.store(self.load() - v); return self
    def __imul__(self, v): self.store(self.load() * v); return self


def _same(a: DType, b: DType, what: str) -> None:
    if a != b:
        raise TypeError(f"{what}: types {a.name} and {b.name} differ "
                        "(cast explicitly with vkad.cast)")


def _builder_of(*vs) -> "KernelBuilder":
    for v in vs:
        if isinstance(v, Value):
            return v.kb
        if isinstance(v, (Scalar, Local)):
            return v.kb
        if isinstance(v, Dim):
            return v.array.kb
    raise TypeError("vkad math needs at least one kernel Value operand")


def _type_of(v) -> Optional[DType]:
    """The type of a kernel operand; None for a Python number (it takes the other's type)."""
    if isinstance(v, (Value, Scalar, Local)):
        return v.dtype
    return DType.i32 if isinstance(v, Dim) else None


def _binary(op: str, a, b, result: Optional[DType] = None) -> Value:
    kb = _builder_of(a, b)
    t = _type_of(a) or _type_of(b)
    va, vb = kb._as_value(a, t), kb._as_value(b, t)
    _same(va.dtype, vb.dtype, op)
    return kb._emit(f"{op} %{va.id}, %{vb.id}", result or va.dtype)


def _arith(op: str, a, b):
    """An operator's binary op; NotImplemented for a Vector / Matrix operand, so that Python
    asks the tensor's reflected operator (2.0 * v with a Value on the left works too)."""
    if _is_tensor(a) or _is_tensor(b):
        return NotImplemented
    return _binary(op, a, b)


def _power(a, n):
    """a ** n. A Python int exponent is unrolled into multiplications (by squaring), as Taichi
    does, so that `(x - 1) ** 2` is exact and defined for a negative base (the IR's `pow` is
    GLSL's: undefined on a device for a base below 0, NaN in f64); a negative int exponent is
    1 / a ** -n (floats only). Any other exponent is the IR's `pow`."""
    if _is_tensor(n):
        return NotImplemented
    if isinstance(n, bool) or not isinstance(n, int):
        return _binary("pow", a, n)
    kb = _builder_of(a)
    base = kb._as_value(a, None)  # a parameter or local is read once
    if n < 0:
        if base.dtype not in _FLOATS:
            raise TypeError(f"pow: negative exponent {n} of an integer ({base.dtype.name})")
        return 1.0 / _power(base, -n)
    if n == 0:
        return kb.constant(1, base.dtype)
    result = None
    while True:
        if n & 1:
            result = base if result is None else result * base
        n >>= 1
        if not n:
            return result
        base = base * base


def _unary(op: str, a) -> Value:
    kb = _builder_of(a)
    va = kb._as_value(a, None)
    return kb._emit(f"{op} %{va.id}", va.dtype)


# Math functions (float operands; abs, min, max also on integers).
def sqrt(a): return _unary("sqrt", a)
def rsqrt(a): return _unary("rsqrt", a)
def exp(a): return _unary("exp", a)
def log(a): return _unary("log", a)
def sin(a): return _unary("sin", a)
def cos(a): return _unary("cos", a)
def tan(a): return _unary("tan", a)
def tanh(a): return _unary("tanh", a)
def asin(a): return _unary("asin", a)
def acos(a): return _unary("acos", a)
def abs(a): return _unary("abs", a)  # noqa: A001
def floor(a): return _unary("floor", a)
def ceil(a): return _unary("ceil", a)
def pow(a, b): return _binary("pow", a, b)  # noqa: A001 - mirrors the IR's name
def atan2(a, b): return _binary("atan2", a, b)
def min(a, b): return _binary("min", a, b)  # noqa: A001
def max(a, b): return _binary("max", a, b)  # noqa: A001
def eq(a, b): return _binary("eq", a, b, DType.bool)
def ne(a, b): return _binary("ne", a, b, DType.bool)


def select(c, a, b):
    """c ? a : b (both branches are evaluated); componentwise for Vector / Matrix operands."""
    if _is_tensor(a) or _is_tensor(b):
        return _select_tensor(c, a, b)
    kb = _builder_of(c, a, b)
    t = _type_of(a) or _type_of(b)
    vc, va, vb = kb._as_value(c, DType.bool), kb._as_value(a, t), kb._as_value(b, t)
    _same(va.dtype, vb.dtype, "select")
    return kb._emit(f"select %{vc.id}, %{va.id}, %{vb.id}", va.dtype)


def cast(a, dtype: DType) -> Value:
    kb = _builder_of(a)
    va = kb._as_value(a, None)
    return kb._emit(f"cast %{va.id}", dtype)


# The IR ops this builder writes, by their text form (ir/ops.def). tests/unit/op_table_test.cpp
# holds this list against the table: every name here is an op there, and every op there is
# here or named in that test as one the Python builder does not offer. _emit and _line write
# no other.
IR_OPS = frozenset({
    "const", "arg", "shape",
    "neg", "not", "sqrt", "rsqrt", "exp", "log", "sin", "cos", "tan", "tanh", "asin", "acos",
    "abs", "floor", "ceil",
    "add", "sub", "mul", "div", "mod", "floordiv", "min", "max", "pow", "atan2", "and", "or",
    "lt", "le", "gt", "ge", "eq", "ne",
    "select", "cast",
    "alloca", "load_local", "store_local",
    "load", "store", "atomic_add",
    "for", "if", "while", "break", "continue",
    "print", "assert",
})


def location_text(where: str) -> str:
    """A source location as the IR carries it (ir/ir.h, intern_source_location: no double
    quote, backslash or line break)."""
    clean = str(where).replace('"', "'").replace("\\", "'")
    return clean.replace("\n", " ").replace("\r", " ")


class KernelBuilder:
    """Builds one kernel; `finish()` (or Session.compile(kb)) takes its IR text."""

    def __init__(self, name: str):
        self.name = name
        self._params: List[str] = []
        # Per parameter, its element shape (the trailing extents a launch's array must have):
        # () for scalars and scalar elements. Session.compile hands it to the kernel.
        self._elements: List[Tuple[int, ...]] = []
        self._tasks: List[Tuple[str, _Block]] = []
        self._stack: List[_Block] = []
        self._next = 0
        self._last_if: Optional[list] = None
        self._loops = 0  # for_range / while_ blocks open (where break_ / continue_ may stand)
        self._at = ""  # the statements' source location suffix (set_location)

    def set_location(self, where: str) -> None:
        """Where the statements built from now on came from ("sim.py:12:5"; "" for none). The
        IR carries it (ir/text.h: `@"..."`), so vkad's errors about them -- at compile time
        and on the device, in their adjoints too -- name it."""
        clean = location_text(where)
        self._at = f' @"{clean}"' if clean else ""

    # --- parameters ---
    def scalar(self, name: str, dtype: DType, grad: bool = False) -> Scalar:
        """A scalar parameter. `grad` (f32 / f64) differentiates it: the adjoint takes its
        gradient as a 1-element array, and a tape gives it as t.grad(kernel, name)."""
        self._params.append(f"{name}: {_tname(dtype)}" + (" grad" if grad else ""))
        self._elements.append(())
        return Scalar(self, name, dtype)

    def ndarray(self, name: str, dtype: DType, rank: int, grad: bool = False,
                readonly: bool = False, element: Tuple[int, ...] = ()) -> Array:
        """An ndarray parameter indexed by `rank` indices. `element` = (n,) or (n, m) makes
        each element a Vector / Matrix held in trailing axes of those extents (the device array
        then has rank + len(element) axes: x of shape (T, P, 2) is rank 2, element (2,)).
        rank 0 without element is one scalar, held in a shape (1,) array (`x[None]`).
        A launch checks the element's extents: an array whose trailing axes differ from
        `element` (a (4, 3) array for element=(2,)) is refused with InvalidArgumentError."""
        element = tuple(element)
        if len(element) > 2 or not all(isinstance(e, int) and e >= 1 for e in element):
            raise TypeError(f"ndarray '{name}': element is () (scalars), (n,) (vectors) or "
                            f"(n, m) (matrices) with positive int extents, got {element!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise TypeError(f"ndarray '{name}': rank is an int >= 0, got {rank!r}")
        flags = (" grad" if grad else "") + (" readonly" if readonly else "")
        array = Array(self, name, dtype, rank, element)
        self._params.append(f"{name}: ndarray<{_tname(dtype)}, {array.rank}>{flags}")
        self._elements.append(element)
        return array

    # --- tasks and control flow (context managers yielding the index) ---
    @contextmanager
    def parallel_for(self, name: str, begin, end, local_size: int = 0) -> Iterator[Value]:
        """A parallel task over [begin, end): ints, scalar parameters or x.shape[d]."""
        with self._task(name, "parallel", begin, end, local_size) as i:
            yield i

    @contextmanager
    def parallel_for_nd(self, name: str, *ranges: Tuple) -> Iterator[Tuple[Value, ...]]:
        """A parallel task over a 2-d or 3-d box, Taichi's `for i, j in ti.ndrange(n, m)`:
        `with kb.parallel_for_nd("grid", (0, n), (0, m)) as (i, j):`, the last index fastest.
        A range is (begin, end) (ints, scalar parameters or x.shape[d]) or an end alone."""
        if not 2 <= len(ranges) <= 3:
            raise TypeError(f"task '{name}': parallel_for_nd takes 2 or 3 ranges, got "
                            f"{len(ranges)} (one range: parallel_for)")
        if self._stack:
            raise RuntimeError(f"task '{name}': tasks cannot nest; use for_range inside a task")
        dims = []
        for r in ranges:
            begin, end = r if isinstance(r, tuple) and len(r) == 2 else (0, r)
            dims.append((self._fresh(), self._bound(begin), self._bound(end)))
        head = f"task {name} parallel " + ", ".join(f"%{i} in [{b}, {e})" for i, b, e in dims)
        body = _Block()
        self._tasks.append((head, body))
        self._stack.append(body)
        try:
            yield tuple(Value(self, i, DType.i32) for i, _, _ in dims)
        finally:
            self._stack.pop()

    @contextmanager
    def serial_for(self, name: str, begin, end) -> Iterator[Value]:
        """A serial task: one invocation runs [begin, end) in order."""
        with self._task(name, "serial", begin, end, 0) as i:
            yield i

    @contextmanager
    def _task(self, name, kind, begin, end, local_size):
        if self._stack:
            raise RuntimeError(f"task '{name}': tasks cannot nest; use for_range inside a task")
        index = self._fresh()
        head = f"task {name} {kind} %{index} in [{self._bound(begin)}, {self._bound(end)})"
        if local_size:
            head += f" local_size {local_size}"
        body = _Block()
        self._tasks.append((head, body))
        self._stack.append(body)
        try:
            yield Value(self, index, DType.i32)
        finally:
            self._stack.pop()

    @contextmanager
    def for_range(self, begin, end, max_trip: Optional[int] = None) -> Iterator[Value]:
        """A serial loop inside a body over [begin, end) (i32). `max_trip` states the loop's
        maximum trip count for reverse mode when the bounds depend on ndarray contents."""
        b, e = self._as_value(begin, DType.i32), self._as_value(end, DType.i32)
        index = self._fresh()
        head = f"for %{index} in [%{b.id}, %{e.id})"
        if max_trip is not None:
            head += f" max_trip({int(max_trip)})"
        head += self._at
        body = _Block()
        self._cur().append([head, body, None])
        self._stack.append(body)
        self._loops += 1
        try:
            yield Value(self, index, DType.i32)
        finally:
            self._loops -= 1
            self._stack.pop()

    @contextmanager
    def while_(self, cond: Callable[[], Any], max_trip: Optional[int] = None) -> Iterator[Value]:
        """A loop inside a body while `cond()` holds: `cond` is called once, now, to build the
        test (a bool Value, evaluated before every trip); the `with` block is the loop's body,
        and yields the trip index (i32). Reverse mode needs `max_trip`, the most trips any
        invocation makes, unless it can bound them itself:

            with kb.while_(lambda: v.load() * v.load() > 0.01, max_trip=64):
                v.store(v.load() * 0.5)
        """
        index = self._fresh()
        test = _Block()
        self._stack.append(test)
        try:
            c = self._as_value(cond(), DType.bool)
        finally:
            self._stack.pop()
        if c.dtype != DType.bool:
            raise TypeError(f"while_: the condition is a bool Value, got {c.dtype.name}")
        head = f"while %{index} (%{c.id})"
        if max_trip is not None:
            head += f" max_trip({int(max_trip)})"
        head += self._at
        body = _Block()
        self._cur().append([head, test, None, body])
        self._stack.append(body)
        self._loops += 1
        try:
            yield Value(self, index, DType.i32)
        finally:
            self._loops -= 1
            self._stack.pop()

    def break_(self) -> None:
        """Leaves the innermost for_range / while_ loop."""
        self._jump("break")

    def continue_(self) -> None:
        """Starts the innermost for_range / while_ loop's next trip."""
        self._jump("continue")

    def print_(self, format: str, *values) -> None:
        """Prints a line when the launch retires: `format` with each `{}` replaced by the next
        value (values left over follow it), after `[kernel 'k', task 't', thread (i)] `.
        Values are kernel Values (or numbers); at most 16. Where the lines go:
        Session.set_print_sink (default: stdout). docs/debugging.md."""
        self._debug_line("print", format, [self._as_value(v, None) for v in values])

    def assert_(self, cond, message: str, *values) -> None:
        """Where `cond` (a bool Value) is false the launch raises vkad.DeviceError at the next
        synchronize or download, naming `message`, the statement (and its Python line), the
        first failing invocation's index and `values` (at most 16)."""
        c = self._as_value(cond, DType.bool)
        if c.dtype != DType.bool:
            raise TypeError(f"assert_: the condition is a bool Value, got {c.dtype.name}")
        self._debug_line("assert", message, [c] + [self._as_value(v, None) for v in values])

    def _debug_line(self, op: str, text: str, values: list) -> None:
        if len(values) > 16 + (op == "assert"):
            raise ValueError(f"{op}: at most 16 values, got {len(values) - (op == 'assert')}")
        text = location_text(text)
        self._line(f'{op} "{text}"' + "".join(f", %{v.id}" for v in values))

    def _jump(self, op: str) -> None:
        if not self._loops:
            raise RuntimeError(f"{op}_() belongs inside a for_range or while_ loop")
        self._line(op)

    @contextmanager
    def if_(self, cond) -> Iterator[None]:
        c = self._as_value(cond, DType.bool)
        body = _Block()
        node = [f"if %{c.id}{self._at}", body, None]
        self._cur().append(node)
        self._stack.append(body)
        try:
            yield
        finally:
            self._stack.pop()
        self._last_if = node

    @contextmanager
    def else_(self) -> Iterator[None]:
        """The else branch of the `if_` just closed (it must come right after it)."""
        node = self._last_if
        cur = self._cur()
        if node is None or not cur or cur[-1] is not node:
            raise RuntimeError("else_() must directly follow a `with kb.if_(...)` block")
        body = _Block()
        node[2] = body
        self._stack.append(body)
        try:
            yield
        finally:
            self._stack.pop()
        self._last_if = None

    # --- values ---
    def local(self, init):
        """A mutable local: of a dtype (starts at zero), or initialised with a Value, or a
        Vector / Matrix local (one local per component) initialised with one."""
        if _is_tensor(init):
            return _make_local(self, init)
        if isinstance(init, DType):
            return Local(self, self._emit("alloca", init).id, init)
        v = self._as_value(init, None)
        loc = Local(self, self._emit("alloca", v.dtype).id, v.dtype)
        loc.store(v)
        return loc

    def constant(self, value: Number, dtype: DType) -> Value:
        return self._emit(f"const {_literal(value, dtype)}", dtype)

    def f32(self, v: float) -> Value: return self.constant(v, DType.f32)
    def f64(self, v: float) -> Value: return self.constant(v, DType.f64)
    def i32(self, v: int) -> Value: return self.constant(v, DType.i32)
    def u32(self, v: int) -> Value: return self.constant(v, DType.u32)

    def finish(self) -> str:
        """The kernel's IR text (ir/text.h)."""
        if self._stack:
            raise RuntimeError(f"kernel '{self.name}': finish() inside an open block")
        out = [f"kernel {self.name}({', '.join(self._params)}) {{"]
        for head, body in self._tasks:
            out.append(f"  {head} {{")
            self._print(body, 2, out)
            out.append("  }")
        out.append("}")
        return "\n".join(out) + "\n"

    text = finish

    # --- internals ---
    def _print(self, block: _Block, depth: int, out: List[str]) -> None:
        pad = "  " * depth
        for s in block:
            if isinstance(s, str):
                out.append(pad + s)
                continue
            head, body, orelse = s[:3]
            out.append(f"{pad}{head} {{")
            self._print(body, depth + 1, out)
            if len(s) == 4:  # while_: the test block, then `do` the body
                out.append(f"{pad}}} do {{")
                self._print(s[3], depth + 1, out)
            if orelse:
                out.append(f"{pad}}} else {{")
                self._print(orelse, depth + 1, out)
            out.append(pad + "}")

    def _fresh(self) -> int:
        self._next += 1
        return self._next - 1

    def _cur(self) -> _Block:
        if not self._stack:
            raise RuntimeError(f"kernel '{self.name}': statements belong inside "
                               "`with kb.parallel_for(...)` or `with kb.serial_for(...)`")
        return self._stack[-1]

    def _line(self, text: str) -> None:
        assert text.split(" ", 1)[0] in IR_OPS, text
        self._cur().append(text + self._at)

    def _emit(self, text: str, dtype: DType) -> Value:
        assert text.split(" ", 1)[0] in IR_OPS, text
        block = self._cur()
        id = self._fresh()
        block.append(f"%{id} = {text} : {_tname(dtype)}{self._at}")
        return Value(self, id, dtype)

    def _as_value(self, v, dtype: Optional[DType]) -> Value:
        if isinstance(v, Value):
            if v.kb is not self:
                raise ValueError("a Value of another KernelBuilder")
            return v
        if isinstance(v, (Scalar, Dim)):
            return v.value
        if isinstance(v, Local):
            return v.load()
        if isinstance(v, bool):
            return self.constant(v, DType.bool)
        if isinstance(v, (int, float)):
            if dtype is None:
                dtype = DType.i32 if isinstance(v, int) else DType.f32
            return self.constant(v, dtype)
        raise TypeError(f"expected a kernel Value or a number, got {type(v).__name__}")

    def _bound(self, b) -> str:
        if isinstance(b, bool) or not isinstance(b, (int, Scalar, Dim)):
            raise TypeError("a task bound is an int, a scalar parameter or x.shape[d], "
                            f"got {type(b).__name__}")
        return str(b) if isinstance(b, int) else b._bound()


# Vectors and matrices build on the scalar Values above (imported last: matrix imports this
# module); Array, select and local accept them.
from .matrix import (_Tensor, _shape_name, make_local as _make_local,  # noqa: E402
                     select_tensor as _select_tensor)

__all__ = ["KernelBuilder", "Value", "Scalar", "Array", "Dim", "Local", "sqrt", "rsqrt", "exp",
           "log", "sin", "cos", "tan", "tanh", "asin", "acos", "abs", "floor", "ceil", "pow",
           "atan2", "min", "max", "eq", "ne", "select", "cast"]
