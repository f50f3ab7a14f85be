"""Captured launch sequences from Python (Session.capture / replay): results equal launching the
steps one by one, scalar updates, a whole training iteration (tape forward + backward)
captured and replayed, and the misuse errors."""
import numpy as np
import pytest

import vkad

AXPY = """
kernel axpy(a: f32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = arg a : f32
    %2 = load x[%0] : f32
    %3 = load y[%0] : f32
    %4 = mul %1, %2 : f32
    %5 = add %4, %3 : f32
    store y[%0], %5
  }
}"""
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
N = 100
XS = (0.25 * (np.arange(N) % 17)).astype(np.float32)  # small exact values: sums are exact


def test_replay_equals_the_steps_and_takes_updates(session):
    s = session
    k = s.compile(AXPY)
    x, y = s.ndarray(XS), s.zeros(N, vkad.f32)
    launches = s.stats()["launches"]
    with s.capture("three") as g:
        s.fill(y, 1.0)
        for a in (2.0, 3.0, 4.0):
            s.launch(k, a, x, y)
    assert s.stats()["launches"] == launches, "capturing runs nothing"
    np.testing.assert_array_equal(y.numpy(), np.zeros(N, np.float32))
    assert g.launches == 3 and g.name == "three"
    s.replay(g)
    np.testing.assert_array_equal(y.numpy(), 1 + 9 * XS)
    s.replay(g, updates=[(1, 0, -5)])  # an int converts to the f32 parameter
    np.testing.assert_array_equal(y.numpy(), 1 + 1 * XS)
    s.replay(g)  # the update was kept
    np.testing.assert_array_equal(y.numpy(), 1 + 1 * XS)
    with pytest.raises(vkad.InvalidArgumentError, match=r"update of launch 3; the graph has 3"):
        s.replay(g, updates=[(3, 0, 1.0)])
    with pytest.raises(vkad.InvalidArgumentError, match=r"parameter 1 is not a scalar parameter"):
        s.replay(g, updates=[(0, 1, 1.0)])
    with pytest.raises(vkad.InvalidArgumentError, match=r"value 1e\+300 does not fit f32"):
        s.replay(g, updates=[(0, 0, 1e300)])
    # Malformed updates are named (they were `RuntimeError: std::bad_cast`), and none is kept.
    for bad, what in [([(-1, 0, 1.0)], r"update 0: launch index -1 is out of range"),
                      ([(2**40, 0, 1.0)], r"update 0: launch index 1099511627776 is out of range"),
                      ([(0, -1, 1.0)], r"update 0: parameter index -1 is out of range"),
                      ([(0, 0.5, 1.0)], r"update 0: parameter index 0.5 is not an int"),
                      ([(0, 0, 1.0), [0, 0, 1.0]], r"update 1: \[0, 0, 1.0\] is not a \(launch"),
                      ((0, 0, 1.0), r"update 0: 0 is not a \(launch, param, value\) tuple"),
                      (7, r"updates are a list of \(launch, param, value\) tuples, not int")]:
        with pytest.raises(vkad.InvalidArgumentError, match=what):
            s.replay(g, updates=bad)
    s.replay(g)
    np.testing.assert_array_equal(y.numpy(), 1 + 1 * XS)
    g.release()
    with pytest.raises(vkad.InvalidArgumentError, match="released"):
        s.replay(g)


def test_uploads_and_readbacks_are_refused_while_capturing(session):
    s = session
    a = s.zeros(4, vkad.f32)
    with s.capture("open"):
        with pytest.raises(vkad.FailedPreconditionError, match="graph 'open' is being captured"):
            a.numpy()
        with pytest.raises(vkad.FailedPreconditionError, match="graph 'open' is being captured"):
            a.upload(np.ones(4, np.float32))
        s.flush()  # submits nothing, no error
    np.testing.assert_array_equal(a.numpy(), np.zeros(4, np.float32))


def _sin_chain(s, steps):
    """x0, the arrays x0..x_steps, a tape, and a training iteration: STEP from each to the next
    on the tape, then its backward seeded at the last."""
    step = s.differentiate(STEP)
    x0 = np.linspace(-1.5, 1.5, N).astype(np.float32)
    xs = [s.ndarray(x0)] + [s.empty(N, vkad.f32) for _ in range(steps)]
    t = s.tape()

    def iteration():
        with t:
            for j in range(steps):
                s.launch(step, xs[j], xs[j + 1])
        t.backward(seed={xs[-1]: 1.0})

    return x0, xs, t, iteration


