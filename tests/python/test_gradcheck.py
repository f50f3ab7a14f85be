"""vkad.gradcheck and vkad.jacobian (python/vkad/debugging.py, docs/debugging.md; issue 56, point
4): reverse-mode gradients against central differences on correct kernels (elementwise, a loop, a
grad scalar, a stencil, a function launching two kernels on a tape) in f32 and f64; failures on
a deliberately wrong custom gradient and at a kink; Jacobians against a matrix and against
differences; the size cap and the argument errors."""
import numpy as np
import pytest

import vkad
from conftest import f64_ok

N = 12


def npt(ft):
    return np.float64 if ft == vkad.f64 else np.float32


def kinds(session):
    return [vkad.f32] + ([vkad.f64] if f64_ok(session) else [])


def points(ft, n=N, seed=1, lo=-1.8, hi=1.8):
    return np.random.default_rng(seed).uniform(lo, hi, n).astype(npt(ft))


def elementwise(ft):
    @vkad.kernel
    def sin_times(x: vkad.array(ft, grad=True), y: vkad.array(ft, grad=True)):
        for i in range(x.shape[0]):
            y[i] = vkad.sin(x[i]) * x[i]
    return sin_times


def looped(ft):
    @vkad.kernel
    def iterate(x: vkad.array(ft, grad=True), y: vkad.array(ft, grad=True)):
        for i in range(x.shape[0]):
            acc = x[i]
            for k in range(5):
                acc = vkad.sin(acc) * 1.3 + 0.2 * acc * acc
            y[i] = acc
    return iterate


def stencil(ft):
    @vkad.kernel
    def neighbours(x: vkad.array(ft, grad=True), y: vkad.array(ft, grad=True)):
        for i in range(1, x.shape[0] - 1):
            y[i] = x[i - 1] * x[i + 1] - vkad.tanh(x[i]) + vkad.exp(0.5 * x[i + 1])
    return neighbours


def with_scalar(ft):
    @vkad.kernel
    def scaled(a: vkad.scalar(ft, grad=True), x: vkad.array(ft, grad=True),
               y: vkad.array(ft, grad=True), loss: vkad.array(ft, ndim=0, grad=True)):
        for i in range(x.shape[0]):
            v = vkad.sin(a * x[i])
            y[i] = v
            loss[None] += v * v
    return scaled


def check_passed(r, ft):
    assert r, str(r)
    assert r.precision == ft.name, str(r)
    for c in r.inputs:
        assert c.passed and np.all(np.abs(c.analytic - c.numeric) <= c.tol), str(r)
        # with a margin, and close relative to the gradient's largest element
        assert c.abs_err <= 0.5 * c.tol_at, str(r)
        scale = np.max(np.abs(c.numeric))
        assert np.max(np.abs(c.analytic - c.numeric)) <= scale * (
            1e-3 if ft == vkad.f32 else 1e-8), str(r)


@pytest.mark.parametrize("make", [elementwise, looped, stencil])
def test_correct_kernels_pass_in_f32_and_f64(session, make):
    for ft in kinds(session):
        x = points(ft)
        r = vkad.gradcheck(make(ft), [x, np.zeros(N, npt(ft))], session=session)
        check_passed(r, ft)
        assert [c.name for c in r.inputs] == ["x"] and r.outputs == ["y"]
        assert r.inputs[0].elements == N and r.runs == 1 + 4 * N


def test_elementwise_gradient_is_the_closed_form(session):
    # What gradcheck compares is itself right: with one output the objective's gradient is
    # w * (sin x + x cos x), and the numeric side matches that closed form (not just analytic).
    ft = kinds(session)[-1]
    x = points(ft)
    r = vkad.gradcheck(elementwise(ft), [x, np.zeros(N, npt(ft))], session=session, seed=7)
    rng = np.random.default_rng(7)
    w = (rng.uniform(0.5, 1.5, N) * rng.choice([-1.0, 1.0], N)).astype(npt(ft))
    x64 = x.astype(np.float64)
    exact = w * (np.sin(x64) + x64 * np.cos(x64))
    tol = 1e-9 if ft == vkad.f64 else 1e-3
    np.testing.assert_allclose(r.inputs[0].numeric, exact, rtol=tol, atol=tol)
    np.testing.assert_allclose(r.inputs[0].analytic, exact, rtol=tol, atol=tol)


