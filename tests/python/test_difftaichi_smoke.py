"""examples/difftaichi/smoke.py (DiffTaichi's smoke_taichi.py on vkad) at a small size: the forward
against a float64 numpy transcription of DiffTaichi's equations, the gradient of the loss w.r.t.
entries of the initial velocity against central differences of that transcription, a replayed
(graph) iteration against a launched one, and training lowering the loss."""

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_graph_and_step_loop_in_the_first, assert_plots, dtypes,
                               load_example, loss_line, run_main)

smoke = load_example("smoke")

# A 32^2 grid (DiffTaichi's: 128^2) and 12 steps (DiffTaichi's: 100), with DiffTaichi's 10
# Jacobi iterations per step and its 16-cell checkerboard (here 2 x 2 squares). The test's
# initial velocity is random, up to 1.5 cells per step in each direction, so that the fetches
# wrap around every edge (negative and past-the-end source cells) and land at fractional
# positions; v[0] = 0 (DiffTaichi's start) samples exactly at the cells, where the bilinear
# fetch has a kink and central differences would straddle it.
GRID = 32
STEPS = 12
# DiffTaichi's learning rate, 400, is for its 128^2 grid: the loss is a mean over the cells, so
# one cell's gradient is ~(128 / n)^2 larger on an n^2 grid, and 400 there takes 16x DiffTaichi's
# steps on this one -- steps so large that the optimisation amplifies a rounding difference
# (another order of an atomic sum) ~10-40x per iteration: after 3 iterations a replayed graph
# and the launches one by one differed by 5e-4 in v[0] and 1% in the loss. The tests train with
# 400 (n / 128)^2, DiffTaichi's steps, where the two stay within 3e-7 after 5 iterations.
LR = smoke.LEARNING_RATE * (GRID / smoke.N_GRID) ** 2  # 25
FIELDS = ("v", "v_updated", "div", "p", "smoke")


def _advect(field, vel, n):
    """DiffTaichi's advect for one step: field (n, n) or (n, n, 2) fetched bilinearly at
    (y - vel[..., 0], x - vel[..., 1]), indices wrapped."""
    yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    cx, cy = yy - vel[..., 0], xx - vel[..., 1]
    left, top = np.floor(cx), np.floor(cy)
    rw, bw = cx - left, cy - top
    li = left.astype(np.int64) % n
    ri = (li + 1) % n
    ti = top.astype(np.int64) % n
    bi = (ti + 1) % n
    if field.ndim == 3:
        rw, bw = rw[..., None], bw[..., None]
    return ((1 - rw) * ((1 - bw) * field[li, ti] + bw * field[li, bi])
            + rw * ((1 - bw) * field[ri, ti] + bw * field[ri, bi]))


def reference(v0, smoke0, target, n=GRID, steps=STEPS):
    """DiffTaichi's forward() and compute_loss in float64 numpy: (fields, loss). np.roll(a, -1)
    is a[inc_index(.)], np.roll(a, 1) a[dec_index(.)]."""
    nj = smoke.NUM_JACOBI
    dx = 1.0 / n

    def inc(a, axis):
        return np.roll(a, -1, axis)

    def dec(a, axis):
        return np.roll(a, 1, axis)

    v = np.zeros((steps, n, n, 2))
    vu = np.zeros_like(v)
    div = np.zeros((steps, n, n))
    sm = np.zeros((steps, n, n))
    p = np.zeros((nj * steps + 1, n, n))
    v[0], sm[0] = v0, smoke0
    for t in range(1, steps):
        vu[t] = _advect(v[t - 1], v[t - 1], n)
        div[t] = -0.5 * dx * (inc(vu[t, ..., 0], 0) - dec(vu[t, ..., 0], 0)
                              + inc(vu[t, ..., 1], 1) - dec(vu[t, ..., 1], 1))
        for k in range(nj):
            a = k + t * nj
            p[a + 1] = (div[t] + dec(p[a], 0) + inc(p[a], 0) + dec(p[a], 1) + inc(p[a], 1)) / 4.0
        a = nj * t - 1  # DiffTaichi's row: step t - 1's second-to-last iterate (0 at t = 1)
        v[t, ..., 0] = vu[t, ..., 0] - 0.5 * (inc(p[a], 0) - dec(p[a], 0)) / dx
        v[t, ..., 1] = vu[t, ..., 1] - 0.5 * (inc(p[a], 1) - dec(p[a], 1)) / dx
        sm[t] = _advect(sm[t - 1], v[t], n)
    loss = np.sum((target - sm[steps - 1]) ** 2) * (1 / n ** 2)
    return dict(v=v, v_updated=vu, div=div, p=p, smoke=sm), loss


def _initial(seed=1):
    return np.random.RandomState(seed).uniform(-1.5, 1.5, (GRID, GRID, 2))


