"""Session.bind: a kernel with some arguments fixed, launched by calling the result with the
others -- the same launch as Session.launch (results, tape, capture) and the same checks, the
fixed arguments converted once."""
import numpy as np
import pytest

import vkad


def scaled_sine() -> vkad.KernelBuilder:
    """y[i] = sin(x[i] * (t + 1)) * c: a step t and a scale c beside two arrays."""
    kb = vkad.KernelBuilder("scaled_sine")
    t = kb.scalar("t", vkad.i32)
    c = kb.scalar("c", vkad.f32)
    x = kb.ndarray("x", vkad.f32, 1, grad=True)
    y = kb.ndarray("y", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        y[i] = vkad.sin(x[i] * vkad.cast(t + 1, vkad.f32)) * c
    return kb


@pytest.fixture(scope="module")
def sine(session):
    return session.differentiate(scaled_sine())


X0 = np.linspace(-1, 1, 9).astype(np.float32)


def test_a_bound_launch_is_the_launch(session, sine):
    x = session.ndarray(X0)
    y_bound, y_launch = session.empty(9, vkad.f32), session.empty(9, vkad.f32)
    b = session.bind(sine.forward, x=x, y=y_bound)
    assert b.free_params == ["t", "c"] and b.kernel is sine.forward
    b(2, 0.5)
    session.launch(sine.forward, 2, 0.5, x, y_launch)
    np.testing.assert_array_equal(y_bound.numpy(), y_launch.numpy())
    # sin is within 2^-11 absolute on [-pi, pi] on Vulkan; the products are correctly rounded
    np.testing.assert_allclose(y_bound.numpy(), np.sin(X0 * 3) * 0.5, atol=2e-3)
    # scalars may be bound too, and every argument: a call with none
    b2 = session.bind(sine.forward, t=0, c=2.0, x=x, y=y_bound)
    assert b2.free_params == []
    b2()
    np.testing.assert_allclose(y_bound.numpy(), np.sin(X0) * 2.0, atol=4e-3)


def test_a_tape_records_bound_launches_and_differentiates_them(session, sine):
    # z = sine(t=1)(sine(t=0)(x)): two bound launches of one kernel on a tape, the second
    # reading what the first wrote; dz/dx by the chain rule.
    x, y, z = session.ndarray(X0), session.empty(9, vkad.f32), session.empty(9, vkad.f32)
    first, second = session.bind(sine, x=x, y=y), session.bind(sine, x=y, y=z)
    with session.tape() as tape:
        first(0, 1.0)
        second(1, 0.5)
    tape.backward(seed={z: 1.0})
    inner = np.sin(X0)
    expected = 0.5 * 2 * np.cos(2 * inner) * np.cos(X0)
    np.testing.assert_allclose(tape.grad(x).numpy(), expected, atol=5e-3)
    # the same through Session.launch: the same gradient, bit for bit
    with session.tape() as again:
        session.launch(sine, 0, 1.0, x, y)
        session.launch(sine, 1, 0.5, y, z)
    again.backward(seed={z: 1.0})
    np.testing.assert_array_equal(again.grad(x).numpy(), tape.grad(x).numpy())


def test_bound_launches_are_captured_and_replayed(session, sine):
    x, y = session.ndarray(X0), session.empty(9, vkad.f32)
    b = session.bind(sine.forward, x=x, y=y)
    with session.capture("bound") as g:
        b(4, 1.0)
        b(1, 3.0)  # the last launch wins: y = 3 sin(2 x)
    assert g.launches == 2
    y.upload(np.zeros(9, np.float32))
    session.replay(g)
    np.testing.assert_allclose(y.numpy(), 3 * np.sin(2 * X0), atol=6e-3)


def test_bind_and_its_calls_name_what_is_wrong(session, sine):
    x, y = session.ndarray(X0), session.empty(9, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError, match="bind 'scaled_sine': no parameter 'q'"):
        session.bind(sine, q=x)
    with pytest.raises(vkad.InvalidArgumentError,
                       match=r"bind 'scaled_sine', argument 1 \('c': f32\): expected a number"):
        session.bind(sine, c=x)
    with pytest.raises(vkad.InvalidArgumentError, match="expected a vkad ndarray"):
        session.bind(sine, x=1.0)
    with pytest.raises(vkad.InvalidArgumentError, match="expected a vkad Kernel"):
        session.bind("scaled_sine", x=x)
    b = session.bind(sine.forward, x=x, y=y)
    with pytest.raises(vkad.InvalidArgumentError,
                       match=r"1 arguments given, the bound launch takes 2 \(t, c\)"):
        b(1)
    with pytest.raises(vkad.InvalidArgumentError, match=r"argument 0 \('t': i32\)"):
        b(1.5, 1.0)
    # a bound array freed since: refused as Session.launch refuses it
    gone = session.empty(9, vkad.f32)
    b_gone = session.bind(sine.forward, x=x, y=gone)
    session.free(gone)
    with pytest.raises(vkad.Error) as bound_err:
        b_gone(0, 1.0)
    with pytest.raises(vkad.Error) as launch_err:
        session.launch(sine.forward, 0, 1.0, x, gone)
    assert type(bound_err.value) is type(launch_err.value)
    assert str(bound_err.value) == str(launch_err.value)
    # the session is usable after every refusal
    b(0, 1.0)
    np.testing.assert_allclose(y.numpy(), np.sin(X0), atol=2e-3)


def test_a_bound_launch_of_a_closed_session_is_refused():
    s = vkad.Session()
    k = s.compile(scaled_sine())
    b = s.bind(k, x=s.ndarray(X0), y=s.empty(9, vkad.f32))
    x = s.ndarray(X0)
    s.close()
    with pytest.raises(vkad.Error, match="closed"):
        b(0, 1.0)
    with pytest.raises(vkad.FailedPreconditionError, match="the session is closed"):
        s.bind(k, x=x)
