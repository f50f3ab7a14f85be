"""Gradients of differentiated scalar parameters (`a: f32 grad` in IR text) on the Python tape
(issue 50, point 3): t.grad(kernel, "a") is a shape (1,) array holding d(objective)/d(a) summed
over the recording's launches of that kernel; against closed forms and central finite
differences of the forward, on plain launches, a step loop and a checkpointed tape."""
import numpy as np
import pytest

import vkad
from conftest import f64_ok

N, T = 16, 5
X0 = np.linspace(-1.2, 1.3, N)


def scaled_ir(t):
    # y[i] = sin(a * x[i])
    return f"""
kernel scaled(a: {t} grad, x: ndarray<{t}, 1> grad, y: ndarray<{t}, 1> grad) {{
  task main parallel %0 in [0, shape(x, 0)) {{
    %1 = load x[%0] : {t}
    %2 = arg a : {t}
    %3 = mul %1, %2 : {t}
    %4 = sin %3 : {t}
    store y[%0], %4
  }}
}}"""


def rolled_ir(t):
    # x[f + 1, i] = sin(a * x[f, i]): a time axis, for a step loop and a checkpointed tape
    return f"""
kernel rolled(a: {t} grad, x: ndarray<{t}, 2> grad, f: i32) {{
  task main parallel %0 in [0, shape(x, 1)) {{
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %1 = load x[%f, %0] : {t}
    %2 = arg a : {t}
    %3 = mul %1, %2 : {t}
    %4 = sin %3 : {t}
    store x[%f1, %0], %4
  }}
}}"""


@pytest.fixture(scope="module")
def ftype(session):
    # f64 where the device has it: central differences of an f32 forward are too noisy to
    # pin a gradient closely.
    return vkad.f64 if f64_ok(session) else vkad.f32


def tol(ftype):
    return dict(rtol=1e-6, atol=1e-8) if ftype == vkad.f64 else dict(rtol=2e-2, atol=2e-3)


def test_adjoint_signature_gives_the_scalar_gradient_as_a_one_element_array(session):
    d = session.differentiate(scaled_ir("f32"))
    # The compiled adjoint takes a 1-element array for a_grad; the signature says so.
    assert "a_grad: ndarray<f32, 1>" in d.adjoint.signature, d.adjoint.signature
    assert d.forward.gradients == [(0, "a_grad"), (1, "x_grad"), (2, "y_grad")]


def test_two_launches_sum_into_the_scalar_gradient(session, ftype):
    s = session
    d = s.differentiate(scaled_ir("f64" if ftype == vkad.f64 else "f32"))
    npt = vkad.numpy_dtype(ftype)
    a = 0.8
    w = np.linspace(0.5, 1.5, N)
    x, y, z = s.ndarray(X0.astype(npt)), s.empty(N, ftype), s.empty(N, ftype)
    t = s.tape()
    with t:
        s.launch(d, a, x, y)  # y = sin(a x)
        s.launch(d, a, y, z)  # z = sin(a y)
    t.backward(seed={z: w.astype(npt)})
    g = t.grad(d, "a")
    assert g.shape == (1,) and t.grad(d, 0) is g and t.grad(d.forward, "a") is g

    def loss(a_):
        return float((w * np.sin(a_ * np.sin(a_ * X0))).sum())

    # Closed form: dL/da = sum w cos(a y) (y + a cos(a x) x).
    yv = np.sin(a * X0)
    closed = float((w * np.cos(a * yv) * (yv + a * np.cos(a * X0) * X0)).sum())
    np.testing.assert_allclose(g.numpy()[0], closed, **tol(ftype))
    # Central differences of the device's own forward.
    h = 1e-4

    def device_loss(a_):
        s.launch(d.forward, a_, x, y)
        s.launch(d.forward, a_, y, z)
        return float((w * z.numpy()).sum())

    fd = (device_loss(a + h) - device_loss(a - h)) / (2 * h)
    np.testing.assert_allclose(fd, (loss(a + h) - loss(a - h)) / (2 * h), rtol=1e-3)
    if ftype == vkad.f64:
        np.testing.assert_allclose(g.numpy()[0], fd, rtol=1e-6)
    # The array gradient is there too: dL/dx = w cos(a y) a cos(a x) a.
    np.testing.assert_allclose(t.grad(x).numpy(),
                               w * np.cos(a * yv) * a * np.cos(a * X0) * a, **tol(ftype))
    # A second backward gives the same (the scalar gradient is zeroed with the others).
    with t:
        s.launch(d, a, x, y)
        s.launch(d, a, y, z)
    t.backward(seed={z: w.astype(npt)})
    np.testing.assert_allclose(t.grad(d, "a").numpy()[0], closed, **tol(ftype))


def _rolled_closed_form(a):
    xs, g_a, g_x = [X0], 0.0, np.ones(N)
    for _ in range(T):
        xs.append(np.sin(a * xs[-1]))
    # L = sum x[T]; backwards through x[f + 1] = sin(a x[f]).
    for f in range(T - 1, -1, -1):
        c = np.cos(a * xs[f])
        g_a += float((g_x * c * xs[f]).sum())
        g_x = g_x * c * a
    return g_a


@pytest.mark.parametrize("how", ["launches", "loop", "checkpointed"])
def test_scalar_gradient_through_a_time_axis(session, ftype, how):
    s = session
    d = s.differentiate(rolled_ir("f64" if ftype == vkad.f64 else "f32"))
    npt = vkad.numpy_dtype(ftype)
    a = 1.1
    host = np.zeros((T + 1, N), npt)
    host[0] = X0
    x = s.ndarray(host)
    t = s.tape()
    if how == "checkpointed":
        t.checkpoint_every = 2
    with t:
        if how == "loop":
            s.loop(0, T, lambda f: s.launch(d, a, x, f))
        else:
            for f in range(T):
                s.launch(d, a, x, f)
    seed = np.zeros((T + 1, N), npt)
    seed[T] = 1
    t.backward(seed={x: seed})
    np.testing.assert_allclose(t.grad(d, "a").numpy()[0], _rolled_closed_form(a), **tol(ftype))
    # Central differences of the whole forward on the device.
    h = 1e-4

    def device_loss(a_):
        x.upload(host)
        for f in range(T):
            s.launch(d.forward, a_, x, f)
        return float(x.numpy()[T].sum())

    fd = (device_loss(a + h) - device_loss(a - h)) / (2 * h)
    np.testing.assert_allclose(fd, _rolled_closed_form(a), rtol=1e-3)


def test_scalar_grad_errors_name_the_parameter(session):
    s = session
    d = s.differentiate(scaled_ir("f32"))
    x, y = s.ndarray(X0.astype(np.float32)), s.empty(N, vkad.f32)
    t = s.tape()
    with pytest.raises(vkad.InvalidArgumentError, match="no launch of 'scaled' was recorded"):
        t.grad(d, "a")
    with t:
        s.launch(d, 0.5, x, y)
    t.backward(seed={y: 1.0})
    with pytest.raises(vkad.InvalidArgumentError, match="kernel 'scaled' has no parameter 'b'"):
        t.grad(d, "b")
    with pytest.raises(vkad.InvalidArgumentError,
                       match="parameter 'x' of kernel 'scaled' is not a differentiated"):
        t.grad(d, "x")
