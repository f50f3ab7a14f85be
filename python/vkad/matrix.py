"""Small vectors and matrices in the kernel builder, like Taichi's ti.Vector / ti.Matrix.

    x = kb.ndarray("x", vkad.f32, 2, element=(2,))       # shape (T, P, 2): a 2-vector per (t, p)
    F = kb.ndarray("F", vkad.f32, 2, element=(2, 2))     # shape (T, P, 2, 2)
    with kb.parallel_for("p", 0, x.shape[1]) as p:
        R, S = vkad.polar_decompose(F[t, p])             # Matrix values
        x[t + 1, p] = x[t, p] + dt * (R @ vkad.Vector([0.0, 1.0]))

A Vector or Matrix is a fixed-size tuple of scalar components, each a Value (or a Python number,
which takes the type of the Value it meets, as everywhere in the builder). Every operation is
unrolled while the kernel is built into scalar IR statements, so the IR, the verifier and
reverse mode see only scalars: a matrix product is n*m*k multiplies, nothing more. Values are
immutable like every Value: a new vector replaces an old one (`v = v + dv`); what changes at
run time under `kb.if_` goes through `vkad.select(c, a, b)` or a local (`kb.local(v)`).

Shapes and dtypes are checked at the operator: `Vector(2) + Vector(3)` raises TypeError naming
both shapes. Sizes are compile-time Python ints; determinant and inverse need a square matrix of
size 1, 2 or 3, polar_decompose a 2x2 one (diffmpm's 2D elastic model).
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from . import builder as _b
from ._vkad import DType

_KERNEL = (_b.Value, _b.Scalar, _b.Local, _b.Dim)


def _component(c, where: str):
    """A component as stored: a Value (parameters and locals are read now) or a number."""
    if isinstance(c, _b.Value):
        return c
    if isinstance(c, (_b.Scalar, _b.Dim)):
        return c.value
    if isinstance(c, _b.Local):
        return c.load()
    if isinstance(c, bool) or not isinstance(c, (int, float)):
        raise TypeError(f"{where}: a component is a kernel Value or a number, "
                        f"got {type(c).__name__}")
    return c


def _dtype_of(flat, declared: Optional[DType], where: str) -> Optional[DType]:
    t = declared
    for c in flat:
        if isinstance(c, _b.Value):
            if t is None:
                t = c.dtype
            elif c.dtype != t:
                raise TypeError(f"{where}: components of types {t.name} and {c.dtype.name} "
                                "(cast explicitly with vkad.cast)")
    return t


def _merge(a: Optional[DType], b: Optional[DType], what: str) -> Optional[DType]:
    if a is not None and b is not None and a != b:
        raise TypeError(f"{what}: types {a.name} and {b.name} differ "
                        "(cast explicitly with vkad.cast or .cast())")
    return a if a is not None else b


def _is_scalar(o) -> bool:
    return isinstance(o, _KERNEL) or (isinstance(o, (int, float)) and not isinstance(o, bool))


def _scalar_dtype(o) -> Optional[DType]:
    return _b._type_of(o)


def _sqrt(x):
    return math.sqrt(x) if isinstance(x, (int, float)) else _b.sqrt(x)


def _shape_name(shape: Tuple[int, ...]) -> str:
    if len(shape) == 1:
        return f"{shape[0]}-vector"
    return f"{shape[0]}x{shape[1]} matrix"


class _Tensor:
    """A Vector or a Matrix: `shape` and row-major components `flat`."""

    __slots__ = ("shape", "flat", "dtype")
    __array_ufunc__ = None  # numpy operands on the left defer to our reflected operators

    def __init__(self, shape: Tuple[int, ...], flat: Sequence, dtype: Optional[DType] = None,
                 where: str = "vector"):
        self.shape = shape
        self.flat = tuple(_component(c, where) for c in flat)
        self.dtype = _dtype_of(self.flat, dtype, where)

    # --- construction helpers ---
    @staticmethod
    def _make(shape: Tuple[int, ...], flat: Sequence, dtype: Optional[DType]) -> "_Tensor":
        if len(shape) == 1:
            return Vector(flat, dtype)
        return Matrix._from_flat(shape, flat, dtype)

    def __repr__(self) -> str:
        t = self.dtype.name if self.dtype is not None else "untyped"
        return f"{type(self).__name__}({_shape_name(self.shape)}, {t})"

    def __bool__(self):
        raise TypeError(f"a {_shape_name(self.shape)} has no truth value while the kernel is "
                        "built: compare components and use kb.if_ or vkad.select")

    __hash__ = object.__hash__

    # --- elementwise arithmetic (a scalar broadcasts) ---
    def _elementwise(self, o, op: str, fn, reflected: bool = False) -> "_Tensor":
        if isinstance(o, _Tensor):
            if o.shape != self.shape:
                a, b = (o, self) if reflected else (self, o)
                raise TypeError(f"{op}: shapes {_shape_name(a.shape)} {a.shape} and "
                                f"{_shape_name(b.shape)} {b.shape} differ")
            t = _merge(self.dtype, o.dtype, op)
            other = o.flat
        elif _is_scalar(o):
            t = _merge(self.dtype, _scalar_dtype(o), op)
            other = (_component(o, op),) * len(self.flat)  # a parameter is read once
        else:
            return NotImplemented
        if reflected:
            flat = [fn(b, a) for a, b in zip(self.flat, other)]
        else:
            flat = [fn(a, b) for a, b in zip(self.flat, other)]
        return self._make(self.shape, flat, t)

    def __add__(self, o): return self._elementwise(o, "add", lambda a, b: a + b)
    def __radd__(self, o): return self._elementwise(o, "add", lambda a, b: a + b, True)
    def __sub__(self, o): return self._elementwise(o, "sub", lambda a, b: a - b)
    def __rsub__(self, o): return self._elementwise(o, "sub", lambda a, b: a - b, True)
    def __mul__(self, o): return self._elementwise(o, "mul", lambda a, b: a * b)
    def __rmul__(self, o): return self._elementwise(o, "mul", lambda a, b: a * b, True)
    def __truediv__(self, o): return self._elementwise(o, "div", lambda a, b: a / b)
    def __rtruediv__(self, o): return self._elementwise(o, "div", lambda a, b: a / b, True)

    def __pow__(self, o):  # an int exponent multiplies (Value.__pow__): defined for c < 0
        return self._elementwise(o, "pow", lambda a, b: a ** b)

    def __rpow__(self, o): return self._elementwise(o, "pow", lambda a, b: a ** b, True)

    def __neg__(self): return self._make(self.shape, [-c for c in self.flat], self.dtype)
    def __pos__(self): return self

    def map(self, fn) -> "_Tensor":
        """fn applied to every component (e.g. `v.map(vkad.tanh)`)."""
        return self._make(self.shape, [fn(c) for c in self.flat], self.dtype)

    def cast(self, dtype: DType) -> "_Tensor":
        """Every Value component cast to dtype; numbers stay numbers, typed dtype."""
        flat = [_b.cast(c, dtype) if isinstance(c, _b.Value) else c for c in self.flat]
        return self._make(self.shape, flat, dtype)

    def sum(self):
        acc = self.flat[0]
        for c in self.flat[1:]:
            acc = acc + c
        return acc

    def norm_sqr(self):
        """Sum of squared components (squared Frobenius norm of a matrix)."""
        acc = self.flat[0] * self.flat[0]
        for c in self.flat[1:]:
            acc = acc + c * c
        return acc

    def norm(self, eps: float = 0.0):
        """sqrt(norm_sqr() + eps), Taichi's norm: eps > 0 keeps the gradient finite at 0."""
        s = self.norm_sqr()
        return _sqrt(s + eps if eps else s)

    def __matmul__(self, o): return _matmul(self, o)
    def __rmatmul__(self, o): return _matmul(o, self)


