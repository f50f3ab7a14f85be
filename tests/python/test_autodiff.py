"""differentiate and the Tape: gradients against central finite differences, computed from
Python by running the forward kernel on the device."""
import numpy as np
import pytest

import vkad
from conftest import f64_ok


@pytest.fixture(scope="module")
def ftype(session):
    # f64 where the device has it: finite differences are then accurate to ~1e-8.
    return vkad.f64 if f64_ok(session) else vkad.f32


def tol(ftype):
    return dict(rtol=1e-6, atol=1e-7) if ftype == vkad.f64 else dict(rtol=2e-2, atol=2e-3)


def h(ftype):
    return 1e-5 if ftype == vkad.f64 else 1e-2


def wavy(ftype):
    """y[i] = sum_t sin(x[i] * (t+1)) * x[i]^2 + exp(a * x[i]), with a serial loop carrying a
    local (the adjoint needs the adstack)."""
    kb = vkad.KernelBuilder("wavy")
    a = kb.scalar("a", ftype)
    steps = kb.scalar("steps", vkad.i32)
    x = kb.ndarray("x", ftype, 1, grad=True)
    y = kb.ndarray("y", ftype, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        v = x[i]
        acc = kb.local(ftype)
        with kb.for_range(0, steps) as t:
            acc.value = acc.value + vkad.sin(v * vkad.cast(t + 1, ftype)) * v * v
        y[i] = acc.value + vkad.exp(a * v)
    return kb


def objective(session, kernel, args, out, weights):
    """sum(weights * out) after one forward launch."""
    session.launch(kernel, *args)
    return float(np.sum(weights * out.numpy()))


def test_differentiated_object(session, ftype):
    d = session.differentiate(wavy(ftype))
    assert d.gradients == {"x": "x_grad", "y": "y_grad"}
    assert d.forward.param_names == ["a", "steps", "x", "y"]
    assert d.adjoint.param_names == ["a", "steps", "x", "y", "x_grad", "y_grad"]
    assert d.forward.adjoint.name == d.adjoint.name


def test_gradient_matches_finite_differences(session, ftype):
    d = session.differentiate(wavy(ftype))
    npt = vkad.numpy_dtype(ftype)
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1, 1, 8).astype(npt)
    w = rng.uniform(0.5, 1.5, 8).astype(npt)  # dL/dy: an array seed
    x, y = session.ndarray(x0, name="x"), session.empty(8, ftype, name="y")
    with session.tape() as t:
        session.launch(d, 0.7, 3, x, y)
    t.backward(seed={y: w})
    g = t.grad(x).numpy()
    fd = np.zeros(8)
    for j in range(8):
        for sign in (1, -1):
            xp = x0.copy()
            xp[j] += sign * h(ftype)
            x.upload(xp)
            fd[j] += sign * objective(session, d.forward, (0.7, 3, x, y), y, w)
        fd[j] /= 2 * h(ftype)
    np.testing.assert_allclose(g, fd, **tol(ftype))


def test_tape_replays_in_reverse_order(session, ftype):
    # z = g(f(x)) through two kernels: the adjoint of g must run first, so that y's gradient
    # is complete before f's adjoint reads it. A forward-order replay gives 0 for dL/dx.
    square = """
kernel square(x: ndarray<T, 1> grad, y: ndarray<T, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : T
    %2 = mul %1, %1 : T
    store y[%0], %2
  }
}""".replace("T", ftype.name)
    sine = square.replace("square", "sine").replace("%2 = mul %1, %1", "%2 = sin %1")
    f, g = session.differentiate(square), session.differentiate(sine)
    npt = vkad.numpy_dtype(ftype)
    x0 = np.linspace(-1, 1, 5).astype(npt)
    x, y, z = session.ndarray(x0), session.empty(5, ftype), session.empty(5, ftype)
    with session.tape() as t:
        session.launch(f, x, y)
        session.launch(g, y, z)
    t.backward(seed={z: 1.0})
    # closed form: d sin(x^2) / dx = 2 x cos(x^2)
    np.testing.assert_allclose(t.grad(x).numpy(), 2 * x0 * np.cos(x0 * x0), **tol(ftype))
    np.testing.assert_allclose(t.grad(y).numpy(), np.cos(x0 * x0), **tol(ftype))


