"""@vkad.kernel / @vkad.func (python/vkad/frontend.py, docs/kernels.md, issue 55): every construct
of the subset against the same kernel written with KernelBuilder (the same IR text) or against
numpy, on the session's device (lavapipe in CI); gradients (s.differentiate, tapes) against
central finite differences; and one test per refused construct checking the reported line,
column and caret."""
import math
import re

import numpy as np
import pytest

import vkad
from conftest import f64_ok


@pytest.fixture(scope="module")
def ft(session):
    return vkad.f64 if f64_ok(session) else vkad.f32


def npt(ft):
    return np.float64 if ft == vkad.f64 else np.float32


def tol(ft):
    return dict(rtol=1e-9, atol=1e-12) if ft == vkad.f64 else dict(rtol=1e-5, atol=1e-6)


def line_of(fn, text):
    """The file line of the first source line of `fn` containing `text`."""
    import inspect
    lines, first = inspect.getsourcelines(fn.__wrapped__ if hasattr(fn, "__wrapped__") else fn)
    for k, l in enumerate(lines):
        if text in l:
            return first + k, l.index(text) + 1
    raise AssertionError(f"{text!r} not in {fn}")


def without_locations(ir):
    """IR text without its statements' source locations (`@"f.py:12:5"`)."""
    return re.sub(r' @"[^"]*"', "", ir)


def assert_error_at(excinfo, fn, text, message):
    """The error names this file, the line holding `text`, its column, and shows the caret."""
    e = excinfo.value
    assert isinstance(e, vkad.InvalidArgumentError)
    msg = str(e)
    assert re.search(message, msg), msg
    line, col = line_of(fn, text)
    assert e.lineno == line, msg
    assert e.col_offset == col, msg
    assert f'File "{__file__}", line {line}, column {col}' in msg, msg
    src, caret = msg.splitlines()[-2:]
    assert text in src
    assert caret.index("^") == src.index(text), msg


# --- the same kernel as a KernelBuilder --------------------------------------------------------

@vkad.kernel
def saxpy(a: vkad.f32, x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def test_same_ir_as_the_builder(session):
    kb = vkad.KernelBuilder("saxpy")
    a = kb.scalar("a", vkad.f32)
    x = kb.ndarray("x", vkad.f32, 1, grad=True)
    y = kb.ndarray("y", vkad.f32, 1)
    line, _ = line_of(saxpy, "for i in range")
    with kb.parallel_for(f"line_{line}", 0, x.shape[0]) as i:
        y[i] = a * x[i] + y[i]
    assert without_locations(saxpy.ir()) == kb.finish()
    # each statement carries the Python line and column it came from
    line, col = line_of(saxpy, "y[i] = a * x[i]")
    stores = [t for t in saxpy.ir().splitlines() if t.strip().startswith("store y")]
    assert len(stores) == 1 and stores[0].endswith(f' @"{__file__}:{line}:{col}"'), stores
    # launched by a call (and through s.compile), the same results
    xs = session.ndarray(np.arange(5, dtype=np.float32))
    ys = session.ndarray(np.ones(5, np.float32))
    saxpy(2.0, xs, ys, session=session)
    np.testing.assert_allclose(ys.numpy(), 2 * np.arange(5) + 1)
    k = session.compile(saxpy)
    session.launch(k, 1.0, xs, ys)
    np.testing.assert_allclose(ys.numpy(), 3 * np.arange(5) + 1)


def test_lowering_is_cached(session):
    assert saxpy.lowered() is saxpy.lowered()
    assert saxpy.compile(session) is saxpy.compile(session)


# --- control flow ------------------------------------------------------------------------------

def control_ref(x, w):
    # what `control` computes, in Python
    out = []
    for xi in x:
        acc, v = 0.0, xi
        for k in range(len(w)):
            if w[k] < -0.3:
                continue
            acc += math.sin(v * w[k])
            if acc > 1.6:
                break
        n = 0
        while v * v > 0.01 and n < 40:
            v = v * 0.5
            n += 1
        if acc > 1.0:
            r = acc * 2.0
        elif acc > 0.0:
            r = acc + v
        else:
            r = -acc
        out.append(r + n)
    return np.array(out)


def make_control(ft):
    @vkad.kernel
    def control(x: vkad.array(ft, grad=True), w: vkad.array(ft, readonly=True),
                y: vkad.array(ft, grad=True)):
        for i in range(x.shape[0]):
            acc = 0.0
            v = x[i]
            for k in range(w.shape[0]):
                if w[k] < -0.3:
                    continue
                acc += vkad.sin(v * w[k])
                if acc > 1.6:
                    break
            n = 0
            while vkad.max_trip(v * v > 0.01 and n < 40, 40):
                v = v * 0.5
                n += 1
            if acc > 1.0:
                r = acc * 2.0
            elif acc > 0.0:
                r = acc + v
            else:
                r = -acc
            y[i] = r + n
    return control


def test_control_flow(session, ft):
    control = make_control(ft)
    assert control.fp == ft  # `acc = 0.0` is a local of the parameters' float type
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, 9).astype(npt(ft))
    w = np.array([0.9, -0.5, 0.7, 1.3, 0.2], npt(ft))
    xs, ws, ys = session.ndarray(x), session.ndarray(w), session.zeros(9, ft)
    control(xs, ws, ys, session=session)
    np.testing.assert_allclose(ys.numpy(), control_ref(x.astype(np.float64), w), **tol(ft))


def test_control_flow_gradient_on_a_tape(session, ft):
    if ft != vkad.f64:
        pytest.skip("finite differences want f64")
    control = make_control(ft)
    x = np.array([0.3, -1.1, 0.77, 1.7], np.float64)
    w = np.array([0.9, -0.5, 0.7, 1.3, 0.2])
    xs, ws, ys = session.ndarray(x), session.ndarray(w), session.zeros(4, ft)
    t = session.tape()
    with t:
        control(xs, ws, ys, session=session)  # the differentiated kernel, recorded
    t.backward(seed={ys: 1.0})
    g = t.grad(xs).numpy()
    h = 1e-6
    fd = [(control_ref(x + h * e, w).sum() - control_ref(x - h * e, w).sum()) / (2 * h)
          for e in np.eye(4)]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


# --- locals, tuples, expressions ---------------------------------------------------------------