def test_grad_scalar_and_an_accumulated_loss_that_starts_nonzero(session):
    # The loss accumulates (atomic adds) into an array given as 5: every run starts from 5,
    # else the differences would see the previous runs' sums.
    for ft in kinds(session):
        x = points(ft)
        r = vkad.gradcheck(with_scalar(ft), [0.7, x, np.zeros(N), np.array([5.0])],
                           session=session)
        check_passed(r, ft)
        assert [c.name for c in r.inputs] == ["a", "x"] and r.outputs == ["y", "loss"]
        assert r.inputs[0].index == () and r.inputs[0].elements == 1
        # the scalar's gradient sums every element's: far from zero here
        assert abs(r.inputs[0].analytic_at) > 1.0


def test_ir_text_and_a_differentiated_kernel(session):
    ir = """
kernel cube(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = mul %1, %1 : f32
    %3 = mul %2, %1 : f32
    store y[%0], %3
  }
}"""
    x = points(vkad.f32)
    for fn in (ir, session.differentiate(ir)):
        check_passed(vkad.gradcheck(fn, [x, np.zeros(N, np.float32)], session=session),
                     vkad.f32)


@vkad.kernel
def squash(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        y[i] = vkad.tanh(x[i] * x[i] * 0.7) + 0.3 * x[i]


@vkad.kernel
def weigh(y: vkad.array(vkad.f32, grad=True), w: vkad.array(vkad.f32, grad=True),
          loss: vkad.array(vkad.f32, ndim=0, grad=True)):
    for i in range(y.shape[0]):
        loss[None] += w[i] * y[i] * y[i]


def two_kernels(s, x, w):
    y = s.empty(tuple(x.shape), vkad.f32)
    loss = s.zeros(1, vkad.f32)
    squash(x, y, session=s)
    weigh(y, w, loss, session=s)
    return y, loss


def test_function_launching_two_kernels_on_a_tape(session):
    x, w = points(vkad.f32), points(vkad.f32, seed=2, lo=0.2, hi=1.0)
    r = vkad.gradcheck(two_kernels, [x, w], session=session)
    check_passed(r, vkad.f32)
    assert [c.name for c in r.inputs] == ["input 0", "input 1"]
    assert r.outputs == ["output 0", "output 1"]
    r = vkad.gradcheck(two_kernels, [x, w], session=session, wrt=[1])
    assert [c.name for c in r.inputs] == ["input 1"]


def test_precision_f64_lowers_an_f32_kernel_again(session):
    x = points(vkad.f32)
    r = vkad.gradcheck(looped(vkad.f32), [x, np.zeros(N, np.float32)], session=session,
                       precision="f64")
    if f64_ok(session):
        check_passed(r, vkad.f64)
        assert r.note == ""
    else:
        check_passed(r, vkad.f32)
        assert "no f64" in r.note

    @vkad.kernel
    def casts(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
        for i in range(x.shape[0]):
            y[i] = x[i] * vkad.f32(2.0)
    if f64_ok(session):
        with pytest.raises(vkad.InvalidArgumentError, match="does not lower with its f32"):
            vkad.gradcheck(casts, [x, np.zeros(N, np.float32)], session=session,
                           precision="f64")
    with pytest.raises(vkad.InvalidArgumentError, match="re-lowers a @vkad.kernel"):
        vkad.gradcheck(session.differentiate(casts), [x, np.zeros(N, np.float32)],
                       session=session, precision="f64")


# --- a deliberately wrong gradient -------------------------------------------------------------
# vkad pairs every forward with the adjoint reverse mode derives, so a wrong gradient is made
# the way a custom gradient would be: a surrogate kernel the tape records (its adjoint gives the
# gradient) and the true value written over it by a kernel without grad parameters, which the
# tape does not record. With scale 1 the surrogate's gradient, 2 x, is right; with 1.5 it is
# 3 x against the value's 2 x.

@vkad.kernel
def surrogate(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True),
              scale: vkad.f32):
    for i in range(x.shape[0]):
        y[i] = scale * x[i] * x[i]


@vkad.kernel
def value(x: vkad.array(vkad.f32), y: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        y[i] = x[i] * x[i]


def custom_square(s, x, scale):
    y = s.zeros(tuple(x.shape), vkad.f32)
    surrogate(x, y, scale, session=s)  # recorded: the custom gradient
    value(x, y, session=s)             # not recorded: the value
    return y


def test_a_wrong_custom_gradient_fails(session):
    x = points(vkad.f32, lo=0.5, hi=2.0)
    check_passed(vkad.gradcheck(custom_square, [x, 1.0], session=session), vkad.f32)
    r = vkad.gradcheck(custom_square, [x, 1.5], session=session, raise_exception=False)
    assert not r and not r.passed
    c = r.inputs[0]
    assert c.failures == N
    np.testing.assert_allclose(c.analytic / c.numeric, 1.5, rtol=1e-3)
    assert "FAILED" in str(r) and "input 0" in str(r)
    with pytest.raises(vkad.GradcheckError) as e:
        vkad.gradcheck(custom_square, [x, 1.5], session=session)
    assert isinstance(e.value, vkad.Error) and isinstance(e.value, AssertionError)
    msg = str(e.value)
    assert f"input 'input 0' element {c.index}" in msg, msg
    assert f"reverse mode gives {c.analytic_at:.9g}" in msg, msg
    assert f"central differences {c.numeric_at:.9g}" in msg, msg
    assert e.value.result is not None and not e.value.result


def test_a_kink_fails_where_reverse_mode_picks_a_side(session):
    # abs'(0) is +1 by vkad's convention (docs/reference.md); central differences give 0.
    @vkad.kernel
    def absolute(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
        for i in range(x.shape[0]):
            y[i] = abs(x[i]) * 2.0
    x = np.array([0.5, 0.0, -1.0], np.float32)
    with pytest.raises(vkad.GradcheckError, match=r"input 'x' element \(1,\): reverse mode "
                                                  r"gives -?[0-9.]+, central differences 0 "):
        vkad.gradcheck(absolute, [x, np.zeros(3, np.float32)], session=session)
    # away from the kink it passes
    check_passed(vkad.gradcheck(absolute, [x[[0, 2]], np.zeros(2, np.float32)],
                                session=session), vkad.f32)


# --- jacobian -----------------------------------------------------------------------------------

def test_jacobian_of_a_linear_map_is_its_matrix(session):
    ft = kinds(session)[-1]

    @vkad.kernel
    def matvec(A: vkad.array(ft, ndim=2), x: vkad.array(ft, grad=True),
               y: vkad.array(ft, grad=True)):
        for i in range(y.shape[0]):
            acc = 0.0
            for j in range(x.shape[0]):
                acc += A[i, j] * x[j]
            y[i] = acc
    A = np.random.default_rng(3).standard_normal((5, 7)).astype(npt(ft))
    J = vkad.jacobian(matvec, [A, points(ft, 7), np.zeros(5, npt(ft))], session=session)
    assert J.shape == (5, 7) and J.dtype == np.float64
    np.testing.assert_array_equal(J, A.astype(np.float64))


def test_jacobian_of_a_nonlinear_kernel_matches_differences(session):
    ft = kinds(session)[-1]
    kernel = with_scalar(ft)
    a, x = 0.7, points(ft, 6)
    args = [a, x, np.zeros(6, npt(ft)), np.zeros(1, npt(ft))]
    J = vkad.jacobian(kernel, args, session=session)
    assert set(J) == {("y", "a"), ("y", "x"), ("loss", "a"), ("loss", "x")}
    assert J[("y", "x")].shape == (6, 6) and J[("y", "a")].shape == (6,)
    assert J[("loss", "x")].shape == (1, 6) and J[("loss", "a")].shape == (1,)

    # central differences of the forward, by hand
    d = kernel.differentiate(session)
    arrays = [session.ndarray(v) for v in args[1:]]

    def run(a, x):
        arrays[0].upload(x)
        arrays[1].upload(args[2])
        arrays[2].upload(args[3])
        session.launch(d, a, *arrays)
        return arrays[1].numpy().astype(np.float64), arrays[2].numpy().astype(np.float64)

    h = 1e-6 if ft == vkad.f64 else 2e-3
    tol = dict(rtol=1e-7, atol=1e-8) if ft == vkad.f64 else dict(rtol=5e-3, atol=5e-3)
    for e in range(6):
        xp, xm = x.copy(), x.copy()
        xp[e] += h
        xm[e] -= h
        (yp, lp), (ym, lm) = run(a, xp), run(a, xm)
        dx = float(xp[e]) - float(xm[e])
        np.testing.assert_allclose(J[("y", "x")][:, e], (yp - ym) / dx, **tol)
        np.testing.assert_allclose(J[("loss", "x")][:, e], (lp - lm) / dx, **tol)
    (yp, lp), (ym, lm) = run(a + h, x), run(a - h, x)
    np.testing.assert_allclose(J[("y", "a")], (yp - ym) / (2 * h), **tol)
    np.testing.assert_allclose(J[("loss", "a")], (lp - lm) / (2 * h), **tol)
    # and the closed form of dy/dx: diagonal a cos(a x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(J[("y", "x")], np.diag(a * np.cos(a * x64)), **tol)


def test_jacobian_of_a_function(session):
    x, w = points(vkad.f32, 4), points(vkad.f32, 4, seed=2, lo=0.2, hi=1.0)
    J = vkad.jacobian(two_kernels, [x, w], session=session, wrt=[1])
    assert set(J) == {(0, 1), (1, 1)}
    np.testing.assert_array_equal(J[(0, 1)], np.zeros((4, 4)))  # y does not depend on w
    y, _ = two_kernels(session, session.ndarray(x), session.ndarray(w))
    np.testing.assert_allclose(J[(1, 1)][0], y.numpy().astype(np.float64) ** 2, rtol=1e-6)


# --- limits and errors --------------------------------------------------------------------------

def test_size_cap(session):
    x = points(vkad.f32, 40)
    with pytest.raises(vkad.InvalidArgumentError, match="40 input elements to perturb .* "
                                                        "max_elements=30"):
        vkad.gradcheck(elementwise(vkad.f32), [x, np.zeros(40, np.float32)], session=session,
                       max_elements=30)
    with pytest.raises(vkad.InvalidArgumentError, match="40 output elements .* max_elements=8"):
        vkad.jacobian(elementwise(vkad.f32), [x, np.zeros(40, np.float32)], session=session,
                      max_elements=8)
    assert vkad.gradcheck(elementwise(vkad.f32), [x, np.zeros(40, np.float32)],
                          session=session, max_elements=40)


def test_argument_errors(session):
    k = with_scalar(vkad.f32)
    x = points(vkad.f32)
    args = [0.7, x, np.zeros(N, np.float32), np.zeros(1, np.float32)]
    with pytest.raises(vkad.InvalidArgumentError, match="3 inputs given, kernel 'scaled' takes 4"):
        vkad.gradcheck(k, args[:3], session=session)
    with pytest.raises(vkad.InvalidArgumentError, match="'y' is written by the kernel"):
        vkad.gradcheck(k, args, session=session, wrt=["y"])
    with pytest.raises(vkad.InvalidArgumentError, match="wrt 'b' is not a parameter"):
        vkad.gradcheck(k, args, session=session, wrt=["b"])
    with pytest.raises(vkad.InvalidArgumentError, match="output 'x' is not a differentiated"):
        vkad.gradcheck(k, args, session=session, outputs=["x"])
    r = vkad.gradcheck(k, args, session=session, wrt="a", outputs="loss")
    assert [c.name for c in r.inputs] == ["a"] and r.outputs == ["loss"]
    with pytest.raises(vkad.InvalidArgumentError, match="returns its outputs"):
        vkad.gradcheck(lambda s, x: None, [x], session=session)
    with pytest.raises(vkad.InvalidArgumentError, match="neither a differentiable kernel"):
        vkad.gradcheck(42, [x], session=session)
    with session.tape():
        with pytest.raises(vkad.FailedPreconditionError, match="recording on a tape"):
            vkad.gradcheck(k, args, session=session)


def test_fixed_tolerances(session):
    x = points(vkad.f32, lo=0.5, hi=2.0)
    # atol / rtol replace the derived tolerance: a 50 % error passes with rtol=0.6
    assert vkad.gradcheck(custom_square, [x, 1.5], session=session, atol=0.0, rtol=0.6)
    r = vkad.gradcheck(custom_square, [x, 1.0], session=session, atol=1e-12, rtol=1e-12,
                       raise_exception=False)
    assert not r  # f32 differences are not that close
