"""examples/difftaichi/diffmpm_simple.py (DiffTaichi's MLS-MPM block whose initial velocity learns
to reach a point) at a reduced size -- a 16^2 block (256 particles) on a 64^2 grid, 100 steps,
the block in DiffTaichi's cells (10 .. 20.5 x 25 .. 35.5), so its mean starts below and left of
the target as at full size: the forward against a float64 numpy transcription of set_v / p2g /
grid_op / g2p / compute_x_avg / compute_loss, the gradient against central differences of that
transcription (f32 and f64), a replayed (graph) iteration against a launched one, and training
lowering the loss."""

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import assert_plots, load_example, run_main

mpm = load_example("diffmpm_simple")
N, GRID, STEPS = 16, 64, 100
STATE = ("x", "v", "C", "F")


def polar(m):
    """Taichi's closed-form 2x2 polar decomposition, R of M = R S, per particle."""
    a, b = m[:, 0, 0] + m[:, 1, 1], m[:, 1, 0] - m[:, 0, 1]
    scale = 1.0 / np.sqrt(a * a + b * b)
    c, s = a * scale, b * scale
    return np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)


def reference(init_v, n=N, n_grid=GRID, steps=STEPS, spacing=mpm.SPACING):
    """DiffTaichi's set_v, substeps 0 .. steps - 2 and loss in float64 numpy, every particle at
    once: (state dict, loss). `spacing`: the block's (diffmpm_checkpointing's is 0.5)."""
    dx, inv_dx, dt = 1.0 / n_grid, float(n_grid), mpm.DT
    count, eye = n * n, np.eye(2)
    x, v = np.zeros((steps, count, 2)), np.zeros((steps, count, 2))
    C, F = np.zeros((steps, count, 2, 2)), np.zeros((steps, count, 2, 2))
    x[0], F[0], v[0] = mpm.block(n, n_grid, spacing), eye, init_v
    stencil = [np.array(o) for o in np.ndindex(3, 3)]
    node = np.stack(np.meshgrid(np.arange(n_grid), np.arange(n_grid), indexing="ij"), -1)
    for f in range(steps - 1):
        base = np.trunc(x[f] * inv_dx - 0.5).astype(int)
        fx = x[f] * inv_dx - base
        w = np.stack([0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2])
        new_F = (eye + dt * C[f]) @ F[f]
        F[f + 1] = new_F
        J = np.linalg.det(new_F)
        cauchy = 2 * mpm.MU * (new_F - polar(new_F)) @ new_F.transpose(0, 2, 1) \
            + eye * (mpm.LA * (J - 1) * J)[:, None, None]
        affine = -(dt * mpm.P_VOL * 4 * inv_dx * inv_dx) * cauchy + mpm.P_MASS * C[f]
        grid_v, grid_m = np.zeros((n_grid ** 2, 2)), np.zeros(n_grid ** 2)
        for o in stencil:  # p2g's atomic adds, node by node of the 3x3 stencil
            weight = w[o[0], :, 0] * w[o[1], :, 1]
            cell = np.ravel_multi_index((base + o).T, (n_grid,) * 2)
            momentum = weight[:, None] * (mpm.P_MASS * v[f]
                                          + np.einsum("pij,pj->pi", affine, (o - fx) * dx))
            for c in range(2):
                grid_v[:, c] += np.bincount(cell, momentum[:, c], n_grid ** 2)
            grid_m += np.bincount(cell, weight * mpm.P_MASS, n_grid ** 2)
        v_out = (grid_v / (grid_m + 1e-10)[:, None]).reshape(n_grid, n_grid, 2)
        v_out[..., 1] -= dt * mpm.GRAVITY
        for c in range(2):  # the walls, one component at a time as grid_op's ifs
            into = ((node[..., c] < mpm.BOUND) & (v_out[..., c] < 0)) | (
                (node[..., c] > n_grid - mpm.BOUND) & (v_out[..., c] > 0))
            v_out[..., c][into] = 0
        for o in stencil:  # g2p
            weight = w[o[0], :, 0] * w[o[1], :, 1]
            g_v = v_out[tuple((base + o).T)]
            v[f + 1] += weight[:, None] * g_v
            C[f + 1] += 4 * inv_dx * weight[:, None, None] * g_v[:, :, None] * (o - fx)[:, None]
        x[f + 1] = x[f] + dt * v[f + 1]
    x_avg = x[steps - 1].mean(0)
    loss = 0.5 * np.sum((x_avg - np.array(mpm.TARGET)) ** 2)
    return {"x": x, "v": v, "C": C, "F": F}, loss