@vkad.kernel
def expressions(x: vkad.array(vkad.f32), ij: vkad.array(vkad.i32), y: vkad.array(vkad.f32, ndim=2)):
    for i in range(x.shape[0]):
        a, b = x[i], ij[i]
        p, q = (a * 2.0, b // 3)
        c = a if b % 2 == 0 else -a           # a select
        d = 1.0 if 0 < b <= 4 and not b == 2 else 0.0
        e = b / 2                              # int / int: a float, as in Python
        f = vkad.f32(b) ** 2 + abs(a) - min(a, 0.5) + max(b, 3)
        g = (b > 1) or (a < 0.0)
        y[i, 0] = p
        y[i, 1] = vkad.f32(q)
        y[i, 2] = c
        y[i, 3] = d
        y[i, 4] = e
        y[i, 5] = f
        y[i, 6] = vkad.select(g, 1.0, 0.0)
        y[i, 7] = math.sin(a) + vkad.cos(a) * math.pi + vkad.atan2(a, 2.0) + vkad.sqrt(abs(a))


def test_expressions(session):
    x = np.array([-1.5, 0.25, 2.0, -0.75, 3.0, 0.5], np.float32)
    ij = np.array([0, 1, 2, 3, 4, 7], np.int32)
    ys = session.zeros((6, 8), vkad.f32)
    expressions(session.ndarray(x), session.ndarray(ij), ys, session=session)
    x64, i64 = x.astype(np.float64), ij.astype(np.float64)
    want = np.stack([
        x64 * 2, ij // 3, np.where(ij % 2 == 0, x64, -x64),
        np.where((ij > 0) & (ij <= 4) & (ij != 2), 1.0, 0.0), i64 / 2,
        i64 ** 2 + np.abs(x64) - np.minimum(x64, 0.5) + np.maximum(ij, 3),
        np.where((ij > 1) | (x64 < 0), 1.0, 0.0),
        np.sin(x64) + np.cos(x64) * math.pi + np.arctan2(x64, 2.0) + np.sqrt(np.abs(x64))], 1)
    np.testing.assert_allclose(ys.numpy(), want, rtol=1e-5, atol=1e-5)


# --- vectors and matrices, element arrays, atomics ---------------------------------------------

DT = 0.01


@vkad.func
def rotate(R, v):
    return R @ v


@vkad.kernel
def particles(x: vkad.array(vkad.vec(2, vkad.f32), ndim=1),
              F: vkad.array(vkad.mat(2, 2, vkad.f32), ndim=1),
              out: vkad.array(vkad.vec(2, vkad.f32), ndim=1),
              stats: vkad.array(vkad.f32, ndim=1)):
    for p in range(x.shape[0]):
        R, S = vkad.polar_decompose(F[p])
        u = rotate(R, x[p]) + DT * vkad.Vector([0.0, 1.0])
        u[0] = u[0] + S.trace()                 # a component replaced
        px, py = u                              # a vector unpacks
        out[p] = vkad.Vector([px, py * 2.0]) + (F[p] @ x[p]).normalized() * x[p].norm()
        stats[0] += u.dot(x[p])                 # an atomic add
        stats[1] -= F[p].determinant()          # an atomic add of the negation
        vkad.atomic_add(stats[2], x[p].norm_sqr())
        vkad.atomic_sub(stats[3], 1.0)


def _polar(A):
    xx, yy = A[0, 0] + A[1, 1], A[1, 0] - A[0, 1]
    c, s = np.array([xx, yy]) / math.hypot(xx, yy)
    R = np.array([[c, -s], [s, c]])
    return R, R.T @ A


def test_vectors_matrices_atomics(session):
    rng = np.random.default_rng(2)
    n = 16
    x = rng.normal(size=(n, 2)).astype(np.float32)
    F = (np.eye(2) + 0.3 * rng.normal(size=(n, 2, 2))).astype(np.float32)
    out, stats = session.zeros((n, 2)), session.zeros(4)
    particles(session.ndarray(x), session.ndarray(F), out, stats, session=session)
    want, st = [], np.zeros(4)
    for p in range(n):
        xp, Fp = x[p].astype(np.float64), F[p].astype(np.float64)
        R, S = _polar(Fp)
        u = R @ xp + DT * np.array([0.0, 1.0])
        u[0] += np.trace(S)
        Fx = Fp @ xp
        want.append(np.array([u[0], u[1] * 2]) + Fx / np.linalg.norm(Fx) * np.linalg.norm(xp))
        st += [u @ xp, -np.linalg.det(Fp), xp @ xp, -1.0]
    np.testing.assert_allclose(out.numpy(), np.array(want), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats.numpy(), st, rtol=1e-4, atol=1e-4)


# --- @vkad.func, captured constants, vkad.static, ndrange --------------------------------------

WEIGHTS = (0.5, -1.0, 2.0)
USE_SQUARE = True


@vkad.func
def poly(v: vkad.f32, k: vkad.i32):
    """A helper with a loop and a local: inlined."""
    acc = 0.0
    for j in range(k):
        acc = acc * v + 1.0
    if vkad.static(USE_SQUARE):
        return acc * acc
    return acc


@vkad.func
def weighted(v):
    s = 0.0
    for c in vkad.static(WEIGHTS):          # unrolled: one term per captured weight
        s = s + c * v
    return s


@vkad.kernel
def helpers(x: vkad.array(vkad.f32), y: vkad.array(vkad.f32, ndim=2)):
    for i, j in vkad.ndrange(x.shape[0], 3):
        y[i, j] = poly(x[i], j + 1) + weighted(x[i]) * j


def test_funcs_static_and_ndrange(session):
    global USE_SQUARE
    x = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    xs, ys = session.ndarray(x), session.zeros((4, 3))

    def ref(square):
        out = np.zeros((4, 3))
        for i in range(4):
            for j in range(3):
                acc = 0.0
                for _ in range(j + 1):
                    acc = acc * x[i] + 1.0
                out[i, j] = (acc * acc if square else acc) + sum(WEIGHTS) * x[i] * j
        return out

    helpers(xs, ys, session=session)
    np.testing.assert_allclose(ys.numpy(), ref(True), rtol=1e-5)
    first = helpers.lowered()
    assert "for " in first.ir and first.ir.count("task ") == 1
    # a captured constant changed: lowered again (its own cache entry), and back: the first
    USE_SQUARE = False
    try:
        helpers(xs, ys, session=session)
        np.testing.assert_allclose(ys.numpy(), ref(False), rtol=1e-5)
        assert helpers.lowered() is not first
    finally:
        USE_SQUARE = True
    assert helpers.lowered() is first


def make_scaled(scale, squared):
    """A factory: every call defines the kernel (same source) with funcs of its own, whose
    closures hold this call's values; `squared` is read by a nested func only."""

    @vkad.func
    def power(v):
        if vkad.static(squared):
            return v * v
        return v

    @vkad.func
    def scaled(v):
        return power(v) * scale

    @vkad.kernel
    def apply(x: vkad.array(vkad.f32), y: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            y[i] = scaled(x[i])

    return apply


def test_a_kernel_made_again_reads_its_own_funcs_closures(session):
    # The values a kernel's funcs capture are part of its cache key, read from the funcs of the
    # definition being called, not of the first definition of the same source (the bug: a
    # factory's second kernel, differing only in a value a nested func reads, ran the first's
    # lowering: diffmpm's ring rows).
    x = np.array([1.0, 2.0, -3.0], np.float32)
    xs, ys = session.ndarray(x), session.zeros(3)
    for scale, squared in [(2.0, False), (2.0, True), (3.0, True), (2.0, False)]:
        make_scaled(scale, squared)(xs, ys, session=session)
        np.testing.assert_allclose(ys.numpy(), (x * x if squared else x) * scale, rtol=1e-6,
                                   err_msg=f"scale {scale}, squared {squared}")


def make_bounds():
    @vkad.kernel
    def bounds(n: vkad.i32, x: vkad.array(vkad.f32), y: vkad.array(vkad.f32)):
        m = x.shape[0]
        for i in range(1, m - 1):               # a size expression: add(shape(x, 0), -1)
            y[i] = x[i - 1] + x[i + 1]
        for i in range(n):                      # a second task
            y[0] += 1.0
        if vkad.static(m is not None):
            y[m - 1] = 7.0                      # kernel-level statements: a serial task
    return bounds


def test_tasks_bounds_and_serial_statements(session):
    bounds = make_bounds()
    ir = bounds.ir()
    assert "add(shape(x, 0), -1)" in ir and ir.count("task ") == 3 and " serial " in ir
    x = np.arange(6, dtype=np.float32)
    ys = session.zeros(6)
    bounds(4, session.ndarray(x), ys, session=session)
    want = np.zeros(6)
    want[1:5] = x[:4] + x[2:]
    want[0] = 4
    want[5] = 7
    np.testing.assert_allclose(ys.numpy(), want)


# --- reverse mode: s.differentiate(kernel), scalar gradients, the tape -------------------------

def make_energy(ft):
    @vkad.kernel
    def energy(k: vkad.scalar(ft), x: vkad.array(vkad.vec(2, ft), ndim=1, grad=True),
               loss: vkad.array(ft, ndim=0, grad=True)):
        for i in range(x.shape[0] - 1):
            d = x[i + 1] - x[i]
            r = d.norm()
            e = 0.5 * k * (r - 1.0) ** 2
            if r > 2.0:
                e = e * 2.0
            loss[None] += e + vkad.exp(-x[i].norm_sqr())
    return energy


def test_differentiate_against_finite_differences(session, ft):
    if ft != vkad.f64:
        pytest.skip("finite differences want f64")
    energy = make_energy(ft)
    d = session.differentiate(energy)       # as for a KernelBuilder
    assert d is not None
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 2)) * 1.3

    def f(xv):
        loss = 0.0
        for i in range(5):
            r = np.linalg.norm(xv[i + 1] - xv[i])
            e = 0.5 * 3.0 * (r - 1) ** 2
            e = e * 2 if r > 2 else e
            loss += e + math.exp(-xv[i] @ xv[i])
        return loss

    xs, loss = session.ndarray(x, grad=True), session.zeros(1, ft, grad=True)
    t = session.tape()
    with t:
        energy(3.0, xs, loss, session=session)
    t.backward(seed={loss: 1.0})
    np.testing.assert_allclose(loss.numpy()[0], f(x), rtol=1e-12)
    h, fd = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = (f(x + e) - f(x - e)) / (2 * h)
    np.testing.assert_allclose(t.grad(xs).numpy(), fd, rtol=1e-6, atol=1e-8)


