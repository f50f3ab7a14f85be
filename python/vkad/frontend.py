"""Kernels written as Python functions: `@vkad.kernel` and `@vkad.func` (docs/kernels.md).

    @vkad.kernel
    def saxpy(a: vkad.f32, x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):          # the outermost loop is the parallel task
            y[i] = a * x[i] + y[i]

    saxpy(2.0, xs, ys)                       # launched on vkad.default_session()
    d = s.differentiate(saxpy)               # as a KernelBuilder kernel is

The function's source is parsed once (inspect.getsource + ast.parse, line numbers those of its
file) and lowered statement by statement onto a vkad.KernelBuilder, so the IR, the verifier,
reverse mode, tapes, graphs and the caches see exactly what a builder kernel gives them.
Everything outside the subset, a type mismatch or an undefined name raises
vkad.InvalidArgumentError whose message names the file, line and column and shows the source
line with a caret (the exception also carries `filename`, `lineno` and `col_offset`).

The subset: assignments (typed locals, inferred from the first value; a later value of another
type is an error), augmented assignments (`x[i] += v` on an array is an atomic add, as in
Taichi and Warp), Python operators, comparisons, `and` / `or` / `not`, `a if c else b`
(a select), if / elif / else, `for k in range(...)` (serial inside the parallel loop), while,
break, continue, tuple unpacking, vkad.Vector / vkad.Matrix and their methods, the math
functions (vkad.sin ..., and math.sin ... on kernel values), vkad.atomic_add / atomic_sub,
`@vkad.func` helpers (inlined), names of the enclosing scope (numbers, tuples, bools, dtypes:
compile-time constants) and `vkad.static(...)` (a loop unrolled, a branch picked, a value
computed while the kernel is built).
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import linecache
import json
import math
import operator
import os
import re
import sys
import stat
import tempfile
import textwrap
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as _np

from . import builder as _b
from . import matrix as _m
from ._vkad import DType, NdArray
from .errors import Error, InvalidArgumentError

_FLOATS = (DType.f32, DType.f64)
_INTS = (DType.i32, DType.u32, DType.i64)
_KVALUE = (_b.Value, _b.Scalar, _b.Dim, _b.Local)  # kernel scalars (read as a Value)


# --- type annotations ------------------------------------------------------------------------

class ScalarType:
    """A scalar parameter's annotation: `vkad.f32`, or `vkad.scalar(vkad.f32, grad=True)`."""

    def __init__(self, dtype: DType, grad: bool = False):
        self.dtype, self.grad = _dtype_arg(dtype, "scalar"), bool(grad)

    def __repr__(self) -> str:
        return f"vkad.scalar(vkad.{self.dtype.name}{', grad=True' if self.grad else ''})"


class ElementType:
    """A vector or matrix element type: `vkad.vec(2, vkad.f32)`, `vkad.mat(2, 2, vkad.f32)`."""

    def __init__(self, shape: Tuple[int, ...], dtype: DType):
        if not 1 <= len(shape) <= 2 or not all(isinstance(e, int) and e >= 1 for e in shape):
            raise InvalidArgumentError(f"element shape {shape!r}: (n,) or (n, m), positive ints")
        self.shape, self.dtype = tuple(shape), _dtype_arg(dtype, "element")

    def __repr__(self) -> str:
        if len(self.shape) == 1:
            return f"vkad.vec({self.shape[0]}, vkad.{self.dtype.name})"
        return f"vkad.mat({self.shape[0]}, {self.shape[1]}, vkad.{self.dtype.name})"

    def __eq__(self, o) -> bool:
        return isinstance(o, ElementType) and (o.shape, o.dtype) == (self.shape, self.dtype)

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype))


class ArrayType:
    """An ndarray parameter's annotation: `vkad.array(vkad.f32, ndim=2, grad=True)`.

    dtype: a scalar dtype, or vkad.vec(n, dt) / vkad.mat(n, m, dt) (the element's components in
    the trailing axes: ndim indices pick an element). ndim=0: one scalar (`loss[None]`), held in
    a shape (1,) array. grad: differentiated (s.differentiate, tapes). readonly: never written."""

    def __init__(self, dtype, ndim: int = 1, grad: bool = False, readonly: bool = False,
                 element: Sequence[int] = ()):
        if isinstance(dtype, ElementType):
            element, dtype = dtype.shape, dtype.dtype
        self.dtype = _dtype_arg(dtype, "array")
        if isinstance(ndim, bool) or not isinstance(ndim, int) or not 0 <= ndim <= 8:
            raise InvalidArgumentError(f"vkad.array: ndim is an int 0..8, got {ndim!r}")
        self.ndim, self.grad, self.readonly = ndim, bool(grad), bool(readonly)
        self.element = tuple(element)
        if self.grad and self.readonly:
            raise InvalidArgumentError("vkad.array: grad=True and readonly=True exclude each "
                                       "other (a read-only array has no gradient)")

    @property
    def rank(self) -> int:
        """The device array's axes (what a launch checks)."""
        return (self.ndim + len(self.element)) or 1

    def __repr__(self) -> str:
        dt = f"vkad.{self.dtype.name}"
        if self.element:
            dt = repr(ElementType(self.element, self.dtype))
        flags = (", grad=True" if self.grad else "") + (", readonly=True" if self.readonly else "")
        return f"vkad.array({dt}, ndim={self.ndim}{flags})"


def _dtype_arg(dtype, what: str) -> DType:
    if isinstance(dtype, DType):
        return dtype
    if dtype is float:
        return DType.f32
    if dtype is int:
        return DType.i32
    if dtype is bool:
        return DType.bool
    raise InvalidArgumentError(f"vkad.{what}: a dtype (vkad.f32, vkad.f64, vkad.i32, vkad.u32, "
                               f"vkad.i64, vkad.bool_), got {dtype!r}")


def scalar(dtype, grad: bool = False) -> ScalarType:
    """A scalar parameter's annotation; `grad=True` (f32 / f64) differentiates it."""
    return ScalarType(dtype, grad)


def vec(n: int, dtype=DType.f32) -> ElementType:
    """An n-vector element type, for vkad.array(vkad.vec(2, vkad.f32), ndim=1)."""
    return ElementType((n,), dtype)


def mat(n: int, m: int, dtype=DType.f32) -> ElementType:
    """An n x m matrix element type, for vkad.array(vkad.mat(2, 2, vkad.f32), ndim=1)."""
    return ElementType((n, m), dtype)


def array(dtype, ndim: int = 1, grad: bool = False, readonly: bool = False,
          element: Sequence[int] = ()) -> ArrayType:
    """An ndarray parameter's annotation (see ArrayType)."""
    return ArrayType(dtype, ndim, grad, readonly, element)


# --- markers a kernel's body uses (plain Python outside kernels) -------------------------------

def static(x):
    """Inside a kernel: `x` is evaluated while the kernel is built (a loop over it unrolled, an
    `if` on it a branch picked). Outside: x."""
    return x


def ndrange(*ranges):
    """`for i, j in vkad.ndrange(n, m)`: the outermost loop of a kernel over a 2-d / 3-d box,
    the last index fastest (Taichi's ti.ndrange). A range is an end or (begin, end). Outside
    a kernel: the box's points."""
    import itertools
    return itertools.product(*(range(*r) if isinstance(r, tuple) else range(r) for r in ranges))


class max_trip:  # noqa: N801 - used as a function
    """`while vkad.max_trip(cond, 64):` / `for k in vkad.max_trip(range(b, e), 64):` states a
    loop's most trips for reverse mode (the builder's max_trip)."""

    def __init__(self, loop, n: int):
        self.loop, self.n = loop, n

    def __iter__(self):
        return iter(self.loop)

    def __bool__(self):
        return bool(self.loop)


def atomic_add(target, value):
    """Inside a kernel: `vkad.atomic_add(x[i, j], v)` adds v into x[i, j] atomically
    (componentwise for a vector / matrix element). A statement: unlike Taichi's and Warp's
    atomic_add it does not return the old value, and using its result is refused."""
    raise InvalidArgumentError("vkad.atomic_add is called inside a @vkad.kernel or @vkad.func")


def atomic_sub(target, value):
    """Inside a kernel: `vkad.atomic_sub(x[i], v)` is vkad.atomic_add(x[i], -v) (a statement,
    no old value returned)."""
    raise InvalidArgumentError("vkad.atomic_sub is called inside a @vkad.kernel or @vkad.func")


# --- errors ------------------------------------------------------------------------------------

class _Fail(Exception):
    """An error at a node; turned into InvalidArgumentError with the location by _located."""

    def __init__(self, node: Optional[ast.AST], msg: str, src: Optional["_Source"] = None,
                 where: str = ""):
        super().__init__(msg)
        self.node, self.msg, self.src, self.where = node, msg, src, where


_SOURCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _source(fn: Callable, what: str) -> "_Source":
    """fn's parsed source, once per code object: a function defined inside another (a kernel
    made per simulation) shares its code object with every earlier definition."""
    code = fn.__code__
    src = _SOURCES.get(code)
    if src is None:
        src = _SOURCES[code] = _Source(fn, what)
    return src


class _Source:
    """A function's source, parsed, with line numbers of its file."""

    def __init__(self, fn: Callable, what: str):
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise InvalidArgumentError(f"{what} '{fn.__name__}': its source is not available "
                                       f"({e}); define it in a file") from None
        self.text = "".join(lines)
        self.filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
        dedented = textwrap.dedent(self.text)
        first_line = next((l for l in lines if l.strip()), "").rstrip("\r\n")
        ded_first = next((l for l in dedented.splitlines() if l.strip()), "")
        self.indent = len(first_line) - len(ded_first)
        tree = ast.parse(dedented, self.filename)
        ast.increment_lineno(tree, first - 1)
        node = tree.body[0]
        if not isinstance(node, ast.FunctionDef):
            raise InvalidArgumentError(f"{what}: decorates a plain `def` function "
                                       f"({self.filename}:{first})")
        self.fn_node = node
        self.lines = lines
        self.first = first

    def line(self, lineno: int) -> str:
        if self.first <= lineno < self.first + len(self.lines):
            return self.lines[lineno - self.first].rstrip("\n")
        return linecache.getline(self.filename, lineno).rstrip("\n")

    def location(self, node: ast.AST, func: str = "") -> Tuple:
        """(file, line, column, end column, source line, func name) of a node."""
        line, col = node.lineno, node.col_offset + self.indent
        end = col + 1
        if getattr(node, "end_lineno", None) == line and node.end_col_offset is not None:
            end = max(col + 1, node.end_col_offset + self.indent)
        return (self.filename, line, col, end, self.line(line), func)

    def error(self, node: Optional[ast.AST], msg: str, where: str) -> InvalidArgumentError:
        if node is None or not hasattr(node, "lineno"):
            node = self.fn_node
        line, col = node.lineno, node.col_offset + self.indent
        text = self.line(line)
        end = col + 1
        if getattr(node, "end_lineno", None) == line and node.end_col_offset is not None:
            end = max(col + 1, node.end_col_offset + self.indent)
        caret = " " * col + "^" * (end - col)
        e = InvalidArgumentError(f"{where}: {msg}\n  File \"{self.filename}\", line {line}, "
                                 f"column {col + 1}\n    {text}\n    {caret}")
        e.filename, e.lineno, e.col_offset = self.filename, line, col + 1
        e.source_line = text
        return e


# --- the assignment analysis: which names need a mutable local ---------------------------------

def _static_test(expr: ast.AST, names: set, scope: Callable[[str], Any]) -> bool:
    """Whether an `if` test is a compile-time constant: vkad.static(...), or built from
    constants and names of the enclosing scope (a captured `toi`)."""
    if isinstance(expr, ast.Call):
        f = _resolve_static_callee(expr.func, names, scope)
        return f is static
    for n in ast.walk(expr):
        if isinstance(n, ast.Name):
            if n.id in names:
                return False
            try:
                v = scope(n.id)
            except KeyError:
                return False
            if not isinstance(v, (bool, int, float, type(None), tuple, str)):
                if not inspect.ismodule(v):
                    return False
        elif not isinstance(n, (ast.Constant, ast.Load, ast.UnaryOp, ast.BoolOp, ast.Compare,
                                ast.Attribute, ast.unaryop, ast.boolop, ast.cmpop,
                                ast.BinOp, ast.operator)):
            return False
    return True


def _resolve_static_callee(f: ast.AST, names: set, scope) -> Any:
    chain = []
    while isinstance(f, ast.Attribute):
        chain.append(f.attr)
        f = f.value
    if not isinstance(f, ast.Name) or f.id in names:
        return None
    try:
        v = scope(f.id)
    except KeyError:
        return None
    for a in reversed(chain):
        v = getattr(v, a, None)
    return v