def test_a_captured_training_iteration_equals_the_direct_one(session):
    """Forward launches on a tape and its backward, captured once; each replay computes the
    gradient the direct iteration computes, bit for bit, and creates no Vulkan object."""
    s = session
    steps = 12
    _, xs, t, iteration = _sin_chain(s, steps)
    iteration()
    direct = t.grad(xs[0]).numpy()
    with s.capture("train") as g:
        iteration()
    assert g.launches == 2 * steps
    t.grad(xs[0]).upload(np.full(N, 7.0, np.float32))  # garbage: the replay must zero it
    created = None
    for i in range(3):
        s.replay(g)
        np.testing.assert_array_equal(t.grad(xs[0]).numpy(), direct)
        if i == 1:
            created = s.stats()["vulkan_objects_created"]
        elif i == 2:
            assert s.stats()["vulkan_objects_created"] == created


def test_a_capture_that_runs_is_the_direct_iteration_and_its_graph_replays_it(session):
    """capture(run=True): the block's launches run as they are captured (no replay after it):
    the gradient it leaves is the direct iteration's, bit for bit, as is every replay's after;
    a run over several pieces runs them all, in order."""
    s = session
    steps = 300  # 600 launches: six pieces (16, 32, 64, 128, 256, the rest)
    _, xs, t, iteration = _sin_chain(s, steps)
    iteration()
    direct = t.grad(xs[0]).numpy()
    last = xs[-1].numpy()
    t.grad(xs[0]).upload(np.full(N, 7.0, np.float32))  # garbage: the run must zero it
    xs[-1].upload(np.zeros(N, np.float32))
    before = s.stats()["launches"]
    with s.capture("train", run=True) as g:
        iteration()
    assert s.stats()["launches"] == before + 2 * steps  # run, not only captured
    np.testing.assert_array_equal(xs[-1].numpy(), last)
    np.testing.assert_array_equal(t.grad(xs[0]).numpy(), direct)
    t.grad(xs[0]).upload(np.full(N, 7.0, np.float32))
    s.replay(g)
    np.testing.assert_array_equal(t.grad(xs[0]).numpy(), direct)
    with pytest.raises(vkad.FailedPreconditionError, match="graph 'open' is being captured"):
        with s.capture("open", run=True):
            xs[0].numpy()  # readbacks are refused as in any capture


def test_a_background_rework_gives_the_direct_gradient_before_and_after_its_install(session):
    """capture(background=True): end_capture returns before the rework; replays before its
    install (launches as captured) and after (fused: fewer launches) both compute the direct
    iteration's gradient, and an update made before the install carries over."""
    s = session
    k = s.compile(AXPY)
    x0, xs, t, train = _sin_chain(s, 12)
    y = s.zeros(N, vkad.f32)

    def iteration():
        train()
        s.fill(y, 1.0)
        s.launch(k, 2.0, xs[0], y)

    iteration()
    direct = t.grad(xs[0]).numpy()
    with s.capture("train", background=True) as g:
        iteration()
    n = g.launches
    s.replay(g, updates=[(n - 1, 0, 3.0)])  # the axpy's a: y = 1 + 3 x0
    np.testing.assert_array_equal(t.grad(xs[0]).numpy(), direct)
    np.testing.assert_allclose(y.numpy(), 1 + 3 * x0, rtol=1e-6)
    s.finish_rework(g)
    t.grad(xs[0]).upload(np.full(N, 7.0, np.float32))
    y.upload(np.zeros(N, np.float32))
    before = s.stats()["launches"]
    s.replay(g)
    np.testing.assert_allclose(y.numpy(), 1 + 3 * x0, rtol=1e-6)  # the update was carried
    assert s.stats()["launches"] - before < n
    np.testing.assert_allclose(t.grad(xs[0]).numpy(), direct, rtol=1e-5, atol=1e-7)
    s.finish_rework(g)  # installed already: nothing to do


CELL = """
kernel cell(f: i32, m: ndarray<f32, 3>, v: ndarray<f32, 3>, o: ndarray<f32, 3>) {
  task main parallel %i in [0, shape(m, 1)), %j in [0, shape(m, 2)) {
    %f = arg f : i32
    %a = load m[%f, %i, %j] : f32
    %b = load v[%f, %i, %j] : f32
    %one = const 1.0 : f32
    %d = add %a, %one : f32
    %q = div %b, %d : f32
    store o[%f, %i, %j], %q
  }
}"""


def test_cell_kernels_of_a_loop_at_different_rows_run_fused(session):
    """An N-d cell kernel launched once per row of a time axis (DiffTaichi's grid_op): the
    launches share arrays only at different rows, so the graph merges them (8 to a launch)
    and computes what launching them one by one does. The box is 18 x 16 cells: more than a
    resident loop takes (256), which would run the whole loop as one launch instead."""
    s = session
    k = s.compile(CELL)
    steps, rows, cols = 40, 18, 16
    rng = np.random.RandomState(3)
    m = s.ndarray(rng.uniform(0, 2, (steps, rows, cols)).astype(np.float32))
    v = s.ndarray(rng.uniform(-1, 1, (steps, rows, cols)).astype(np.float32))
    direct, o = s.zeros((steps, rows, cols), vkad.f32), s.zeros((steps, rows, cols), vkad.f32)
    for f in range(steps):
        s.launch(k, f, m, v, direct)
    with s.capture("cells") as g:
        for f in range(steps):
            s.launch(k, f, m, v, o)
    n0 = s.stats()["launches"]
    s.replay(g)
    launched = s.stats()["launches"] - n0
    np.testing.assert_array_equal(o.numpy(), direct.numpy())
    assert launched == 5, launched  # 40 launches, 8 to a launch


