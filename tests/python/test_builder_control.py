"""The Python builder at parity with the C++ one (issue 50, point 4): while_ loops, break_ and
continue_, scalar parameters marked grad, and forward mode (Session.jvp) -- each kernel's forward
against a Python reference and its gradient (on a tape) or tangent against central finite
differences."""
import math

import numpy as np
import pytest

import vkad
from conftest import f64_ok

N = 7


@pytest.fixture(scope="module")
def ftype(session):
    return vkad.f64 if f64_ok(session) else vkad.f32


def close(ftype):
    return dict(rtol=1e-6, atol=1e-9) if ftype == vkad.f64 else dict(rtol=2e-2, atol=2e-3)


def halve_kernel(ftype):
    # while v^2 > 0.01: acc += v sin v; v *= 0.5  ->  y = acc + v
    kb = vkad.KernelBuilder("halve")
    x = kb.ndarray("x", ftype, 1, grad=True)
    y = kb.ndarray("y", ftype, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        v = kb.local(x[i])
        acc = kb.local(ftype)
        with kb.while_(lambda: v.load() * v.load() > kb.constant(0.01, ftype), max_trip=64):
            b = v.load()
            acc.store(acc.load() + b * vkad.sin(b))
            v.store(b * kb.constant(0.5, ftype))
        y[i] = acc.load() + v.load()
    return kb


def halve_ref(x):
    v, acc = x, 0.0
    while v * v > 0.01:
        acc += v * math.sin(v)
        v *= 0.5
    return acc + v


def jumps_kernel(ftype):
    # for k in range(len(w)): skip w[k] < -0.3 (continue); v += sin(v w[k]); stop (break) once
    # the sum of the sines passes 1.6.
    kb = vkad.KernelBuilder("jumps")
    x = kb.ndarray("x", ftype, 1, grad=True)
    w = kb.ndarray("w", ftype, 1, readonly=True)
    y = kb.ndarray("y", ftype, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        v = kb.local(x[i])
        acc = kb.local(ftype)
        with kb.for_range(0, w.shape[0]) as k:
            wk = w[k]
            with kb.if_(wk < kb.constant(-0.3, ftype)):
                kb.continue_()
            s = vkad.sin(v.load() * wk)
            acc.store(acc.load() + s)
            v.store(v.load() + s)
            with kb.if_(acc.load() > kb.constant(1.6, ftype)):
                kb.break_()
        y[i] = acc.load() * v.load()
    return kb


def jumps_ref(x, w):
    v, acc = x, 0.0
    for wk in w:
        if wk < -0.3:
            continue
        s = math.sin(v * wk)
        acc += s
        v += s
        if acc > 1.6:
            break
    return acc * v


def _forward_and_fd(s, d, ftype, xs, extra, ref):
    npt = vkad.numpy_dtype(ftype)
    x, y = s.ndarray(xs.astype(npt)), s.empty(N, ftype)
    with s.tape() as t:
        s.launch(d, x, *extra, y)
    want = np.array([ref(v) for v in xs])
    np.testing.assert_allclose(y.numpy(), want, **close(ftype))
    t.backward(seed={y: 1.0})
    got = t.grad(x).numpy()
    # Central differences of the device's forward, per element (the elements are independent).
    h = 1e-6 if ftype == vkad.f64 else 1e-2
    xp, xm = s.ndarray((xs + h).astype(npt)), s.ndarray((xs - h).astype(npt))
    yp, ym = s.empty(N, ftype), s.empty(N, ftype)
    s.launch(d.forward, xp, *extra, yp)
    s.launch(d.forward, xm, *extra, ym)
    fd = (yp.numpy().astype(np.float64) - ym.numpy()) / (2 * h)
    np.testing.assert_allclose(got, fd, rtol=1e-5 if ftype == vkad.f64 else 5e-2,
                               atol=1e-7 if ftype == vkad.f64 else 5e-2)


def test_while_loop_forward_and_gradient(session, ftype):
    s = session
    d = s.differentiate(halve_kernel(ftype))
    assert "while %" in halve_kernel(ftype).finish() and "} do {" in halve_kernel(ftype).finish()
    xs = np.array([0.05, 0.3, -0.7, 1.1, 2.0, -3.5, 0.9])
    _forward_and_fd(s, d, ftype, xs, (), halve_ref)


def test_break_and_continue_forward_and_gradient(session, ftype):
    s = session
    d = s.differentiate(jumps_kernel(ftype))
    wv = np.array([0.4, -0.5, 0.9, 0.2, -0.1, 1.3, -0.8, 0.6, 0.7])
    w = s.ndarray(wv.astype(vkad.numpy_dtype(ftype)))
    xs = np.array([0.1, 0.5, -0.4, 1.0, 2.2, -1.3, 0.75])
    _forward_and_fd(s, d, ftype, xs, (w,), lambda v: jumps_ref(v, wv))


def test_break_outside_a_loop_is_refused():
    kb = vkad.KernelBuilder("bad")
    x = kb.ndarray("x", vkad.f32, 1)
    with kb.parallel_for("main", 0, x.shape[0]):
        with pytest.raises(RuntimeError, match="break_\\(\\) belongs inside a for_range or while_"):
            kb.break_()


def test_builder_scalar_grad_on_a_tape(session, ftype):
    s = session
    kb = vkad.KernelBuilder("scale")
    a = kb.scalar("a", ftype, grad=True)
    x = kb.ndarray("x", ftype, 1, grad=True)
    y = kb.ndarray("y", ftype, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        y[i] = vkad.exp(a * x[i])
    assert "a: " + ("f64" if ftype == vkad.f64 else "f32") + " grad" in kb.finish()
    d = s.differentiate(kb)
    xs = np.linspace(-1, 1, N)
    xa, ya = s.ndarray(xs.astype(vkad.numpy_dtype(ftype))), s.empty(N, ftype)
    t = s.tape()
    with t:
        s.launch(d, 0.6, xa, ya)
    t.backward(seed={ya: 1.0})
    # d/da sum exp(a x) = sum x exp(a x); and its central difference.
    want = float((xs * np.exp(0.6 * xs)).sum())
    fd = (np.exp(0.6001 * xs).sum() - np.exp(0.5999 * xs).sum()) / 2e-4
    assert want == pytest.approx(fd, rel=1e-6)
    np.testing.assert_allclose(t.grad(d, "a").numpy()[0], want, **close(ftype))


def test_forward_mode_matches_finite_differences(session, ftype):
    # Session.jvp (make_jvp): y = exp(a x) sin(x) with a scalar `a` and x both marked grad; the
    # tangent kernel writes y and y_dot = dy/dx * x_dot + dy/da * a_dot.
    s = session
    kb = vkad.KernelBuilder("wave")
    a = kb.scalar("a", ftype, grad=True)
    x = kb.ndarray("x", ftype, 1, grad=True)
    y = kb.ndarray("y", ftype, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        y[i] = vkad.exp(a * x[i]) * vkad.sin(x[i])
    j = s.jvp(kb)
    assert [p[0] for p in j.params] == ["a", "x", "y", "a_dot", "x_dot", "y_dot"]
    npt = vkad.numpy_dtype(ftype)
    xs, xd = np.linspace(-1, 1.5, N), np.linspace(0.3, -0.7, N)
    av, ad = 0.4, 0.25
    xa, ya = s.ndarray(xs.astype(npt)), s.empty(N, ftype)
    xda, yda = s.ndarray(xd.astype(npt)), s.zeros(N, ftype)
    s.launch(j, av, xa, ya, ad, xda, yda)

    def f(a_, x_):
        return np.exp(a_ * x_) * np.sin(x_)

    np.testing.assert_allclose(ya.numpy(), f(av, xs), **close(ftype))
    h = 1e-6
    fd = (f(av + h * ad, xs + h * xd) - f(av - h * ad, xs - h * xd)) / (2 * h)
    np.testing.assert_allclose(yda.numpy(), fd, rtol=1e-6 if ftype == vkad.f64 else 2e-2,
                               atol=1e-8 if ftype == vkad.f64 else 2e-3)
