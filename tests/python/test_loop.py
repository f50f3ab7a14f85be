"""Session.loop (docs/graphs.md, "Step loops"): a step loop said as one -- its body traced once with
a symbolic index, run as one resident kernel where it may be rolled -- gives the results and the
gradients of the same launches from a Python loop, records on a tape and in a capture, and names
what is wrong in a body."""
import numpy as np
import pytest

import vkad

N, T = 24, 40


def decay() -> vkad.KernelBuilder:
    """x[t + 1, i] = x[t, i] * w[i] + 0.1: a chain over the time axis (row t read, t + 1
    written), as DiffTaichi writes its state."""
    kb = vkad.KernelBuilder("decay")
    t = kb.scalar("t", vkad.i32)
    x = kb.ndarray("x", vkad.f32, 2, grad=True)
    w = kb.ndarray("w", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[1]) as i:
        x[t + 1, i] = x[t, i] * w[i] + 0.1
    return kb


def total() -> vkad.KernelBuilder:
    """loss[0] += x[t, i]."""
    kb = vkad.KernelBuilder("total")
    t = kb.scalar("t", vkad.i32)
    x = kb.ndarray("x", vkad.f32, 2, grad=True)
    loss = kb.ndarray("loss", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", 0, x.shape[1]) as i:
        loss.atomic_add(0, x[t, i])
    return kb


def shift_back() -> vkad.KernelBuilder:
    """x[t, i] = 2 x[t + 1, i]: iteration t + 1 overwrites the row iteration t read."""
    kb = vkad.KernelBuilder("shift_back")
    t = kb.scalar("t", vkad.i32)
    x = kb.ndarray("x", vkad.f32, 2, grad=True)
    with kb.parallel_for("main", 0, x.shape[1]) as i:
        x[t, i] = x[t + 1, i] * 2.0
    return kb


@pytest.fixture(scope="module")
def kernels(session):
    return session.differentiate(decay()), session.differentiate(total())


X0 = np.linspace(-1, 1, N).astype(np.float32)
W = np.linspace(0.8, 1.05, N).astype(np.float32)


def arrays(session):
    x0 = np.zeros((T + 1, N), np.float32)
    x0[0] = X0
    x = session.ndarray(x0, name="x")
    w = session.ndarray(W, name="w")
    loss = session.zeros(1, vkad.f32, "loss")
    return x, w, loss


def simulate(session, kernels, x, w, loss, looped: bool):
    step, tot = kernels
    b = session.bind(step, x=x, w=w)
    if looped:
        session.loop(0, T, lambda t: b(t))
    else:
        for t in range(T):
            b(t)
    session.launch(tot, T, x, loss)


def closed_form():
    # x_T = w^T x0 + 0.1 (1 + w + ... + w^(T-1)); d loss / d w = d x_T / d w per element.
    w, x0 = W.astype(np.float64), X0.astype(np.float64)
    xt = w ** T * x0 + 0.1 * sum(w ** k for k in range(T))
    dw = T * w ** (T - 1) * x0 + 0.1 * sum(k * w ** (k - 1) for k in range(1, T))
    return xt, dw


def test_a_loop_gives_the_python_loops_results_and_gradients(session, kernels):
    out = {}
    for looped in (False, True):
        x, w, loss = arrays(session)
        with session.tape() as tape:
            simulate(session, kernels, x, w, loss, looped)
        tape.backward(seed={loss: 1.0})
        out[looped] = (x.numpy(), loss.numpy()[0], tape.grad(w).numpy(), tape.grad(x).numpy())
        if looped:
            # the tape holds the loop as one entry, then the loss launch
            assert isinstance(tape.launches[0], vkad.LoopRecord)
            assert tape.launches[0].count == T and tape.launches[0].start == 0
            assert len(tape.launches) == 2
    # Same f32 operations in the same order per element (a resident kernel runs each launch's
    # body as the launch does): the states agree to rounding of contracted multiply-adds.
    np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[True][2], out[False][2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[True][3], out[False][3], rtol=1e-5, atol=1e-5)
    # and the closed form: |x| <= ~4, T = 40 steps of f32 rounding (~2^-24 relative each)
    xt, dw = closed_form()
    np.testing.assert_allclose(out[True][0][T], xt, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[True][1], xt.sum(), rtol=1e-5)
    np.testing.assert_allclose(out[True][2], dw, rtol=1e-4, atol=1e-4)


def test_small_ranges_run_as_one_resident_launch_forward_and_backward(session, kernels):
    x, w, loss = arrays(session)
    before = session.stats()["rolled_loops"]
    with session.capture("looped") as g:
        with session.tape() as tape:
            simulate(session, kernels, x, w, loss, True)
        tape.backward(seed={loss: 1.0})
    # N = 24 elements per launch and T = 40 iterations: rolled where the device allows it
    # (lavapipe cuts long loops; 40 x 2 passes is far below its cap)
    assert session.stats()["rolled_loops"] - before == 2
    # the loop, the loss launch, the loss's adjoint and the adjoint loop (and two fills: the
    # gradients' zeroing, the seed): each loop is one launch
    assert g.launches == 4
    session.replay(g)
    xt, dw = closed_form()
    np.testing.assert_allclose(x.numpy()[T], xt, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tape.grad(w).numpy(), dw, rtol=1e-4, atol=1e-4)
    # the rolled launch has no parameters to update
    with pytest.raises(vkad.InvalidArgumentError, match="Session.loop that runs as one resident"):
        session.replay(g, updates=[(0, 0, 3)])


def test_a_prepared_loop_runs_and_is_checked_as_if_it_was_not(session, kernels):
    step, tot = kernels
    x, w, loss = arrays(session)
    b = session.bind(step, x=x, w=w)
    before = session.stats()["rolled_loops"]
    # its kernel and its adjoint's made, the tape's check of it kept; nothing run
    assert session.prepare_loop(0, T, lambda t: b(t)) is True
    np.testing.assert_array_equal(x.numpy()[1:], 0)
    back = session.differentiate(shift_back())
    with session.tape() as tape:
        session.loop(0, T, lambda t: b(t))
        # The record the kept check left is the recording's: iteration 5 read row 5, so a launch
        # overwriting it is refused, numbered after the loop's 40 launches.
        with pytest.raises(vkad.InvalidArgumentError,
                           match=r"launch 40 \('shift_back'\) writes ndarray 'x'.*launch 5 "
                                 r"\('decay'\) read"):
            session.launch(back, 5, x)
        session.launch(tot, T, x, loss)
    tape.backward(seed={loss: 1.0})
    assert session.stats()["rolled_loops"] - before == 2
    xt, dw = closed_form()
    np.testing.assert_allclose(x.numpy()[T], xt, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tape.grad(w).numpy(), dw, rtol=1e-4, atol=1e-4)
    # A second recording from an empty record takes the kept check again: same refusal.
    with session.tape() as again:
        session.loop(0, T, lambda t: b(t))
        with pytest.raises(vkad.InvalidArgumentError, match=r"launch 40 \('shift_back'\)"):
            session.launch(back, 5, x)


def test_a_loop_past_the_resident_range_runs_its_launches(session):
    wide = session.compile(decay())
    x = session.zeros((5, 600), vkad.f32)  # 600 elements: past resident_max_range (256)
    w = session.ndarray(np.full(600, 0.5, np.float32))
    before = session.stats()["rolled_loops"]
    with session.capture("wide") as g:
        session.loop(0, 4, lambda t: session.launch(wide, t, x, w))
    assert g.launches == 4 and session.stats()["rolled_loops"] == before
    assert session.stats()["reworked_loops"] == 0
    session.replay(g)
    # x[t + 1] = 0.5 x[t] + 0.1 from 0: 0.1, 0.15, 0.175, 0.1875 (to f32 rounding)
    np.testing.assert_allclose(x.numpy()[:, 0], [0, 0.1, 0.15, 0.175, 0.1875], rtol=1e-6)


def test_a_prepared_loop_past_the_resident_range_runs_reworked(session):
    # prepare_loop makes the graph rework's plan of a loop too wide to roll: its four
    # element-wise launches fuse into one, launched from the loop's first run.
    wide = session.compile(decay())
    x = session.zeros((5, 600), vkad.f32)
    w = session.ndarray(np.linspace(0.1, 0.9, 600).astype(np.float32))
    before = session.stats()
    assert session.prepare_loop(0, 4, lambda t: session.launch(wide, t, x, w)) is False
    with session.capture("wide") as g:
        session.loop(0, 4, lambda t: session.launch(wide, t, x, w))
    after = session.stats()
    assert g.launches == 1
    assert after["reworked_loops"] - before["reworked_loops"] == 1
    assert after["rolled_loops"] == before["rolled_loops"]
    want = np.zeros((5, 600), np.float32)
    for t in range(4):
        want[t + 1] = w.numpy() * want[t] + np.float32(0.1)
    session.replay(g)
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)
    # The same loop over another array is another loop: launched one by one.
    y = session.zeros((5, 600), vkad.f32)
    with session.capture("other") as g2:
        session.loop(0, 4, lambda t: session.launch(wide, t, y, w))
    assert g2.launches == 4 and session.stats()["reworked_loops"] == after["reworked_loops"]
    session.replay(g2)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    # Its scalars came from the plan: an update of one is refused, naming the loop.
    with pytest.raises(vkad.InvalidArgumentError, match="reworked launches"):
        session.replay(g, updates=[(0, 0, 1)])