CTRL = """
kernel ctrl(t: f32, w: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad, a: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(w, 0)) {
    %1 = arg t : f32
    %2 = load w[%0] : f32
    %3 = load b[%0] : f32
    %4 = mul %2, %1 : f32
    %5 = add %4, %3 : f32
    %6 = sin %5 : f32
    store a[%0], %6
  }
}"""
DRIVE = """
kernel drive(a: ndarray<f32, 1> grad, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = shape a 0 : i32
    %2 = mod %0, %1 : i32
    %3 = load a[%2] : f32
    %4 = load x[%0] : f32
    %5 = sin %4 : f32
    %6 = add %5, %3 : f32
    store y[%0], %6
  }
}"""


def test_a_parameters_gradient_added_by_every_step_is_batched_after_the_steps(session):
    """A controller with its own parameters, launched every step beside the state's step (a
    smaller range: they never fuse together): on a device with hardware float atomics, the
    gradients of the parameters (arrays the controller only reads) are added atomically, so the controller adjoints commute, wait for
    none of each other and run together after the steps' adjoints -- fewer launches than one
    per step -- and the replay's gradients are the direct iteration's."""
    s = session
    if not s.capabilities["atomic_float32_add"]:
        pytest.skip("the device has no hardware f32 atomic add: the gradients keep their order")
    ctrl, drive = s.differentiate(CTRL), s.differentiate(DRIVE)
    steps, m = 16, 4
    w = s.ndarray(np.linspace(0.5, 1.5, m).astype(np.float32))
    b = s.ndarray(np.linspace(-0.2, 0.2, m).astype(np.float32))
    acts = [s.empty(m, vkad.f32) for _ in range(steps)]
    xs = [s.ndarray(np.linspace(-1.0, 1.0, N).astype(np.float32))]
    xs += [s.empty(N, vkad.f32) for _ in range(steps)]
    t = s.tape()

    def iteration():
        with t:
            for j in range(steps):
                s.launch(ctrl, 0.1 * (j + 1), w, b, acts[j])
                s.launch(drive, acts[j], xs[j], xs[j + 1])
        t.backward(seed={xs[-1]: 1.0})

    iteration()
    direct = [t.grad(p).numpy() for p in (w, b)]
    with s.capture("params") as g:
        iteration()
    n0 = s.stats()["launches"]
    s.replay(g)
    launched = s.stats()["launches"] - n0
    for p, want in zip((w, b), direct):
        np.testing.assert_allclose(t.grad(p).numpy(), want, rtol=1e-5, atol=1e-6)
    # The forward: the controllers together, then the steps; the backward: the steps' adjoints,
    # then the controllers' adjoints together (a step loop of launches each after its own
    # controller adjoint was 2 per step).
    assert launched < steps, launched