def test_same_kernel_twice_on_one_tape(session, ftype):
    d = session.differentiate(wavy(ftype))
    npt = vkad.numpy_dtype(ftype)
    x1, x2 = session.ndarray(np.full(3, 0.2, npt)), session.ndarray(np.full(3, -0.4, npt))
    y1, y2 = session.empty(3, ftype), session.empty(3, ftype)
    with session.tape() as t:
        session.launch(d, 0.5, 2, x1, y1)
        session.launch(d.forward, 0.5, 2, x2, y2)
    t.backward(seed={y1: 1.0, y2: 2.0})

    def dy(v):  # d/dv of sum_{t<2} sin(v (t+1)) v^2 + exp(0.5 v)
        return sum((t + 1) * np.cos(v * (t + 1)) * v * v + 2 * v * np.sin(v * (t + 1))
                   for t in range(2)) + 0.5 * np.exp(0.5 * v)
    np.testing.assert_allclose(t.grad(x1).numpy(), np.full(3, dy(0.2)), **tol(ftype))
    np.testing.assert_allclose(t.grad(x2).numpy(), np.full(3, 2 * dy(-0.4)), **tol(ftype))
    # backward again: gradients are zeroed first, not accumulated twice
    t.backward(seed={y1: 1.0, y2: 2.0})
    np.testing.assert_allclose(t.grad(x1).numpy(), np.full(3, dy(0.2)), **tol(ftype))


def test_readme_cube_from_ir_text(session):
    cube = session.differentiate("""
kernel cube(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = const 1.0 : f32
    %2 = alloca : f32
    store_local %2, %1
    %3 = const 0 : i32
    %4 = const 3 : i32
    for %5 in [%3, %4) {
      %6 = load_local %2 : f32
      %7 = load x[%0] : f32
      %8 = mul %6, %7 : f32
      store_local %2, %8
    }
    %9 = load_local %2 : f32
    %10 = const 3.0 : f32
    %11 = div %9, %10 : f32
    store y[%0], %11
  }
}""")
    xs = np.array([1, 2, 3, 4], np.float32)
    x, y = session.ndarray(xs), session.empty(4, vkad.f32)
    with session.tape() as t:
        session.launch(cube, x, y)
    t.backward(seed={y: 1.0})
    np.testing.assert_allclose(t.grad(x).numpy(), xs ** 2, rtol=1e-6)  # d(x^3/3)/dx


def test_tape_errors(session, ftype):
    d = session.differentiate(wavy(ftype))
    plain = session.compile(wavy(ftype))
    x, y, other = (session.empty(2, ftype) for _ in range(3))
    empty_tape = session.tape()
    with empty_tape:
        session.launch(plain, 1.0, 1, x, y)  # not differentiated: not recorded
    with pytest.raises(vkad.InvalidArgumentError, match="no launch of a differentiated kernel"):
        empty_tape.backward(seed={y: 1.0})
    with session.tape() as t:
        session.launch(d, 1.0, 1, x, y)
        with pytest.raises(vkad.InvalidArgumentError, match="after the `with` block"):
            t.backward(seed={y: 1.0})
        with pytest.raises(vkad.InvalidArgumentError, match="already recording"):
            with session.tape():
                pass
    with pytest.raises(vkad.InvalidArgumentError, match="not a differentiated"):
        t.backward(seed={other: 1.0})
    with pytest.raises(vkad.InvalidArgumentError, match="not a differentiated"):
        t.grad(other)
    with pytest.raises(vkad.InvalidArgumentError, match="shape"):
        t.backward(seed={y: np.ones(3)})  # the seed array must have y's shape
    assert len(t.launches) == 1