def _targets(t: ast.AST) -> List[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        return [n for e in t.elts for n in _targets(e)]
    if isinstance(t, ast.Starred):
        return _targets(t.value)
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
        return [t.value.id]  # v[0] = ... rebuilds the vector v
    return []


def _analyze(stmts: List[ast.stmt], params: Sequence[str], scope,
             known: Sequence[str] = ()) -> Dict[str, Tuple]:
    """The names of `stmts` that need a mutable local, each with the deepest runtime block
    (a path of (id(node), branch)) holding every assignment: a name assigned in one block and
    assigned or read in a block around it (a value carried by a loop, merged after an if).
    Names assigned and read in one block (or in sibling blocks only) stay SSA values."""
    assigns: Dict[str, List[Tuple]] = {p: [()] for p in params}
    reads: Dict[str, List[Tuple]] = {}
    local_names = set(params) | set(known)  # names that are not the enclosing scope's
    for n in ast.walk(ast.Module(body=stmts, type_ignores=[])):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                local_names.update(_targets(t))
        elif isinstance(n, ast.For):
            local_names.update(_targets(n.target))

    def read(exprs, path):
        for e in exprs:
            if e is None:
                continue
            for n in ast.walk(e):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    reads.setdefault(n.id, []).append(path)

    def walk(body, path):
        for s in body:
            if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                read([s.value] + [t for t in targets if not isinstance(t, ast.Name)], path)
                for t in targets:
                    for name in _targets(t):
                        assigns.setdefault(name, []).append(path)
                        if isinstance(s, ast.AugAssign):
                            reads.setdefault(name, []).append(path)
            elif isinstance(s, ast.If):
                read([s.test], path)
                if _static_test(s.test, local_names, scope):
                    walk(s.body, path)
                    walk(s.orelse, path)
                else:
                    walk(s.body, path + ((id(s), 0),))
                    walk(s.orelse, path + ((id(s), 1),))
            elif isinstance(s, ast.For):
                read([s.iter], path)
                is_static = (isinstance(s.iter, ast.Call)
                             and _resolve_static_callee(s.iter.func, local_names, scope) is static)
                inner = path if is_static else path + ((id(s), 0),)
                if is_static:  # an unrolled loop's target is assigned at each copy
                    for name in _targets(s.target):
                        assigns.setdefault(name, []).append(inner)
                walk(s.body, inner)
            elif isinstance(s, ast.While):
                read([s.test], path + ((id(s), 0),))
                walk(s.body, path + ((id(s), 0),))
            else:
                read([n for n in ast.iter_child_nodes(s) if isinstance(n, ast.expr)], path)

    walk(stmts, ())
    out = {}
    for name, aps in assigns.items():
        aset = set(aps)
        around = {q for q in aset | set(reads.get(name, ()))
                  if any(len(q) < len(a) and a[:len(q)] == q for a in aset)}
        if not around:
            continue
        ps = list(aset | around)
        lca = ps[0]
        for p in ps[1:]:
            k = 0
            while k < min(len(lca), len(p)) and lca[k] == p[k]:
                k += 1
            lca = lca[:k]
        out[name] = lca
    return out


# --- lowering ----------------------------------------------------------------------------------

class _Mutable:
    """A name held in a local (one per component for a vector / matrix)."""

    def __init__(self, loc, dtype: DType, shape: Tuple[int, ...], node: ast.AST):
        self.loc, self.dtype, self.shape, self.node = loc, dtype, shape, node


class _StaticBreak(Exception):
    pass


class _StaticContinue(Exception):
    pass


class _Return(Exception):
    def __init__(self, value):
        self.value = value


_MATH = {math.sqrt: _b.sqrt, math.exp: _b.exp, math.log: _b.log, math.sin: _b.sin,
         math.cos: _b.cos, math.tan: _b.tan, math.tanh: _b.tanh, math.asin: _b.asin,
         math.acos: _b.acos, math.floor: _b.floor, math.ceil: _b.ceil, math.pow: _b.pow,
         math.atan2: _b.atan2, math.fabs: _b.abs, builtins.abs: _b.abs, builtins.pow: _b.pow}
_BUILDER_FUNCS = {_b.sqrt, _b.rsqrt, _b.exp, _b.log, _b.sin, _b.cos, _b.tan, _b.tanh, _b.asin,
                  _b.acos, _b.abs, _b.floor, _b.ceil, _b.pow, _b.atan2, _b.min, _b.max, _b.eq,
                  _b.ne, _b.select, _b.cast, _m.polar_decompose}
_CONST_EVAL = {_b.sqrt: math.sqrt, _b.rsqrt: lambda x: 1.0 / math.sqrt(x), _b.exp: math.exp,
               _b.log: math.log, _b.sin: math.sin, _b.cos: math.cos, _b.tan: math.tan,
               _b.tanh: math.tanh, _b.asin: math.asin, _b.acos: math.acos, _b.abs: builtins.abs,
               _b.floor: lambda x: float(math.floor(x)), _b.ceil: lambda x: float(math.ceil(x)),
               _b.pow: lambda a, b: a ** b, _b.atan2: math.atan2, _b.min: builtins.min,
               _b.max: builtins.max}
_PY_CONST_FUNCS = {builtins.abs, builtins.min, builtins.max, builtins.float, builtins.int,
                   builtins.bool, builtins.len, builtins.round, builtins.pow, builtins.range,
                   builtins.tuple, builtins.divmod}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.MatMult: operator.matmul, ast.BitAnd: operator.and_,
        ast.BitOr: operator.or_}
_CMPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
         ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_,
         ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b,
         ast.NotIn: lambda a, b: a not in b}
_CONST_TYPES = (bool, int, float, type(None), str, DType)


def _is_const(v) -> bool:
    if isinstance(v, tuple):
        return all(_is_const(e) for e in v)
    return isinstance(v, _CONST_TYPES)


def _kdtype(v) -> Optional[DType]:
    if isinstance(v, (_b.Value, _b.Scalar, _b.Local)):
        return v.dtype
    if isinstance(v, _b.Dim):
        return DType.i32
    if isinstance(v, _m._Tensor):
        return v.dtype
    return None


def _describe(v) -> str:
    if isinstance(v, _m._Tensor):
        return f"a {_m._shape_name(v.shape)} of {v.dtype.name if v.dtype else 'numbers'}"
    t = _kdtype(v)
    if t is not None:
        return t.name
    if isinstance(v, bool):
        return "a Python bool"
    if isinstance(v, (int, float)):
        return f"a Python {type(v).__name__}"
    if isinstance(v, _b.Array):
        return f"ndarray '{v.name}'"
    return type(v).__name__


class _Scope:
    """One function's names: kernel / func parameters, SSA bindings and mutable locals."""

    def __init__(self, lowerer: "_Lowerer", fn, src: _Source, mutables: Dict[str, Tuple],
                 base_depth: int):
        self.lw, self.fn, self.src = lowerer, fn, src
        self.names: Dict[str, Any] = {}
        self.mutables = mutables
        self.base_depth = base_depth  # kb._stack length at the function's entry
        self.path: List[Tuple] = []  # open blocks: (path element, kb stack length after)
        self.block_names: List[List[str]] = [[]]  # SSA names bound per runtime block
        self.dropped: Dict[str, int] = {}  # names that went out of scope -> line
        self.loops: List[Tuple[str, int]] = []  # ("static" / "runtime" / "parallel", len(path))
        self.loop_indices: set = set()  # runtime loop indices bound now (not assignable)
        self.kernel_names: set = set()  # kernel parameters and kernel-level names
        self.closure = {}
        if fn.__closure__:
            self.closure = {n: c for n, c in zip(fn.__code__.co_freevars, fn.__closure__)}

    def captured(self, name: str):
        if name in self.closure:
            try:
                return self.closure[name].cell_contents
            except ValueError:
                raise KeyError(name) from None
        g = self.fn.__globals__
        if name in g:
            return g[name]
        b = g.get("__builtins__", builtins)
        b = b if isinstance(b, dict) else vars(b)
        if name in b:
            return b[name]
        raise KeyError(name)


