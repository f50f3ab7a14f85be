"""examples/difftaichi/wave.py (DiffTaichi's wave on vkad) at a small size: the forward against a
float64 numpy transcription of DiffTaichi's equations, the gradient of the loss w.r.t. entries of
the initial height against central differences of that transcription, a replayed (graph)
iteration against a launched one, and training lowering the loss."""

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               assert_main_graph_equals_launches, assert_plots, dtypes,
                               load_example, replayed_and_launched, run_main)

wave = load_example("wave")

# A 32^2 grid (DiffTaichi's: 256^2) and 40 steps: at c dt / dx = 1 / sqrt(3) cells per step the
# wave crosses 23 cells, so every cell's height reaches the edges (get_p's zeros) and back.
GRID = 32
STEPS = 40


def reference(initial, target, n_grid=GRID, steps=STEPS):
    """DiffTaichi's initialize, fdtd and compute_loss in float64 numpy: (p, loss)."""
    k = wave.constants(n_grid)

    def laplacian(q):
        z = np.pad(q, 1)  # get_p: 0 outside the grid
        return k["inv_dx2"] * (-4 * q + z[1:-1, :-2] + z[1:-1, 2:] + z[2:, 1:-1] + z[:-2, 1:-1])

    p = np.zeros((steps, n_grid, n_grid))
    p[0] = initial  # p[1] is never written: 0
    for t in range(2, steps):
        p[t] = (2 * p[t - 1] + k["k_q"] * laplacian(p[t - 1]) - p[t - 2]
                - k["k_p"] * laplacian(p[t - 2]))
    loss = k["dx"] ** 2 * np.sum((target - p[steps - 1]) ** 2)
    return p, loss


def _initial(seed=1):
    return np.random.RandomState(seed).uniform(-0.5, 0.5, (GRID, GRID))


def test_forward_matches_a_float64_transcription(session):
    # The scheme is stable (c^2 dt^2 / dx^2 = 1/3 <= 1/2), so a rounding error is carried, not
    # amplified: after 38 steps of ~10 f32 operations each the heights err by ~steps x 10 x
    # 6e-8 x |p| ~ 2e-5 of their scale (1, the initial height's) at most; measured 1.0e-6 (f32;
    # f64: equal to the last bit). The loss (a sum of 1024 squares, 0.244) to the f32 rounding of
    # the sum: rel 1e-5 (measured 1e-7).
    init = _initial()
    for dtype in dtypes(session):
        sim = wave.Wave(session, steps=STEPS, n_grid=GRID, dtype=dtype, graph=False)
        sim.set_weights({"initial": init})
        want_p, want_loss = reference(sim.weights()["initial"], sim.target)
        loss = sim.loss()
        f32 = dtype == vkad.f32
        np.testing.assert_allclose(sim.heights(), want_p, rtol=0, atol=2e-5 if f32 else 1e-12,
                                   err_msg=str(dtype))
        assert loss == pytest.approx(want_loss, rel=1e-5 if f32 else 1e-12), dtype
        assert np.abs(want_p[STEPS - 1]).max() > 0.05  # a wave that is there at the end


def test_target_is_taichis_logo():
    img = wave.taichi_logo(64)
    assert img.shape == (64, 64) and abs(img.mean()) < 1e-12
    white, black = img.max(), img.min()
    assert white - black == pytest.approx(1.0)
    assert img[0, 0] == white  # the corners: white outside the ring
    assert img[32, 1] == black  # the ring
    assert img[32, 16] == white and img[32, 48] == black  # the yin and yang halves
    assert img[17, 32] == black and img[47, 32] == white  # the dots
    assert img[17, 44] == white and img[47, 20] == black  # the bulges