def _sim(session, dtype=vkad.f32, **kw):
    return mpm.DiffMPMSimple(session, steps=STEPS, n_grid=GRID, n=N, dtype=dtype, **kw)


def _dtypes(session):
    return [vkad.f32] + ([vkad.f64] if f64_ok(session) else [])


def test_the_block_is_difftaichis():
    # DiffTaichi: x[0, i * N + j] = [dx * (i * 0.7 + 10), dx * (j * 0.7 + 25)]
    x = mpm.block()
    assert x.shape == (3600, 2)
    assert x[61] == pytest.approx([(0.7 + 10) / 120, (0.7 + 25) / 120], abs=1e-15)
    assert x[-1] == pytest.approx([(59 * 0.7 + 10) / 120, (59 * 0.7 + 25) / 120], abs=1e-15)


# the block at rest (DiffTaichi's start) and thrown up and right at about the speed training
# reaches (measured at full size: init_v ~ (0.5, 1.7) after 30 iterations)
STARTS = ((0.0, 0.0), (0.5, 1.5))


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations, p2g's atomic adds in another order (~1e-16 relative); tolerance
    # 1e-12 on positions and velocities, 1e-9 on C and F (C ~ v / dx: 64 times larger, and F
    # integrates dt C). f32: a particle's velocity is a weighted sum of 9 node velocities, each a
    # quotient of atomic sums (a few ulps of ~1.5 a step), carried from step to step: <= 99 *
    # 1e-7 ~ 1e-5 (measured 6.4e-6); positions ~0.5 add dt v and round (~3e-8) each step, <=
    # 3e-6 (measured 5e-7). The block moves as a whole, so C (the velocity's spatial derivative,
    # 4 inv_dx = 256 times the nodes' differences) is 0 but for rounding: ~256 * 5e-7 = 1.3e-4
    # of f32 noise (measured 7.9e-5), F integrates dt times that (measured 2.7e-7). Tolerances
    # v 2e-5, x 3e-6, C 1e-3, F 2e-6, and 1e-4 relative on the loss (~1e-2; measured 4.6e-6).
    tols = {vkad.f32: {"x": 3e-6, "v": 2e-5, "C": 1e-3, "F": 2e-6, "loss": 1e-4},
            vkad.f64: {"x": 1e-12, "v": 1e-12, "C": 1e-9, "F": 1e-9, "loss": 1e-10}}
    for dtype in _dtypes(session):
        sim = _sim(session, dtype, graph=False)
        for start in STARTS:
            sim.set_weights({"init_v": start})
            loss = sim.loss()
            want, want_loss = reference(np.array(start))
            assert np.abs(want["x"][-1] - want["x"][0]).max() > 1e-3  # it moved
            for name in STATE:
                np.testing.assert_allclose(sim.arrays[name].numpy(), want[name], rtol=0,
                                           atol=tols[dtype][name], err_msg=f"{dtype} {name}")
            assert loss == pytest.approx(want_loss, rel=tols[dtype]["loss"]), dtype


