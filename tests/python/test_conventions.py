"""Conventions a user relies on, pinned (docs/reference.md "Derivatives where an operation has a
kink", docs/graphs.md): min / max at an exact tie give the gradient to the
first operand, abs'(0) = +1 (either zero); a captured backward is seeded with numbers; a replay
update's launch index counts the backward's adjoints in capture order, as Graph.launch_names
lists them."""
import numpy as np
import pytest

import vkad

N = 6


def _binary(name, op):
    kb = vkad.KernelBuilder(name)
    a = kb.ndarray("a", vkad.f32, 1, grad=True)
    b = kb.ndarray("b", vkad.f32, 1, grad=True)
    out = kb.ndarray("out", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", 0, out.shape[0]) as i:
        out[i] = op(a[i], b[i])
    return kb


@pytest.mark.parametrize("name,op", [("min", vkad.min), ("max", vkad.max)])
def test_min_max_ties_give_the_gradient_to_the_first_operand(session, name, op):
    s = session
    d = s.differentiate(_binary(name, op))
    # Ties (equal values, and +0 / -0), then one element where each operand wins outright.
    av = np.array([0.5, -2.0, 0.0, -0.0, 1.0, 3.0], np.float32)
    bv = np.array([0.5, -2.0, -0.0, 0.0, 3.0, 1.0], np.float32)
    a, b, out = s.ndarray(av), s.ndarray(bv), s.empty(N, vkad.f32)
    with s.tape() as t:
        s.launch(d, a, b, out)
    t.backward(seed={out: 1.0})
    first = (av <= bv) if name == "min" else (av >= bv)
    np.testing.assert_array_equal(t.grad(a).numpy(), first.astype(np.float32))
    np.testing.assert_array_equal(t.grad(b).numpy(), (~first).astype(np.float32))
    assert first[:4].all(), "every tie goes to a"


def test_abs_derivative_at_zero_is_plus_one(session):
    s = session
    kb = vkad.KernelBuilder("absolute")
    x = kb.ndarray("x", vkad.f32, 1, grad=True)
    y = kb.ndarray("y", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", 0, y.shape[0]) as i:
        y[i] = abs(x[i])
    d = s.differentiate(kb)
    xv = np.array([0.0, -0.0, 2.0, -2.0], np.float32)
    xa, ya = s.ndarray(xv), s.empty(4, vkad.f32)
    with s.tape() as t:
        s.launch(d, xa, ya)
    t.backward(seed={ya: 1.0})
    np.testing.assert_array_equal(t.grad(xa).numpy(), np.array([1, 1, 1, -1], np.float32))


SCALED = """
kernel scaled(c: f32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = arg c : f32
    %3 = mul %1, %2 : f32
    %4 = mul %3, %1 : f32
    store y[%0], %4
  }
}"""


def test_captured_backward_is_seeded_with_numbers_and_updates_number_its_adjoints(session):
    s = session
    d = s.differentiate(SCALED)  # y = c x^2
    xv = np.linspace(-1, 1, N).astype(np.float32)
    x, y = s.ndarray(xv), s.empty(N, vkad.f32)
    t = s.tape()
    with s.capture("seeded") as g:
        with t:
            s.launch(d, 2.0, x, y)
        with pytest.raises(vkad.FailedPreconditionError, match="graph 'seeded' is being captured"):
            t.backward(seed={y: np.ones(N, np.float32)})  # an array seed is an upload
        t.backward(seed={y: 1.0})
    assert g.launch_names == ["scaled", "scaled_adjoint"]
    s.replay(g)
    np.testing.assert_allclose(t.grad(x).numpy(), 4 * xv, rtol=1e-6)  # d(2 x^2)/dx
    # The adjoint is launch 1; c is parameter 0 of both kernels (param_names).
    adjoint = g.launch_names.index("scaled_adjoint")
    assert d.adjoint.param_names[0] == "c"
    s.replay(g, updates=[(0, 0, 3.0), (adjoint, 0, 3.0)])
    np.testing.assert_allclose(y.numpy(), 3 * xv * xv, rtol=1e-6)
    np.testing.assert_allclose(t.grad(x).numpy(), 6 * xv, rtol=1e-6)
    # Updating the forward alone leaves the adjoint's c at 3: the two are addressed apart.
    s.replay(g, updates=[(0, 0, 5.0)])
    np.testing.assert_allclose(y.numpy(), 5 * xv * xv, rtol=1e-6)
    np.testing.assert_allclose(t.grad(x).numpy(), 6 * xv, rtol=1e-6)


def test_launch_names_are_unique_and_address_updates(session):
    """Two launches of one differentiated kernel on a tape: the backward's adjoints come last
    launch first, and every launch has its own name ('#k' on the k-th repeat) that a replay
    update can give instead of the index (issue 50, point 6)."""
    s = session
    d = s.differentiate(SCALED)
    xv = np.linspace(-1, 1, N).astype(np.float32)
    x, y, z = s.ndarray(xv), s.empty(N, vkad.f32), s.empty(N, vkad.f32)
    t = s.tape()
    with s.capture("named") as g:
        with t:
            s.launch(d, 2.0, x, y)
            s.launch(d, 3.0, x, z)
        t.backward(seed={y: 1.0, z: 1.0})
    assert g.launch_names == ["scaled", "scaled#1", "scaled_adjoint", "scaled_adjoint#1"]
    s.replay(g)
    np.testing.assert_allclose(t.grad(x).numpy(), (4 + 6) * xv, rtol=1e-6)
    # The second forward (z = c x^2) and its adjoint, which the backward runs first.
    s.replay(g, updates=[("scaled#1", 0, 5.0), ("scaled_adjoint", 0, 5.0)])
    np.testing.assert_allclose(z.numpy(), 5 * xv * xv, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), 2 * xv * xv, rtol=1e-6)
    np.testing.assert_allclose(t.grad(x).numpy(), (4 + 10) * xv, rtol=1e-6)
    with pytest.raises(vkad.InvalidArgumentError, match="no launch named 'scaled#2'.*'scaled#1'"):
        s.replay(g, updates=[("scaled#2", 0, 1.0)])


def test_an_extent_past_any_integer_is_out_of_range(session):
    for bad in (2**70, -(2**70), 2**32, -1):
        with pytest.raises(vkad.InvalidArgumentError, match="out of range"):
            session.empty((4, bad), vkad.f32)
