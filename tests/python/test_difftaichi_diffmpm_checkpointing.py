"""examples/difftaichi/diffmpm_checkpointing.py (DiffTaichi's diffmpm_simple block of 80^2
particles at spacing 0.5, one grid cleared every step, particle rings, a tape with a memory budget)
at a reduced size -- a 16^2 block on a 64^2 grid, 100 steps, in DiffTaichi's cells (10 .. 17.5 x
25 .. 32.5): the forward against test_difftaichi_diffmpm_simple.py's float64 numpy transcription
(spacing 0.5), the gradient against the time-axis program's (DiffMPMSimple at the same block, on
a plain tape) and against central differences of the transcription (f32 and f64), the tape's
reported peak bytes within its budget, a replayed (graph) iteration against a launched one, and
training lowering the loss."""
import numpy as np
import pytest

import vkad
from difftaichi_checks import assert_plots, dtypes, load_example, loss_line, run_main
from test_difftaichi_diffmpm_simple import assert_trains_init_v, reference

ck = load_example("diffmpm_checkpointing")
simple = ck.simple
N, GRID, STEPS = 16, 64, 100
STATE = ("x", "v", "C", "F")
# 100 steps of 256 particles on 64^2: the tape needs ~2 MiB (the grid, 80 KiB, outweighs the
# rings, 24 KiB); DiffTaichi's checkpoints would be 1.2 MiB, the default's floor 16 MiB
BUDGET = 4 << 20
# the block at rest (DiffTaichi's start) and thrown up and right (training's direction)
STARTS = ((0.0, 0.0), (0.5, 1.5))


class TimeAxis(simple.DiffMPMSimple):
    """The same program with every step's particles and grid kept, on a plain tape."""
    SPACING = ck.SPACING


def _sim(session, dtype=vkad.f32, budget=BUDGET, **kw):
    return ck.DiffMPMCheckpointing(session, steps=STEPS, n_grid=GRID, n=N, dtype=dtype,
                                   memory_budget=budget, **kw)


def test_the_block_and_budget_are_difftaichis():
    # DiffTaichi: x[0, i * N + j] = [dx * (i * 0.5 + 10), dx * (j * 0.5 + 25)], N = 80; its
    # checkpoints x, v, C, F: max_steps x n_particles x (2 + 2 + 4 + 4) f32
    x = simple.block(ck.N, ck.N_GRID, ck.SPACING)
    assert x.shape == (6400, 2)
    assert x[81] == pytest.approx([(0.5 + 10) / 120, (0.5 + 25) / 120], abs=1e-15)
    assert x[-1] == pytest.approx([(79 * 0.5 + 10) / 120, (79 * 0.5 + 25) / 120], abs=1e-15)
    assert ck.default_budget(1024, 6400, vkad.f32) == 1024 * 6400 * 12 * 4
    assert ck.default_budget(STEPS, N * N, vkad.f32) == ck.MIN_BUDGET


def test_forward_matches_a_float64_transcription(session):
    # The rings hold the last two steps. diffmpm_simple's tolerances (the same kernels, scene
    # sizes and step count, test_difftaichi_diffmpm_simple.py derives them): f64 1e-12 on x and
    # v, 1e-9 on C and F; f32 x 3e-6, v 2e-5, C 1e-3 (C is 0 but for rounding: the block moves
    # as a whole), F 2e-6; the loss 1e-4 (f32) / 1e-10 (f64) relative. The denser block (4
    # particles a cell, not ~2) sums twice the terms per node: measured f32 x 4.9e-7, v 6.3e-6,
    # C 7.1e-5, F 2.2e-7, loss 1.3e-5; f64 x 2.2e-16, v 4.4e-15, C 3e-13, F 1.7e-15.
    tols = {vkad.f32: {"x": 3e-6, "v": 2e-5, "C": 1e-3, "F": 2e-6, "loss": 1e-4},
            vkad.f64: {"x": 1e-12, "v": 1e-12, "C": 1e-9, "F": 1e-9, "loss": 1e-10}}
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        for start in STARTS:
            sim.set_weights({"init_v": start})
            loss = sim.loss()
            want, want_loss = reference(np.array(start), N, GRID, STEPS, ck.SPACING)
            assert np.abs(want["x"][-1] - want["x"][0]).max() > 1e-3  # it moved
            for name in STATE:
                got = sim.arrays[name].numpy()
                for f in (STEPS - 2, STEPS - 1):
                    np.testing.assert_allclose(got[f % 2], want[name][f], rtol=0,
                                               atol=tols[dtype][name],
                                               err_msg=f"{dtype} {name} step {f}")
            assert loss == pytest.approx(want_loss, rel=tols[dtype]["loss"]), dtype


