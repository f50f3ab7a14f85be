"""Launches refused before they run where they would be silently wrong (issue 50): one array
passed for a parameter the kernel writes and one it reads, on a tape (every way a launch gets
onto one: `with t:`, a step loop, a checkpointed tape, a capture); and an array whose trailing
extents differ from a KernelBuilder parameter's element shape."""
import numpy as np
import pytest

import vkad

N = 8
SIN = """
kernel sin_of(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(a, 0)) {
    %v = load a[%i] : f32
    %s = sin %v : f32
    store b[%i], %s
  }
}"""
IN_PLACE = (r"tape.launch: launch 0 \('sin_of'\) passes ndarray 'x' \(.*\) as both parameter "
            r"'b', which it writes, and parameter 'a', which it reads.*the gradients would be "
            r"wrong. Pass a separate array for 'b'.*Nothing was launched or recorded")


@pytest.fixture(scope="module")
def sin_of(session):
    return session.differentiate(SIN)


def test_in_place_launch_on_a_tape_is_refused(session, sin_of):
    s = session
    x = s.ndarray(np.full(N, 0.7, np.float32), name="x")
    launches = s.stats()["launches"]
    t = s.tape()
    with t:
        with pytest.raises(vkad.InvalidArgumentError, match=IN_PLACE):
            s.launch(sin_of, x, x)
        with pytest.raises(vkad.InvalidArgumentError, match=IN_PLACE):
            s.loop(0, 3, lambda f: s.launch(sin_of, x, x))
    assert not t.launches
    t.checkpoint_every = 2
    with t:
        with pytest.raises(vkad.InvalidArgumentError, match=IN_PLACE):
            s.launch(sin_of, x, x)
    assert s.stats()["launches"] == launches, "nothing ran"
    np.testing.assert_array_equal(x.numpy(), np.full(N, 0.7, np.float32))
    # Off the tape an in-place launch is no gradient's business: it runs.
    s.launch(sin_of, x, x)
    np.testing.assert_allclose(x.numpy(), np.sin(np.full(N, 0.7)), rtol=1e-6)


def test_in_place_launch_in_a_capture_is_refused_and_a_separate_output_is_right(session,
                                                                                sin_of):
    s = session
    x = s.ndarray(np.full(N, 0.7, np.float32), name="x")
    y = s.empty(N, vkad.f32, "y")
    t = s.tape()
    with s.capture("in place") as g:
        with t:
            with pytest.raises(vkad.InvalidArgumentError, match=IN_PLACE):
                s.launch(sin_of, x, x)
            s.launch(sin_of, x, y)  # what the message says to do
        t.backward(seed={y: 1.0})
    s.replay(g)
    np.testing.assert_allclose(t.grad(x).numpy(), np.cos(np.full(N, 0.7)), rtol=1e-5)


def _vector_copy(grad=False):
    kb = vkad.KernelBuilder("vcopy")
    src = kb.ndarray("src", vkad.f32, 1, element=(2,), grad=grad)
    dst = kb.ndarray("dst", vkad.f32, 1, element=(2,), grad=grad)
    with kb.parallel_for("main", 0, dst.shape[0]) as p:
        dst[p] = src[p] * 2.0
    return kb


def test_element_shape_is_checked_at_launch(session):
    s = session
    k = s.compile(_vector_copy())
    good = s.ndarray(np.ones((4, 2), np.float32), name="good")
    wide = s.ndarray(np.ones((4, 3), np.float32), name="wide")
    out = s.empty((4, 2), vkad.f32, "out")
    with pytest.raises(vkad.InvalidArgumentError,
                       match=r"launch 'vcopy', argument 0 \('src': ndarray<f32, 2>\): ndarray "
                             r"'wide' has shape \(4, 3\); the parameter's elements are of "
                             r"shape \(2,\)"):
        s.launch(k, wide, out)
    with pytest.raises(vkad.InvalidArgumentError, match=r"argument 1 \('dst'"):
        s.launch(k, good, s.empty((4, 3), vkad.f32))
    s.launch(k, good, out)
    np.testing.assert_array_equal(out.numpy(), np.full((4, 2), 2.0, np.float32))
    # differentiate() checks the same, and so does the adjoint's gradient parameter.
    d = s.differentiate(_vector_copy(grad=True))
    with pytest.raises(vkad.InvalidArgumentError, match="has shape \\(4, 3\\)"):
        s.launch(d, wide, out)
    with pytest.raises(vkad.InvalidArgumentError, match="argument 2 \\('src_grad'"):
        s.launch(d.adjoint, good, out, wide, out)
