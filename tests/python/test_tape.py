"""The reusable Tape (vkad::Tape's behaviour, python/vkad/tape.py), array.grad, and zero_many:
gradients against closed forms, no allocation after the first iteration, every error."""
import gc

import numpy as np
import pytest

import vkad

STEP = """
kernel step(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = sin %1 : f32
    %3 = const 0.9 : f32
    %4 = mul %2, %3 : f32
    %5 = const 0.1 : f32
    %6 = add %4, %5 : f32
    store y[%0], %6
  }
}"""
N, STEPS = 32, 10
X0 = np.linspace(-1.5, 1.5, N).astype(np.float32)


def chain(x0, frm, to):
    """d x_to / d x_frm through y = 0.9 sin(x) + 0.1, in double."""
    x, g = x0.astype(np.float64), np.ones(len(x0))
    for k in range(to):
        if k >= frm:
            g = g * 0.9 * np.cos(x)
        x = np.sin(x) * 0.9 + 0.1
    return g


@pytest.fixture(scope="module")
def step(session):
    return session.differentiate(STEP)


def memory(s):
    st = s.stats()
    return st["ndarrays"], st["memory_block_bytes"], st["memory_used_bytes"]


def test_reused_tape_allocates_nothing_after_the_first_iteration(session, step):
    s = session
    xs = [s.ndarray(X0)] + [s.empty(N, vkad.f32) for _ in range(STEPS)]
    t = s.tape()
    first, mem = None, None
    for it in range(3):
        with t:
            for k in range(STEPS):
                s.launch(step, xs[k], xs[k + 1])
        assert len(t.launches) == STEPS
        t.backward(seed={xs[-1]: 1.0})
        g = t.grad(xs[0]).numpy()  # the readback drains every retirement
        if it == 0:
            np.testing.assert_allclose(g, chain(X0, 0, STEPS), atol=5e-3)
            np.testing.assert_allclose(t.grad(xs[4]).numpy(), chain(X0, 4, STEPS), atol=5e-3)
            first, mem = g, memory(s)
        else:
            np.testing.assert_array_equal(g, first)  # zeroed each time, not accumulated
            assert memory(s) == mem, f"iteration {it}"


def test_array_grad_is_used_and_kept_by_the_caller(session, step):
    s = session
    x = s.ndarray(X0, grad=True, name="x")
    assert x.grad is not None and x.grad.shape == (N,) and x.grad.name == "x_grad"
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(N, np.float32))
    y = s.zeros(N, vkad.f32, grad=True)
    np.testing.assert_array_equal(y.grad.numpy(), np.zeros(N, np.float32))
    z = s.empty(N, vkad.f32)
    before = s.stats()["ndarrays"]
    with s.tape() as t:
        s.launch(step, x, y)
        s.launch(step, y, z)
    t.backward(seed={z: 1.0})
    assert t.grad(x) is x.grad and t.grad(y) is y.grad
    assert s.stats()["ndarrays"] == before + 1  # only z's gradient was made
    np.testing.assert_allclose(x.grad.numpy(), chain(X0, 0, 2), atol=5e-3)
    with pytest.raises(vkad.InvalidArgumentError, match="a gradient has its array's dtype and shape"):
        x.grad = s.empty(3, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError, match="its own gradient"):
        x.grad = x
    x.grad = None
    assert x.grad is None


def test_gradient_of_a_collected_array_is_dropped(session, step):
    s = session
    t = s.tape()
    a, b = s.ndarray(X0), s.empty(N, vkad.f32)
    with t:
        s.launch(step, a, b)
    t.backward(seed={b: 1.0})
    s.synchronize()
    count = s.stats()["ndarrays"]
    handle = a.handle
    del a
    with t:  # the recording that held a is gone; its gradient goes at the next recording
        pass
    gc.collect()
    assert handle not in t._grads
    assert s.stats()["ndarrays"] == count - 2  # a and its gradient


def test_zero_many(session):
    s = session
    junk = np.full(N, 7.5, np.float32)
    a, b, c = s.ndarray(junk), s.ndarray(junk), s.ndarray(junk)
    s.zero_many([a, c])
    np.testing.assert_array_equal(a.numpy(), np.zeros(N, np.float32))
    np.testing.assert_array_equal(c.numpy(), np.zeros(N, np.float32))
    np.testing.assert_array_equal(b.numpy(), junk)
    dead = s.ndarray(junk)
    s.free(dead)
    a.upload(junk)
    with pytest.raises(vkad.NotFoundError, match="zero_many: ndarray handle .* was freed"):
        s.zero_many([a, b, dead])
    np.testing.assert_array_equal(a.numpy(), junk)  # nothing recorded
    with pytest.raises(vkad.InvalidArgumentError, match="zero_many: expected a vkad ndarray"):
        s.zero_many([a, 3])
    s.zero_many([])


def test_tape_errors_match_the_cpp_tape(session, step):
    s = session
    scaled = s.differentiate("""
kernel scaled(a: f32 grad, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = arg a : f32
    %3 = mul %1, %2 : f32
    store y[%0], %3
  }
}""")
    x, y = s.ndarray(X0), s.empty(N, vkad.f32)
    launches = s.stats()["launches"]
    with s.tape() as t:
        with pytest.raises(vkad.InvalidArgumentError,
                           match=r"tape.launch: argument 0 \(gradient 'a_grad'\) is a scalar"):
            s.launch(scaled, 2.0, x, y)
        s.launch(step, x, y)
    assert len(t.launches) == 1 and s.stats()["launches"] == launches + 1
    with pytest.raises(vkad.InvalidArgumentError, match="value 1e\\+300 does not fit f32"):
        t.backward(seed={y: 1e300})
    with pytest.raises(vkad.InvalidArgumentError, match="8 bytes given, the array holds 128"):
        t.backward(seed={y: np.ones(2)})
    t.backward(seed={y: np.float32(2.0)})  # a numpy number is a value
    np.testing.assert_allclose(t.grad(x).numpy(), 2 * chain(X0, 0, 1), atol=5e-3)
