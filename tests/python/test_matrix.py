"""vkad.Vector / vkad.Matrix in the kernel builder (python/vkad/matrix.py): every operation's
kernel result against numpy, loads and stores of vector / matrix elements (the trailing axes of
an ndarray), rank-0 arrays, the type errors, and gradients of a kernel built from matmul,
determinant and polar decomposition against central finite differences."""
import numpy as np
import pytest

import vkad
from conftest import f64_ok
from vkad import Matrix, Vector

P = 8  # elements per test kernel


@pytest.fixture(scope="module")
def ftype(session):
    return vkad.f64 if f64_ok(session) else vkad.f32


def close(ftype):
    # Forward results: a few roundings of O(1) values (at most 3x3 products and one inverse of a
    # matrix with condition number < 3): f32 ~ 1e-6 relative, f64 ~ 1e-15.
    return dict(rtol=1e-12, atol=1e-12) if ftype == vkad.f64 else dict(rtol=2e-5, atol=2e-5)


def inputs(n, ftype, seed=0):
    rng = np.random.default_rng(seed + n)
    npt = vkad.numpy_dtype(ftype)
    # 1.5 I + noise: well conditioned (inverse), positive trace (polar decomposition is defined)
    A = (1.5 * np.eye(n) + 0.3 * rng.standard_normal((P, n, n))).astype(npt)
    B = rng.standard_normal((P, n, n)).astype(npt)
    u = rng.standard_normal((P, n)).astype(npt)
    w = rng.standard_normal((P, n)).astype(npt)
    s = rng.uniform(0.2, 1.0, P).astype(npt)
    return A, B, u, w, s


def run(session, ftype, n, body, out_element, seed=0):
    """Launches out[p] = body(A[p], B[p], u[p], w[p], s[p]) over P elements; returns
    (out, (A, B, u, w, s))."""
    kb = vkad.KernelBuilder("op")
    arrays = [kb.ndarray("A", ftype, 1, element=(n, n), readonly=True),
              kb.ndarray("B", ftype, 1, element=(n, n), readonly=True),
              kb.ndarray("u", ftype, 1, element=(n,), readonly=True),
              kb.ndarray("w", ftype, 1, element=(n,), readonly=True),
              kb.ndarray("s", ftype, 1, readonly=True)]
    out = kb.ndarray("out", ftype, 1, element=out_element)
    with kb.parallel_for("main", 0, out.shape[0]) as p:
        out[p] = body(*(a[p] for a in arrays))
    data = inputs(n, ftype, seed)
    o = session.empty((P,) + out_element, ftype)
    session.launch(session.compile(kb), *(session.ndarray(d) for d in data), o)
    return o.numpy(), data


def mat(x):  # the scalar per element as a broadcastable matrix / vector factor
    return x[:, None, None]


def vec(x):
    return x[:, None]