class _Lowerer:
    def __init__(self, kfn: "KernelFunction"):
        self.kfn = kfn
        self.kb = _b.KernelBuilder(kfn.name)
        self.captured: Dict[Tuple[int, str], Any] = {}  # (id(fn), name) -> value, for the key
        self.fp = kfn.fp
        self.scope: Optional[_Scope] = None
        self.inline_depth = 0
        self.task_count = 0
        self.stmt_call = None  # the call an expression statement makes (its value unused)
        self.task_names: set = set()
        self.inlined: List["Func"] = []
        self.lines: Dict[str, Tuple] = {}  # IR source location ("f.py:12:5") -> _where's tuple
        self.assert_test: Optional[ast.AST] = None  # s_Assert's comparison, and its operands
        self.assert_operands: list = []
        self.func_parent: Dict[int, Tuple[int, str]] = {}

    # --- errors ---
    def fail(self, node, msg: str):
        sc = self.scope
        where = ""
        if sc is not None and self.inline_depth:
            where = f" (in @vkad.func '{sc.fn.__name__}')"
        raise _Fail(node, msg, sc.src if sc is not None else None, where)

    # --- the kernel ---
    def lower(self):
        src = self.kfn.src
        fnode = src.fn_node
        kb = self.kb
        sc = _Scope(self, self.kfn.fn, src, {}, 0)
        self.scope = sc
        for arg, ann in zip(self.kfn.arg_nodes, self.kfn.annotations):
            name = arg.arg
            if isinstance(ann, ArrayType):
                sc.names[name] = kb.ndarray(name, ann.dtype, ann.ndim, grad=ann.grad,
                                            readonly=ann.readonly, element=ann.element)
            else:
                sc.names[name] = kb.scalar(name, ann.dtype, grad=ann.grad) if ann.grad \
                    else kb.scalar(name, ann.dtype)
            sc.kernel_names.add(name)
        self.kernel_level(_strip_docstring(fnode.body))
        if not kb._tasks:
            self.fail(fnode, "the kernel has no loop: its outermost `for i in range(n)` (or "
                             "`for i, j in vkad.ndrange(n, m)`) is the parallel task")
        return kb

    def kernel_level(self, stmts: List[ast.stmt]):
        """The kernel's top level: each outermost for is a parallel task; a run of other
        statements that builds anything is a serial task of one invocation."""
        sc = self.scope
        sc.mutables = {}
        run: List[ast.stmt] = []
        for s in stmts:
            if isinstance(s, ast.For) and not self._is_static_call(s.iter):
                self.serial_run(run)
                run = []
                self.parallel(s)
            elif isinstance(s, ast.For):  # vkad.static: unrolled at kernel level
                self.serial_run(run)
                run = []
                for v in self.static_iter(s):
                    self.assign_target(s.target, v, s)
                    self.kernel_level(s.body)
            elif isinstance(s, ast.If) and self.try_static_test(s.test):
                self.serial_run(run)
                run = []
                self.kernel_level(s.body if self.static_test_value(s) else s.orelse)
            elif isinstance(s, (ast.Assign, ast.AnnAssign)) and self._const_assign(s):
                self.serial_run(run)
                run = []
            elif isinstance(s, ast.Pass) or (isinstance(s, ast.Expr)
                                             and isinstance(s.value, ast.Constant)):
                continue
            elif isinstance(s, ast.Return) and s.value is None:
                continue
            else:
                run.append(s)
        self.serial_run(run)

    def _const_assign(self, s) -> bool:
        """A kernel-level assignment of a compile-time value (n = 3): bound, nothing built."""
        sc = self.scope
        if isinstance(s, ast.AnnAssign) or s.value is None:
            return False
        if not all(isinstance(t, (ast.Name, ast.Tuple)) and all(
                isinstance(n, ast.Name) for n in ast.walk(t) if isinstance(n, ast.expr)
                and not isinstance(n, ast.Tuple)) for t in s.targets):
            return False
        try:
            v = self.expr(s.value)
        except _Fail:
            return False
        if not _is_const(v) and not isinstance(v, (_b.Scalar, _b.Dim, _b.Array, _b._Shape)):
            return False
        targets = s.targets if isinstance(s, ast.Assign) else [s.target]
        sc.mutables = {}
        for t in targets:
            self.assign_target(t, v, s, ssa_only=True)
            sc.kernel_names.update(_targets(t))
        return True

    def _is_static_call(self, node) -> bool:
        return isinstance(node, ast.Call) and self.callee(node.func) is static

    def task_name(self, node) -> str:
        """line_<n>, the line of the task's loop (line_<n>_<k> for the k-th copy of an
        unrolled one): the verifier's and the runtime's messages name it."""
        name = base = f"line_{node.lineno}"
        while name in self.task_names:
            self.task_count += 1
            name = f"{base}_{self.task_count}"
        self.task_names.add(name)
        return name

    def serial_run(self, run: List[ast.stmt]):
        if not run:
            return
        sc = self.scope
        sc.mutables = _analyze(run, [], sc.captured, list(sc.names))
        with self.kb.serial_for(self.task_name(run[0]), 0, 1):
            self.open_block(("serial", id(run[0])))
            try:
                self.stmts(run)
            finally:
                self.close_block()

    def parallel(self, s: ast.For):
        sc = self.scope
        if s.orelse:
            self.fail(s.orelse[0], "a for loop's `else` is not in the kernel subset")
        sc.mutables = _analyze([s], [], sc.captured, list(sc.names))
        it = s.iter
        call = it if isinstance(it, ast.Call) else None
        f = self.callee(call.func) if call is not None else None
        if f is builtins.range:
            if not isinstance(s.target, ast.Name):
                self.fail(s.target, "the parallel loop over range(...) has one index: "
                                    "`for i in range(n)` (2-d: `for i, j in vkad.ndrange(n, m)`)")
            b, e = self.range_bounds(call)
            ctx = self.kb.parallel_for(self.task_name(s), b, e)
        elif f is ndrange:
            if call.keywords:
                self.fail(call, "vkad.ndrange takes positional ranges")
            ranges = []
            for a in call.args:
                if isinstance(a, ast.Tuple) and len(a.elts) == 2:
                    ranges.append((self.bound(a.elts[0]), self.bound(a.elts[1])))
                else:
                    ranges.append((0, self.bound(a)))
            n_idx = len(_targets(s.target)) if isinstance(s.target, ast.Tuple) else 1
            if not isinstance(s.target, ast.Tuple) or n_idx != len(ranges):
                self.fail(s.target, f"vkad.ndrange of {len(ranges)} ranges gives {len(ranges)} "
                                    "indices: `for i, j in vkad.ndrange(n, m)`")
            if len(ranges) == 1:
                ctx = self.kb.parallel_for(self.task_name(s), *ranges[0])
            elif len(ranges) > 3:
                self.fail(call, "vkad.ndrange: a task has 1 to 3 dimensions")
            else:
                ctx = self.kb.parallel_for_nd(self.task_name(s), *ranges)
        else:
            self.fail(it, "the kernel's outermost loop is the parallel task: "
                          "`for i in range(n)` or `for i, j in vkad.ndrange(n, m)`")
        with ctx as idx:
            self.open_block(self.runtime_elem(s, 0))
            sc.loops.append(("parallel", len(sc.path)))
            try:
                self.bind_loop_target(s.target, idx, s)
                if _thread_exits(s.body):
                    # `continue` (or a bare `return`) ends the thread's iteration: the body
                    # is the one trip of a serial loop, left with the IR's continue
                    with self.kb.for_range(0, 1):
                        sc.loops.append(("thread", len(sc.path)))
                        try:
                            self.stmts(s.body)
                        finally:
                            sc.loops.pop()
                else:
                    self.stmts(s.body)
            finally:
                sc.loops.pop()
                self.close_block()

    def range_bounds(self, call: ast.Call):
        if call.keywords or not 1 <= len(call.args) <= 2:
            self.fail(call, "the parallel loop is range(end) or range(begin, end) (no step)")
        if len(call.args) == 1:
            return 0, self.bound(call.args[0])
        return self.bound(call.args[0]), self.bound(call.args[1])

    def bound(self, node):
        """A task bound: an int, a scalar parameter, x.shape[d], or +, -, * of them (a
        constant subtracted), max(a, b) -- the IR's size expressions."""
        v = self._bound(node)
        if isinstance(v, int):
            return v
        if isinstance(v, (_b.Scalar, _b.Dim)):
            return v
        return _Bound(v)

    def _bound(self, node):
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult):
            a, b = self._bound(node.left), self._bound(node.right)
            if isinstance(a, int) and isinstance(b, int):
                return _OPS[type(node.op)](a, b)
            if isinstance(node.op, ast.Sub):
                if not isinstance(b, int):
                    self.fail(node, "a task bound subtracts only a constant (n - 1)")
                return f"add({_bstr(a)}, {-b})"
            return f"{'add' if isinstance(node.op, ast.Add) else 'mul'}({_bstr(a)}, {_bstr(b)})"
        if (isinstance(node, ast.Call) and self.callee(node.func) is builtins.max
                and len(node.args) == 2):
            a, b = self._bound(node.args[0]), self._bound(node.args[1])
            return f"max({_bstr(a)}, {_bstr(b)})"
        v = self.expr(node)
        if isinstance(v, bool) or not isinstance(v, (int, _b.Scalar, _b.Dim)):
            self.fail(node, "a task bound is an int, a scalar parameter, x.shape[d] or "
                            f"+ - * of them, got {_describe(v)}")
        if isinstance(v, _b.Scalar) and v.dtype not in (DType.i32, DType.u32):
            self.fail(node, f"a task bound is an i32 / u32 scalar, '{v.name}' is {v.dtype.name}")
        return v

    # --- blocks and scopes ---
    def open_block(self, elem):
        sc = self.scope
        sc.path.append((elem, len(self.kb._stack)))
        sc.block_names.append([])

    def close_block(self):
        sc = self.scope
        sc.path.pop()
        for name in sc.block_names.pop():
            if name.startswith("\0index:"):
                sc.loop_indices.discard(name[7:])
                continue
            if sc.names.pop(name, None) is not None:
                sc.dropped[name] = True

    def runtime_elem(self, node, branch=0):
        return (id(node), branch)

    # --- statements ---
    def stmts(self, body: List[ast.stmt]):
        for s in body:
            self.stmt(s)

    def stmt(self, s: ast.stmt):
        m = getattr(self, "s_" + type(s).__name__, None)
        if m is None:
            self.fail(s, f"a `{_stmt_word(s)}` statement is not in the kernel subset "
                         "(docs/kernels.md lists what is)")
        # The IR statements this one writes carry its Python location (the IR's `@"..."`), so
        # vkad's errors about them and their adjoints name this line.
        src, where = self.scope.src, self.scope.fn.__name__ if self.inline_depth else ""
        loc = src.location(s, where)
        key = _b.location_text(f"{loc[0]}:{loc[1]}:{loc[2] + 1}")
        self.lines.setdefault(key, loc)
        outer = self.kb._at
        self.kb.set_location(key)
        try:
            m(s)
        except (_Fail, _StaticBreak, _StaticContinue, _Return):
            raise
        except (TypeError, ValueError, IndexError, RuntimeError, ZeroDivisionError) as e:
            if isinstance(e, InvalidArgumentError) and "\n  File " in str(e):
                raise
            self.fail(s, str(e))
        finally:
            self.kb._at = outer

    def s_Pass(self, s):
        pass

    def s_Assert(self, s: ast.Assert):
        """`assert cond[, "message"]`: checked on the device; a failing invocation makes the
        launch raise vkad.DeviceError with the message (default: the condition's source), this
        line, the invocation's index and the compared values (`assert a < b`)."""
        if s.msg is not None and not (isinstance(s.msg, ast.Constant) and
                                      isinstance(s.msg.value, str)):
            self.fail(s.msg, "an assert's message is a string constant")
        message = s.msg.value if s.msg is not None else ast.unparse(s.test)
        self.assert_test, self.assert_operands = s.test, []
        try:
            cond = self.expr(s.test)
        finally:
            self.assert_test = None
        if _is_const(cond):  # known while building: checked now
            if not cond:
                self.fail(s, f"assert {message}: false where the kernel is built")
            return
        if _kdtype(cond) != DType.bool:
            self.fail(s.test, f"an assert's condition is a bool, got {_describe(cond)}")
        values = [v for v in self.assert_operands if _kdtype(v) is not None and
                  not isinstance(v, _m._Tensor) and not _is_const(v)]
        self.kb.assert_(cond, message, *values)

    def print_call(self, node: ast.Call) -> None:
        """`print(a, "text", f"x = {x}", sep=" ")` in a kernel: a line per invocation, printed
        by the host when the launch retires (docs/debugging.md); vectors and matrices print
        their components."""
        if node is not self.stmt_call:
            self.fail(node, "print(...) is a statement: call it on a line of its own")
        sep = " "
        for k in node.keywords:
            if k.arg == "sep" and isinstance(k.value, ast.Constant) and \
                    isinstance(k.value.value, str):
                sep = k.value.value
            else:
                self.fail(k, "print in a kernel takes values and sep=\"...\" (a constant)")
        pieces, values = [], []

        def piece(n: ast.AST) -> str:
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                return n.value
            if isinstance(n, ast.JoinedStr):
                text = ""
                for part in n.values:
                    if isinstance(part, ast.FormattedValue):
                        if part.format_spec is not None or part.conversion != -1:
                            self.fail(part, "a kernel's f-string formats values as print does "
                                            "(no format spec or !r)")
                        text += piece(part.value)
                    else:
                        text += str(part.value)
                return text
            if isinstance(n, ast.Starred):
                self.fail(n, "print(*...) is not in the kernel subset")
            v = self.expr(n)
            return self.print_value(n, v, values)

        for a in node.args:
            pieces.append(piece(a))
        if len(values) > 16:
            self.fail(node, f"print records at most 16 values, got {len(values)}")
        self.kb.print_(sep.join(pieces), *values)

    def print_value(self, node: ast.AST, v, values: list) -> str:
        """`{}` for a kernel value (added to `values`), nested brackets of them for a vector or
        a matrix, the text of a value known while building."""
        if isinstance(v, _m._Tensor):
            comps = ["{}"] * len(v.flat)
            values.extend(self.kb._as_value(c, v.dtype) for c in v.flat)
            if len(v.shape) == 1:
                return "[" + ", ".join(comps) + "]"
            n = v.shape[1]
            return "[" + ", ".join("[" + ", ".join(comps[r * n:(r + 1) * n]) + "]"
                                   for r in range(v.shape[0])) + "]"
        if _is_const(v) or isinstance(v, str):
            return str(v)
        if _kdtype(v) is None:
            self.fail(node, f"print of {_describe(v)}")
        values.append(self.kb._as_value(v, None))
        return "{}"

    def s_Expr(self, s):
        if isinstance(s.value, ast.Constant):  # a docstring or a bare constant
            return
        outer, self.stmt_call = self.stmt_call, s.value
        try:
            self.expr(s.value)
        finally:
            self.stmt_call = outer

    def no_result(self, node: ast.Call, what: str) -> None:
        """An atomic add is a statement: the IR's atomic yields no value, so the old value that
        Taichi's ti.atomic_add and Warp's wp.atomic_add return cannot be had. Used as a value,
        it is refused here rather than read as None."""
        if node is not self.stmt_call:
            self.fail(node, f"{what} is a statement here: it does not return the old value "
                            "(Taichi's and Warp's atomic_add do; vkad's atomic add yields none), "
                            "so its result cannot be used. Call it on a line of its own")

    def s_Assign(self, s: ast.Assign):
        v = self.expr(s.value)
        for t in s.targets:
            self.assign_target(t, v, s)

    def s_AnnAssign(self, s: ast.AnnAssign):
        if s.value is None:
            self.fail(s, "a declaration without a value: give one (`acc: vkad.f32 = 0.0`)")
        if not isinstance(s.target, ast.Name):
            self.fail(s.target, "an annotated assignment names a local (`acc: vkad.f32 = 0.0`)")
        ann = self.expr(s.annotation, const_only=True)
        if isinstance(ann, ScalarType):
            ann = ann.dtype
        if isinstance(ann, type) and ann in (int, float, bool):
            ann = _dtype_arg(ann, "local")
        if not isinstance(ann, DType):
            self.fail(s.annotation, f"a local's annotation is a dtype (vkad.f32, ...), got "
                                    f"{ann!r}")
        v = self.expr(s.value)
        v = self.convert(v, ann, s.value, f"'{s.target.id}: {ann.name}'")
        self.assign_target(s.target, v, s)

    def convert(self, v, dt: DType, node, what: str):
        if isinstance(v, bool) or isinstance(v, (int, float)):
            if dt in _INTS and isinstance(v, float) and not v.is_integer():
                self.fail(node, f"{what}: {v!r} is not an integer")
            return self.kb.constant(v, dt)
        t = _kdtype(v)
        if isinstance(v, _m._Tensor):
            if v.dtype is None:
                return v.cast(dt)
            if v.dtype != dt:
                self.fail(node, f"{what}: the value is {_describe(v)} (vkad.cast it)")
            return v
        if t is None:
            self.fail(node, f"{what}: the value is {_describe(v)}")
        if t != dt:
            self.fail(node, f"{what}: the value is {t.name} (cast it: vkad.{dt.name}(x) or "
                            "vkad.cast(x, dtype))")
        return v

    def s_AugAssign(self, s: ast.AugAssign):
        op = _OPS.get(type(s.op))
        if op is None:
            self.fail(s, f"augmented assignment {type(s.op).__name__} is not in the subset")
        t = s.target
        if isinstance(t, ast.Subscript):
            base = self.expr(t.value)
            if isinstance(base, _b.Array):
                idx = self.index(t.slice)
                rhs = self.expr(s.value)
                if isinstance(s.op, (ast.Add, ast.Sub)):
                    # x[i] += v: an atomic add, as Taichi and Warp make it
                    if isinstance(s.op, ast.Sub):
                        rhs = -rhs
                    base.atomic_add(idx, self.typed_for(base, rhs))
                    return
                cur = base[idx]
                base[idx] = self.binop(s.op, cur, rhs, s)
                return
        cur = self.expr(_load_copy(t))
        rhs = self.expr(s.value)
        self.assign_target(t, self.binop(s.op, cur, rhs, s), s)

    def typed_for(self, arr: _b.Array, v):
        if _is_const(v) and not isinstance(v, tuple):
            return self.kb.constant(v, arr.dtype) if not arr.element else v
        return v

    def s_If(self, s: ast.If):
        if self.try_static_test(s.test):
            self.stmts(s.body if self.static_test_value(s) else s.orelse)
            return
        c = self.cond(s.test)
        if _is_const(c):
            self.stmts(s.body if c else s.orelse)
            return
        with self.kb.if_(c):
            self.open_block(self.runtime_elem(s, 0))
            try:
                self.stmts(s.body)
            finally:
                self.close_block()
        if s.orelse:
            with self.kb.else_():
                self.open_block(self.runtime_elem(s, 1))
                try:
                    self.stmts(s.orelse)
                finally:
                    self.close_block()

    def try_static_test(self, test) -> bool:
        sc = self.scope
        names = set(sc.names) | set(sc.mutables)
        return _static_test(test, names, sc.captured)

    def static_test_value(self, s) -> bool:
        v = self.expr(s.test, const_only=True)
        if not _is_const(v):
            self.fail(s.test, "vkad.static(...) needs a value known while the kernel is built, "
                              f"got {_describe(v)}")
        return bool(v)

    def cond(self, node):
        c = self.expr(node)
        if _is_const(c):
            return c
        t = _kdtype(c)
        if isinstance(c, _m._Tensor) or t is None:
            self.fail(node, f"a condition is a bool (or a number), got {_describe(c)}")
        if t != DType.bool:
            c = c != 0  # Python's truth of a number
        return c

    def s_For(self, s: ast.For):
        sc = self.scope
        if s.orelse:
            self.fail(s.orelse[0], "a for loop's `else` is not in the kernel subset")
        if self._is_static_call(s.iter):
            sc.loops.append(("static", len(sc.path)))
            try:
                for v in self.static_iter(s):
                    self.assign_target(s.target, v, s)
                    try:
                        self.stmts(s.body)
                    except _StaticContinue:
                        continue
                    except _StaticBreak:
                        break
            finally:
                sc.loops.pop()
            return
        it = s.iter
        bound = None
        if isinstance(it, ast.Call) and self.callee(it.func) is max_trip:
            if len(it.args) != 2:
                self.fail(it, "vkad.max_trip(range(...), n)")
            bound = self.expr(it.args[1], const_only=True)
            it = it.args[0]
        if not (isinstance(it, ast.Call) and self.callee(it.func) is builtins.range):
            if isinstance(it, ast.Call) and self.callee(it.func) is ndrange:
                self.fail(it, "vkad.ndrange is the kernel's outermost (parallel) loop only; "
                              "nest range loops inside")
            self.fail(it, "a loop inside the parallel loop is `for k in range(...)` or "
                          "`for k in vkad.static(...)` (unrolled)")
        if it.keywords or not 1 <= len(it.args) <= 3:
            self.fail(it, "range(end), range(begin, end) or range(begin, end, step)")
        args = [self.expr(a) for a in it.args]
        if len(args) == 3:
            step = args[2]
            if step != 1 or not isinstance(step, int):
                self.fail(it.args[2], "a serial loop's step is 1 (or unroll it: "
                                      "vkad.static(range(...)))")
            args = args[:2]
        b, e = (0, args[0]) if len(args) == 1 else args
        for a, n in zip((b, e), it.args if len(it.args) > 1 else it.args[:1]):
            t = _kdtype(a)
            if not (isinstance(a, int) and not isinstance(a, bool)) and t not in (DType.i32,):
                self.fail(n, f"a range bound is an int or an i32 value, got {_describe(a)}")
        if not isinstance(s.target, ast.Name):
            self.fail(s.target, "a serial loop has one index: `for k in range(...)`")
        with self.kb.for_range(b, e, bound) as k:
            self.open_block(self.runtime_elem(s, 0))
            sc.loops.append(("runtime", len(sc.path)))
            try:
                self.bind_loop_target(s.target, k, s)
                self.stmts(s.body)
            finally:
                sc.loops.pop()
                self.close_block()

    def static_iter(self, s: ast.For):
        it = self.expr(s.iter.args[0], const_only=True, static=True) if s.iter.args else None
        if len(s.iter.args) != 1:
            self.fail(s.iter, "vkad.static takes one value")
        try:
            return list(it)
        except TypeError:
            self.fail(s.iter, f"vkad.static(...) of a loop is iterable while the kernel is "
                              f"built (a range, a tuple), got {_describe(it)}")

    def s_While(self, s: ast.While):
        sc = self.scope
        if s.orelse:
            self.fail(s.orelse[0], "a while loop's `else` is not in the kernel subset")
        test, bound = s.test, None
        if isinstance(test, ast.Call) and self.callee(test.func) is max_trip:
            if len(test.args) != 2:
                self.fail(test, "vkad.max_trip(condition, n)")
            bound = self.expr(test.args[1], const_only=True)
            test = test.args[0]
        fails = []

        def build():
            try:
                c = self.cond(test)
            except _Fail as f:
                fails.append(f)
                return True
            if _is_const(c):
                fails.append(_Fail(test, "a while loop's condition is a kernel value; a "
                                         "constant one never ends or never runs"))
                return True
            return c

        with self.kb.while_(build, bound):
            if fails:
                raise fails[0]
            self.open_block(self.runtime_elem(s, 0))
            sc.loops.append(("runtime", len(sc.path)))
            try:
                self.stmts(s.body)
            finally:
                sc.loops.pop()
                self.close_block()

    def s_Break(self, s):
        self._jump(s, "break")

    def s_Continue(self, s):
        self._jump(s, "continue")

    def _jump(self, s, what: str):
        sc = self.scope
        if not sc.loops:
            self.fail(s, f"`{what}` outside a loop")
        kind, depth = sc.loops[-1]
        if kind in ("parallel", "thread") and what == "break":
            self.fail(s, "`break` in the parallel loop: its iterations are threads (`continue` "
                         "or `return` ends this one)")
        if kind == "static":
            # a Python-level break / continue of an unrolled loop; not under a runtime if
            if len(sc.path) > depth:
                self.fail(s, f"`{what}` of a vkad.static (unrolled) loop under a runtime `if`: "
                             "the unrolled copies are fixed while the kernel is built (use a "
                             "range loop)")
            raise _StaticBreak() if what == "break" else _StaticContinue()
        (self.kb.break_ if what == "break" else self.kb.continue_)()

    def s_Return(self, s: ast.Return):
        if self.inline_depth == 0:
            sc = self.scope
            if s.value is None and sc.loops and sc.loops[-1][0] == "thread":
                self.kb.continue_()  # Warp's early exit: this thread's iteration ends
                return
            if s.value is None:
                self.fail(s, "a bare `return` ends a thread's iteration in the parallel loop, "
                             "not inside a serial or unrolled loop (`break` out of it first)")
            self.fail(s, "a kernel returns nothing: write results into an array")
        sc = self.scope
        if len(sc.path) > 0 and any(e[0][0] != "func" for e in sc.path):
            self.fail(s, "a @vkad.func returns at its end (or in a vkad.static branch), not "
                         "inside a loop or a runtime if: assign a local and return it after")
        raise _Return(None if s.value is None else self.expr(s.value))

    # --- assignment ---
    def bind_loop_target(self, target, idx, node):
        sc = self.scope
        if isinstance(idx, tuple):
            if not all(isinstance(t, ast.Name) for t in target.elts):
                self.fail(target, "the loop's indices are names: `for i, j in ...`")
            pairs = [(t.id, v) for t, v in zip(target.elts, idx)]
        else:
            pairs = [(target.id, idx)]
        for n, v in pairs:
            if n in sc.names and n != "_":
                self.fail(target, f"the loop index '{n}' hides a name already bound: use "
                                  "another name")
            self.bind_ssa(n, v, target)
            sc.loop_indices.add(n)
            sc.block_names[-1].append("\0index:" + n)

    def assign_target(self, t, v, node, ssa_only: bool = False):
        if isinstance(t, ast.Name):
            self.assign_name(t.id, v, t, ssa_only)
        elif isinstance(t, (ast.Tuple, ast.List)):
            if isinstance(v, (_m.Vector, tuple, list)):
                vals = list(v)
            elif isinstance(v, _m.Matrix):
                vals = list(v)
            else:
                self.fail(t, f"unpacking {_describe(v)}: a tuple, a Vector or a Matrix unpacks")
            if len(vals) != len(t.elts):
                self.fail(t, f"unpacking {len(vals)} values into {len(t.elts)} names")
            for e, x in zip(t.elts, vals):
                self.assign_target(e, x, node, ssa_only)
        elif isinstance(t, ast.Subscript):
            base = self.expr(t.value)
            if isinstance(base, _b.Array):
                idx = self.index(t.slice)
                base[idx] = self.typed_for(base, v)
            elif isinstance(base, _m._Tensor) and isinstance(t.value, ast.Name):
                self.assign_name(t.value.id, self.set_component(base, t, v), t.value)
            else:
                self.fail(t, f"assignment into {_describe(base)}: arrays and vector / matrix "
                             "locals take item assignment")
        else:
            self.fail(t, "this assignment target is not in the kernel subset")

    def set_component(self, base: _m._Tensor, t: ast.Subscript, v):
        idx = self.expr(t.slice, const_only=True)
        flat = list(base.flat)
        if isinstance(base, _m.Vector):
            if not isinstance(idx, int):
                self.fail(t.slice, "a vector's component is a Python int")
            flat[idx % base.n] = v
        else:
            if not (isinstance(idx, tuple) and len(idx) == 2):
                self.fail(t.slice, "a matrix component is M[i, j], Python ints")
            flat[(idx[0] % base.n) * base.m + idx[1] % base.m] = v
        return base._make(base.shape, flat, base.dtype)

    def bind_ssa(self, name, v, node):
        sc = self.scope
        if name not in sc.names:
            sc.block_names[-1].append(name)
        sc.names[name] = v

    def assign_name(self, name: str, v, node, ssa_only: bool = False):
        sc = self.scope
        if isinstance(v, _b.Local):
            v = v.load()
        elif isinstance(v, _m.TensorLocal):
            v = v.load()
        if name in sc.loop_indices:
            self.fail(node, f"'{name}' is a loop index: assign a new name")
        if name in sc.kernel_names and len(sc.block_names) > 1:
            self.fail(node, f"'{name}' is a kernel parameter or a kernel-level name: "
                            "assign a new name inside the loop")
        if name not in sc.mutables or ssa_only:
            old = sc.names.get(name)
            if old is not None and not _is_const(old) and not _is_const(v):
                told, tnew = _typekey(old), _typekey(v)
                if isinstance(told, tuple) and isinstance(tnew, tuple) and told[0] == tnew[0] \
                        and None in (told[1], tnew[1]):
                    told = tnew  # a vector of numbers takes the type of what it meets
                if told != tnew and told is not None and tnew is not None:
                    self.fail(node, f"'{name}' changes type: it was {_describe(old)}, now "
                                    f"{_describe(v)} (a local keeps its type; cast, or use "
                                    "another name)")
            self.bind_ssa(name, v, node)
            return
        cur = sc.names.get(name)
        if not isinstance(cur, _Mutable):
            cur = self.make_mutable(name, v, node)
            sc.names[name] = cur
        self.store_mutable(name, cur, v, node)

    def make_mutable(self, name, v, node) -> _Mutable:
        sc = self.scope
        lca = set(sc.mutables[name])
        # the block of the deepest path element the local's assignments share that is open
        # as a builder block (an `if` picked at compile time opens none)
        depth = sc.base_depth
        for elem, kb_len in sc.path:
            if elem[0] in ("serial", "func") or elem in lca:
                depth = kb_len
        if depth == 0:
            self.fail(node, f"'{name}' is assigned in two tasks (two top-level loops): a local "
                            "lives in one; use another name")
        if isinstance(v, _m._Tensor):
            dt = v.dtype or self.fp
            shape = v.shape
        elif isinstance(v, bool):
            dt, shape = DType.bool, ()
        elif isinstance(v, int):
            dt, shape = DType.i32, ()
        elif isinstance(v, float):
            dt, shape = self.fp, ()
        else:
            dt, shape = _kdtype(v), ()
            if dt is None:
                self.fail(node, f"'{name}' is assigned in more than one block (an if's "
                                f"branches, a loop and before it), so it is a local; a local "
                                f"holds a number, a vector or a matrix, not {_describe(v)}")
        block = self.kb._stack[depth - 1]
        ids = []
        n = 1
        for e in shape:
            n *= e
        for _ in range(n):
            id_ = self.kb._fresh()
            line = f"%{id_} = alloca : {dt.name}"
            if depth == len(self.kb._stack):
                block.append(line)
            else:
                block.insert(len(block) - 1, line)  # before the open if / loop node
            ids.append(_b.Local(self.kb, id_, dt))
        loc = ids[0] if not shape else _m.TensorLocal(self.kb, shape, dt, ids)
        mv = _Mutable(loc, dt, shape, node)
        # a local lives in the block it was made in; dropped with it (not an SSA name)
        for k in range(len(sc.path) - 1, -1, -1):
            if sc.path[k][1] == depth:
                sc.block_names[k + 1].append(name)
                break
        else:
            sc.block_names[0].append(name)
        return mv

    def store_mutable(self, name, mv: _Mutable, v, node):
        where = f"'{name}' (a {mv.dtype.name}{' ' + _m._shape_name(mv.shape) if mv.shape else ''}" \
                f" local, first assigned on line {mv.node.lineno})"
        if mv.shape:
            if not isinstance(v, _m._Tensor) or v.shape != mv.shape:
                self.fail(node, f"{where} changes type: assigned {_describe(v)}")
            if v.dtype is not None and v.dtype != mv.dtype:
                self.fail(node, f"{where} changes type: assigned {_describe(v)}")
            mv.loc.store(v if v.dtype is not None else v.cast(mv.dtype))
            return
        if isinstance(v, _m._Tensor) or (not _is_const(v) and _kdtype(v) is None):
            self.fail(node, f"{where} changes type: assigned {_describe(v)}")
        if _is_const(v):
            if isinstance(v, float) and mv.dtype in _INTS and not v.is_integer():
                self.fail(node, f"{where} changes type: assigned the float {v!r}")
            if isinstance(v, (tuple, str)) or v is None:
                self.fail(node, f"{where} changes type: assigned {_describe(v)}")
            mv.loc.store(self.kb.constant(v, mv.dtype))
            return
        t = _kdtype(v)
        if t != mv.dtype:
            self.fail(node, f"{where} changes type: assigned {t.name} (cast it: "
                            f"vkad.{mv.dtype.name}(x))")
        mv.loc.store(v)

    # --- expressions ---
    def expr(self, node, const_only: bool = False, static: bool = False):
        m = getattr(self, "e_" + type(node).__name__, None)
        if m is None:
            self.fail(node, f"{_expr_word(node)} is not in the kernel subset")
        try:
            v = m(node, static) if m.__code__.co_argcount > 2 else m(node)
        except (_Fail, _StaticBreak, _StaticContinue, _Return):
            raise
        except (TypeError, ValueError, IndexError, RuntimeError, ZeroDivisionError,
                AttributeError, KeyError) as e:
            if isinstance(e, InvalidArgumentError) and "\n  File " in str(e):
                raise
            self.fail(node, str(e).strip("'\"") if isinstance(e, KeyError) else str(e))
        if const_only and not _is_const(v) and not isinstance(v, (ScalarType, ArrayType)):
            if not (static and isinstance(v, (range, list))):
                self.fail(node, f"a value known while the kernel is built is needed here, "
                                f"got {_describe(v)}")
        return v

    def e_Constant(self, node):
        v = node.value
        if isinstance(v, (bool, int, float)) or v is None:
            return v
        if isinstance(v, str):
            return v
        self.fail(node, f"the constant {v!r} is not a kernel value")

    def e_Name(self, node: ast.Name):
        sc = self.scope
        name = node.id
        if name in sc.names:
            v = sc.names[name]
            if isinstance(v, _Mutable):
                return v.loc.load()
            return v
        if name in sc.mutables and name not in sc.dropped:
            self.fail(node, f"'{name}' is read before it is assigned")
        if name in sc.dropped or name in sc.mutables:
            self.fail(node, f"'{name}' is assigned only inside a block that has ended (an if "
                            "branch or a loop body) or a task of its own: assign it before the "
                            "block to use it after")
        try:
            v = sc.captured(name)
        except KeyError:
            self.fail(node, f"undefined name '{name}'")
        return self.capture(name, v, node)

    def capture(self, name, v, node):
        if isinstance(v, _np.generic):
            v = v.item()
        if _is_const(v) or isinstance(v, (KernelFunction, Func)) or inspect.ismodule(v) \
                or callable(v) or isinstance(v, (ScalarType, ArrayType, ElementType)):
            if isinstance(v, list):
                self.fail(node, f"'{name}' is a list: a kernel captures numbers, bools and "
                                "tuples as constants (a list may change: make it a tuple)")
            self.captured[(id(self.scope.fn), name)] = v
            if isinstance(v, Func):  # how the kernel reaches the func (the disk cache's path)
                self.func_parent.setdefault(id(v.fn), (id(self.scope.fn), name))
            return v
        kind = type(v).__name__
        hint = ""
        if isinstance(v, list):
            hint = " (a list may change: make it a tuple)"
        elif isinstance(v, _np.ndarray):
            hint = " (pass it as an array argument)"
        elif type(v).__name__ == "NdArray":
            hint = " (pass it as an argument; kernels take arrays through their parameters)"
        self.fail(node, f"'{name}' is a {kind} of the enclosing scope: a kernel captures "
                        f"numbers, bools, tuples and dtypes as constants{hint}")

    def e_Attribute(self, node: ast.Attribute):
        base = self.expr(node.value)
        a = node.attr
        if a.startswith("_"):
            self.fail(node, f"attribute '{a}' is not in the kernel subset")
        if inspect.ismodule(base) or isinstance(base, type):
            try:
                return getattr(base, a)
            except AttributeError:
                self.fail(node, f"{getattr(base, '__name__', base)} has no attribute '{a}'")
        if isinstance(base, _b.Array):
            if a == "shape":
                return base.shape
            if a == "atomic_add":
                return base.atomic_add
            self.fail(node, f"ndarray '{base.name}': .{a} is not in the kernel subset "
                            "(.shape, x[i], vkad.atomic_add(x[i], v))")
        if isinstance(base, (_m._Tensor, _m.TensorLocal)):
            if not hasattr(base, a):
                self.fail(node, f"{_describe(base)} has no '{a}'")
            return getattr(base, a)
        if isinstance(base, (_b.Value, _b.Scalar, _b.Local, _b.Dim)) and a in ("cast", "dtype"):
            return getattr(self.kb._as_value(base, None), a)
        if _is_const(base) and not isinstance(base, (tuple, str)):
            return getattr(base, a)
        self.fail(node, f"attribute '{a}' of {_describe(base)} is not in the kernel subset")

    def e_Tuple(self, node, static=False):
        return tuple(self.expr(e, static=static) for e in node.elts)

    def e_List(self, node, static=False):
        return [self.expr(e, static=static) for e in node.elts]

    def e_Slice(self, node):
        self.fail(node, "slices are not in the kernel subset")

    def e_UnaryOp(self, node: ast.UnaryOp):
        v = self.expr(node.operand)
        if isinstance(node.op, ast.Not):
            if _is_const(v):
                return not v
            if isinstance(v, _m._Tensor) or _kdtype(v) is None:
                self.fail(node, f"`not` of {_describe(v)}")
            c = (v != 0) if _kdtype(v) != DType.bool else v
            return ~c
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return +v
        if isinstance(node.op, ast.Invert):
            if _is_const(v):
                return ~v
            if _kdtype(v) == DType.bool:
                return ~v
        self.fail(node, f"unary {type(node.op).__name__} is not in the kernel subset")

    def e_BinOp(self, node: ast.BinOp):
        a, b = self.expr(node.left), self.expr(node.right)
        return self.binop(node.op, a, b, node)

    def binop(self, op_node, a, b, node):
        op = _OPS.get(type(op_node))
        if op is None:
            self.fail(node, f"operator {type(op_node).__name__} is not in the kernel subset")
        if _is_const(a) and _is_const(b):
            return op(a, b)
        ta, tb = _kdtype(a), _kdtype(b)
        # Python's int-with-float and int / int give a float: cast the integer kernel value
        # to the kernel's float type (Taichi does the same)
        if not isinstance(a, _m._Tensor) and not isinstance(b, _m._Tensor):
            if ta in _INTS and (isinstance(b, float) or
                                (isinstance(op_node, ast.Div) and (tb in _INTS or
                                                                    isinstance(b, int)))):
                a = _b.cast(a, self.fp)
                if tb in _INTS:
                    b = _b.cast(b, self.fp)
            elif tb in _INTS and (isinstance(a, float) or
                                  (isinstance(op_node, ast.Div) and isinstance(a, int))):
                b = _b.cast(b, self.fp)
            a, b = self.promote(a, b)
            ta, tb = _kdtype(a), _kdtype(b)
            if (ta is not None and tb is not None and ta != tb
                    and not isinstance(op_node, (ast.BitAnd, ast.BitOr))):
                self.fail(node, f"{type(op_node).__name__.lower()}: types {ta.name} and "
                                f"{tb.name} differ (cast one: vkad.{ta.name}(x) or "
                                f"vkad.{tb.name}(x))")
        r = op(a, b)
        if r is NotImplemented:
            self.fail(node, f"{_describe(a)} {type(op_node).__name__} {_describe(b)}")
        return r

    def e_BoolOp(self, node: ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        acc = None
        for e in node.values:
            v = self.expr(e)
            if _is_const(v):
                if is_and and not v:
                    return v if acc is None else False
                if not is_and and v:
                    return v if acc is None else True
                continue  # the constant does not change a kernel value's result
            if isinstance(v, _m._Tensor) or _kdtype(v) is None:
                self.fail(e, f"`and` / `or` of {_describe(v)}")
            c = (v != 0) if _kdtype(v) != DType.bool else v
            acc = c if acc is None else ((acc & c) if is_and else (acc | c))
        if acc is None:
            return v
        return acc

    def e_Compare(self, node: ast.Compare):
        left = self.expr(node.left)
        result = None
        for op, right_node in zip(node.ops, node.comparators):
            right = self.expr(right_node)
            f = _CMPS.get(type(op))
            if f is None:
                self.fail(node, f"comparison {type(op).__name__} is not in the kernel subset")
            if (_is_const(left) and _is_const(right)) or type(op) in (ast.Is, ast.IsNot):
                r = f(left, right)  # `is`: Python's identity, known while building
            else:
                if type(op) in (ast.In, ast.NotIn):
                    self.fail(node, f"`{type(op).__name__}` compares values known while the "
                                    "kernel is built; kernel values compare with == < ...")
                ta, tb = _kdtype(left), _kdtype(right)
                if isinstance(left, _m._Tensor) or isinstance(right, _m._Tensor):
                    self.fail(node, "compare vector / matrix components, not whole ones")
                if ta in _INTS and isinstance(right, float):
                    left = _b.cast(left, self.fp)
                elif tb in _INTS and isinstance(left, float):
                    right = _b.cast(right, self.fp)
                else:
                    left, right = self.promote(left, right)
                    ta, tb = _kdtype(left), _kdtype(right)
                    if ta is not None and tb is not None and ta != tb:
                        self.fail(node, f"comparison: types {ta.name} and {tb.name} differ")
                r = f(left, right)
            if result is None:
                result = r
            elif _is_const(result) and _is_const(r):
                result = result and r
            elif _is_const(result):
                result = r if result else False
            elif _is_const(r):
                result = result if r else False
            else:
                result = result & r
            if node is self.assert_test and len(node.ops) == 1:
                self.assert_operands = [left, right]  # what a failed assert reports
            left = right
        return result

    def e_IfExp(self, node: ast.IfExp):
        c = self.cond(node.test)
        if _is_const(c):
            return self.expr(node.body if c else node.orelse)
        a, b = self.expr(node.body), self.expr(node.orelse)
        if not isinstance(a, _m._Tensor) and not isinstance(b, _m._Tensor):
            a, b = self.unify(a, b, node)
        if _is_const(a) and _is_const(b) and not isinstance(a, _m._Tensor):
            t = self.fp if isinstance(a, float) or isinstance(b, float) else DType.i32
            if isinstance(a, bool) and isinstance(b, bool):
                t = DType.bool
            a = self.kb.constant(a, t)
        return _b.select(c, a, b)

    def e_Subscript(self, node: ast.Subscript):
        base = self.expr(node.value)
        if isinstance(base, _b.Array):
            return base[self.index(node.slice)]
        idx = self.expr(node.slice)
        if isinstance(base, (_m._Tensor, tuple, list, _b._Shape, str, range)):
            if not _is_const(idx):
                self.fail(node.slice, f"{_describe(base)} is indexed with Python ints (its "
                                      "size is fixed when the kernel is built)")
            return base[idx]
        self.fail(node, f"{_describe(base)} cannot be indexed")

    def index(self, sl):
        v = self.expr(sl)
        if isinstance(v, list):
            v = tuple(v)
        return v

    # --- calls ---
    def callee(self, fnode):
        """The object a call's function expression names, without building anything."""
        try:
            return self.expr(fnode) if not isinstance(fnode, ast.Lambda) else None
        except _Fail:
            return None

    def e_Call(self, node: ast.Call, static: bool = False):
        f = self.expr(node.func)
        if f is static_fn:
            if len(node.args) != 1 or node.keywords:
                self.fail(node, "vkad.static takes one value")
            return self.expr(node.args[0], static=True)
        if f is atomic_add or f is atomic_sub:
            return self.atomic(node, f is atomic_sub)
        if f is builtins.print:
            return self.print_call(node)
        if isinstance(f, Func):
            return self.inline(f, node)
        if isinstance(f, KernelFunction):
            self.fail(node, f"kernel '{f.name}' is launched from Python, not called in a "
                            "kernel (make the helper a @vkad.func)")
        if f is max_trip:
            self.fail(node, "vkad.max_trip wraps a while condition or a for loop's range")
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                v = self.expr(a.value)
                if not isinstance(v, (tuple, list, _m.Vector)):
                    self.fail(a, f"*{_describe(v)}: a tuple or a Vector unpacks into arguments")
                args.extend(v)
            else:
                args.append(self.expr(a, static=static))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                self.fail(k, "**kwargs is not in the kernel subset")
            kwargs[k.arg] = self.expr(k.value)
        all_const = all(_is_const(a) for a in args) and all(_is_const(v) for v in kwargs.values())
        if f is builtins.len and len(args) == 1 and not kwargs:
            return len(args[0])  # a tuple's, a vector's, x.shape's: known while building
        if f is builtins.range or f is ndrange:
            if all_const and static:
                return f(*args)
            self.fail(node, f"{f.__name__}(...) is a loop's iterable: `for k in range(...)` "
                            "(or vkad.static(range(...)) unrolled)")
        if all_const and f in _CONST_EVAL:
            return _CONST_EVAL[f](*args)
        if f is _b.cast and len(args) == 2 and _is_const(args[0]) and isinstance(args[1], DType):
            return self.kb.constant(args[0], args[1]) if self.kb._stack else args[0]
        if isinstance(f, DType):  # vkad.f32(x): a cast
            if len(args) != 1 or kwargs:
                self.fail(node, f"vkad.{f.name}(x) casts one value")
            x = args[0]
            if _is_const(x):
                return self.kb.constant(x, f) if self.kb._stack else x
            if isinstance(x, _m._Tensor):
                return x.cast(f)
            return _b.cast(x, f) if _kdtype(x) != f else self.kb._as_value(x, None)
        if f is builtins.float or f is builtins.int or f is builtins.bool:
            if all_const:
                return f(*args)
            t = {builtins.float: self.fp, builtins.int: DType.i32, builtins.bool: DType.bool}[f]
            if len(args) != 1:
                self.fail(node, f"{f.__name__}(x) of one value")
            x = args[0]
            if isinstance(x, _m._Tensor) or _kdtype(x) is None:
                self.fail(node, f"{f.__name__}() of {_describe(x)}")
            if t == DType.bool:
                return x if _kdtype(x) == DType.bool else x != 0
            return _b.cast(x, t) if _kdtype(x) != t else x
        if all_const and (f in _PY_CONST_FUNCS or f in _MATH or static
                          or getattr(f, "__module__", None) == "math"):
            return f(*args, **kwargs)
        if f in (builtins.min, builtins.max, _b.min, _b.max):
            fn = _b.min if f in (builtins.min, _b.min) else _b.max
            if len(args) < 2 or kwargs:
                self.fail(node, f"{f.__name__}(a, b, ...) of values")
            if any(isinstance(a, _m._Tensor) for a in args):
                self.fail(node, f"{f.__name__} of vectors: take it per component")
            acc = args[0]
            for a in args[1:]:
                acc = fn(*self.unify(acc, a, node))
            return acc
        if f in _MATH:
            f = _MATH[f]
        if f in _BUILDER_FUNCS:
            if f in (_b.pow, _b.atan2):
                args = list(self.unify(args[0], args[1], node)) if len(args) == 2 else args
            if any(isinstance(a, _m._Tensor) for a in args) and f not in (
                    _b.select, _m.polar_decompose):
                if len(args) == 1:
                    return args[0].map(f)
            if f is _b.select and len(args) == 3 and _is_const(args[1]) and _is_const(args[2]):
                t = self.fp if isinstance(args[1], float) or isinstance(args[2], float) \
                    else DType.i32
                args[1] = self.kb.constant(args[1], t)
            if f is _b.cast and len(args) == 2 and isinstance(args[0], _m._Tensor):
                return args[0].cast(args[1])
            return f(*args, **kwargs)
        if isinstance(f, type) and issubclass(f, _m._Tensor):
            return f(*args, **kwargs)
        owner = getattr(f, "__self__", None)
        if isinstance(owner, (_m._Tensor, _m.TensorLocal)) or (
                inspect.isfunction(f) and getattr(f, "__qualname__", "").split(".")[0]
                in ("Vector", "Matrix", "_Tensor")):
            return f(*args, **kwargs)
        if isinstance(owner, _b.Array) and f.__name__ == "atomic_add":
            self.no_result(node, f"{owner.name}.atomic_add(...)")
            return f(*args, **kwargs)
        if owner is not None and _kdtype(owner) is not None:
            return f(*args, **kwargs)  # v.cast(dtype)
        if all_const and (static or f in (math.isclose,)):
            return f(*args, **kwargs)
        name = getattr(f, "__name__", repr(f))
        self.fail(node, f"'{name}' is not a kernel function: mark a helper @vkad.func, or "
                        f"compute a constant with vkad.static({name}(...))")

    def promote(self, a, b):
        """Python's numeric tower on kernel values: an integer beside a float is cast to the
        float's type (f32 beside f64, or two integer types, stay an error)."""
        ta, tb = _kdtype(a), _kdtype(b)
        if isinstance(a, _m._Tensor) or isinstance(b, _m._Tensor):
            return a, b
        if ta in _INTS and tb in _FLOATS:
            a = _b.cast(a, tb)
        elif tb in _INTS and ta in _FLOATS:
            b = _b.cast(b, ta)
        return a, b

    def unify(self, a, b, node):
        a, b = self.promote(a, b)
        ta, tb = _kdtype(a), _kdtype(b)
        if ta in _INTS and isinstance(b, float):
            a = _b.cast(a, self.fp)
        elif tb in _INTS and isinstance(a, float):
            b = _b.cast(b, self.fp)
        elif ta is not None and tb is not None and ta != tb:
            self.fail(node, f"types {ta.name} and {tb.name} differ (cast one)")
        return a, b

    def atomic(self, node: ast.Call, negate: bool):
        what = "vkad.atomic_sub" if negate else "vkad.atomic_add"
        if len(node.args) != 2 or node.keywords:
            self.fail(node, f"{what}(x[i], value)")
        self.no_result(node, what)
        t = node.args[0]
        if not isinstance(t, ast.Subscript):
            self.fail(t, f"{what}: the first argument is an array element, x[i]")
        base = self.expr(t.value)
        if not isinstance(base, _b.Array):
            self.fail(t.value, f"{what}: into an ndarray parameter's element, not "
                               f"{_describe(base)}")
        idx = self.index(t.slice)
        v = self.expr(node.args[1])
        if negate:
            v = -v
        base.atomic_add(idx, self.typed_for(base, v))
        return None

    def inline(self, f: "Func", node: ast.Call):
        if self.inline_depth > 32:
            self.fail(node, f"@vkad.func '{f.name}': calls nest more than 32 deep (recursion "
                            "is not in the kernel subset)")
        if not self.kb._stack:
            self.fail(node, f"@vkad.func '{f.name}' is called inside a loop of the kernel")
        fsrc = f.src
        fnode = fsrc.fn_node
        params = [a.arg for a in fnode.args.args]
        if fnode.args.vararg or fnode.args.kwarg or fnode.args.kwonlyargs:
            self.fail(fnode, "a @vkad.func has positional parameters only")
        args = [self.expr(a) for a in node.args]
        kw = {k.arg: self.expr(k.value) for k in node.keywords}
        defaults = fnode.args.defaults
        bound: Dict[str, Any] = {}
        for i, p in enumerate(params):
            if i < len(args):
                bound[p] = args[i]
            elif p in kw:
                bound[p] = kw.pop(p)
            else:
                k = i - (len(params) - len(defaults))
                if k < 0:
                    self.fail(node, f"@vkad.func '{f.name}': no value for parameter '{p}'")
                bound[p] = self._func_default(f, k)
        if len(args) > len(params) or kw:
            self.fail(node, f"@vkad.func '{f.name}' takes {len(params)} arguments "
                            f"({', '.join(params)})")
        outer = self.scope
        self.inlined.append(f)
        sc = _Scope(self, f.fn, fsrc, {}, len(self.kb._stack))
        sc.loops = []
        self.scope = sc
        self.inline_depth += 1
        try:
            # the parameters' annotations: checked (a number becomes a constant of the dtype)
            for a, p in zip(fnode.args.args, params):
                v = bound[p]
                if a.annotation is not None:
                    ann = self.expr(a.annotation, const_only=True)
                    if isinstance(ann, ScalarType):
                        ann = ann.dtype
                    if isinstance(ann, type) and ann in (int, float, bool):
                        ann = _dtype_arg(ann, "func")
                    if isinstance(ann, DType):
                        self.scope = outer
                        try:
                            v = self.convert(v, ann, node, f"@vkad.func '{f.name}' parameter "
                                                           f"'{p}: {ann.name}'")
                        finally:
                            self.scope = sc
                    elif isinstance(ann, ArrayType) and not isinstance(v, _b.Array):
                        self.scope = outer
                        self.fail(node, f"@vkad.func '{f.name}' parameter '{p}' is an array, "
                                        f"got {_describe(v)}")
                sc.names[p] = v
            sc.mutables = _analyze(fnode.body, params, sc.captured)
            for p in params:
                if p in sc.mutables:
                    v = sc.names.pop(p)
                    mv = self.make_mutable(p, v, fnode)
                    sc.names[p] = mv
                    self.store_mutable(p, mv, v, fnode)
            self.open_block(("func", id(node)))
            try:
                self.stmts(_strip_docstring(fnode.body))
            except _Return as r:
                return r.value
            finally:
                self.close_block()
            return None
        except (_StaticBreak, _StaticContinue):
            self.fail(node, "break / continue of a loop outside the @vkad.func")
        finally:
            self.inline_depth -= 1
            self.scope = outer

    def _func_default(self, f, k):
        d = f.fn.__defaults__[k]
        return d


static_fn = static


def _bstr(v) -> str:
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v
    return v._bound()


class _Bound(_b.Dim):
    """A task bound given as a size expression (add(shape(x, 0), -1)); a Dim for the
    builder's check of task bounds, never read as a value."""

    def __init__(self, text: str):
        self.text = text

    def _bound(self) -> str:
        return self.text


def _typekey(v):
    if isinstance(v, _m._Tensor):
        return (v.shape, v.dtype)
    if isinstance(v, _b.Array):
        return ("array", v.name)
    t = _kdtype(v)
    return t


def _load_copy(t: ast.AST) -> ast.AST:
    """The load form of an assignment target (for x += v)."""
    n = ast.parse(ast.unparse(t), mode="eval").body
    ast.copy_location(n, t)
    for a, b in zip(ast.walk(n), ast.walk(t)):
        ast.copy_location(a, b)
    return n


def _thread_exits(body) -> bool:
    """Whether a parallel loop's body has a `continue` or bare `return` of its own (not of a
    nested loop's)."""
    for st in body:
        if isinstance(st, ast.Continue) or (isinstance(st, ast.Return) and st.value is None):
            return True
        if isinstance(st, ast.If) and (_thread_exits(st.body) or _thread_exits(st.orelse)):
            return True
    return False


def _strip_docstring(body):
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _stmt_word(s) -> str:
    return {"Return": "return", "Delete": "del", "With": "with", "Raise": "raise",
            "Try": "try", "Assert": "assert", "Import": "import", "ImportFrom": "import",
            "Global": "global", "Nonlocal": "nonlocal", "FunctionDef": "def",
            "ClassDef": "class", "AsyncFunctionDef": "async def", "Match": "match",
            "AsyncFor": "async for", "AsyncWith": "async with"}.get(type(s).__name__,
                                                                   type(s).__name__)


def _expr_word(e) -> str:
    return {"Lambda": "a lambda", "ListComp": "a list comprehension",
            "DictComp": "a dict comprehension", "SetComp": "a set comprehension",
            "GeneratorExp": "a generator expression", "Dict": "a dict", "Set": "a set",
            "Await": "await", "Yield": "yield", "YieldFrom": "yield from",
            "JoinedStr": "an f-string", "NamedExpr": "an assignment expression (:=)",
            "Starred": "a starred expression"}.get(type(e).__name__, type(e).__name__)


# --- the decorated objects ---------------------------------------------------------------------

class Func:
    """A `@vkad.func` helper: inlined where a kernel (or another func) calls it. Called from
    plain Python it runs as the Python function."""

    def __init__(self, fn: Callable):
        self.fn, self.name = fn, fn.__name__
        self._src: Optional[_Source] = None
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def src(self) -> _Source:
        if self._src is None:
            self._src = _source(self.fn, "@vkad.func")
        return self._src

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<vkad.func {self.name}>"


def func(fn: Callable) -> Func:
    """Marks a helper that kernels call; it is inlined (its own annotations are checked)."""
    return Func(fn)


_LOWERED: Dict[tuple, "_Lowered"] = {}  # by (source, annotations, captured constants)
_NAMES: Dict[tuple, list] = {}  # by (source, annotations): the names a lowering captured
# Each entry of _NAMES is (where, name): `where` the path of func names from the kernel to the
# func that reads `name` ([] for the kernel itself), or the Func object for a func reached
# another way (a module's attribute: the same object for every definition). A path, not the
# Func: another definition of the same source (a kernel made again by a factory) has funcs of
# its own, whose closures hold its values.


def _name_paths(kfn, names, lw) -> list:
    """`names` ((owner Func or None, name), from a lowering by `lw`) as _NAMES keeps them."""
    kfid, out = id(kfn.fn), []
    for owner, name in names:
        if owner is None:
            out.append(([], name))
            continue
        path, fid = [], id(owner.fn)
        while fid != kfid:
            parent = lw.func_parent.get(fid)
            if parent is None:
                path = owner  # reached another way
                break
            fid, step = parent
            path.insert(0, step)
        out.append((path, name))
    return out


def _resolve_names(kfn, entries) -> Optional[list]:
    """_NAMES's entries as (owner Func or None, name) for kernel `kfn`: each path walked from
    kfn's own function; None where a step is not a func now (a miss: lowered again)."""
    names = []
    for where, name in entries:
        if not isinstance(where, list):
            names.append((where, name))
            continue
        owner, fn = None, kfn.fn
        for step in where:
            try:
                v = _Scope(None, fn, None, {}, 0).captured(step)
            except (KeyError, ValueError):
                return None
            if not isinstance(v, Func):
                return None
            owner, fn = v, v.fn
        names.append((owner, name))
    return names
_LOCK = threading.RLock()


class _Lowered:
    def __init__(self, builder: _b.KernelBuilder, ir: str, captured: Dict[Tuple[int, str], Any],
                 lines: Optional[Dict[str, Tuple]] = None):
        self.builder, self.ir, self.captured = builder, ir, captured
        self.elements = list(builder._elements)
        self.key = hashlib.sha256(ir.encode()).hexdigest()
        self.lines = lines or {}  # IR source location -> (file, line, col, end, text, func)
        with _LOCK:
            for k, loc in self.lines.items():
                _LOCATIONS.setdefault(k, loc)

    def locate(self, e: Exception) -> Exception:
        """`e` (a vkad.Error about this kernel) with the Python line of each statement its
        message quotes (`store x[%0], %6 @"f.py:12:9"`) appended: file, line, column, source
        and caret."""
        msg = str(e)
        locs = _quoted_locations(msg)
        if not locs:
            return e
        new = type(e)(msg + "".join(f"\n  {_where(loc)}" for loc in locs))
        new.filename, new.lineno, new.col_offset = locs[0][0], locs[0][1], locs[0][2] + 1
        return new


# Every location a lowering in this process wrote ("f.py:12:5" -> _where's tuple), for errors
# about kernels vkad derived from them (adjoints, graph-made kernels).
_LOCATIONS: Dict[str, Tuple] = {}


def _quoted_locations(msg: str) -> List[Tuple]:
    """The Python locations (_where's tuples) of the IR source locations (`@"f.py:12:5"`) a
    vkad message quotes, each once, in order. One no lowering of this process wrote (a kernel
    read from the disk cache) is read from its file."""
    out, seen = [], set()
    for key in re.findall(r'@"([^"]+)"', msg):
        if key in seen:
            continue
        seen.add(key)
        with _LOCK:
            loc = _LOCATIONS.get(key)
        if loc is None:
            m = re.fullmatch(r"(.*):(\d+):(\d+)", key)
            if m is None:
                continue
            line, col = int(m.group(2)), int(m.group(3)) - 1
            text = linecache.getline(m.group(1), line).rstrip("\n")
            loc = (m.group(1), line, col, col + 1, text, "")
        out.append(loc)
    return out


def _where(loc: Tuple) -> str:
    """`File "f.py", line 12, column 5 (in @vkad.func 'g')`, the source line and a caret, from
    a lowering's (file, line, col, end, text, func)."""
    filename, line, col, end, text, func = loc
    where = f" (in @vkad.func '{func}')" if func else ""
    return (f"File \"{filename}\", line {line}, column {col + 1}{where}\n    {text}\n    "
            f"{' ' * col}{'^' * (end - col)}")


def with_python_lines(msg: str) -> str:
    """A device error's message (vkad.DeviceError) with the Python file, line, source and caret
    of each statement it quotes that a @vkad.kernel wrote -- in the kernel itself or in what
    vkad derived from it (its adjoint, a graph's fused kernels): the IR carries the statement's
    location (`@"f.py:12:9"`). The finite checks name the store that got a NaN or an infinity,
    the bounds checks the access, an adstack overflow the loop (docs/debugging.md)."""
    return msg + "".join(f"\n  {_where(loc)}" for loc in _quoted_locations(msg))


def _file_key(fn) -> tuple:
    """A function's identity across processes: its file (and that file's size and time),
    line and name; its source text where the file cannot be read."""
    code = fn.__code__
    try:
        st = os.stat(code.co_filename)
        return ("file", code.co_filename, st.st_mtime_ns, st.st_size, code.co_firstlineno,
                fn.__qualname__)
    except OSError:
        return ("text", _source(fn, "@vkad.kernel").text, code.co_filename)


def _value_key(v):
    """A captured value as part of a cache key; the first element "object" marks one that is
    keyed by identity (in this process only)."""
    if isinstance(v, Func):
        return ("func",) + _file_key(v.fn)
    if isinstance(v, KernelFunction):
        return ("kernel",) + _file_key(v.fn)
    if isinstance(v, DType):
        return ("dtype", v.name)
    if _is_const(v):
        return ("const", type(v).__name__, repr(v))
    if isinstance(v, (ScalarType, ArrayType, ElementType)):
        return ("type", repr(v))
    if inspect.ismodule(v):
        f = getattr(v, "__file__", None)
        try:
            st = os.stat(f) if f else None
        except OSError:
            st = None
        return ("module", v.__name__, st.st_mtime_ns if st else 0, st.st_size if st else 0)
    if (inspect.isbuiltin(v) or inspect.isfunction(v) or isinstance(v, type)) and \
            getattr(v, "__module__", None) in ("builtins", "math", "vkad", "vkad.builder",
                                                "vkad.matrix", "vkad.frontend", "vkad._vkad"):
        return ("callable", v.__module__, getattr(v, "__qualname__", repr(v)))
    return ("object", id(v))


class _TextKernel(_b.KernelBuilder):
    """A lowering read from the disk cache: its IR text and element shapes."""

    def __init__(self, name: str, ir: str, elements):
        super().__init__(name)
        self._ir = ir
        self._elements = [tuple(e) for e in elements]

    def finish(self) -> str:
        return self._ir

    text = finish


_CACHE_DIR: List[Optional[str]] = [None]
_VERSION: List[str] = []


def set_cache_dir(path: Optional[str]) -> None:
    """Where lowered kernels are kept on disk: None = as the sessions' caches (VKAD_CACHE=0
    off, else VKAD_CACHE_DIR, else $XDG_CACHE_HOME/vkad, else ~/.cache/vkad), "" = off."""
    _CACHE_DIR[0] = path


def _cache_dir() -> Optional[str]:
    d = _CACHE_DIR[0]
    if d is not None:
        return d or None
    if os.environ.get("VKAD_CACHE") == "0":
        return None
    d = os.environ.get("VKAD_CACHE_DIR")
    if not d:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        d = os.path.join(home, "vkad")
    return d


def _version() -> str:
    """The lowering's own version: a hash of the front end, the builder and matrix.py."""
    if not _VERSION:
        h = hashlib.sha256()
        for f in (__file__, _b.__file__, _m.__file__):
            with open(f, "rb") as fh:
                h.update(fh.read())
        _VERSION.append(h.hexdigest()[:16])
    return _VERSION[0]


def _read_at_most(fd: int, n: int) -> bytes:
    """Up to n bytes from fd (fewer at its end)."""
    parts, left = [], n
    while left > 0:
        try:
            b = os.read(fd, min(left, 1 << 20))
        except InterruptedError:
            continue
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


class _Disk:
    """A kernel's lowerings on disk (frontend-<hash>.json in the cache directory): the names
    its last lowering read from its scopes (with the path of captured funcs that reach each)
    and, per set of their values, the IR and element shapes. Anything unreadable is a miss."""

    MAX_LOWERINGS = 16
    MAX_BYTES = 64 << 20  # an entry larger than this is not one (16 lowerings of IR text)

    def __init__(self, kfn: "KernelFunction"):
        self.kfn = kfn
        self.path = None
        d = _cache_dir()
        try:
            sk = kfn._source_key()
        except Exception:  # noqa: BLE001 - no key, no disk
            return
        if not d or sk[0][0] != "file":
            return
        self.key = repr((_version(), sk))
        h = hashlib.sha256(self.key.encode()).hexdigest()[:32]
        self.path = os.path.join(d, f"frontend-{h}.json")

    def _read(self) -> Optional[dict]:
        """The entry, or None (a miss). As the C++ caches read theirs (base/cache_file.cpp):
        opened without blocking (a FIFO under the name returns at once), only a regular file
        (symlinks followed; a directory, FIFO, socket or device such as /dev/zero is a miss),
        at most MAX_BYTES read. A regular file that is not an entry (truncated, garbage, over
        the cap) is removed, so the lowering compiled again replaces it."""
        if self.path is None:
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            data = b""
            if st.st_size <= self.MAX_BYTES:
                data = _read_at_most(fd, self.MAX_BYTES + 1)
            try:
                if len(data) > self.MAX_BYTES or not data:
                    raise ValueError("empty or over the cap")
                entry = json.loads(data.decode("utf-8"))
                if not isinstance(entry, dict):
                    raise ValueError("not an entry")
            except (ValueError, RecursionError):
                self._remove_if(st)
                return None
            return entry if entry.get("key") == self.key else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def _remove_if(self, st: os.stat_result) -> None:
        """Removes the bad entry, unless another process replaced it since it was read."""
        try:
            now = os.stat(self.path)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(self.path)
        except OSError:
            pass

    def load_names(self) -> None:
        entry = self._read()
        if entry is None:
            return
        names = []
        try:
            for path, name in entry.get("names", []):
                if not isinstance(name, str) or not all(isinstance(p, str) for p in path):
                    return
                owner = None
                fn = self.kfn.fn
                for step in path:
                    v = _Scope(None, fn, None, {}, 0).captured(step)
                    if not isinstance(v, Func):
                        return
                    owner, fn = v, v.fn
                names.append((owner, name))
        except (KeyError, TypeError, ValueError):  # an entry of another shape: a miss
            return
        self.kfn._captured_names = names

    @staticmethod
    def _caps_hash(caps) -> Optional[str]:
        if caps is None or any(vk[0] == "object" for _, vk in caps):
            return None
        return hashlib.sha256(repr(caps).encode()).hexdigest()

    def load(self, caps) -> Optional[_Lowered]:
        h = self._caps_hash(caps)
        entry = self._read() if h else None
        lowerings = entry.get("lowerings") if entry is not None else None
        if not isinstance(lowerings, dict) or h not in lowerings:
            return None
        try:
            low = lowerings[h]
            if not isinstance(low["ir"], str):
                return None
            kb = _TextKernel(self.kfn.name, low["ir"], low["elements"])
            lines = {text: tuple(loc) for text, loc in low.get("lines", [])}
            return _Lowered(kb, low["ir"], {}, lines)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def store(self, caps, low: _Lowered, lw: "_Lowerer") -> None:
        h = self._caps_hash(caps)
        if self.path is None or h is None:
            return
        kfid = id(self.kfn.fn)

        def path_of(owner) -> Optional[List[str]]:
            if owner is None:
                return []
            path, fid = [], id(owner.fn)
            while fid != kfid:
                parent = lw.func_parent.get(fid)
                if parent is None:
                    return None
                fid, step = parent
                path.insert(0, step)
            return path

        names = []
        for owner, name in self.kfn._captured_names or ():
            p = path_of(owner)
            if p is None:
                return  # a func reached another way (a module's attribute): not kept
            names.append([p, name])
        entry = self._read() or {}
        lowerings = entry.get("lowerings", {}) if entry.get("names") == names else {}
        if not isinstance(lowerings, dict):
            lowerings = {}
        while len(lowerings) >= self.MAX_LOWERINGS:
            lowerings.pop(next(iter(lowerings)))
        lowerings[h] = {"ir": low.ir, "elements": [list(e) for e in low.elements],
                        "lines": [[text, list(loc)] for text, loc in low.lines.items()]}
        entry = {"key": self.key, "names": names, "lowerings": lowerings}
        # Written whole to a private temporary file, synced, then renamed over the entry: a
        # reader (another thread or process) sees the old entry or the new one, never a torn one.
        tmp = None
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".frontend-", dir=os.path.dirname(self.path))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            tmp = None
        except (OSError, ValueError):
            pass
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


