"""print and assert in @vkad.kernel functions (issue 56, points 1 and 2; docs/debugging.md):
print writes a line per call when the launch retires (stdout), in forward and adjoint kernels and
in replayed graphs; a failed assert raises vkad.DeviceError with its message, the Python line,
the failing invocation's index and the compared values; the session goes on."""
import numpy as np
import pytest

import vkad


@vkad.kernel
def show(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        v = x[i]
        for k in range(2):
            print("i =", i, f"k = {k}", "v:", v * 2.0)
        y[i] = v * v


@vkad.kernel
def show_vector(p: vkad.array(vkad.vec(2, vkad.f32))):
    for i in range(p.shape[0]):
        print("p", p[i], sep=": ")


@vkad.kernel
def bounded(x: vkad.array(vkad.f32), limit: vkad.f32):
    for i in range(x.shape[0]):
        assert x[i] < limit, "x below the limit"
        x[i] = x[i] + 1.0


@vkad.kernel
def positive(x: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        assert x[i] > 0.0


def line_of(text):
    with open(__file__) as f:
        return next(n for n, t in enumerate(f, 1) if text in t)


def printed(capfd):
    return [l for l in capfd.readouterr().out.splitlines() if l.startswith("[kernel")]


def test_print_in_a_loop(session, capfd):
    x, y = session.ndarray(np.arange(4, dtype=np.float32)), session.zeros(4, vkad.f32)
    capfd.readouterr()
    show(x, y, session=session)
    session.synchronize()
    lines = printed(capfd)
    assert len(lines) == 8
    want = {f"[kernel 'show', task 'line_{line_of('for i in range(x.shape[0]):')}', "
            f"thread ({i})] i = {i} k = {k} v: {2 * i}" for i in range(4) for k in range(2)}
    assert set(lines) == want
    # one invocation's lines in its order
    mine = [l for l in lines if "thread (3)" in l]
    assert [("k = 0" in l, "k = 1" in l) for l in mine] == [(True, False), (False, True)]


def test_print_of_a_vector(session, capfd):
    p = session.ndarray(np.array([[1.5, -2.0], [0.25, 3.0]], np.float32))
    capfd.readouterr()
    show_vector(p, session=session)
    session.synchronize()
    assert sorted(l.split("] ")[1] for l in printed(capfd)) == ["p: [0.25, 3]", "p: [1.5, -2]"]


def test_the_adjoint_prints_the_forward_once(session, capfd):
    x, y = session.ndarray(np.arange(3, dtype=np.float32)), session.zeros(3, vkad.f32)
    t = session.tape()
    with t:
        show(x, y, session=session)
    session.synchronize()
    capfd.readouterr()
    t.backward(seed={y: 1.0})
    session.synchronize()
    lines = printed(capfd)
    assert len(lines) == 6 and all(l.startswith("[kernel 'show_adjoint'") for l in lines)
    np.testing.assert_array_equal(t.grad(x).numpy(), 2 * np.arange(3, dtype=np.float32))


def test_a_graph_prints_at_every_replay(session, capfd):
    x, y = session.ndarray(np.arange(2, dtype=np.float32)), session.zeros(2, vkad.f32)
    with session.capture() as g:
        show(x, y, session=session)
    session.synchronize()
    capfd.readouterr()
    for _ in range(3):
        session.replay(g)
    session.synchronize()
    assert len(printed(capfd)) == 3 * 4


def test_a_failed_assert_names_the_message_line_thread_and_values(session):
    x = session.ndarray(np.array([0.5, 1.0, 7.0, 2.0], np.float32))
    bounded(x, 5.0, session=session)
    with pytest.raises(vkad.DeviceError, match=r"kernel 'bounded'.*assertion failed: x below the "
                                               r"limit .*thread \(2\) with 7, 5") as e:
        session.synchronize()
    assert f'File "{__file__}", line {line_of("assert x[i] < limit")}' in str(e.value)
    # the launch ran to its end and the session goes on
    np.testing.assert_array_equal(x.numpy(), [1.5, 2.0, 8.0, 3.0])
    bounded(x, 100.0, session=session)
    session.synchronize()


def test_an_assert_without_a_message_quotes_its_condition(session):
    x = session.ndarray(np.array([1.0, -3.0], np.float32))
    positive(x, session=session)
    with pytest.raises(vkad.DeviceError, match=r"assertion failed: x\[i\] > 0\.0 .*thread \(1\) "
                                               r"with -3;"):
        session.synchronize()


def test_an_assert_in_a_replayed_graph(session):
    x = session.ndarray(np.zeros(8, np.float32))
    with session.capture() as g:
        bounded(x, 4.0, session=session)
    session.synchronize()
    for _ in range(5):  # x reaches 4 in the 3rd or 4th (whether the capture ran or not)
        session.replay(g)
    with pytest.raises(vkad.DeviceError, match=r"(?s)assertion failed.*thread \(\d\) with [45], "
                                               r"4.*of graph"):
        session.synchronize()


def test_print_outside_the_subset_points_at_the_line():
    def bad(x: vkad.array(vkad.f32)):
        for i in range(x.shape[0]):
            print(f"{x[i]:.3f}")

    with pytest.raises(vkad.InvalidArgumentError, match="format spec") as e:
        vkad.kernel(bad).ir()
    assert e.value.lineno == line_of('print(f"{x[i]:.3f}")')


def test_a_print_sink_gets_the_lines(session, capfd):
    got = []
    session.set_print_sink(got.append)
    try:
        x, y = session.ndarray(np.arange(4, dtype=np.float32)), session.zeros(4, vkad.f32)
        capfd.readouterr()
        show(x, y, session=session)
        session.synchronize()
    finally:
        session.set_print_sink(None)
    assert len(got) == 8 and all(l.startswith("[kernel 'show'") for l in got)
    assert printed(capfd) == []  # not on stdout as well
    with pytest.raises(vkad.InvalidArgumentError, match="a callable"):
        session.set_print_sink(42)


@vkad.kernel
def row_below_two(t: vkad.i32, x: vkad.array(vkad.f32, ndim=2, grad=True),
                  y: vkad.array(vkad.f32, ndim=2, grad=True)):
    for i in range(x.shape[1]):
        v = x[t, i]
        assert v < 2.0, "x stays below 2"
        y[t, i] = v * 2.0


def test_a_loops_launches_name_their_iteration(session):
    # Issue 56, point 5: a loop too wide to roll (1,024 columns) runs one launch per iteration,
    # and each launch's device error names its iteration -- on a tape, the loop's entry, and in
    # the adjoint, whose iterations run from the forward's last.
    x0 = np.ones((4, 1024), np.float32)
    x0[2, 700] = 5.0
    x, y = session.ndarray(x0), session.zeros((4, 1024), vkad.f32)
    row_below_two.differentiate(session)  # (a loop's body only launches: made before it)
    session.loop(0, 4, lambda t: row_below_two(t, x, y, session=session))
    with pytest.raises(vkad.DeviceError, match=r"(?s)x stays below 2.*thread \(700\) with 5.*"
                                               r"\(iteration 2 of a launch_loop\)"):
        session.synchronize()
    with session.tape() as tape:
        session.loop(0, 4, lambda t: row_below_two(t, x, y, session=session))
    with pytest.raises(vkad.DeviceError, match=r"\(iteration 2 of the loop at tape entry 0\)"):
        session.synchronize()
    tape.backward(seed={y: 1.0})
    with pytest.raises(vkad.DeviceError, match=r"(?s)kernel 'row_below_two_adjoint'.*\(iteration 1 "
                                               r"of the adjoint \(run from the last iteration\) "
                                               r"of the loop at tape entry 0\)"):
        session.synchronize()
    # the launches ran to their end: row t of y is twice row t of x
    np.testing.assert_array_equal(y.numpy(), 2 * x0)