def test_gradient_equals_the_time_axis_programs(session):
    # The checkpointed tape runs every launch again from its segment's copy, so the adjoints see
    # the forward's values up to the order of p2g's atomic adds, which the rerun may change: f32
    # differences of a few ulps per step through 99 steps, as between two runs of the time-axis
    # program (measured: 0 in f32, 2e-16 of the largest in f64, whose 4 MiB budget takes 4
    # levels); tolerance 1e-5 of the largest (f32) and 1e-12 (f64). A segment put back wrong, a
    # clear not undone in reverse or a missed grid gradient is off by O(1) of it.
    for dtype in dtypes(session):
        tol = 1e-5 if dtype == vkad.f32 else 1e-12
        sims = [_sim(session, dtype, graph=False),
                TimeAxis(session, steps=STEPS, n_grid=GRID, n=N, dtype=dtype, graph=False)]
        for start in STARTS:
            for sim in sims:
                sim.set_weights({"init_v": start})
                sim.forward_backward()
            got, want = (sim.gradients()["init_v"].astype(np.float64) for sim in sims)
            np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max(),
                                       err_msg=f"{dtype} {start}")
            assert sims[0].read_loss() == pytest.approx(sims[1].read_loss(), rel=tol)
            assert sims[0].checkpoint_plan()["recompute"] >= 2  # it did checkpoint


def test_loss_gradient_matches_central_differences(session):
    # d loss / d init_v against central differences of the f64 transcription at h = 1e-5, with
    # test_difftaichi_diffmpm_simple.py's tolerances and reasons: particles on a stencil shift
    # (here 0.5 i + 9.5 an integer: every odd i at the start) make differences err by ~1e-9,
    # 1e-5 of the largest gradient in f64; f32 1e-4 of the largest.
    h = 1e-5
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        for start in STARTS:
            fd = []
            for c in range(2):
                d = np.zeros(2)
                d[c] = h
                fd.append((reference(np.array(start) + d, N, GRID, STEPS, ck.SPACING)[1]
                           - reference(np.array(start) - d, N, GRID, STEPS, ck.SPACING)[1])
                          / (2 * h))
            fd = np.array(fd)
            sim.set_weights({"init_v": start})
            sim.forward_backward()
            got = sim.gradients()["init_v"].astype(np.float64)
            scale = np.abs(fd).max()
            assert np.abs(fd).min() > 0.1 * scale  # both components matter
            tol = (1e-4 if dtype == vkad.f32 else 1e-5) * scale
            np.testing.assert_allclose(got, fd, rtol=0, atol=tol, err_msg=f"{dtype} {start}")


def test_the_checkpoints_stay_within_the_budget(session):
    # The plan's peak and what the copies hold after backward are within the budget, for the
    # test's budget and one near the least the recording needs (more levels or shorter
    # segments); a budget below the least is refused, naming it.
    plans = []
    for budget in (BUDGET, 2 << 20):
        sim = _sim(session, budget=budget, graph=False)
        sim.set_weights({"init_v": STARTS[1]})
        sim.forward_backward()
        plan = sim.checkpoint_plan()
        assert plan["peak_bytes"] <= budget, plan["text"]
        assert 0 < sim.tape.checkpoint_bytes <= budget
        assert plan["min_bytes"] <= plan["peak_bytes"]
        plans.append(plan)
    assert plans[1]["peak_bytes"] < plans[0]["peak_bytes"]
    with pytest.raises(vkad.InvalidArgumentError, match="memory budget"):
        _sim(session, budget=256 << 10, graph=False).forward_backward()


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The first iteration runs as launched (the tape plans its cut), the second is captured,
    # the rest replay it (the checkpoint copies, the reruns, the clears and the update): losses,
    # gradients and init_v equal the launched program's to f32 rounding (1e-5 relative: atomic
    # sums in another order) over four iterations that move init_v.
    sims = [_sim(session, graph=g) for g in (True, False)]
    losses = [[sim.iteration(), sim.iteration()] for sim in sims]
    assert sims[0]._graph is not None and sims[1]._graph is None
    session.finish_rework(sims[0]._graph)
    for sim, ls in zip(sims, losses):
        ls += [sim.iteration() for _ in range(2)]
    assert losses[1][3] < losses[1][0]  # the updates moved init_v
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    w = [sim.weights()["init_v"] for sim in sims]
    np.testing.assert_allclose(w[0], w[1], rtol=1e-5)
    g = [sim.gradients()["init_v"] for sim in sims]
    np.testing.assert_allclose(g[0], g[1], rtol=0, atol=1e-5 * np.abs(g[1]).max())
    assert sims[0].checkpoint_plan()["peak_bytes"] <= BUDGET


def test_training_lowers_the_loss(session):
    assert_trains_init_v(_sim(session))


def test_main_runs_and_writes_plots(tmp_path, capsys):
    args = ["--iters", "3", "--steps", "20", "--grid", str(GRID), "--n", "8", "--out",
            str(tmp_path)]
    out = run_main(ck.main, args, capsys)
    assert "64 particles, 64^2 grid, 20 steps, 3 iterations, memory budget 16.0 MiB" in out
    assert "checkpoints: 2 levels" in out
    assert loss_line(run_main(ck.main, args + ["--no-graph"], capsys)) == loss_line(out)
    with pytest.raises(vkad.InvalidArgumentError, match="memory budget"):
        ck.main(args + ["--memory-budget", "0.01"])
    assert_plots(tmp_path, "diffmpm_checkpointing")