def test_default_session():
    s = vkad.Session()
    try:
        vkad.set_default_session(s)
        assert vkad.default_session() is s
        xs, ys = s.ndarray(np.ones(3, np.float32)), s.zeros(3)
        saxpy(3.0, xs, ys)                   # no session=: the default one
        np.testing.assert_allclose(ys.numpy(), 3.0)
    finally:
        vkad.set_default_session(None)
        s.close()


# --- errors point at the line ------------------------------------------------------------------

def lowering_error(fn):
    with pytest.raises(vkad.InvalidArgumentError) as e:
        vkad.kernel(fn).ir()
    return e


def test_error_undefined_name():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = undefined_thing + 1.0  # noqa: F821
    assert_error_at(lowering_error(k), k, "undefined_thing", "undefined name 'undefined_thing'")


def test_error_type_change():
    def k(x: vkad.array(vkad.f32), n: vkad.array(vkad.i32)):
        for i in range(x.shape[0]):
            acc = 0.0
            for j in range(3):
                acc = n[i]
            x[i] = acc
    assert_error_at(lowering_error(k), k, "acc = n[i]", "'acc'.*changes type: assigned i32")


def test_error_type_mismatch():
    def k(x: vkad.array(vkad.f32), y: vkad.array(vkad.f64)):
        for i in range(x.shape[0]):
            x[i] = x[i] + y[i]
    assert_error_at(lowering_error(k), k, "x[i] + y[i]", "types f32 and f64 differ")


def test_error_return_in_kernel():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            return x[i]
    assert_error_at(lowering_error(k), k, "return x[i]", "a kernel returns nothing")