class KernelFunction:
    """A `@vkad.kernel` function: call it with arrays and numbers to launch it (on `session=`,
    else vkad.default_session()); Session.compile / differentiate / jvp and tapes take it as
    they take a KernelBuilder. `builder()` is the lowered KernelBuilder, `ir()` its IR text."""

    def __init__(self, fn: Callable, fp: Optional[DType] = None, name: Optional[str] = None,
                 defining_locals: Optional[Dict[str, Any]] = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.__doc__, self.__wrapped__ = fn.__doc__, fn
        self._src: Optional[_Source] = None  # parsed when lowered (or to report an error)
        code = fn.__code__
        if (code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount
                or code.co_posonlyargcount or fn.__defaults__):
            self._fail(self.src.fn_node, "a kernel's parameters are positional, annotated, "
                                         "without defaults")
        self.param_names = list(code.co_varnames[:code.co_argcount])
        self.annotations: List[Any] = []
        raw = getattr(fn, "__annotations__", {})
        scope = _Scope(None, fn, None, {}, 0)
        for k, name in enumerate(self.param_names):
            if name not in raw:
                self._fail(self.arg_nodes[k], f"parameter '{name}' has no annotation: a "
                                              "scalar dtype (vkad.f32, ...) or "
                                              "vkad.array(dtype, ndim=...)")
            ann = raw[name]
            if isinstance(ann, str):
                # A string annotation (`from __future__ import annotations`) names what the
                # def saw: the module, the closure, and the defining function's locals (a name
                # used only in an annotation is not a closure cell, as typing.get_type_hints
                # cannot see it either).
                env = dict(defining_locals or {})
                env.update({n: scope.captured(n) for n in fn.__code__.co_freevars
                            if _cell_ok(scope, n)})
                try:
                    ann = eval(ann, fn.__globals__, env)
                except Exception as e:  # noqa: BLE001 - reported at the annotation
                    p = self.arg_nodes[k]
                    self._fail(p.annotation or p, f"annotation of '{name}': {e}")
            if isinstance(ann, DType):
                ann = ScalarType(ann)
            elif ann in (int, float, bool):
                ann = ScalarType(_dtype_arg(ann, "scalar"))
            elif isinstance(ann, ElementType):
                p = self.arg_nodes[k]
                self._fail(p.annotation or p, f"parameter '{name}': a vector / matrix is "
                                              "passed in an array: vkad.array(vkad.vec(2, "
                                              "vkad.f32), ndim=1)")
            elif not isinstance(ann, (ScalarType, ArrayType)):
                p = self.arg_nodes[k]
                self._fail(p.annotation or p, f"parameter '{name}': annotation {ann!r} is not "
                                              "a vkad type (vkad.f32, vkad.scalar(...), "
                                              "vkad.array(...))")
            self.annotations.append(ann)
        floats = {a.dtype for a in self.annotations if a.dtype in _FLOATS}
        self.fp = fp if fp is not None else (floats.pop() if len(floats) == 1 else DType.f32)
        self._captured_names: Optional[List[Tuple[Any, str]]] = None
        self._getters: Optional[List[Callable[[], Any]]] = None
        self._last_values: List[Any] = []
        self._last: Optional[Tuple[tuple, _Lowered]] = None
        self._compiled: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.has_grad = any(a.grad for a in self.annotations)

    @property
    def src(self) -> _Source:
        """The parsed source (read once per code object, when first needed)."""
        if self._src is None:
            self._src = _source(self.fn, "@vkad.kernel")
        return self._src

    @property
    def arg_nodes(self) -> List[ast.arg]:
        return list(self.src.fn_node.args.args)

    def _fail(self, node, msg):
        raise self.src.error(node, msg, f"@vkad.kernel '{self.name}'")

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {a!r}" for n, a in zip(self.param_names, self.annotations))
        return f"<vkad.kernel {self.name}({params})>"

    # --- lowering, cached ---
    def _source_key(self) -> tuple:
        return (_file_key(self.fn), self.name, tuple(map(repr, self.annotations)), self.fp.name)

    def _key(self, captured_values) -> tuple:
        return self._source_key() + (captured_values,)

    def _current_captures(self):
        if self._captured_names is None:
            # a kernel of the same source lowered before (an earlier definition of it): its
            # names, read from this definition's scopes
            entries = _NAMES.get(self._source_key())
            if entries is None:
                return None
            self._captured_names = _resolve_names(self, entries)
            if self._captured_names is None:
                return None
        out = []
        for owner, name in self._captured_names:
            fn = self.fn if owner is None else owner.fn
            sc = _Scope(None, fn, None, {}, 0)
            try:
                v = sc.captured(name)
            except KeyError:
                return None
            out.append((name, _value_key(v)))
        return tuple(out)

    def _make_getters(self) -> None:
        """Per captured name, a function reading its value now (a call compares them with the
        values of the last lowering before anything else)."""
        getters = []
        for owner, name in self._captured_names or ():
            fn = self.fn if owner is None else owner.fn
            if name in fn.__code__.co_freevars and fn.__closure__:
                cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
                getters.append(lambda cell=cell: cell.cell_contents)
                continue
            g = fn.__globals__
            b = g.get("__builtins__", builtins)
            b = b if isinstance(b, dict) else vars(b)
            getters.append(lambda g=g, b=b, name=name: g[name] if name in g else b.get(name))
        self._getters = getters

    def lowered(self) -> _Lowered:
        last = self._last
        if last is not None and self._getters is not None:
            vals = self._last_values
            try:
                now = [g() for g in self._getters]
            except ValueError:  # an empty cell
                now = None
            if now is not None and all(a is b or (type(a) is type(b) and _is_const(a)
                                                   and a == b) for a, b in zip(now, vals)):
                return last[1]
        with _LOCK:
            low = self._lowered()
            self._make_getters()
            try:
                self._last_values = [g() for g in self._getters]
            except ValueError:
                self._getters = None
            return low

    def _lowered(self) -> _Lowered:
        with _LOCK:
            disk = _Disk(self)
            if self._captured_names is None and _NAMES.get(self._source_key()) is None:
                disk.load_names()  # an earlier process's lowering of this source
            caps = self._current_captures()
            if caps is not None and self._last is not None and self._last[0] == caps:
                return self._last[1]
            if caps is not None:
                hit = _LOWERED.get(self._key(caps)) or disk.load(caps)
                if hit is not None:
                    _LOWERED[self._key(caps)] = hit
                    self._last = (caps, hit)
                    return hit
            lw = _Lowerer(self)
            try:
                kb = lw.lower()
                ir = kb.finish()
            except _Fail as f:
                src = f.src or self.src
                raise src.error(f.node, f.msg, f"@vkad.kernel '{self.name}'{f.where}") from None
            # the names the kernel and the funcs it inlined read from their scopes: the
            # cache key is their values (so a changed constant lowers again)
            owners = {id(self.fn): None}
            owners.update({id(f.fn): f for f in lw.inlined})
            names = [(owners[fid], name) for (fid, name) in lw.captured if fid in owners]
            self._captured_names = names
            _NAMES[self._source_key()] = _name_paths(self, names, lw)
            caps = self._current_captures()
            low = _Lowered(kb, ir, lw.captured, lw.lines)
            _LOWERED[self._key(caps)] = low
            self._last = (caps, low)
            disk.store(caps, low, lw)
            return low

    def builder(self) -> _b.KernelBuilder:
        """The kernel as a KernelBuilder (Session.compile(kernel) compiles this)."""
        return self.lowered().builder

    def ir(self) -> str:
        """The kernel's IR text."""
        return self.lowered().ir

    # the hook vkad.Session's compile / differentiate / jvp use
    def _vkad_builder(self) -> _b.KernelBuilder:
        return self.builder()

    # --- launching ---
    def _kernels(self, session) -> dict:
        d = self._compiled.get(session)
        if d is None:
            d = self._compiled[session] = {}
        return d

    def compile(self, session):
        """This kernel compiled on `session` (cached per session and lowered kernel)."""
        low = self.lowered()
        d = self._kernels(session)
        k = d.get(("k", low.key))
        if k is None:
            dk = d.get(("d", low.key))
            k = dk.forward if dk is not None else self._located(session.compile, low)
            d[("k", low.key)] = k
        return k

    @staticmethod
    def _located(make, low: _Lowered):
        try:
            return make(low.builder)
        except Error as e:
            raise low.locate(e) from None

    def jvp(self, session):
        """This kernel's forward-mode (tangent) kernel on `session` (cached, as compile)."""
        low = self.lowered()
        d = self._kernels(session)
        k = d.get(("j", low.key))
        if k is None:
            k = d[("j", low.key)] = self._located(session.jvp, low)
        return k

    def differentiate(self, session):
        """This kernel and its adjoint on `session` (cached, as compile)."""
        low = self.lowered()
        d = self._kernels(session)
        k = d.get(("d", low.key))
        if k is None:
            k = d[("d", low.key)] = self._located(session.differentiate, low)
        return k

    def check_args(self, args: Sequence[Any]) -> None:
        """The launch's arguments against the annotations; an error names the parameter."""
        if len(args) != len(self.annotations):
            self._fail(self.src.fn_node, f"launched with {len(args)} arguments, the kernel takes "
                                         f"{len(self.annotations)} ({', '.join(self.param_names)})")
        for k, (a, ann) in enumerate(zip(args, self.annotations)):
            if type(a) is NdArray:  # the common case, checked without a message
                if isinstance(ann, ArrayType) and a.dtype == ann.dtype:
                    shape = a.shape
                    if len(shape) == ann.rank and (not ann.element or tuple(
                            shape[len(shape) - len(ann.element):]) == ann.element):
                        continue
            elif type(a) in (float, int) and isinstance(ann, ScalarType) and (
                    type(a) is int or ann.dtype in _FLOATS):
                continue
            what = f"argument {k} ('{self.param_names[k]}')"

            def fail(msg, k=k):  # at the parameter's annotation (the source parsed now)
                p = self.arg_nodes[k]
                self._fail(p.annotation or p, msg)

            if isinstance(ann, ArrayType):
                if not hasattr(a, "shape") or not hasattr(a, "dtype") or not hasattr(a, "handle"):
                    fail(f"{what} is an array parameter, got {type(a).__name__} "
                                   "(s.ndarray(x) makes a device array)")
                if a.dtype != ann.dtype:
                    fail(f"{what}: the array is {a.dtype.name}, the parameter "
                                   f"{ann.dtype.name}")
                shape = tuple(a.shape)
                if len(shape) != ann.rank:
                    fail(f"{what}: the array has shape {shape} (rank {len(shape)}), "
                                   f"the parameter {ann!r} takes rank {ann.rank}")
                if ann.element and shape[len(shape) - len(ann.element):] != ann.element:
                    fail(f"{what}: the array's trailing axes {shape} are not the "
                                   f"element shape {ann.element}")
            else:
                ok = isinstance(a, (int, float, bool, _np.number, _np.bool_))
                if type(a).__name__ in ("LoopIndex",) and ann.dtype in _INTS:
                    ok = True
                if not ok:
                    fail(f"{what} is a {ann.dtype.name} scalar, got "
                                   f"{type(a).__name__}")
                if ann.dtype in _INTS and isinstance(a, (float, _np.floating)):
                    fail(f"{what} is {ann.dtype.name}, got the float {a!r}")

    def __call__(self, *args, session=None):
        """Launches the kernel (asynchronous) on `session` or vkad.default_session(); inside a
        tape's recording, its differentiated form (recorded)."""
        s = session if session is not None else default_session()
        self.check_args(args)
        if self.has_grad and getattr(s, "_recording", None) is not None:
            k = self.differentiate(s)
        else:
            k = self.compile(s)
        s.launch(k, *args)


def _cell_ok(scope, n) -> bool:
    try:
        scope.captured(n)
        return True
    except KeyError:
        return False


def kernel(fn: Optional[Callable] = None, *, fp: Optional[DType] = None,
           name: Optional[str] = None):
    """`@vkad.kernel` (or `@vkad.kernel(fp=vkad.f64)`): an annotated Python function as a vkad
    kernel. fp: the float type of Python float literals that start a local (default: the float
    dtype of the parameters when they share one, else f32)."""
    # The defining frame's locals, for string annotations (KernelFunction.__init__); a copy of
    # the names the annotations may use only, so no frame is kept alive.
    def make(f, depth):
        raw = getattr(f, "__annotations__", {})
        names = set()
        for a in raw.values():
            if isinstance(a, str):
                names.update(re.findall(r"[A-Za-z_]\w*", a))
        local = {}
        if names:
            frame_locals = sys._getframe(depth).f_locals
            local = {n: frame_locals[n] for n in names if n in frame_locals}
        return KernelFunction(f, fp, name, local)
    if fn is None:
        return lambda f: make(f, 2)
    return make(fn, 2)


_DEFAULT: List[Any] = []


def default_session():
    """The session a kernel call without `session=` launches on: made at the first call
    (vkad.Session(), a GPU if there is one), closed at exit."""
    with _LOCK:
        if not _DEFAULT or _DEFAULT[0] is None:
            import atexit
            import vkad
            s = vkad.Session()
            _DEFAULT[:] = [s]

            def close():
                try:
                    s.close()
                except Exception:  # noqa: BLE001 - at exit
                    pass
            atexit.register(close)
        return _DEFAULT[0]


def set_default_session(session) -> None:
    """Kernel calls without `session=` launch on `session` from now on (None: a new default
    session at the next call)."""
    with _LOCK:
        _DEFAULT[:] = [session]


def as_builder(kernel_like):
    """A KernelBuilder for a @vkad.kernel, else the argument (Session's compile hook)."""
    hook = getattr(kernel_like, "_vkad_builder", None)
    return hook() if hook is not None else kernel_like


__all__ = ["kernel", "func", "array", "scalar", "vec", "mat", "static", "ndrange", "max_trip",
           "atomic_add", "atomic_sub", "default_session", "set_default_session", "set_cache_dir",
           "KernelFunction", "Func", "ArrayType", "ScalarType", "ElementType"]