class Vector(_Tensor):
    """n components: `Vector([a, b])`, `v[0]`, `x, y = v`, `v.dot(w)`, `v.norm()`."""

    __slots__ = ()

    def __init__(self, components: Iterable, dtype: Optional[DType] = None):
        flat = list(components)
        if not flat:
            raise TypeError("Vector: needs at least one component")
        super().__init__((len(flat),), flat, dtype, "Vector")

    @staticmethod
    def zero(n, dtype: Optional[DType] = None) -> "Vector":
        """The zero n-vector; Taichi's argument order, zero(dtype, n), too."""
        if isinstance(n, DType):  # ti.Vector.zero(dt, n)
            n, dtype = dtype, n
        return Vector([0.0] * n, dtype)

    @staticmethod
    def unit(n: int, i: int, dtype: Optional[DType] = None) -> "Vector":
        """The i-th basis vector of length n."""
        return Vector([1.0 if k == i else 0.0 for k in range(n)], dtype)

    @property
    def n(self) -> int:
        return self.shape[0]

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Iterator:
        return iter(self.flat)

    def __getitem__(self, i: int):
        if not isinstance(i, int):
            raise TypeError(f"a {_shape_name(self.shape)} is indexed with a Python int (its "
                            f"size is fixed when the kernel is built), got {type(i).__name__}")
        if not -self.n <= i < self.n:
            raise IndexError(f"component {i} of a {_shape_name(self.shape)}")
        return self.flat[i]

    def __setitem__(self, i, v):
        raise TypeError("a Vector is an immutable value: build a new one (Vector([...])), "
                        "or use vkad.select / kb.local(vector) for what changes at run time")

    def _same_shape(self, o, what: str) -> "Vector":
        if not isinstance(o, Vector):
            raise TypeError(f"{what}: expects a Vector, got {type(o).__name__}")
        if o.shape != self.shape:
            raise TypeError(f"{what}: shapes {_shape_name(self.shape)} {self.shape} and "
                            f"{_shape_name(o.shape)} {o.shape} differ")
        _merge(self.dtype, o.dtype, what)
        return o

    def dot(self, o: "Vector"):
        self._same_shape(o, "dot")
        acc = self.flat[0] * o.flat[0]
        for a, b in zip(self.flat[1:], o.flat[1:]):
            acc = acc + a * b
        return acc

    def outer_product(self, o: "Vector") -> "Matrix":
        """self (n) x o (m) -> n x m matrix, M[i, j] = self[i] * o[j]."""
        if not isinstance(o, Vector):
            raise TypeError(f"outer_product: expects a Vector, got {type(o).__name__}")
        t = _merge(self.dtype, o.dtype, "outer_product")
        return Matrix([[a * b for b in o.flat] for a in self.flat], t)

    outer = outer_product

    def cross(self, o: "Vector"):
        """2-vectors: the scalar a.x * b.y - a.y * b.x; 3-vectors: the cross product."""
        self._same_shape(o, "cross")
        a, b = self.flat, o.flat
        if self.n == 2:
            return a[0] * b[1] - a[1] * b[0]
        if self.n == 3:
            return Vector([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2],
                           a[0] * b[1] - a[1] * b[0]], self.dtype)
        raise TypeError(f"cross: defined for 2- and 3-vectors, got a {_shape_name(self.shape)}")

    def normalized(self, eps: float = 0.0) -> "Vector":
        """v / (|v| + eps), Taichi's normalized: eps is added to the norm, not under the root
        as in norm(eps) (ported code keeps its numbers)."""
        n = self.norm()
        return self * (1.0 / (n + eps if eps else n))

    def norm_inv(self, eps: float = 0.0):
        """1 / sqrt(|v|^2 + eps), Taichi's norm_inv."""
        return 1.0 / self.norm(eps)