inv = np.linalg.inv
# name: (sizes, kernel body, numpy reference, output element shape as a function of n)
OPS = {
    "M+M": ((2, 3), lambda A, B, u, w, s: A + B, lambda A, B, u, w, s: A + B, "nn"),
    "M-M": ((2, 3), lambda A, B, u, w, s: A - B, lambda A, B, u, w, s: A - B, "nn"),
    "M*M": ((2, 3), lambda A, B, u, w, s: A * B, lambda A, B, u, w, s: A * B, "nn"),
    "M*s": ((2, 3), lambda A, B, u, w, s: A * s, lambda A, B, u, w, s: A * mat(s), "nn"),
    "s*M": ((2, 3), lambda A, B, u, w, s: s * A, lambda A, B, u, w, s: mat(s) * A, "nn"),
    "2*M-1": ((2, 3), lambda A, B, u, w, s: 2.0 * A - 1.0, lambda A, B, u, w, s: 2 * A - 1, "nn"),
    "M/s": ((2, 3), lambda A, B, u, w, s: A / s, lambda A, B, u, w, s: A / mat(s), "nn"),
    "1/M": ((2, 3), lambda A, B, u, w, s: 1.0 / (A + 5.0),
            lambda A, B, u, w, s: 1 / (A + 5), "nn"),
    "-M": ((2, 3), lambda A, B, u, w, s: -A, lambda A, B, u, w, s: -A, "nn"),
    "M@M": ((2, 3), lambda A, B, u, w, s: A @ B, lambda A, B, u, w, s: A @ B, "nn"),
    "M@v": ((2, 3), lambda A, B, u, w, s: A @ u,
            lambda A, B, u, w, s: np.einsum("pij,pj->pi", A, u), "n"),
    "v@M": ((2, 3), lambda A, B, u, w, s: u @ A,
            lambda A, B, u, w, s: np.einsum("pi,pij->pj", u, A), "n"),
    "M.T": ((2, 3), lambda A, B, u, w, s: A.T, lambda A, B, u, w, s: A.transpose(0, 2, 1), "nn"),
    "M@B.T": ((2, 3), lambda A, B, u, w, s: A @ B.transpose(),
              lambda A, B, u, w, s: A @ B.transpose(0, 2, 1), "nn"),
    "outer": ((2, 3), lambda A, B, u, w, s: u.outer_product(w),
              lambda A, B, u, w, s: np.einsum("pi,pj->pij", u, w), "nn"),
    "det": ((2, 3), lambda A, B, u, w, s: A.determinant(), lambda A, B, u, w, s: np.linalg.det(A),
            ""),
    "trace": ((2, 3), lambda A, B, u, w, s: A.trace(),
              lambda A, B, u, w, s: np.trace(A, axis1=1, axis2=2), ""),
    "inverse": ((2, 3), lambda A, B, u, w, s: A.inverse(), lambda A, B, u, w, s: inv(A), "nn"),
    "identity+diag": ((2, 3), lambda A, B, u, w, s: Matrix.identity(A.n) + Matrix.diag(A.n, s),
                      lambda A, B, u, w, s: np.eye(A.shape[1]) * (1 + mat(s)), "nn"),
    "zero+M@I": ((2, 3), lambda A, B, u, w, s: Matrix.zero(A.n) + A @ Matrix.identity(A.n),
                 lambda A, B, u, w, s: A, "nn"),
    "sum": ((2, 3), lambda A, B, u, w, s: A.sum() + u.sum(),
            lambda A, B, u, w, s: A.sum((1, 2)) + u.sum(1), ""),
    "frobenius": ((2, 3), lambda A, B, u, w, s: A.norm_sqr(),
                  lambda A, B, u, w, s: (A * A).sum((1, 2)), ""),
    "row,col,M[i,j]": ((2, 3), lambda A, B, u, w, s: A[1] + A.col(0) * A[0, 1],
                       lambda A, B, u, w, s: A[:, 1] + A[:, :, 0] * vec(A[:, 0, 1]), "n"),
    "Matrix.rows/cols": ((2, 3), lambda A, B, u, w, s: Matrix.rows(list(A)) - Matrix.cols(list(B)),
                         lambda A, B, u, w, s: A - B.transpose(0, 2, 1), "nn"),
    "v+w": ((2, 3), lambda A, B, u, w, s: u + w, lambda A, B, u, w, s: u + w, "n"),
    "v-w": ((2, 3), lambda A, B, u, w, s: u - w, lambda A, B, u, w, s: u - w, "n"),
    "v*w": ((2, 3), lambda A, B, u, w, s: u * w, lambda A, B, u, w, s: u * w, "n"),
    "v*s+1": ((2, 3), lambda A, B, u, w, s: u * s + 1.0, lambda A, B, u, w, s: u * vec(s) + 1, "n"),
    "dot": ((2, 3), lambda A, B, u, w, s: u.dot(w), lambda A, B, u, w, s: (u * w).sum(1), ""),
    "norm": ((2, 3), lambda A, B, u, w, s: u.norm(),
             lambda A, B, u, w, s: np.linalg.norm(u, axis=1), ""),
    "norm(eps)": ((2, 3), lambda A, B, u, w, s: u.norm(1e-2),
                  lambda A, B, u, w, s: np.sqrt((u * u).sum(1) + 1e-2), ""),
    "norm_sqr": ((2, 3), lambda A, B, u, w, s: u.norm_sqr(), lambda A, B, u, w, s: (u * u).sum(1),
                 ""),
    "normalized": ((2, 3), lambda A, B, u, w, s: u.normalized(),
                   lambda A, B, u, w, s: u / np.linalg.norm(u, axis=1, keepdims=True), "n"),
    # Taichi's meaning: eps added to the norm, v / (|v| + eps), not v / sqrt(|v|^2 + eps).
    "normalized(eps)": ((2, 3), lambda A, B, u, w, s: u.normalized(0.5),
                        lambda A, B, u, w, s: u / (np.linalg.norm(u, axis=1, keepdims=True)
                                                   + 0.5), "n"),
    "norm_inv(eps)": ((2, 3), lambda A, B, u, w, s: u.norm_inv(1e-2),
                      lambda A, B, u, w, s: 1 / np.sqrt((u * u).sum(1) + 1e-2), ""),
    "cross2": ((2,), lambda A, B, u, w, s: u.cross(w),
               lambda A, B, u, w, s: u[:, 0] * w[:, 1] - u[:, 1] * w[:, 0], ""),
    "cross3": ((3,), lambda A, B, u, w, s: u.cross(w), lambda A, B, u, w, s: np.cross(u, w), "n"),
    "Vector(...)": ((2, 3), lambda A, B, u, w, s: Vector([s] + [0.5] * (u.n - 1)) + Vector.zero(u.n)
                    + Vector.unit(u.n, 0),
                    lambda A, B, u, w, s: np.stack([s + 1] + [np.full(P, 0.5)] * (u.shape[1] - 1),
                                                   1), "n"),
    "map(tanh)": ((2, 3), lambda A, B, u, w, s: u.map(vkad.tanh), lambda A, B, u, w, s: np.tanh(u),
                  "n"),
    "select": ((2, 3), lambda A, B, u, w, s: vkad.select(s > 0.5, u, w),
               lambda A, B, u, w, s: np.where(vec(s) > 0.5, u, w), "n"),
    "select(scalar)": ((2, 3), lambda A, B, u, w, s: vkad.select(s > 0.5, A, 0.0),
                       lambda A, B, u, w, s: np.where(mat(s) > 0.5, A, 0), "nn"),
    "M**2": ((2, 3), lambda A, B, u, w, s: (B - 1.0) ** 2, lambda A, B, u, w, s: (B - 1) ** 2,
             "nn"),
    "v**3": ((2, 3), lambda A, B, u, w, s: u ** 3, lambda A, B, u, w, s: u ** 3, "n"),
    "v**-1": ((2, 3), lambda A, B, u, w, s: (u + 5.0) ** -1, lambda A, B, u, w, s: 1 / (u + 5),
              "n"),
    "v**s": ((2, 3), lambda A, B, u, w, s: (u * u + 0.5) ** s,
             lambda A, B, u, w, s: (u * u + 0.5) ** vec(s), "n"),
    "unpack": ((2,), lambda A, B, u, w, s: (lambda a, b: Vector([b, a]))(*u),
               lambda A, B, u, w, s: u[:, ::-1], "n"),
}
CASES = [(name, n) for name, (sizes, *_) in OPS.items() for n in sizes]