def test_an_index_offset_and_a_launch_without_it(session, kernels):
    step, tot = kernels
    x, w, loss = arrays(session)
    seen = []

    def body(t):
        seen.append(repr(t - 1))
        session.launch(step.forward, t - 1, x, w)  # t from 1: rows 0..T-1
        session.launch(tot.forward, T, x, loss)    # no index: repeated as given

    session.loop(1, T + 1, body)
    assert seen == ["vkad.LoopIndex(t - 1)"]  # traced once
    xt, _ = closed_form()
    np.testing.assert_allclose(x.numpy()[T], xt, rtol=1e-5, atol=1e-5)
    # the loss launch ran every iteration, summing row T as it stood then (zero until the last)
    np.testing.assert_allclose(loss.numpy()[0], xt.sum(), rtol=1e-5)
    session.loop(5, 5, body)  # an empty range runs nothing (and traces nothing)
    assert len(seen) == 1


def test_a_body_that_uses_the_index_as_a_value_or_does_more_than_launch_is_refused(session,
                                                                                  kernels):
    step, tot = kernels
    x, w, loss = arrays(session)
    with pytest.raises(vkad.InvalidArgumentError, match="symbolic"):
        session.loop(0, 3, lambda t: session.launch(step.forward, int(t), x, w))
    with pytest.raises(vkad.InvalidArgumentError, match="symbolic"):
        session.loop(0, 3, lambda t: session.launch(step.forward, t * 2, x, w))
    with pytest.raises(vkad.InvalidArgumentError, match="only launch kernels"):
        session.loop(0, 3, lambda t: session.zero(loss))
    with pytest.raises(vkad.InvalidArgumentError, match="only launch kernels"):
        session.loop(0, 3, lambda t: loss.numpy())
    with pytest.raises(vkad.InvalidArgumentError, match="inside a loop's body"):
        session.loop(0, 3, lambda t: session.loop(0, 2, lambda u: None))
    f32_param = session.compile(
        "kernel scale(c: f32, x: ndarray<f32, 1>) {\n"
        "  task t parallel %0 in [0, shape(x, 0)) {\n"
        "    %1 = load x[%0] : f32\n    %2 = arg c : f32\n    %3 = mul %1, %2 : f32\n"
        "    store x[%0], %3\n  }\n}\n")
    with pytest.raises(vkad.InvalidArgumentError, match="steps an i32 scalar; this parameter is "
                       "a f32 scalar"):
        session.loop(0, 3, lambda t: session.launch(f32_param, t, w))
    kept = {}

    def keeps(t):
        kept["t"] = t
        session.launch(f32_param, t, w)

    with pytest.raises(vkad.InvalidArgumentError, match="steps an i32 scalar"):
        session.loop(0, 3, keeps)
    with pytest.raises(vkad.InvalidArgumentError, match="symbolic"):  # an index kept past its loop
        session.launch(step.forward, kept["t"], x, w)
    # a body's own exception passes through; nothing of any of these ran, the session works
    with pytest.raises(ZeroDivisionError):
        session.loop(0, 3, lambda t: 1 / 0)
    np.testing.assert_array_equal(w.numpy(), W)
    np.testing.assert_array_equal(x.numpy()[1:], 0)
    session.loop(0, T, lambda t: session.launch(step.forward, t, x, w))
    np.testing.assert_allclose(x.numpy()[T], closed_form()[0], rtol=1e-5, atol=1e-5)