def test_loss_gradient_matches_central_differences(session):
    # d loss / d init_v against central differences of the f64 transcription at h = 1e-5: no
    # particle comes near a wall. Some of DiffTaichi's particles sit exactly where p2g's base
    # cell changes (0.7 i + 9.5 an integer, i = 5, 15, ..), where the quadratic weights'
    # second derivative jumps: central differences there err by ~1e-9 whatever h (measured at h
    # = 1e-3 .. 1e-6), 4e-7 of the largest gradient (~4e-3), against truncation and rounding
    # below 1e-11. Tolerance 1e-5 of the largest in f64. In f32 the adjoint rounds as the forward
    # does (relative ~1e-5 through the atomic sums of 99 steps, measured 4e-6): tolerance 1e-4
    # of the largest. A wrong adjoint (gravity, a stencil term, the average's 1 / n) is off by
    # O(1) of it.
    h = 1e-5
    for dtype in _dtypes(session):
        sim = _sim(session, dtype, graph=False)
        for start in STARTS:
            fd = []
            for c in range(2):
                d = np.zeros(2)
                d[c] = h
                fd.append((reference(np.array(start) + d)[1]
                           - reference(np.array(start) - d)[1]) / (2 * h))
            fd = np.array(fd)
            sim.set_weights({"init_v": start})
            sim.forward_backward()
            got = sim.gradients()["init_v"].astype(np.float64)
            scale = np.abs(fd).max()
            assert np.abs(fd).min() > 0.1 * scale  # both components matter
            tol = (1e-4 if dtype == vkad.f32 else 1e-5) * scale
            np.testing.assert_allclose(got, fd, rtol=0, atol=tol, err_msg=f"{dtype} {start}")


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the zeroing, set_v, the step loop, the loss, the
    # backward and the update on the device) against every launch made from Python: the same
    # operations give the same losses, gradients and init_v to f32 rounding (atomic sums in
    # another order: 1e-5 relative), over three iterations that move init_v.
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    losses = [[sim.iteration()] for sim in sims]
    session.finish_rework(sims[0]._graph)
    for sim, ls in zip(sims, losses):
        ls += [sim.iteration() for _ in range(2)]
    assert losses[1][2] < losses[1][0]  # the updates moved init_v
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    w = [sim.weights()["init_v"] for sim in sims]
    np.testing.assert_allclose(w[0], w[1], rtol=1e-5)
    g = [sim.gradients()["init_v"] for sim in sims]
    np.testing.assert_allclose(g[0], g[1], rtol=0, atol=1e-5 * np.abs(g[1]).max())
    assert sims[0]._graph is not None and sims[1]._graph is None
    assert any(isinstance(r, vkad.LoopRecord) for r in sims[0].tape.launches)
    assert not any(isinstance(r, vkad.LoopRecord) for r in sims[1].tape.launches)


def assert_trains_init_v(sim) -> None:
    """DiffTaichi's update (rate 10) for five iterations from init_v = 0: each lowers the loss,
    and the first is init_v -= 10 d loss / d init_v to f32 rounding (init_v ~0.1 after one: ulp
    7e-9); init_v heads up and right, towards the target. (diffmpm_checkpointing's test too.)"""
    first = sim.loss()
    losses = [sim.iteration()]
    g = sim.gradients()["init_v"].astype(np.float64)
    np.testing.assert_allclose(sim.weights()["init_v"], -mpm.LEARNING_RATE * g, rtol=0,
                               atol=1e-7)
    losses += [sim.iteration() for _ in range(4)]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < losses[-1]
    v = sim.weights()["init_v"]
    assert v[0] > 0 and v[1] > 0  # towards the target, up and right of the block's mean


def test_training_lowers_the_loss(session):
    assert_trains_init_v(_sim(session))


def test_main_runs_and_writes_plots(tmp_path, capsys):
    args = ["--iters", "2", "--steps", "20", "--grid", str(GRID), "--n", "8", "--out",
            str(tmp_path)]
    out = run_main(mpm.main, args, capsys)
    assert "64 particles, 64^2 grid, 20 steps, 2 iterations" in out
    assert_plots(tmp_path, "diffmpm_simple")