@pytest.mark.parametrize("name,n", CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_operation_matches_numpy(session, ftype, name, n):
    _, body, ref, out = OPS[name]
    element = {"nn": (n, n), "n": (n,), "": ()}[out]
    got, data = run(session, ftype, n, body, element)
    want = ref(*(d.astype(np.float64) for d in data))
    np.testing.assert_allclose(got, want, **close(ftype), err_msg=name)


def test_polar_decomposition(session, ftype):
    def body(A, B, u, w, s):
        R, S = vkad.polar_decompose(A)
        return Matrix([list(R.flat), list(S.flat)])  # 2x4: R's and S's components

    got, (A, *_) = run(session, ftype, 2, body, (2, 4))
    R, S = got[:, 0].reshape(P, 2, 2), got[:, 1].reshape(P, 2, 2)
    A = A.astype(np.float64)
    tol = close(ftype)
    np.testing.assert_allclose(R @ S, A, **tol)  # a decomposition of A
    np.testing.assert_allclose(R @ R.transpose(0, 2, 1), np.broadcast_to(np.eye(2), (P, 2, 2)),
                               **tol)  # R orthogonal ...
    np.testing.assert_allclose(np.linalg.det(R), np.ones(P), **tol)  # ... and a rotation
    np.testing.assert_allclose(S, S.transpose(0, 2, 1), **tol)  # S symmetric
    # The polar factor is the rotation nearest A: U V^T of A's SVD when det(A) > 0 (it is here).
    assert (np.linalg.det(A) > 0).all()
    U, _, Vt = np.linalg.svd(A)
    np.testing.assert_allclose(R, U @ Vt, **tol)


def test_vector_and_matrix_elements_of_ndarrays(session, ftype):
    # DiffTaichi's layout: x[t, p] a 2-vector of a (T, P, 2) array, C[t, p] a 2x2 matrix of a
    # (T, P, 2, 2) one; read at step t, written at t + 1 of the same array.
    T = 3
    npt = vkad.numpy_dtype(ftype)
    kb = vkad.KernelBuilder("elements")
    t = kb.scalar("t", vkad.i32)
    x = kb.ndarray("x", ftype, 2, element=(2,))
    C = kb.ndarray("C", ftype, 2, element=(2, 2))
    total = kb.ndarray("total", ftype, 0, element=(2,))  # one 2-vector, shape (2,)
    count = kb.ndarray("count", ftype, 0)  # one scalar, shape (1,)
    assert (x.rank, x.index_rank, x.element) == (3, 2, (2,)) and len(C.shape) == 4
    with kb.parallel_for("main", 0, x.shape[1]) as p:
        xv, Cm = x[t, p], C[t, p]
        x[t + 1, p] = Cm @ xv + Vector([x[t, p, 1], C[t, p, 1][0]])  # component, row
        C[t + 1, p] = Cm @ Cm
        total.atomic_add(None, xv)
        count.atomic_add((), 1.0)
    k = session.compile(kb)
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((T, P, 2)).astype(npt)
    C0 = rng.standard_normal((T, P, 2, 2)).astype(npt)
    xs, Cs = session.ndarray(x0), session.ndarray(C0)
    tot, cnt = session.zeros(2, ftype), session.zeros(1, ftype)
    session.launch(k, 1, xs, Cs, tot, cnt)
    want_x, want_C = x0.copy(), C0.copy()
    want_x[2] = np.einsum("pij,pj->pi", C0[1], x0[1]) + np.stack([x0[1, :, 1], C0[1, :, 1, 0]], 1)
    want_C[2] = C0[1] @ C0[1]
    np.testing.assert_allclose(xs.numpy(), want_x, **close(ftype))
    np.testing.assert_allclose(Cs.numpy(), want_C, **close(ftype))
    np.testing.assert_allclose(tot.numpy(), x0[1].sum(0), **close(ftype))
    assert cnt.numpy().tolist() == [P]


def test_vector_index_and_vector_local(session):
    # grid[base + offset] indexes with an integer Vector (diffmpm's scatter), and a Vector
    # local carries a sum through a run-time loop.
    kb = vkad.KernelBuilder("scatter")
    n = kb.scalar("n", vkad.i32)
    pos = kb.ndarray("pos", vkad.i32, 1, element=(2,), readonly=True)
    grid = kb.ndarray("grid", vkad.f32, 2, element=(2,))
    with kb.parallel_for("main", 0, pos.shape[0]) as p:
        base = pos[p]
        acc = kb.local(Vector([0.0, 0.0], vkad.f32))
        with kb.for_range(0, n) as i:
            acc += Vector([vkad.cast(i, vkad.f32), 1.0])
        grid.atomic_add(base + Vector([1, 0]), acc.value)
    k = session.compile(kb)
    g = session.zeros((4, 4, 2))
    session.launch(k, 3, session.ndarray(np.array([[0, 1], [2, 3], [0, 1]], np.int32)), g)
    want = np.zeros((4, 4, 2), np.float32)
    want[1, 1] = 2 * np.array([0 + 1 + 2, 3])
    want[3, 3] = [0 + 1 + 2, 3]
    np.testing.assert_array_equal(g.numpy(), want)


def test_int_powers_multiply(session, ftype):
    # x ** n with a Python int n is unrolled into multiplications (by squaring), as Taichi does:
    # `(fx - 1) ** 2` of diffmpm's B-spline weights has a negative base, where the IR's `pow`
    # (GLSL's) is undefined on a device and NaN in f64. Other exponents stay `pow`.
    kb = vkad.KernelBuilder("powers")
    x = kb.ndarray("x", ftype, 1, readonly=True)
    y = kb.ndarray("y", ftype, 1, element=(6,))
    with kb.parallel_for("main", 0, x.shape[0]) as p:
        v = x[p]
        y[p] = Vector([v ** 0, v ** 1, v ** 2, v ** 5, v ** -2, abs(v) ** 0.5])
    text = kb.finish()
    assert text.count(" pow ") == 1  # only the float exponent
    assert text.count(" mul ") == 1 + 3 + 1  # v*v; v^2, v^4, v*v^4; (v*v) for v ** -2
    xs = np.array([-1.5, -0.5, 0.25, 2.0], vkad.numpy_dtype(ftype))
    ys = session.empty((4, 6), ftype)
    session.launch(session.compile(kb), session.ndarray(xs), ys)
    x64 = xs.astype(np.float64)[:, None]
    want = np.concatenate([x64 ** 0, x64, x64 ** 2, x64 ** 5, x64 ** -2.0, np.abs(x64) ** 0.5], 1)
    np.testing.assert_allclose(ys.numpy(), want, **close(ftype))
    kb = vkad.KernelBuilder("ipow")
    n = kb.scalar("n", vkad.i32)
    with kb.parallel_for("main", 0, 1):
        with pytest.raises(TypeError, match="negative exponent -1 of an integer"):
            n ** -1


def test_parallel_for_nd(session, ftype):
    # Taichi's `for i, j in grid`: a 2-d (or 3-d) task, the last index fastest, and its adjoint.
    kb = vkad.KernelBuilder("grid")
    a = kb.ndarray("a", ftype, 2, grad=True)
    b = kb.ndarray("b", ftype, 3, grad=True)
    with kb.parallel_for_nd("cells", (1, a.shape[0]), a.shape[1]) as (i, j):
        a_ij = a[i, j]
        b[0, i, j] = a_ij * a_ij + vkad.cast(i * 10 + j, ftype)
    with kb.parallel_for_nd("box", 2, 3, (1, 2)) as (i, j, k):
        b[1 + i, j, k] = vkad.cast(100 * i + 10 * j + k, ftype)
    assert "task cells parallel %0 in [1, shape(a, 0)), %1 in [0, shape(a, 1))" in kb.finish()
    k = session.differentiate(kb)
    npt = vkad.numpy_dtype(ftype)
    a0 = np.arange(12, dtype=npt).reshape(3, 4)
    arr, out = session.ndarray(a0), session.zeros((3, 3, 4), ftype)
    with session.tape() as t:
        session.launch(k, arr, out)
    t.backward(seed={out: 1.0})
    want = np.zeros((3, 3, 4))
    ii, jj = np.meshgrid(np.arange(1, 3), np.arange(4), indexing="ij")
    want[0, 1:] = a0[1:] ** 2 + 10 * ii + jj
    for i in range(2):
        for j in range(3):
            want[1 + i, j, 1] = 100 * i + 10 * j + 1
    np.testing.assert_array_equal(out.numpy(), want)
    grad = np.zeros((3, 4))
    grad[1:] = 2 * a0[1:]
    np.testing.assert_array_equal(t.grad(arr).numpy(), grad)
    with pytest.raises(TypeError, match="2 or 3 ranges"):
        with kb.parallel_for_nd("one", 4):
            pass


def test_type_errors_name_what_is_wrong(session):
    kb = vkad.KernelBuilder("bad")
    a2 = kb.ndarray("a2", vkad.f32, 1, element=(2,))
    m2 = kb.ndarray("m2", vkad.f32, 1, element=(2, 2))
    m3 = kb.ndarray("m3", vkad.f32, 1, element=(3, 3))
    d = kb.ndarray("d", vkad.f64, 1, element=(2,))
    r = kb.ndarray("r", vkad.f32, 1, element=(2, 3))
    s = kb.ndarray("s", vkad.f32, 0)
    with kb.parallel_for("main", 0, a2.shape[0]) as p:
        v, M, M3, vd, R = a2[p], m2[p], m3[p], d[p], r[p]
        with pytest.raises(TypeError, match=r"add: shapes 2-vector \(2,\) and 3-vector \(3,\)"):
            v + M3[0]
        with pytest.raises(TypeError, match=r"mul: shapes 2x2 matrix \(2, 2\) and 3x3 matrix"):
            M * M3
        with pytest.raises(TypeError, match=r"matmul \(@\): shapes 2x2 matrix \(2, 2\) and 3-vector"
                                            r" \(3,\) do not chain"):
            M @ M3[1]
        with pytest.raises(TypeError, match="two vectors .* a.dot"):
            v @ v
        with pytest.raises(TypeError, match="types f32 and f64 differ"):
            v + vd
        with pytest.raises(TypeError, match="dot: shapes 2-vector"):
            v.dot(M3[0])
        with pytest.raises(TypeError, match="determinant: needs a square matrix, got a 2x3"):
            R.determinant()
        with pytest.raises(TypeError, match="polar_decompose: defined for 2x2 matrices, got a 3x3"):
            vkad.polar_decompose(M3)
        with pytest.raises(TypeError, match="cross: defined for 2- and 3-vectors"):
            Vector([1.0, 2.0, 3.0, 4.0]).cross(Vector([1.0, 2.0, 3.0, 4.0]))
        with pytest.raises(TypeError, match="immutable"):
            v[0] = 1.0
        with pytest.raises(TypeError, match="indexed with a Python int"):
            v[p]
        with pytest.raises(IndexError, match="component 2 of a 2-vector"):
            v[2]
        with pytest.raises(TypeError, match="no truth value"):
            bool(v)
        with pytest.raises(TypeError, match=r"store into 'm2': the element is a 2x2 matrix "
                                            r"\(2, 2\), got Vector\(2-vector, f32\)"):
            m2[p] = v
        with pytest.raises(TypeError, match="store into 'a2': types f32 and f64 differ"):
            a2[p] = vd
        with pytest.raises(TypeError, match="atomic_add into 's': the element is a scalar"):
            s.atomic_add(None, v)
        with pytest.raises(IndexError, match=r"ndarray 'm2' takes 1 indices \(then up to 2 "
                                             r"component indices; its elements are 2x2\), "
                                             "indexed with 4"):
            m2[p, 0, 0, 0]
        with pytest.raises(IndexError,
                           match=r"'s' has rank 0 \(one scalar\): index it as s\[None\]"):
            s[p]
        with pytest.raises(TypeError, match="Matrix: row 1 has 1 components, row 0 has 2"):
            Matrix([[1.0, 2.0], [3.0]])
    with pytest.raises(TypeError, match="element is"):
        kb.ndarray("bad", vkad.f32, 1, element=(2, 2, 2))


def test_rank_0_arrays_are_held_in_shape_1(session):
    with pytest.raises(vkad.InvalidArgumentError, match=r"shape \(\): .* in shape \(1,\)"):
        session.zeros(())
    with pytest.raises(vkad.InvalidArgumentError, match=r"shape \(\): .* in shape \(1,\)"):
        session.ndarray(np.float32(1.0))


# --- gradients ---------------------------------------------------------------------------------

def elastic(ftype):
    """diffmpm's stress, per element p, summed into a rank-0 loss with weights W:
    new_F = (I + dt C) F, J = det(new_F), (R, S) = polar(new_F),
    stress = 2 mu (new_F - R) new_F^T + la (J - 1) J I, loss += sum(W * stress) + u^T stress u."""
    kb = vkad.KernelBuilder("elastic")
    F = kb.ndarray("F", ftype, 1, element=(2, 2), grad=True)
    C = kb.ndarray("C", ftype, 1, element=(2, 2), grad=True)
    u = kb.ndarray("u", ftype, 1, element=(2,), grad=True)
    W = kb.ndarray("W", ftype, 1, element=(2, 2), readonly=True)
    loss = kb.ndarray("loss", ftype, 0, grad=True)
    dt, mu, la = 0.3, 1.7, 0.9
    with kb.parallel_for("main", 0, F.shape[0]) as p:
        new_F = (Matrix.identity(2) + dt * C[p]) @ F[p]
        J = new_F.determinant()
        R, _ = vkad.polar_decompose(new_F)
        stress = 2 * mu * (new_F - R) @ new_F.T + Matrix.diag(2, la * (J - 1) * J)
        v = u[p]
        loss.atomic_add(None, (W[p] * stress).sum() + v.dot(stress @ v))
    return kb


def test_gradient_of_matmul_det_polar_matches_finite_differences(session, ftype):
    # Central differences: error h^2/6 |f'''| (truncation) + eps |f| / h (rounding). The loss is
    # O(10) with O(100) third derivatives here; f64 with h = 1e-6: ~1e-10 + ~1e-9, so 1e-6
    # relative is loose and still catches a wrong rule (those are O(1) off). f32 with h = 1e-2
    # (eps 6e-8): ~2e-3 + ~6e-5 of the O(1..10) gradients, hence 2e-2 relative and 1e-2 absolute.
    k = session.differentiate(elastic(ftype))
    npt = vkad.numpy_dtype(ftype)
    rng = np.random.default_rng(11)
    n = 4
    F0 = (np.eye(2) + 0.3 * rng.standard_normal((n, 2, 2))).astype(npt)
    C0 = (0.5 * rng.standard_normal((n, 2, 2))).astype(npt)
    u0 = rng.standard_normal((n, 2)).astype(npt)
    W0 = rng.standard_normal((n, 2, 2)).astype(npt)
    F, C, u, W = (session.ndarray(a) for a in (F0, C0, u0, W0))
    loss = session.zeros(1, ftype)
    with session.tape() as t:
        session.launch(k, F, C, u, W, loss)
    t.backward(seed={loss: 1.0})
    grads = {"F": t.grad(F).numpy(), "C": t.grad(C).numpy(), "u": t.grad(u).numpy()}

    h = 1e-6 if ftype == vkad.f64 else 1e-2
    tol = dict(rtol=1e-6, atol=1e-7) if ftype == vkad.f64 else dict(rtol=2e-2, atol=1e-2)

    def objective(Fh, Ch, uh):
        F.upload(Fh), C.upload(Ch), u.upload(uh), session.zero(loss)
        session.launch(k.forward, F, C, u, W, loss)
        return float(loss.numpy()[0])

    base = {"F": F0, "C": C0, "u": u0}
    for name, g in grads.items():
        fd = np.zeros(g.shape)
        for j in np.ndindex(*g.shape):
            for sign in (1, -1):
                args = {key: a.copy() for key, a in base.items()}
                args[name][j] += sign * h
                fd[j] += sign * objective(args["F"], args["C"], args["u"])
            fd[j] /= 2 * h
        assert np.abs(g).max() > 0.1, name  # a gradient that is there to compare
        np.testing.assert_allclose(g, fd, **tol, err_msg=f"d loss / d {name}")


def test_gradient_of_3x3_inverse_and_determinant(session, ftype):
    # loss = sum_p det(A_p) + sum(inv(A_p) @ b_p): closed forms d det / dA = det A^-T and
    # d (A^-1 b)_i / dA = -A^-T e_i (A^-1 b)^T; compared directly.
    kb = vkad.KernelBuilder("inv3")
    A = kb.ndarray("A", ftype, 1, element=(3, 3), grad=True)
    b = kb.ndarray("b", ftype, 1, element=(3,), readonly=True)
    loss = kb.ndarray("loss", ftype, 0, grad=True)
    with kb.parallel_for("main", 0, A.shape[0]) as p:
        M = A[p]
        loss.atomic_add(None, M.determinant() + (M.inverse() @ b[p]).sum())
    k = session.differentiate(kb)
    A0, _, b0, _, _ = inputs(3, ftype, seed=5)
    a, l = session.ndarray(A0), session.zeros(1, ftype)
    with session.tape() as t:
        session.launch(k, a, session.ndarray(b0), l)
    t.backward(seed={l: 1.0})
    A64, b64 = A0.astype(np.float64), b0.astype(np.float64)
    Ainv = np.linalg.inv(A64)
    x = np.einsum("pij,pj->pi", Ainv, b64)
    want = (np.linalg.det(A64)[:, None, None] * Ainv.transpose(0, 2, 1)
            - np.einsum("pi,pj->pij", Ainv.transpose(0, 2, 1) @ np.ones(3), x))
    tol = dict(rtol=1e-10, atol=1e-10) if ftype == vkad.f64 else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(t.grad(a).numpy(), want, **tol)