def test_backward_names_the_adjoint_that_fails(session, ftype):
    # The adjoints run in vkad::Tape::backward (the binding's _Tape): an adjoint that cannot
    # launch -- an input freed after the recording -- raises the launch's own error class with
    # the recorded launch's index first, and the launches after it in reverse order (0) never run.
    d = session.differentiate(wavy(ftype))
    npt = vkad.numpy_dtype(ftype)
    x0, x1 = (session.ndarray(np.full(2, 0.3, npt)) for _ in range(2))
    y0, y1 = session.empty(2, ftype), session.empty(2, ftype)
    with session.tape() as t:
        session.launch(d, 1.0, 1, x0, y0)
        session.launch(d, 1.0, 1, x1, y1)
    session.free(x1)
    before = session.stats()["launches"]
    with pytest.raises(vkad.Error, match=r"^tape\.backward: adjoint of launch 1: .*freed") as e:
        t.backward(seed={y0: 1.0, y1: 1.0})
    assert type(e.value) is not vkad.Error  # the launch's own subclass, as raised
    assert session.stats()["launches"] == before


def test_time_steps_in_one_array(session, ftype):
    # DiffTaichi's idiom: one array holds every time step's state; each launch reads row f and
    # writes row f + 1 of it (reverse mode proves the rows disjoint). backward replays the
    # adjoints last launch first: step f's adjoint reads as its seed the x_grad[f + 1] that
    # step f + 1's adjoint added into.
    step = session.differentiate("""
kernel step(x: ndarray<T, 2> grad, v: ndarray<T, 2> grad, f: i32, dt: T) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : T
    %vv = load v[%f, %p] : T
    %dt = arg dt : T
    %dx = mul %dt, %vv : T
    %nx = add %xv, %dx : T
    store x[%f1, %p], %nx
    %s = sin %xv : T
    %dv = mul %dt, %s : T
    %nv = sub %vv, %dv : T
    store v[%f1, %p], %nv
  }
}""".replace("T", ftype.name))
    loss = session.differentiate("""
kernel loss(x: ndarray<T, 2> grad, last: i32, l: ndarray<T, 1> grad) {
  task main parallel %p in [0, shape(x, 1)) {
    %t = arg last : i32
    %xv = load x[%t, %p] : T
    %sq = mul %xv, %xv : T
    %zero = const 0 : i32
    atomic_add l[%zero], %sq
  }
}""".replace("T", ftype.name))
    npt = vkad.numpy_dtype(ftype)
    steps, n, dt = 20, 4, 0.1
    rng = np.random.default_rng(5)
    x0 = rng.uniform(-1, 1, (steps + 1, n)).astype(npt)
    v0 = rng.uniform(-1, 1, (steps + 1, n)).astype(npt)
    x, v = session.ndarray(x0, name="x"), session.ndarray(v0, name="v")
    l = session.ndarray(np.zeros(1, npt), name="l")
    with session.tape() as t:
        for f in range(steps):
            session.launch(step, x, v, f, dt)
        session.launch(loss, x, steps, l)
    t.backward(seed={l: 1.0})
    gx, gv = t.grad(x).numpy(), t.grad(v).numpy()

    def objective(xs, vs):
        x.upload(xs)
        v.upload(vs)
        l.upload(np.zeros(1, npt))
        for f in range(steps):
            session.launch(step.forward, x, v, f, dt)
        session.launch(loss.forward, x, steps, l)
        return float(l.numpy()[0])

    for name, g in (("x", gx), ("v", gv)):
        fd = np.zeros(n)
        for j in range(n):
            for sign in (1, -1):
                xs, vs = x0.copy(), v0.copy()
                (xs if name == "x" else vs)[0, j] += sign * h(ftype)
                fd[j] += sign * objective(xs, vs)
            fd[j] /= 2 * h(ftype)
        np.testing.assert_allclose(g[0], fd, **tol(ftype), err_msg=f"d loss / d {name}[0]")