class Matrix(_Tensor):
    """n x m components: `Matrix([[a, b], [c, d]])`, `M[i, j]`, `M[i]` (a row), `M @ v`, `M.T`."""

    __slots__ = ()

    def __init__(self, rows: Iterable[Iterable], dtype: Optional[DType] = None):
        rows = [list(r) for r in rows]
        if not rows or not rows[0]:
            raise TypeError("Matrix: needs at least one row and one column")
        m = len(rows[0])
        for i, r in enumerate(rows):
            if len(r) != m:
                raise TypeError(f"Matrix: row {i} has {len(r)} components, row 0 has {m}")
        super().__init__((len(rows), m), [c for r in rows for c in r], dtype, "Matrix")

    @staticmethod
    def _from_flat(shape: Tuple[int, ...], flat: Sequence, dtype: Optional[DType]) -> "Matrix":
        n, m = shape
        return Matrix([flat[i * m:(i + 1) * m] for i in range(n)], dtype)

    @staticmethod
    def rows(rows: Sequence[Vector]) -> "Matrix":
        return Matrix([list(r) for r in rows])

    @staticmethod
    def cols(cols: Sequence[Vector]) -> "Matrix":
        return Matrix([list(c) for c in cols]).transpose()

    @staticmethod
    def zero(n, m=None, dtype: Optional[DType] = None) -> "Matrix":
        """The n x m (n x n) zero matrix; Taichi's argument order, zero(dtype, n, m), too."""
        if isinstance(n, DType):  # ti.Matrix.zero(dt, n, m)
            n, m, dtype = m, dtype, n
        return Matrix([[0.0] * (n if m is None else m) for _ in range(n)], dtype)

    @staticmethod
    def identity(n, dtype: Optional[DType] = None) -> "Matrix":
        """The n x n identity; Taichi's argument order, identity(dtype, n), too."""
        if isinstance(n, DType):  # ti.Matrix.identity(dt, n)
            n, dtype = dtype, n
        return Matrix.diag(n, 1.0, dtype)

    @staticmethod
    def diag(n: int, value, dtype: Optional[DType] = None) -> "Matrix":
        """n x n with `value` (a number or Value) on the diagonal, Taichi's Matrix.diag."""
        return Matrix([[value if i == j else 0.0 for j in range(n)] for i in range(n)], dtype)

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def m(self) -> int:
        return self.shape[1]

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Iterator[Vector]:
        return (self.row(i) for i in range(self.n))

    def row(self, i: int) -> Vector:
        return Vector(self.flat[i * self.m:(i + 1) * self.m], self.dtype)

    def col(self, j: int) -> Vector:
        return Vector(self.flat[j::self.m], self.dtype)

    def __getitem__(self, idx):
        if isinstance(idx, int):
            if not -self.n <= idx < self.n:
                raise IndexError(f"row {idx} of a {_shape_name(self.shape)}")
            return self.row(idx % self.n)
        if (isinstance(idx, tuple) and len(idx) == 2
                and all(isinstance(k, int) for k in idx)):
            i, j = idx
            if not (-self.n <= i < self.n and -self.m <= j < self.m):
                raise IndexError(f"component [{i}, {j}] of a {_shape_name(self.shape)}")
            return self.flat[(i % self.n) * self.m + j % self.m]
        raise TypeError(f"a {_shape_name(self.shape)} is indexed with Python ints, M[i, j] or "
                        f"M[i] (its size is fixed when the kernel is built), got {idx!r}")

    def __setitem__(self, i, v):
        raise TypeError("a Matrix is an immutable value: build a new one (Matrix([[...]])), "
                        "or use vkad.select / kb.local(matrix) for what changes at run time")

    def transpose(self) -> "Matrix":
        return Matrix([[self.flat[i * self.m + j] for i in range(self.n)]
                       for j in range(self.m)], self.dtype)

    @property
    def T(self) -> "Matrix":  # noqa: N802 - numpy's name
        return self.transpose()

    def trace(self):
        self._square("trace")
        acc = self.flat[0]
        for i in range(1, self.n):
            acc = acc + self.flat[i * self.m + i]
        return acc

    def _square(self, what: str, sizes: Tuple[int, ...] = ()) -> None:
        if self.n != self.m:
            raise TypeError(f"{what}: needs a square matrix, got a {_shape_name(self.shape)}")
        if sizes and self.n not in sizes:
            raise TypeError(f"{what}: defined for {' and '.join(f'{k}x{k}' for k in sizes)} "
                            f"matrices, got a {_shape_name(self.shape)}")

    def determinant(self):
        self._square("determinant", (1, 2, 3))
        a = self.flat
        if self.n == 1:
            return a[0]
        if self.n == 2:
            return a[0] * a[3] - a[1] * a[2]
        # cofactor expansion along row 0
        return (a[0] * (a[4] * a[8] - a[5] * a[7]) - a[1] * (a[3] * a[8] - a[5] * a[6])
                + a[2] * (a[3] * a[7] - a[4] * a[6]))

    det = determinant

    def inverse(self) -> "Matrix":
        """The adjugate over the determinant (no pivoting: the caller knows M is invertible)."""
        self._square("inverse", (1, 2, 3))
        a = self.flat
        inv_det = 1.0 / self.determinant()
        if self.n == 1:
            return Matrix([[inv_det]], self.dtype)
        if self.n == 2:
            return Matrix([[a[3], -a[1]], [-a[2], a[0]]], self.dtype) * inv_det
        cof = [[a[4] * a[8] - a[5] * a[7], a[2] * a[7] - a[1] * a[8], a[1] * a[5] - a[2] * a[4]],
               [a[5] * a[6] - a[3] * a[8], a[0] * a[8] - a[2] * a[6], a[2] * a[3] - a[0] * a[5]],
               [a[3] * a[7] - a[4] * a[6], a[1] * a[6] - a[0] * a[7], a[0] * a[4] - a[1] * a[3]]]
        return Matrix(cof, self.dtype) * inv_det

    def polar_decompose(self) -> Tuple["Matrix", "Matrix"]:
        return polar_decompose(self)