def test_captures_that_run_after_a_replayed_and_released_graph_start_from_several_threads():
    """capture(run=True) / replay / release in a loop: a released graph's bundles wait for the
    replay's list, which the next capture that runs submits first (47-49 of 50 captures failed
    with kInternal 'side bundles still in flight after a wait', each failure making the next
    fail). Nothing waits between a release and the next capture (a read there would submit the
    open list and hide the fault): each round writes its own array, and every capture's run and
    every replay adds x into one more, all read after the loop. Four threads, a session each
    (a capture is its session's: one at a time), at once."""
    import threading
    failures = []
    rounds = 12

    def worker(seed):
        s = vkad.Session()
        try:
            k = s.compile(AXPY)
            xh = XS * (seed + 1)
            x = s.ndarray(xh)
            ys = [s.empty(N, vkad.f32) for _ in range(rounds)]
            runs = s.zeros(N, vkad.f32)  # += x at each capture's run and each replay
            for i in range(rounds):
                with s.capture("run", run=True) as g:
                    s.fill(ys[i], 1.0)
                    for a in (2.0, 3.0, 4.0):
                        s.launch(k, a, x, ys[i])
                    s.launch(k, 1.0, x, runs)
                s.replay(g)
                g.release()  # and straight into the next round's capture
            for i, y in enumerate(ys):  # the first wait
                if not np.array_equal(y.numpy(), 1 + 9 * xh):
                    failures.append(f"thread {seed}, round {i}: wrong result")
            if not np.array_equal(runs.numpy(), 2 * rounds * xh):
                failures.append(f"thread {seed}: captures and replays ran "
                                f"{runs.numpy()[1] / xh[1]} times, not {2 * rounds}")
            if s.validation_messages():
                failures.append(f"thread {seed}: {s.validation_messages()}")
        except vkad.Error as e:
            failures.append(f"thread {seed}: {e}")
        finally:
            s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_graph_dump_writes_the_plan_and_the_barriers_as_recorded(session, monkeypatch, tmp_path):
    """VKAD_GRAPH_DUMP=<file> (docs/graphs.md, "Diagnostics"): at end_capture the reworked plan
    and the graph as recorded are appended to the file: the fill, then the chain x -> y -> z ->
    w fused into one dispatch (its kernel named by id in the plan: the session keeps no IR of
    fused kernels; by its members in the recording), after a barrier."""
    path = tmp_path / "plan.txt"
    monkeypatch.setenv("VKAD_GRAPH_DUMP", str(path))
    s = session
    step, axpy = s.compile(STEP), s.compile(AXPY)
    x, y, z, w = s.ndarray(XS), s.zeros(N, vkad.f32), s.zeros(N, vkad.f32), s.zeros(N, vkad.f32)
    with s.capture("dumped") as g:
        s.fill(w, 1.0)
        s.launch(step, x, y)
        s.launch(step, y, z)
        s.launch(axpy, 2.0, z, w)
    s.finish_rework(g)
    s.replay(g)
    z1 = np.sin(XS) * 0.9 + 0.1
    z2 = np.sin(z1.astype(np.float32)) * 0.9 + 0.1
    np.testing.assert_allclose(w.numpy(), 1 + 2 * z2, rtol=1e-5)
    text = path.read_text()
    plan, recorded = text.split("=== dumped as recorded ('|': after a barrier)\n")
    assert plan.startswith("=== dumped\n"), text
    w_id = plan.splitlines()[1].split()[1]
    assert plan.splitlines()[1] == f"fill {w_id} 1", text
    assert plan.splitlines()[2].startswith("launch k") and plan.splitlines()[2].endswith(
        f", 2, {w_id})"), text
    assert recorded.splitlines()[:2] == [f"| fill {w_id}", "| step+step+axpy"], text


SCATTER = """
kernel scatter(f: i32, x: ndarray<f32, 2>, g: ndarray<f32, 1>) {
  task particles parallel %p in [0, shape(x, 1)) {
    %r = arg f : i32
    %v = load x[%r, %p] : f32
    %c = const 8 : i32
    %i = mod %p, %c : i32
    atomic_add g[%i], %v
  }
}"""
GATHER = """
kernel gather(f: i32, x: ndarray<f32, 2>, g: ndarray<f32, 1>) {
  task particles parallel %p in [0, shape(x, 1)) {
    %r = arg f : i32
    %one = const 1 : i32
    %w = add %r, %one : i32
    %c = const 8 : i32
    %i = mod %p, %c : i32
    %v = load x[%r, %p] : f32
    %h = load g[%i] : f32
    %s = add %v, %h : f32
    store x[%w, %p], %s
  }
}"""


def test_fills_hoisted_to_the_fills_before_them_keep_the_results(session, monkeypatch, tmp_path):
    """The hoist graph pass (docs/graphs.md, "Graph passes"): each step fills its own grid (1-d:
    rename gives it no ring) before scattering into it; the later steps' fills move up to the
    first, nothing between touching their grids, and run as one group. The replay computes what
    the launches compute (exact: small integers), the recording shows the fills together."""
    path = tmp_path / "plan.txt"
    monkeypatch.setenv("VKAD_GRAPH_DUMP", str(path))
    s = session
    scatter, gather = s.compile(SCATTER), s.compile(GATHER)
    steps = 4
    x0 = np.zeros((steps + 1, 64), np.float32)
    x0[0] = np.arange(64) % 5
    grids = [s.zeros(8, vkad.f32) for _ in range(steps)]

    def run():
        for f in range(steps):
            s.fill(grids[f], 0.0)
            s.launch(scatter, f, x, grids[f])
            s.launch(gather, f, x, grids[f])

    x = s.ndarray(x0)
    run()
    direct = x.numpy()
    x = s.ndarray(x0)
    with s.capture("hoisted") as g:
        run()
    s.finish_rework(g)
    s.replay(g)
    np.testing.assert_array_equal(x.numpy(), direct)
    assert direct[steps].max() > x0[0].max()  # the steps did something
    recorded = path.read_text().split("as recorded ('|': after a barrier)\n")[1].splitlines()
    assert [l.startswith("| fill ") for l in recorded[:steps + 1]] == [True] * steps + [False]