def test_target_and_initial_smoke():
    img = smoke.taichi_image(64)
    assert img.shape == (64, 64) and img.min() == 0.0 and img.max() == 1.0
    assert img[0, 0] == 1.0  # the corners: white outside the ring
    assert img[32, 1] == 0.0  # the ring
    assert img[32, 16] == 1.0 and img[32, 48] == 0.0  # the yin and yang halves
    assert img[17, 32] == 0.0 and img[47, 32] == 1.0  # the dots
    s0 = smoke.initial_smoke(48)
    assert s0[0, 0] == 0 and s0[15, 15] == 0 and s0[16, 0] == 1 and s0[0, 16] == 1
    assert s0[16, 16] == 0 and s0[47, 16] == 1 and s0[47, 47] == 0
    assert s0.sum() == 4 * 16 * 16  # 3 x 3 squares, 4 of them white


def test_forward_matches_a_float64_transcription(session):
    # Every step is a convex combination (the bilinear fetch; the Jacobi average, plus div) or a
    # difference of neighbours, so a rounding error is carried, not amplified: f32's relative
    # rounding of the cell coordinates (up to 32 - 1 + 1.5: ~2e-6 absolute) and ~10 operations a
    # step over 11 steps put the velocities and smoke (scale 1.5 and 1) off by ~1e-5 at most;
    # measured 6.4e-6 (v_updated), 4.1e-6 (smoke), 1.1e-7 (div, scale 0.05), 4.3e-8 (p, scale
    # 0.03); f64: equal to the last bit (0.0 measured: the same operations in the same order).
    # Tolerances: 3e-5 of each field's scale in f32, 1e-12 in f64. The loss (0.39, a sum of
    # 1024 squares) to rel 1e-5 (f32, measured 3e-7) and 1e-12 (f64).
    init = _initial()
    for dtype in dtypes(session):
        sim = smoke.Smoke(session, steps=STEPS, n_grid=GRID, dtype=dtype, graph=False)
        sim.set_weights({"v": init})
        want, want_loss = reference(sim.weights()["v"], sim.smoke0, sim.target)
        loss = sim.loss()
        got = sim.fields()
        f32 = dtype == vkad.f32
        for name in FIELDS:
            scale = np.abs(want[name]).max()
            np.testing.assert_allclose(got[name], want[name], rtol=0,
                                       atol=(3e-5 if f32 else 1e-12) * scale,
                                       err_msg=f"{name} {dtype}")
        assert loss == pytest.approx(want_loss, rel=1e-5 if f32 else 1e-12), dtype
        # a flow that moved the smoke and a pressure that is there
        assert np.abs(want["smoke"][STEPS - 1] - want["smoke"][0]).max() > 0.5
        assert np.abs(want["p"][STEPS * smoke.NUM_JACOBI]).max() > 1e-3


def test_loss_gradient_matches_central_differences(session):
    # The loss is piecewise polynomial in v[0] (kinks only where a fetch position crosses a
    # cell: the test's velocities keep every position fractional, and a step of h = 1e-5 moves
    # them by less, so no kink falls inside a difference -- the differences at h = 1e-4, 1e-5
    # and 1e-6 agree to 7 digits), so central differences of the f64 transcription err by their
    # rounding, ~eps |L| / h = 2e-16 x 0.39 / 1e-5 ~ 1e-11, i.e. ~1e-9 of the largest gradient
    # (0.0077): measured <= 9e-10 against vkad's f64 gradient. vkad's f32 gradient runs the 11
    # steps' adjoints, erring like the forward: measured <= 6e-7 of the largest gradient at the
    # picks, and 5.9e-6 at worst over the whole grid against vkad's f64 gradient. Tolerances:
    # 2e-5 (f32) / 1e-8 (f64) of the largest gradient, 3-10x the measured error, while a wrong
    # adjoint (a wrapped neighbour missed, a bilinear weight's derivative dropped) is off by
    # O(1) of the gradient.
    init = _initial()
    target = smoke.taichi_image(GRID)
    smoke0 = smoke.initial_smoke(GRID)
    # corners and edges (the wraps), the middle, and some at random; both components
    picks = [(0, 0, 0), (0, 0, 1), (31, 31, 1), (0, 17, 0), (15, 31, 1), (16, 16, 0),
             (16, 15, 1), (9, 22, 0), (22, 9, 1)]
    h = 1e-5
    grads = {}
    for dtype in dtypes(session):
        sim = smoke.Smoke(session, steps=STEPS, n_grid=GRID, dtype=dtype, graph=False)
        sim.set_weights({"v": init})
        x0 = sim.weights()["v"]  # the f32 run starts from init rounded to f32: use that
        sim.forward_backward()
        g = sim.gradients()["v"].astype(np.float64)
        grads[dtype] = g
        scale = np.abs(g).max()
        atol = (2e-5 if dtype == vkad.f32 else 1e-8) * scale
        for idx in picks:
            d = 0.0
            for sign in (1, -1):
                x = x0.copy()
                x[idx] += sign * h
                d += sign * reference(x, smoke0, target)[1]
            want = d / (2 * h)
            assert abs(want) > 1e-2 * scale, idx  # a gradient that is there
            assert abs(g[idx] - want) <= atol, (dtype, idx, g[idx], want)
    if vkad.f64 in grads:  # the whole grid, f32 against f64 (init's f32 rounding: negligible)
        scale = np.abs(grads[vkad.f64]).max()
        np.testing.assert_allclose(grads[vkad.f32], grads[vkad.f64], rtol=0, atol=2e-5 * scale)


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop, the update on the
    # device) against every launch made from Python.
    sims = [smoke.Smoke(session, steps=STEPS, n_grid=GRID, graph=g, loop=g, learning_rate=LR)
            for g in (True, False)]
    losses = [[sim.iteration()] for sim in sims]
    # The first iteration: the same to rounding (the loss's atomic sum and the adjoints'
    # scatters may add in another order; measured: gradients to 2e-7 of the largest).
    np.testing.assert_allclose(losses[0][0], losses[1][0], rtol=1e-5)
    g = [sim.gradients()["v"] for sim in sims]
    np.testing.assert_allclose(g[0], g[1], rtol=0, atol=2e-5 * np.abs(g[1]).max())
    w = [sim.weights()["v"] for sim in sims]
    np.testing.assert_allclose(w[0], w[1], rtol=0, atol=1e-5 * np.abs(w[1]).max())
    session.finish_rework(sims[0]._graph)
    for sim, ls in zip(sims, losses):
        ls += [sim.iteration() for _ in range(2)]
    # Later iterations, the loss only: bilinear fetches floor their positions, so the gradient
    # jumps where a position crosses a cell, and a rounding difference (a pipeline specialized to
    # the shapes or not yet, an atomic order) moves a few cells' gradients by percents (measured
    # once in ~15 runs at the third iteration: 3% of the largest) while the loss, continuous,
    # stays within 1e-4. A launch missing from either path moves it by far more than 1e-3.
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-3)
    assert_graph_and_step_loop_in_the_first(sims)
    # the step's 14 launches x 11 steps, and compute_loss
    assert len(sims[1].tape.launches) == 14 * (STEPS - 1) + 1