def test_error_refused_statements():
    def k1(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            with open("f"):
                pass
    assert_error_at(lowering_error(k1), k1, "with open", "`with` statement is not in the")

    def k2(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            try:
                x[i] = 1.0
            except Exception:
                pass
    assert_error_at(lowering_error(k2), k2, "try:", "`try` statement is not in the")


def test_error_refused_expressions():
    def k1(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = sum([x[j] for j in range(3)])
    assert_error_at(lowering_error(k1), k1, "[x[j] for", "a list comprehension is not in the")

    def k2(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            f = lambda v: v  # noqa: E731
            x[i] = f(x[i])
    assert_error_at(lowering_error(k2), k2, "lambda", "a lambda is not in the")


def test_error_break_in_parallel_loop():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            if x[i] > 0.0:
                break
    assert_error_at(lowering_error(k), k, "break", "`break` in the parallel loop")


@vkad.kernel
def early_exits(x: vkad.array(vkad.f32), y: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        if x[i] < 0.0:
            continue                        # Taichi's: this iteration ends
        y[i] = 1.0
        if x[i] > 5.0:
            return                          # Warp's early exit
        y[i] = 2.0 + x[i]


def test_continue_and_return_in_the_parallel_loop(session):
    xs = session.ndarray(np.array([-1.0, 2.0, 7.0, 0.5], np.float32))
    ys = session.zeros(4)
    early_exits(xs, ys, session=session)
    np.testing.assert_allclose(ys.numpy(), [0.0, 4.0, 1.0, 2.5])


@vkad.kernel
def early_exits_grad(x: vkad.array(vkad.f64, grad=True), y: vkad.array(vkad.f64, grad=True)):
    for i in range(x.shape[0]):
        if x[i] < 0.0:
            continue
        if x[i] > 5.0:
            y[i] = x[i] * x[i]
            return
        y[i] = vkad.sin(x[i])


def test_continue_and_return_gradient(session, ft):
    if ft != vkad.f64:
        pytest.skip("needs f64")
    x = np.array([-1.0, 2.0, 7.0, 0.5])
    xs, ys = session.ndarray(x), session.zeros(4, vkad.f64)
    t = session.tape()
    with t:
        early_exits_grad(xs, ys, session=session)
    t.backward(seed={ys: 1.0})
    np.testing.assert_allclose(ys.numpy(), [0, math.sin(2), 49, math.sin(0.5)], rtol=1e-12)
    np.testing.assert_allclose(t.grad(xs).numpy(), [0, math.cos(2), 14, math.cos(0.5)],
                               rtol=1e-12)


@vkad.kernel
def decay_in_place(x: vkad.array(vkad.f32, grad=True), rate: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        x[i] = x[i] * x[i] * rate[i] + 0.1


def test_an_update_in_place_differentiates_on_a_tape(session):
    # DiffTaichi's idiom, a state updated where it lives, three times on one tape: each launch's
    # adjoint reads the copy of x the tape took before it (docs/tape.md).
    x0 = np.linspace(0.2, 1.2, 6)
    r = np.linspace(0.5, 0.9, 6)
    xs, rs = session.ndarray(x0.astype(np.float32)), session.ndarray(r.astype(np.float32))
    t = session.tape()
    with t:
        for _ in range(3):
            decay_in_place(xs, rs, session=session)
    t.backward(seed={xs: 1.0})
    v, dx, dr = x0.copy(), np.ones(6), np.zeros(6)
    for _ in range(3):
        dr = dr * 2 * v * r + v * v  # d x_{k+1} / d rate, through x_k and directly
        dx = dx * 2 * v * r
        v = v * v * r + 0.1
    np.testing.assert_allclose(xs.numpy(), v, rtol=1e-5)
    np.testing.assert_allclose(t.grad(xs).numpy(), dx, rtol=1e-5)
    np.testing.assert_allclose(t.grad(rs).numpy(), dr, rtol=1e-5)


def test_error_bare_return_in_a_serial_loop():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            for j in range(3):
                return
    assert_error_at(lowering_error(k), k, "return", "a bare `return` ends a thread")


def test_error_loop_else_and_step():
    def k1(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            for j in range(0, 4, 3):
                x[i] = 1.0
    assert_error_at(lowering_error(k1), k1, "3)", "a serial loop's step is 1")

    def k2(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            while x[i] > 1.0:
                x[i] = 1.0
            else:
                x[i] = 2.0
    assert_error_at(lowering_error(k2), k2, "x[i] = 2.0", "while loop's `else`")


def test_error_not_a_kernel_function():
    def helper(v):
        return v

    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = helper(x[i])
    assert_error_at(lowering_error(k), k, "helper(x[i])", "'helper' is not a kernel function")


def test_error_captured_list():
    table = [1.0, 2.0]

    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = table[0]
    assert_error_at(lowering_error(k), k, "table", "'table' is a list")


def test_error_outer_loop_not_range():
    def k(x: vkad.array(vkad.f32)):
        for i in [0, 1]:
            x[i] = 1.0
    assert_error_at(lowering_error(k), k, "[0, 1]", "outermost loop is the parallel task")


def test_error_name_out_of_its_block():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            for j in range(2):
                inner = x[j]
            x[i] = inner
    # assigned in the loop, read after it: a local (zero when the loop does not run)
    vkad.kernel(k).ir()

    def k2(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            d = x[i]
        for j in range(x.shape[0]):
            x[j] = d + 1.0
    assert_error_at(lowering_error(k2), k2, "d + 1.0", "'d' is assigned only inside a block")


def test_error_in_a_func_names_its_line():
    @vkad.func
    def bad(v):
        return v + nowhere  # noqa: F821

    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = bad(x[i])
    e = lowering_error(k)
    assert "in @vkad.func 'bad'" in str(e.value)
    assert_error_at(e, bad.fn, "nowhere", "undefined name 'nowhere'")


def test_error_unannotated_parameter():
    def k(x):
        for i in range(3):
            x[i] = 1.0
    with pytest.raises(vkad.InvalidArgumentError) as e:
        vkad.kernel(k)
    assert_error_at(e, k, "x):", "parameter 'x' has no annotation")


def test_error_wrong_argument_at_launch(session):
    xs_i = session.zeros(4, vkad.i32)
    with pytest.raises(vkad.InvalidArgumentError) as e:
        saxpy(1.0, xs_i, xs_i, session=session)
    assert_error_at(e, saxpy, "vkad.array(vkad.f32, grad=True)",
                    r"argument 1 \('x'\): the array is i32, the parameter f32")
    with pytest.raises(vkad.InvalidArgumentError) as e:
        saxpy(1.0, session.zeros((2, 2)), session.zeros(4), session=session)
    assert "rank 2" in str(e.value)
    with pytest.raises(vkad.InvalidArgumentError) as e:
        saxpy(1.0, np.zeros(4, np.float32), session.zeros(4), session=session)
    assert "s.ndarray(x)" in str(e.value)
    with pytest.raises(vkad.InvalidArgumentError) as e:
        saxpy(1.0, session.zeros(4), session=session)
    assert "launched with 2 arguments, the kernel takes 3" in str(e.value)


# --- more constructs: the builder's IR for control flow, locals, funcs, graphs, loops ----------

@vkad.kernel
def branches(x: vkad.array(vkad.f32), y: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        v = x[i]
        if v > 0.0:
            y[i] = v
        else:
            y[i] = -v
        for k in range(3):
            y[i] = y[i] * 2.0


def test_control_flow_same_ir_as_the_builder():
    kb = vkad.KernelBuilder("branches")
    x = kb.ndarray("x", vkad.f32, 1)
    y = kb.ndarray("y", vkad.f32, 1)
    line, _ = line_of(branches, "for i in range")
    with kb.parallel_for(f"line_{line}", 0, x.shape[0]) as i:
        v = x[i]
        with kb.if_(v > 0.0):
            y[i] = v
        with kb.else_():
            y[i] = -v
        with kb.for_range(0, 3):
            y[i] = y[i] * 2.0
    assert without_locations(branches.ir()) == kb.finish()
    line, col = line_of(branches, "for k in range(3)")
    assert f'for %' in branches.ir() and f'@"{__file__}:{line}:{col}" {{' in branches.ir()


@vkad.func
def clamp_add(acc: vkad.f64, v, lo=0.0):
    acc = acc + v        # a parameter reassigned
    if acc < lo:
        acc = lo         # ... in a branch: a local
    return acc


@vkad.func
def twice(v):
    return clamp_add(v, v)  # funcs call funcs


@vkad.kernel
def locals_and_funcs(x: vkad.array(vkad.f64, ndim=2), y: vkad.array(vkad.f64)):
    for i in range(x.shape[0]):
        total: vkad.f64 = 0      # an annotated local: an int literal of an f64 local
        u = vkad.Vector([0.0, 0.0])
        for j in range(x.shape[1]):
            u = u + vkad.Vector([x[i, j], 1.0])   # a vector local carried by the loop
            if x[i, j] < -5.0:
                continue
            total = clamp_add(total, x[i, j])
            if total > 100.0:
                break
        for k in vkad.static(range(10)):
            if vkad.static(k == 2):
                break                              # stops the unrolling
            total += twice(0.25)
        y[i] = total + u[0] * 1000.0 + u[1] * 1e6


def test_locals_funcs_static_break(session, ft):
    if ft != vkad.f64:
        pytest.skip("needs f64")
    x = np.array([[1.0, -2.0, 3.0, -9.0, 60.0, 50.0, 1.0],
                  [-1.0, -1.0, 0.5, 2.0, -7.0, 0.25, 3.0]])
    ys = session.zeros(2, vkad.f64)
    locals_and_funcs(session.ndarray(x), ys, session=session)
    want = []
    for row in x:
        total, u = 0.0, np.zeros(2)
        for v in row:
            u += [v, 1.0]
            if v < -5.0:
                continue
            total = max(total + v, 0.0)
            if total > 100.0:
                break
        total += 2 * 0.5
        want.append(total + u[0] * 1000 + u[1] * 1e6)
    np.testing.assert_allclose(ys.numpy(), want, rtol=1e-12)


@vkad.kernel
def step(t: vkad.i32, x: vkad.array(vkad.f32, ndim=2, grad=True)):
    for i in range(x.shape[1]):
        x[t, i] = x[t - 1, i] * 1.5 + 1.0


def test_graph_capture_and_step_loop(session):
    x0 = np.zeros((6, 3), np.float32)
    x0[0] = [1, 2, 3]
    want = x0.astype(np.float64).copy()
    for t in range(1, 6):
        want[t] = want[t - 1] * 1.5 + 1
    xs = session.ndarray(x0)
    step.compile(session)  # (a loop's body only launches: compile before it)
    session.loop(1, 6, lambda t: step(t, xs, session=session))   # t symbolic: a LoopIndex
    np.testing.assert_allclose(xs.numpy(), want, rtol=1e-6)
    ys = session.ndarray(x0)
    with session.capture() as g:
        for t in range(1, 6):
            step(t, ys, session=session)
    session.replay(g)
    np.testing.assert_allclose(ys.numpy(), want, rtol=1e-6)


def test_mass_spring_port_matches_its_builder_kernels(session, ft):
    # examples/difftaichi/mass_spring.py's kernels are @vkad.kernel functions; the same kernels
    # written with KernelBuilder (difftaichi_builder_kernels.py, the port's `build=` hook) give
    # the same losses and gradients (the same operations in the same order: equal in f32 and
    # f64 on lavapipe, checked to round-off), and training agrees
    import difftaichi_builder_kernels as ref
    ms = ref.ms
    for toi in (True, False):
        a = ms.MassSpring(session, steps=40, dtype=ft, toi=toi, graph=False,
                          build=ref.mass_spring_kernels)
        b = ms.MassSpring(session, steps=40, dtype=ft, toi=toi, graph=False)
        assert isinstance(b.kernels["nn1"], vkad.Differentiated)
        assert isinstance(ms.build_kernels(ft, 6, 11, toi)[0]["nn1"], vkad.KernelFunction)
        a.forward_backward()
        b.forward_backward()
        r = dict(rtol=1e-10, atol=1e-14) if ft == vkad.f64 else dict(rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.arrays["loss"].numpy(), a.arrays["loss"].numpy(), **r)
        ga, gb = a.gradients(), b.gradients()
        for name in ga:
            np.testing.assert_allclose(gb[name], ga[name], **r)
        la = [a.iteration() for _ in range(2)]
        lb = [b.iteration() for _ in range(2)]
        np.testing.assert_allclose(lb, la, **r)


# --- more refused constructs -------------------------------------------------------------------

def test_error_static_break_under_runtime_if():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            for j in vkad.static(range(3)):
                if x[i] > 0.0:
                    break
    assert_error_at(lowering_error(k), k, "break", "vkad.static \\(unrolled\\) loop under a")


def test_error_assign_loop_index_and_parameter():
    def k1(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            i = 2
            x[i] = 1.0
    assert_error_at(lowering_error(k1), k1, "i = 2", "'i' is a loop index")

    def k2(a: vkad.f32, x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            a = a * 2.0
            x[i] = a
    assert_error_at(lowering_error(k2), k2, "a = a", "'a' is a kernel parameter")


def test_error_runtime_index_of_a_vector():
    def k(x: vkad.array(vkad.vec(2, vkad.f32)), n: vkad.array(vkad.i32)):
        for i in range(x.shape[0]):
            v = x[i]
            x[i] = v * v[n[i]]
    assert_error_at(lowering_error(k), k, "n[i]]", "indexed with Python ints")


def test_error_return_inside_a_runtime_if_of_a_func():
    @vkad.func
    def f(v):
        if v > 0.0:
            return v
        return -v

    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = f(x[i])
    assert_error_at(lowering_error(k), f.fn, "return v", "returns at its end")


def test_error_atomic_into_a_value():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            v = x[i]
            vkad.atomic_add(v, 1.0)
    assert_error_at(lowering_error(k), k, "v, 1.0", "the first argument is an array element")


# vkad.atomic_add borrows Taichi's and Warp's name, whose atomic_add returns the old value; the
# IR's atomic add yields none, so using the result is refused at its line (never None).
OLD_VALUE = "does not return the old value"


def test_atomic_result_is_refused(session):
    def assigned(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
        for i in range(x.shape[0]):
            old = vkad.atomic_add(y[0], x[i])
            y[i] = old
    assert_error_at(lowering_error(assigned), assigned, "vkad.atomic_add(y[0]", OLD_VALUE)

    def in_expression(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = vkad.atomic_sub(x[0], 1.0) + 1.0
    assert_error_at(lowering_error(in_expression), in_expression, "vkad.atomic_sub(x[0]",
                    "vkad.atomic_sub is a statement")

    @vkad.func
    def bump(x, i):
        return vkad.atomic_add(x[i], 1.0)

    def through_a_func(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            bump(x, i)
    assert_error_at(lowering_error(through_a_func), bump.fn, "vkad.atomic_add(x[i]", OLD_VALUE)

    def method(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = x.atomic_add((0,), 1.0)
    assert_error_at(lowering_error(method), method, "x.atomic_add((0,)", OLD_VALUE)

    def as_argument(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            vkad.atomic_add(x[i], vkad.atomic_add(x[0], 1.0))
    assert_error_at(lowering_error(as_argument), as_argument, "vkad.atomic_add(x[0], 1.0)",
                    OLD_VALUE)

    # refused the same way when differentiated or launched on a tape: nothing runs
    k = vkad.kernel(assigned)
    with pytest.raises(vkad.InvalidArgumentError, match=OLD_VALUE):
        session.differentiate(k)
    xs = session.ndarray(np.ones(3, np.float32), grad=True)
    ys = session.zeros(3, grad=True)
    with pytest.raises(vkad.InvalidArgumentError, match=OLD_VALUE):
        with session.tape():
            k(xs, ys, session=session)
    np.testing.assert_array_equal(ys.numpy(), 0.0)


@vkad.kernel
def scatter(w: vkad.array(vkad.f64), idx: vkad.array(vkad.i32),
            x: vkad.array(vkad.f64, grad=True), h: vkad.array(vkad.f64, grad=True)):
    for i in range(x.shape[0]):
        vkad.atomic_add(h[idx[i]], w[i] * x[i] * x[i])   # statements: their value unused
        vkad.atomic_sub(h[0], vkad.sin(x[i]))
        h.atomic_add((1,), x[i])


def test_atomic_statements_against_numpy_and_finite_differences(session, ft):
    if ft != vkad.f64:
        pytest.skip("finite differences want f64")
    rng = np.random.default_rng(5)
    n, m = 12, 4
    w, x = rng.normal(size=n), rng.normal(size=n)
    idx = rng.integers(0, m, size=n).astype(np.int32)
    seed = rng.normal(size=m)

    def f(xv):
        h = np.zeros(m)
        np.add.at(h, idx, w * xv * xv)
        h[0] -= np.sin(xv).sum()
        h[1] += xv.sum()
        return h

    xs, hs = session.ndarray(x, grad=True), session.zeros(m, vkad.f64, grad=True)
    t = session.tape()
    with t:
        scatter(session.ndarray(w), session.ndarray(idx), xs, hs, session=session)
    np.testing.assert_allclose(hs.numpy(), f(x), rtol=1e-12, atol=1e-12)
    t.backward(seed={hs: seed})
    step, fd = 1e-6, np.zeros(n)
    for j in range(n):
        e = np.zeros(n)
        e[j] = step
        fd[j] = seed @ (f(x + e) - f(x - e)) / (2 * step)
    np.testing.assert_allclose(t.grad(xs).numpy(), fd, rtol=1e-6, atol=1e-8)


def test_error_in_on_kernel_values_and_strings():
    def k(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            if x[i] in (1.0, 2.0):
                x[i] = 0.0
    assert_error_at(lowering_error(k), k, "x[i] in", "`In` compares values known")

    def k2(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            x[i] = f"{i}"
    assert_error_at(lowering_error(k2), k2, 'f"{i}"', "an f-string is not in the")


def test_guide_example_runs(tmp_path, capsys):
    # docs/kernels.md's first example, run from a file (a kernel's source is read from its file)
    import pathlib
    import runpy
    guide = pathlib.Path(__file__).resolve().parents[2] / "docs" / "kernels.md"
    code = guide.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "guide_example.py"
    path.write_text(code)
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out.strip() == "[ 1.  4.  9. 16.]"


def test_diffmpm_port_matches_its_builder_kernels(session, ft):
    # examples/difftaichi/diffmpm.py's kernels in DiffTaichi's spelling (@vkad.kernel, runtime
    # ifs for the actuators and the fluid) against the same kernels written with
    # KernelBuilder (selects; difftaichi_builder_kernels.py): same loss and gradients, for the
    # robot and for the fish (whose fluid takes p2g's fluid branches)
    import difftaichi_builder_kernels as ref
    dm = ref.dm
    kernels = dm.build_kernels(ft, 32, 10, False)
    assert "if " in kernels["p2g"].ir()  # runtime ifs (the actuators)
    assert "if " not in kernels["grid_op"].ir()  # a select: g2p recomputes a straight-line body
    r = dict(rtol=1e-10, atol=1e-15) if ft == vkad.f64 else dict(rtol=1e-4, atol=1e-8)
    for scene, grid, steps in (("robot", 32, 20), ("fish", 64, 8)):
        kw = dict(steps=steps, n_grid=grid, dtype=ft, scene=scene, graph=False, loop=False)
        a = dm.DiffMPM(session, build=ref.diffmpm_kernels, **kw)
        b = dm.DiffMPM(session, **kw)
        a.forward_backward()
        b.forward_backward()
        np.testing.assert_allclose(b.arrays["loss"].numpy(), a.arrays["loss"].numpy(), **r)
        ga, gb = a.gradients(), b.gradients()
        for name in ga:
            np.testing.assert_allclose(gb[name], ga[name], **r)


# --- more constructs: 3-d ndrange, u32 / i64 parameters, tuple returns, int / bool locals ------

@vkad.func
def split(v):
    return v[0] * 2.0, v[1] + 1.0         # a tuple, unpacked by the caller


@vkad.kernel
def box(x: vkad.array(vkad.f32, ndim=3), c: vkad.array(vkad.u32), big: vkad.array(vkad.i64)):
    for i, j, l in vkad.ndrange((1, x.shape[0]), x.shape[1], (0, 2)):
        x[i, j, l] = vkad.f32(i * 100 + j * 10 + l) + math.sqrt(vkad.f32(l)) \
            + vkad.static(math.sqrt(4.0))
        if i == 1 and j == 0 and l == 0:
            c[0] = c[0] + vkad.u32(7)
            big[1] = vkad.i64(i) * vkad.i64(3000000000 // 3)


def test_ndrange_3d_and_integer_types(session):
    xs = session.zeros((3, 2, 2))
    cs = session.ndarray(np.array([5, 0], np.uint32))
    bs = session.zeros(2, vkad.i64)
    box(xs, cs, bs, session=session)
    want = np.zeros((3, 2, 2))
    for i, j, l in np.ndindex(3, 2, 2):
        if i >= 1:
            want[i, j, l] = i * 100 + j * 10 + l + math.sqrt(l) + 2
    np.testing.assert_allclose(xs.numpy(), want, rtol=1e-6)
    assert cs.numpy().tolist() == [12, 0]
    assert bs.numpy().tolist() == [0, 1000000000]


@vkad.kernel
def loops_and_locals(x: vkad.array(vkad.vec(3, vkad.f64), ndim=1),
                     M: vkad.array(vkad.mat(3, 3, vkad.f64), ndim=1),
                     out: vkad.array(vkad.f64, ndim=2)):
    for i in range(x.shape[0]):
        v = x[i].map(vkad.tanh)
        A = M[i]
        w = A.inverse() @ (A @ v)
        a, b = split(w)
        count = 0                          # an i32 local
        found = False                      # a bool local
        u = vkad.Vector([0.0, 0.0, 0.0])   # a vector local (f64: it meets f64 values)
        n = 0
        while n < 10:
            n += 1
            if n % 3 == 0:
                continue
            count += 1
            u = u + v * 0.5
            if not found and u.norm() > 1.0:
                found = True
        out[i, 0] = a
        out[i, 1] = b
        out[i, 2] = vkad.f64(count)
        out[i, 3] = 1.0 if found else 0.0
        out[i, 4] = u.sum()
        out[i, 5] = (A.T @ A).trace()
        out[i, 6] = x[i, 0]                # a component of an element array


def test_while_continue_int_bool_vector_locals(session, ft):
    if ft != vkad.f64:
        pytest.skip("needs f64")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)) * 0.3
    x[0] = 0.01
    M = np.eye(3) + 0.2 * rng.normal(size=(5, 3, 3))
    out = session.zeros((5, 7), vkad.f64)
    loops_and_locals(session.ndarray(x), session.ndarray(M), out, session=session)
    v = np.tanh(x)
    u = v * 0.5 * 7
    want = np.stack([v[:, 0] * 2, v[:, 1] + 1, np.full(5, 7.0),
                     (np.linalg.norm(u, axis=1) > 1.0).astype(float), u.sum(1),
                     np.einsum("nij,nij->n", M, M), x[:, 0]], 1)
    assert want[0, 3] == 0.0 and want[:, 3].any()  # both outcomes of the flag occur
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-10, atol=1e-12)


def test_error_kernel_without_a_loop_and_func_outside_one():
    def k(x: vkad.array(vkad.f32)):
        n = 3
    assert_error_at(lowering_error(k), k, "def k", "the kernel has no loop")

    @vkad.func
    def f(v):
        return v

    def k2(x: vkad.array(vkad.f32)):
        y = f(x.shape[0])
        for i in range(y):
            x[i] = 1.0
    assert_error_at(lowering_error(k2), k2, "y)", "a task of its own")


n = 5  # a global of the same name as a kernel parameter below


@vkad.kernel
def shadowing(n: vkad.i32, x: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        if n > 3:                           # the parameter, not the global: a runtime if
            r = 1.0
        else:
            r = 2.0
        for _ in range(1):
            for _ in range(2):              # `_` may be reused
                r = r + 0.5
        x[i] = r


def test_parameter_shadows_a_global(session):
    xs = session.zeros(2)
    shadowing(1, xs, session=session)
    np.testing.assert_allclose(xs.numpy(), 3.0)
    shadowing(4, xs, session=session)
    np.testing.assert_allclose(xs.numpy(), 2.0)


def test_second_process_parses_nothing(tmp_path):
    # The lowering is kept on disk (frontend-<hash>.json beside the sessions' caches): a second
    # process with the same kernel and captured values compiles from it without parsing.
    import os
    import subprocess
    import sys
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import sys, numpy as np, vkad, vkad.frontend as fe\n"
        "SCALE = float(sys.argv[1])\n"
        "if sys.argv[2] == 'no-parse':\n"
        "    def refuse(*a, **k): raise AssertionError('parsed')\n"
        "    fe._Source.__init__ = refuse\n"
        "@vkad.func\n"
        "def twice(v):\n"
        "    return v * 2.0\n"
        "@vkad.kernel\n"
        "def k(x: vkad.array(vkad.f32)):\n"
        "    for i in range(x.shape[0]):\n"
        "        x[i] = twice(x[i]) * SCALE\n"
        "with vkad.Session() as s:\n"
        "    xs = s.ndarray(np.arange(3, dtype=np.float32))\n"
        "    k(xs, session=s)\n"
        "    print(xs.numpy().tolist())\n")
    env = dict(os.environ, VKAD_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("VKAD_CACHE", None)

    def run(*args):
        r = subprocess.run([sys.executable, str(prog), *args], env=env, capture_output=True,
                           text=True, timeout=120)
        return r.returncode, r.stdout.strip(), r.stderr

    assert run("3", "parse")[:2] == (0, "[0.0, 6.0, 12.0]")
    assert any(p.name.startswith("frontend-") for p in (tmp_path / "cache").iterdir())
    assert run("3", "no-parse")[:2] == (0, "[0.0, 6.0, 12.0]")       # from the disk
    code, out, err = run("5", "no-parse")                              # SCALE changed
    assert code != 0 and "parsed" in err
    assert run("5", "parse")[:2] == (0, "[0.0, 10.0, 20.0]")
    assert run("3", "no-parse")[:2] == (0, "[0.0, 6.0, 12.0]")       # both kept


@vkad.kernel
def conversions(x: "vkad.array(vkad.f32)", n: "vkad.array(vkad.i32)"):  # string annotations
    for i in range(x.shape[0]):
        a = int(x[i])                        # a cast to i32 (truncates)
        b = float(n[i]) + vkad.cast(2, vkad.f32) + vkad.f32(1)
        c = bool(n[i])                       # != 0
        x[i] = vkad.f32(a) * 100.0 + b + (10.0 if c else 0.0) + vkad.static(abs(-0.5))


def test_conversions_and_string_annotations(session):
    xs = session.ndarray(np.array([1.75, -2.5, 3.0], np.float32))
    ns = session.ndarray(np.array([0, 4, -1], np.int32))
    conversions(xs, ns, session=session)
    want = [100 * 1 + 0 + 3 + 0 + 0.5, -200 + 4 + 3 + 10 + 0.5, 300 - 1 + 3 + 10 + 0.5]
    np.testing.assert_allclose(xs.numpy(), want)


def test_torch_function_takes_a_kernel(session):
    torch = pytest.importorskip("torch")
    import vkad.torch as vt

    @vkad.kernel
    def sq(x: vkad.array(vkad.f64, grad=True), y: vkad.array(vkad.f64, grad=True)):
        for i in range(x.shape[0]):
            y[i] = x[i] * x[i] * 0.5

    if not f64_ok(session):
        pytest.skip("needs f64")
    F = vt.function(sq, session)
    # The session's arrays' device (cuda:N on an NVIDIA GPU, else the CPU): the tensors' too.
    kind, index = session.empty(1).__dlpack_device__()
    dev = "cpu" if kind == 1 else f"cuda:{index}"
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, device=dev, requires_grad=True)
    y = F.apply(x, torch.zeros(3, dtype=torch.float64, device=dev))
    y = y[0] if isinstance(y, tuple) else y
    y.sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), [1.0, -2.0, 3.0])


def test_scalar_grad_annotation(session):
    @vkad.kernel
    def scaled(a: vkad.scalar(vkad.f32, grad=True), x: vkad.array(vkad.f32, grad=True),
               y: vkad.array(vkad.f32, grad=True)):
        for i in range(x.shape[0]):
            y[i] = a * x[i]

    assert "a: f32 grad" in scaled.ir()
    d = session.differentiate(scaled)
    assert d.gradients == {"a": "a_grad", "x": "x_grad", "y": "y_grad"}


def test_scalar_gradient_on_a_tape_and_forward_mode(session, ft):
    if ft != vkad.f64:
        pytest.skip("needs f64")

    @vkad.kernel
    def scaled(a: vkad.scalar(vkad.f64, grad=True), x: vkad.array(vkad.f64, grad=True),
               y: vkad.array(vkad.f64, grad=True)):
        for i in range(x.shape[0]):
            y[i] = a * x[i] * x[i]

    x = np.array([1.0, 2.0, 3.0])
    xs, ys = session.ndarray(x), session.zeros(3, vkad.f64)
    t = session.tape()
    with t:
        scaled(2.0, xs, ys, session=session)
    t.backward(seed={ys: 1.0})
    np.testing.assert_allclose(t.grad(xs).numpy(), 4 * x)
    np.testing.assert_allclose(t.grad(scaled.differentiate(session), "a").numpy(), [14.0])
    j = session.jvp(scaled)  # forward mode: a_dot = 1, x_dot = e_0
    y_dot = session.zeros(3, vkad.f64)
    session.launch(j, 2.0, xs, ys, 1.0, session.ndarray(np.array([1.0, 0.0, 0.0])), y_dot)
    np.testing.assert_allclose(y_dot.numpy(), x * x + 4 * x * np.array([1.0, 0.0, 0.0]))


def test_refused_reverse_mode_names_the_python_line(session):
    # vkad's own errors quote the IR statement; the front end appends its Python line
    # x read at i + 1 and written at i: another invocation's element (an update of x[i] from
    # x[i] alone would be differentiated: docs/tape.md, "A kernel that updates an array in
    # place")
    def k(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
        for i in range(x.shape[0] - 1):
            y[i] = x[i + 1] * 2.0
            b = y[i] + 1.0
            x[i] = b
    kern = vkad.kernel(k)
    with pytest.raises(vkad.InvalidArgumentError) as e:
        session.differentiate(kern)
    assert "reverse mode of kernel 'k'" in str(e.value)
    assert_error_at(e, k, "x[i] = b", "is both read and written")
    xs, ys = session.zeros(3, grad=True), session.zeros(3, grad=True)
    with pytest.raises(vkad.InvalidArgumentError) as e:
        with session.tape():
            kern(xs, ys, session=session)   # differentiated at the call: the same error
    assert_error_at(e, k, "x[i] = b", "is both read and written")