def test_a_loop_that_fails_part_way_leaves_its_tape_refusing_backward(session, kernels):
    # The second launch's range begins at t - 2: out of bounds in iteration 0, which only the
    # launch finds (its arguments pass the checks), after the first launch of the body ran.
    step, tot = kernels
    kb = vkad.KernelBuilder("tail")
    t = kb.scalar("t", vkad.i32)
    x = kb.ndarray("x", vkad.f32, 2, grad=True)
    y = kb.ndarray("y", vkad.f32, 1, grad=True)
    with kb.parallel_for("main", t, x.shape[1]) as i:
        y[i] = x[0, i] * 2.0
    tail = session.compile(kb)  # not recorded: only its range matters here
    x, w, loss = arrays(session)
    y = session.zeros(N, vkad.f32)
    with session.tape() as tape:
        with pytest.raises(vkad.InvalidArgumentError, match=r"range \[-2, 24\) is out of bounds"):
            session.loop(0, 4, lambda t: (session.launch(step, t, x, w),
                                          session.launch(tail, t - 2, x, y)))
    with pytest.raises(vkad.FailedPreconditionError,
                       match="a launch_loop failed after 1 of its launches ran"):
        tape.backward(seed={loss: 1.0})
    # the next recording is whole again
    with tape:
        session.launch(tot, T, x, loss)
    tape.backward(seed={loss: 1.0})
    np.testing.assert_array_equal(tape.grad(x).numpy()[T], 1)