def test_training_lowers_the_loss(session):
    # DiffTaichi's update (at its step size, LR) from v[0] = 0: here each of five iterations
    # lowers the loss (0.468 -> 0.339 measured), and the first update is v[0] = -LR dL/dv[0]
    # exactly. (From v[0] = 0 every fetch lands on a cell, where the bilinear fetch has a kink:
    # the gradient there is the one-sided one of floor's side, as in Taichi.)
    sim = smoke.Smoke(session, steps=STEPS, n_grid=GRID, learning_rate=LR)
    first = sim.loss()
    losses = [sim.iteration()]
    g = sim.gradients()["v"].astype(np.float64)
    assert np.abs(g).max() > 0
    np.testing.assert_allclose(sim.weights()["v"], -LR * g, rtol=1e-6, atol=0)
    losses += [sim.iteration() for _ in range(4)]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < 0.8 * first, (first, losses)


def test_main_runs_and_writes_plots(tmp_path, capsys):
    out = run_main(smoke.main, ["--iters", "2", "--steps", "6", "--grid", "16", "--lr", "6.25",
                                "--out", str(tmp_path)], capsys)
    assert "16^2 grid, 6 steps, 2 iterations" in out
    assert "loss " in out
    assert_plots(tmp_path, "smoke")


def _losses(out):
    """(first, last) from the example's 'loss A -> B' line."""
    first, last = loss_line(out)[len("loss "):].split(" -> ")
    return float(first), float(last)


@pytest.mark.parametrize("f64", [False, True], ids=["f32", "f64"])
def test_main_with_its_graph_and_loop_equals_launches(session, f64, tmp_path, capsys):
    # The default (the iteration captured and replayed, the step loop through Session.loop)
    # against --no-graph --no-loop (every launch from Python): the same losses to the digits
    # printed; in f64 the captured backward seeds the f64 loss gradient with 1.0 (a fill whose
    # 8-byte halves differ).
    if f64 and not f64_ok(session):
        pytest.skip("the device has no f64")
    args = ["--iters", "3", "--steps", "8", "--grid", "24", "--lr", "14.0625",  # 400 (24/128)^2
            "--out", str(tmp_path)]
    args += ["--f64"] if f64 else []
    graphed = _losses(run_main(smoke.main, args, capsys))
    launched = _losses(run_main(smoke.main, args + ["--no-graph", "--no-loop"], capsys))
    # The loss is an atomic sum over the 24^2 cells, whose order a GPU does not fix: two orders
    # of n positive terms differ by at most (n - 1) u times the sum (u the unit roundoff), plus
    # the 5e-7 the six printed digits round. The last loss also follows two updates, each
    # through gradients summed atomically the same way (lr 14 scales their rounding): it gets
    # ten times the first's bound.
    u = 2.0 ** -53 if f64 else 2.0 ** -24
    first_bound = (24 * 24 - 1) * u * graphed[0] + 5e-7
    assert abs(launched[0] - graphed[0]) <= first_bound, (graphed, launched)
    assert abs(launched[1] - graphed[1]) <= 10 * first_bound, (graphed, launched)