def _matmul(a, b) -> _Tensor:
    if not isinstance(a, _Tensor) or not isinstance(b, _Tensor):
        other = b if isinstance(a, _Tensor) else a
        raise TypeError(f"matmul (@): both operands are a Vector or Matrix, got "
                        f"{type(other).__name__} (scale with *)")
    t = _merge(a.dtype, b.dtype, "matmul (@)")
    if isinstance(a, Vector) and isinstance(b, Vector):
        raise TypeError(f"matmul (@) of two vectors ({a.shape} and {b.shape}): say a.dot(b) "
                        "or a.outer_product(b)")
    ak = a.shape[-1]
    bk = b.shape[0]
    if ak != bk:
        raise TypeError(f"matmul (@): shapes {_shape_name(a.shape)} {a.shape} and "
                        f"{_shape_name(b.shape)} {b.shape} do not chain ({ak} != {bk})")

    def dot(xs, ys):
        acc = xs[0] * ys[0]
        for x, y in zip(xs[1:], ys[1:]):
            acc = acc + x * y
        return acc

    if isinstance(a, Matrix) and isinstance(b, Vector):
        return Vector([dot(a.row(i).flat, b.flat) for i in range(a.n)], t)
    if isinstance(a, Vector):  # row vector times matrix, as numpy
        return Vector([dot(a.flat, b.col(j).flat) for j in range(b.m)], t)
    return Matrix([[dot(a.row(i).flat, b.col(j).flat) for j in range(b.m)]
                   for i in range(a.n)], t)