def test_an_index_compared_or_too_many_iterations_is_refused(session, kernels):
    step, _ = kernels
    x, w, _ = arrays(session)
    with pytest.raises(vkad.InvalidArgumentError, match="symbolic"):
        session.loop(0, 3, lambda t: t == 0 and session.launch(step, t, x, w))
    with pytest.raises(vkad.InvalidArgumentError, match="at most 2\\^32 - 1"):
        session.loop(0, 2 ** 32, lambda t: session.launch(step, t, x, w))
    session.loop(0, 1, lambda t: session.launch(step, t, x, w))  # the session goes on
    np.testing.assert_allclose(x.numpy()[1], X0 * W + 0.1, rtol=1e-6, atol=1e-6)


def test_another_threads_calls_are_not_traced_into_a_loop(session, kernels):
    # While thread A's body is traced (waiting mid-body), thread B launches and reads back on
    # the same session: B's launch runs now, once, and A's loop has only A's launches.
    import threading
    step, _ = kernels
    x, w, _ = arrays(session)
    other = session.zeros((T + 1, N), vkad.f32)
    inside, go, seen = threading.Event(), threading.Event(), {}

    def body(t):
        inside.set()
        go.wait(timeout=30)
        session.launch(step, t, x, w)

    def b():
        inside.wait(timeout=30)
        try:
            session.launch(step, 0, other, w)  # row 1 of `other` = 0 * w + 0.1
            seen["row1"] = other.numpy()[1].copy()
        finally:
            go.set()

    tb = threading.Thread(target=b)
    tb.start()
    session.loop(0, T, body)
    tb.join()
    np.testing.assert_allclose(seen["row1"], np.full(N, 0.1, np.float32), rtol=1e-6)
    np.testing.assert_array_equal(other.numpy()[2:], 0)  # B's launch ran once, not per iteration
    np.testing.assert_allclose(x.numpy()[T], closed_form()[0], rtol=1e-5, atol=1e-5)


def test_the_tapes_check_runs_per_iteration_before_the_loop_runs(session):
    back = session.differentiate(shift_back())
    x0 = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    x = session.ndarray(x0)
    with session.tape() as tape:
        # iteration 1 writes row 1, which iteration 0 read: its gradient would be wrong
        with pytest.raises(vkad.InvalidArgumentError,
                           match=r"tape.launch_loop: launch 0 of the body \('shift_back'\), "
                                 r"iteration 1: "):
            session.loop(0, 3, lambda t: session.launch(back, t, x))
        # nothing ran and the recording goes on: one iteration alone is fine
        session.loop(2, 3, lambda t: session.launch(back, t, x))
    tape.backward(seed={x: 1.0})
    expected = x0.copy()
    expected[2] = 2 * x0[3]
    np.testing.assert_array_equal(x.numpy(), expected)
    # d(sum x)/d x[3] = 1 + 2 (itself, and through x[2] = 2 x[3]); rows 0, 1 untouched
    g = tape.grad(x).numpy()
    np.testing.assert_array_equal(g[3], 3)
    np.testing.assert_array_equal(g[:2], 1)


def test_a_checkpointing_tape_runs_the_body_per_iteration(session, kernels):
    grads = {}
    for every in (0, 7):
        x, w, loss = arrays(session)
        tape = session.tape()
        tape.checkpoint_every = every
        with tape:
            simulate(session, kernels, x, w, loss, True)
        tape.backward(seed={loss: 1.0})
        grads[every] = tape.grad(w).numpy()
        # checkpointed: the plain loop's T launches, then the loss
        assert len(tape.launches) == (2 if every == 0 else T + 1)
    np.testing.assert_allclose(grads[7], grads[0], rtol=1e-5, atol=1e-6)
