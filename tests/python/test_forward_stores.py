"""A kernel that reads back what the same invocation stored (DiffTaichi's billiards `advance`:
v[t, i] = v[t - 1, i] + impulse[t, i]; x[t, i] = x[t - 1, i] + dt * v[t, i]) differentiates
(issue 50, point 7: autodiff/forward_stores.h), with the gradient of a whole time-axis
simulation on a tape against central finite differences; a read-before-overwrite in one task
is still refused, its message giving the one-line fix."""
import numpy as np
import pytest

import vkad
from conftest import f64_ok

N, T = 5, 6


def advance_ir(t):
    return f"""
kernel advance(x: ndarray<{t}, 2> grad, v: ndarray<{t}, 2> grad,
               impulse: ndarray<{t}, 2> grad, t: i32) {{
  task main parallel %i in [0, shape(x, 1)) {{
    %t = arg t : i32
    %one = const 1 : i32
    %tm = sub %t, %one : i32
    %vp = load v[%tm, %i] : {t}
    %imp = load impulse[%t, %i] : {t}
    %vn = add %vp, %imp : {t}
    store v[%t, %i], %vn
    %vv = load v[%t, %i] : {t}
    %xp = load x[%tm, %i] : {t}
    %dt = const 0.1 : {t}
    %s = sin %xp : {t}
    %d = mul %dt, %vv : {t}
    %e = mul %d, %s : {t}
    %xn = add %xp, %e : {t}
    store x[%t, %i], %xn
  }}
}}"""


def simulate(x0, v0, imp):
    x, v = [x0], [v0]
    for t in range(1, T + 1):
        v.append(v[-1] + imp[t])
        x.append(x[-1] + 0.1 * v[-1] * np.sin(x[-1]))
    return x[-1].sum()


def test_read_back_of_a_store_differentiates(session):
    s = session
    ftype = vkad.f64 if f64_ok(session) else vkad.f32
    npt = vkad.numpy_dtype(ftype)
    d = s.differentiate(advance_ir("f64" if ftype == vkad.f64 else "f32"))
    rng = np.random.default_rng(5)
    x0, v0 = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    imp = rng.uniform(-0.5, 0.5, (T + 1, N))
    xh = np.zeros((T + 1, N), npt)
    vh = np.zeros((T + 1, N), npt)
    xh[0], vh[0] = x0, v0
    x, v, ia = s.ndarray(xh), s.ndarray(vh), s.ndarray(imp.astype(npt))
    t = s.tape()
    with t:
        for step in range(1, T + 1):
            s.launch(d, x, v, ia, step)
    np.testing.assert_allclose(x.numpy()[T].sum(), simulate(x0, v0, imp), rtol=1e-5)
    seed = np.zeros((T + 1, N), npt)
    seed[T] = 1
    t.backward(seed={x: seed})
    h = 1e-6 if ftype == vkad.f64 else 1e-3
    tol = dict(rtol=1e-5, atol=1e-7) if ftype == vkad.f64 else dict(rtol=3e-2, atol=3e-3)
    # d loss / d impulse[t, i] and d loss / d x[0, i], against central differences.
    g_imp, g_x = t.grad(ia).numpy(), t.grad(x).numpy()
    for (r, c) in [(1, 0), (3, 2), (T, 4)]:
        e = np.zeros_like(imp)
        e[r, c] = h
        fd = (simulate(x0, v0, imp + e) - simulate(x0, v0, imp - e)) / (2 * h)
        np.testing.assert_allclose(g_imp[r, c], fd, **tol)
    for c in range(N):
        e = np.zeros(N)
        e[c] = h
        fd = (simulate(x0 + e, v0, imp) - simulate(x0 - e, v0, imp)) / (2 * h)
        np.testing.assert_allclose(g_x[0, c], fd, **tol)


def test_read_before_overwrite_is_still_refused_with_the_fix(session):
    # x[i] from x[i + 1]: invocation i reads the element invocation i + 1 overwrites.
    with pytest.raises(vkad.InvalidArgumentError,
                       match="is both read and written in task 'main'.*keep the value in a local"):
        session.differentiate("""
kernel k(x: ndarray<f32, 1> grad) {
  task main parallel %i in [0, add(shape(x, 0), -1)) {
    %one = const 1 : i32
    %j = add %i, %one : i32
    %v = load x[%j] : f32
    %s = sin %v : f32
    store x[%i], %s
  }
}""")


# x[i] = sin(x[i]), in place.
_SIN_IN_PLACE = """
kernel k(x: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %s = sin %v : f32
    store x[%i], %s
  }
}"""


def test_an_update_in_place_of_the_own_element_is_differentiated_on_a_tape(session):
    # x[i] = sin(x[i]): the adjoint reads the copy of x the tape took before the launch
    # (autodiff/in_place.h), so d x_after / d x_before = cos(x_before), twice in a row.
    d = session.differentiate(_SIN_IN_PLACE)
    x0 = np.linspace(-1.5, 1.5, 9)
    x = session.ndarray(x0.astype(np.float32))
    with session.tape() as t:
        session.launch(d, x)
        session.launch(d, x)
    t.backward(seed={x: 1.0})
    x1 = np.sin(x0)
    # Vulkan's f32 sin and cos: 2^-11 absolute on [-pi, pi]; two of them chained.
    np.testing.assert_allclose(x.numpy(), np.sin(x1), rtol=0, atol=2e-3)
    np.testing.assert_allclose(t.grad(x).numpy(), np.cos(x1) * np.cos(x0), rtol=0, atol=2e-3)
    # A gradient that ignored the copy (the adjoint reading x after the launches) would be
    # cos(sin(x1)) cos(x1): far outside that.
    assert np.max(np.abs(np.cos(np.sin(x1)) * np.cos(x1) - np.cos(x1) * np.cos(x0))) > 0.1


def test_an_update_in_place_in_a_step_loop_on_a_tape(session):
    # Session.loop of the same update on a tape: recorded launch by launch (each adjoint reads
    # its own copy), d x_3 / d x_0 = cos(x_2) cos(x_1) cos(x_0).
    s = session
    d = s.differentiate(_SIN_IN_PLACE)
    x0 = np.linspace(-1.5, 1.5, 9)
    x = s.ndarray(x0.astype(np.float32))
    with s.tape() as t:
        s.loop(0, 3, lambda f: s.launch(d, x))
    assert len(t.launches) == 1  # the loop's record
    t.backward(seed={x: 1.0})
    x1 = np.sin(x0)
    x2 = np.sin(x1)
    # Vulkan's f32 sin and cos: 2^-11 absolute on [-pi, pi]; three of each chained.
    np.testing.assert_allclose(x.numpy(), np.sin(x2), rtol=0, atol=3e-3)
    np.testing.assert_allclose(t.grad(x).numpy(), np.cos(x2) * np.cos(x1) * np.cos(x0),
                               rtol=0, atol=3e-3)