def polar_decompose(A: Matrix) -> Tuple[Matrix, Matrix]:
    """A = R @ S with R a rotation and S symmetric, for a 2x2 A (Taichi's closed form, what
    diffmpm uses): R is the rotation by atan2(a10 - a01, a00 + a11), computed without atan2 as
    (c, s) = (x, y) / |(x, y)|, and S = R^T A. Undefined where a00 + a11 = a10 - a01 = 0 (no
    rotation is nearest; the division gives inf/NaN there, as in Taichi)."""
    if not isinstance(A, Matrix):
        raise TypeError(f"polar_decompose: expects a Matrix, got {type(A).__name__}")
    A._square("polar_decompose", (2,))
    x, y = A[0, 0] + A[1, 1], A[1, 0] - A[0, 1]
    scale = 1.0 / _sqrt(x * x + y * y)
    c, s = x * scale, y * scale
    R = Matrix([[c, -s], [s, c]], A.dtype)
    return R, R.transpose() @ A


def select_tensor(cond, a, b) -> _Tensor:
    """vkad.select for Vector / Matrix operands: componentwise cond ? a : b."""
    if not isinstance(a, _Tensor) or not isinstance(b, _Tensor):
        scalar, tensor = (a, b) if isinstance(b, _Tensor) else (b, a)
        if not _is_scalar(scalar):
            raise TypeError(f"select: expected a Vector, Matrix or scalar, got "
                            f"{type(scalar).__name__}")
        scalar_t = _scalar_dtype(scalar)
        _merge(tensor.dtype, scalar_t, "select")
        broadcast = tensor._make(tensor.shape, [scalar] * len(tensor.flat),
                                 tensor.dtype or scalar_t)
        a, b = (broadcast, b) if tensor is b else (a, broadcast)
    if a.shape != b.shape:
        raise TypeError(f"select: shapes {_shape_name(a.shape)} {a.shape} and "
                        f"{_shape_name(b.shape)} {b.shape} differ")
    t = _merge(a.dtype, b.dtype, "select")
    kb = _b._builder_of(cond)
    flat = []
    for x, y in zip(a.flat, b.flat):
        if not isinstance(x, _b.Value) and not isinstance(y, _b.Value):
            # two numbers: the tensor's type (or f32, the builder's default for a float)
            ct = t if t is not None else DType.f32
            x = kb.constant(x, ct)
        flat.append(_b.select(cond, x, y))
    return a._make(a.shape, flat, t)