def test_loss_gradient_matches_central_differences(session):
    # The loss is quadratic in the initial height (the scheme is linear), so central differences
    # of the f64 transcription have no truncation error; their rounding is ~eps |L| / h = 2e-16 x
    # 0.24 / 1e-3 ~ 5e-14, i.e. ~5e-12 of the largest gradient (0.011; measured 2e-12 against
    # vkad's f64 gradient). The gradients picked are 3e-4 .. 5e-3 (3-42% of the largest). vkad's
    # gradient runs the 38 steps' adjoints, erring like the forward: measured <= 5.6e-7 of the
    # largest gradient in f32. Tolerances: atol 1e-5 (f32) / 1e-10 (f64) of the largest gradient,
    # ~20x the measured error each, while a wrong adjoint (a neighbour missed at an edge, a
    # dropped term) is off by O(1) of the gradient.
    init = _initial()
    target = wave.taichi_logo(GRID)
    # the corner and edges (get_p's zeros), next to an edge, the middle, and one at random
    picks = [(0, 0), (0, 17), (31, 5), (1, 30), (16, 16), (9, 22)]
    h = 1e-3
    fd = []
    for idx in picks:
        d = 0.0
        for sign in (1, -1):
            x = init.copy()
            x[idx] += sign * h
            d += sign * reference(x, target)[1]
        fd.append(d / (2 * h))
    for dtype in dtypes(session):
        sim = wave.Wave(session, steps=STEPS, n_grid=GRID, dtype=dtype, graph=False)
        sim.set_weights({"initial": init})
        sim.forward_backward()
        g = sim.gradients()["initial"].astype(np.float64)
        # the f32 run starts from init rounded to f32: differences of ~|g| x 3e-8, negligible
        scale = np.abs(g).max()
        atol = (1e-5 if dtype == vkad.f32 else 1e-10) * scale
        for idx, want in zip(picks, fd):
            assert abs(want) > 1e-2 * scale, idx  # a gradient that is there
            assert abs(g[idx] - want) <= atol, (dtype, idx, g[idx], want)


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop, the update on the
    # device) against every launch made from Python; the losses and the updated heights agree
    # to float rounding (the loss's atomic sum may add in another order). The 32^2 grid is 4
    # tiles: blocked (a session has no floor on a box's tiles).
    sims = [wave.Wave(session, steps=STEPS, n_grid=GRID, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol_of_max=1e-6)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol_of_max=1e-5)
    assert_graph_and_step_loop_in_the_first(sims)
    # The replayed graph runs the step loop's stencil launches several per dispatch (blocked
    # stencils, docs/graphs.md): what the agreement above checks.
    assert session.stats()["blocked_launches"] > 0


def test_first_iteration_runs_both_step_loops_as_their_plans(session):
    # The step loop and its adjoint are reworked at construction (Session.loop prepared): the
    # adjoint's plan blocks the gathered stencil adjoint, which adds into rows of the height's
    # gradient that the loss's adjoint seeded before the loop. The plan relies on no zero (a
    # blocked run's rows that hold sums get a stash), so the first, captured iteration and
    # every launched one run both plans -- and equal the Python loop of launches (gradients to
    # the blocked adjoint's order of sums: rounding).
    for graph in (True, False):
        sims = [wave.Wave(session, steps=STEPS, n_grid=GRID, graph=graph, loop=lp)
                for lp in (True, False)]
        before = session.stats()
        losses = [sims[0].iteration()]
        after = session.stats()
        assert after["reworked_loops"] - before["reworked_loops"] == 2, graph
        assert after["blocked_launches"] > before["blocked_launches"], graph
        losses.append(sims[1].iteration())
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
        g = [sim.gradients()["initial"] for sim in sims]
        np.testing.assert_allclose(g[0], g[1], rtol=0, atol=1e-5 * np.abs(g[1]).max())


def test_training_lowers_the_loss(session):
    # DiffTaichi's update (rate 1) from initial = 0: here each of five iterations lowers the
    # loss (0.217 -> 0.152 measured), and the update is initial -= dL/dinitial exactly.
    sim = wave.Wave(session, steps=STEPS, n_grid=GRID)
    first = sim.loss()
    losses = [sim.iteration()]
    g = sim.gradients()["initial"].astype(np.float64)
    np.testing.assert_allclose(sim.weights()["initial"], -g, rtol=1e-6, atol=0)
    losses += [sim.iteration() for _ in range(4)]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < 0.8 * first, (first, losses)


def test_main_runs_and_writes_plots(tmp_path, capsys):
    out = run_main(wave.main, ["--iters", "2", "--steps", "12", "--grid", "16", "--out",
                               str(tmp_path)], capsys)
    assert "16^2 grid, 12 steps, 2 iterations" in out
    assert "loss " in out
    assert_plots(tmp_path, "wave")


@pytest.mark.parametrize("f64", [False, True], ids=["f32", "f64"])
def test_main_with_its_graph_and_loop_equals_launches(session, f64, tmp_path, capsys):
    # in f64 the captured backward seeds the f64 loss gradient with 1.0 (a fill whose 8-byte
    # halves differ)
    if f64 and not f64_ok(session):
        pytest.skip("the device has no f64")
    args = ["--iters", "3", "--steps", "16", "--grid", "24", "--out", str(tmp_path)]
    assert_main_graph_equals_launches(wave.main, args + (["--f64"] if f64 else []), capsys)