class TensorLocal:
    """A mutable Vector / Matrix local (`kb.local(v)`): one scalar local per component.
    `.value` loads (a new Vector / Matrix of Values) and stores; `+=`, `-=`, `*=`."""

    def __init__(self, kb: "_b.KernelBuilder", shape: Tuple[int, ...], dtype: DType,
                 locals_: List["_b.Local"]):
        self.kb, self.shape, self.dtype, self._locals = kb, shape, dtype, locals_

    def load(self) -> _Tensor:
        return _Tensor._make(self.shape, [l.load() for l in self._locals], self.dtype)

    def store(self, v) -> None:
        if not isinstance(v, _Tensor) or v.shape != self.shape:
            got = _shape_name(v.shape) if isinstance(v, _Tensor) else type(v).__name__
            raise TypeError(f"store into a {_shape_name(self.shape)} local: got {got}")
        _merge(self.dtype, v.dtype, f"store into a {_shape_name(self.shape)} local")
        for l, c in zip(self._locals, v.flat):
            l.store(c)

    value = property(load, store)

    def __iadd__(self, v): self.store(self.load() + v); return self
    def __isub__(self, v): self.store(self.load() - v); return self
    def __imul__(self, v): self.store(self.load() * v); return self


def make_local(kb: "_b.KernelBuilder", init: _Tensor) -> TensorLocal:
    t = init.dtype
    if t is None:
        raise TypeError(f"kb.local: a {_shape_name(init.shape)} of numbers only has no type: "
                        "give one (Vector([...], vkad.f32))")
    locs = [kb.local(c if isinstance(c, _b.Value) else kb.constant(c, t)) for c in init.flat]
    return TensorLocal(kb, init.shape, t, locs)


__all__ = ["Vector", "Matrix", "polar_decompose", "TensorLocal"]
