"""examples/difftaichi/diffmpm3d.py (DiffTaichi's diffmpm3d on vkad) at a small size: the forward
against a float64 numpy transcription of DiffTaichi's equations, the gradient of the loss w.r.t.
controller weights and biases against central differences of that transcription, a replayed
(graph) iteration against a launched one, and training lowering the loss."""
import functools
import math

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               dtypes, load_example, replayed_and_launched)

mpm = load_example("diffmpm3d")

# A 32^3 grid (DiffTaichi's: 64^3) and DiffTaichi's robot at the block size its comment offers
# for small GPUs (0.05; default 0.1): 272 particles, 16 actuators; 40 steps (0.08 s). The robot
# stands in the floor's band (3 cells, y < 0.094), so the sticky floor's select takes both sides.
GRID = 32
STEPS = 40
SCENE = functools.partial(mpm.robot, block_size=0.05)


def reference(weights, bias, n_grid=GRID, steps=STEPS, scene=SCENE):
    """DiffTaichi's compute_actuation, p2g, grid_op, g2p (steps - 1 steps) and compute_x_avg /
    compute_loss in float64 numpy, every particle at once: (state dict, loss)."""
    sc = scene(mpm.Scene(n_grid))
    dx, inv_dx, dt = 1.0 / n_grid, float(n_grid), mpm.DT
    n, eye = sc.n_particles, np.eye(3)
    aid, ptype = np.array(sc.actuator_id), np.array(sc.particle_type)
    fluid = ptype == 0
    x, v = np.zeros((steps, n, 3)), np.zeros((steps, n, 3))
    C, F = np.zeros((steps, n, 3, 3)), np.zeros((steps, n, 3, 3))
    x[0], F[0] = sc.x, eye
    act = np.zeros((steps, len(bias)))
    stencil = [np.array(o) for o in np.ndindex(3, 3, 3)]
    node_index = np.stack(np.meshgrid(*[np.arange(n_grid)] * 3, indexing="ij"), -1)
    for f in range(steps - 1):
        phase = mpm.ACTUATION_OMEGA * f * dt + 2 * math.pi / mpm.N_SIN_WAVES * np.arange(4)
        act[f] = np.tanh(weights @ np.sin(phase) + bias)
        base = np.trunc(x[f] * inv_dx - 0.5).astype(int)
        fx = x[f] * inv_dx - base
        w = np.stack([0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2])
        new_F = (eye + dt * C[f]) @ F[f]
        J = np.linalg.det(new_F)
        new_F[fluid] = np.diag([1.0, 1.0, 0.0]) * np.sqrt(J[fluid])[:, None, None] + np.diag(
            [0.0, 0.0, 1.0])
        F[f + 1] = new_F
        A = np.zeros((n, 3, 3))
        A[:, 2, 2] = np.where(aid == -1, 0.0, act[f, np.maximum(0, aid)] * mpm.ACT_STRENGTH)
        FT = new_F.transpose(0, 2, 1)
        solid_stress = mpm.MU * new_F @ FT + eye * (
            mpm.LA * np.log(np.where(fluid, 1.0, J)) - mpm.MU)[:, None, None]
        cauchy = np.where(fluid[:, None, None], eye * ((J - 1) * mpm.E)[:, None, None],
                          solid_stress) + new_F @ A @ FT
        mass = np.where(fluid, 4.0, 1.0)
        affine = -(dt * mpm.P_VOL * 4 * inv_dx * inv_dx) * cauchy + mass[:, None, None] * C[f]
        grid_v = np.zeros((n_grid ** 3, 3))
        grid_m = np.zeros(n_grid ** 3)
        for o in stencil:  # p2g's atomic adds, node by node of the 3x3x3 stencil
            weight = w[o[0], :, 0] * w[o[1], :, 1] * w[o[2], :, 2]
            node = np.ravel_multi_index((base + o).T, (n_grid,) * 3)
            momentum = weight[:, None] * (mass[:, None] * v[f]
                                          + np.einsum("pij,pj->pi", affine, (o - fx) * dx))
            for c in range(3):
                grid_v[:, c] += np.bincount(node, momentum[:, c], n_grid ** 3)
            grid_m += np.bincount(node, weight * mass, n_grid ** 3)
        v_out = grid_v / (grid_m + 1e-10)[:, None]
        v_out[:, 1] -= dt * mpm.GRAVITY
        v_out = v_out.reshape((n_grid,) * 3 + (3,))
        stop = np.zeros((n_grid,) * 3, bool)
        for c in range(3):  # walls, floor and ceiling
            stop |= (node_index[..., c] < mpm.BOUND) & (v_out[..., c] < 0)
            stop |= (node_index[..., c] > n_grid - mpm.BOUND) & (v_out[..., c] > 0)
        v_out[stop] = 0
        for o in stencil:  # g2p
            weight = w[o[0], :, 0] * w[o[1], :, 1] * w[o[2], :, 2]
            g_v = v_out[tuple((base + o).T)]
            v[f + 1] += weight[:, None] * g_v
            C[f + 1] += 4 * inv_dx * weight[:, None, None] * g_v[:, :, None] * (o - fx)[:, None]
        x[f + 1] = x[f] + dt * v[f + 1]
    solid = ptype == 1
    loss = -np.sum(x[steps - 1, solid, 0]) / max(1, solid.sum())
    return {"x": x, "v": v, "C": C, "F": F, "actuation": act}, loss


def _sim(session, dtype=vkad.f32, **kw):
    return mpm.DiffMPM3D(session, steps=STEPS, n_grid=GRID, dtype=dtype, scene=SCENE, **kw)


def test_the_robot_is_difftaichis():
    # DiffTaichi's add_rect puts int(w / dx * 3) x int(h / dx * 3) x int(d / dx * 3) particles
    # in a box. On its 64^3 grid: a leg block 0.05 x 0.035 x 0.1 -> 9 x 6 x 19 = 1026, 16 of
    # them; a body block 0.1 x 0.07 x 0.1 -> 19 x 13 x 19 = 4693, 3 of them: 30,495 particles.
    sc = mpm.robot(mpm.Scene(64))
    assert (sc.n_particles, sc.n_solid_particles, sc.n_actuators) == (30495, 30495, 16)
    assert sc.actuator_id.count(-1) == 3 * 4693
    assert all(sc.actuator_id.count(a) == 1026 for a in range(16))
    x = np.array(sc.x)
    # half a spacing in from the boxes' faces (the body's 0.1 / 19, 0.07 / 13 the finer)
    assert x.min(0) == pytest.approx([0.1 + 0.1 / 38, 0.05 + 0.07 / 26, 0.3 + 0.1 / 38])
    assert x.max(0) == pytest.approx([0.4 - 0.1 / 38, 0.05 + 0.07 - 0.07 / 26,
                                      0.6 - 0.1 / 38])
    small = SCENE(mpm.Scene(GRID))  # the tests' robot: 16 x (2 x 1 x 4) + 3 x (4 x 3 x 4)
    assert (small.n_particles, small.n_actuators) == (272, 16)


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations (but for the order of the grid's atomic adds and numpy's
    # determinant), measured equal to 3e-16 (x, v, F) and 2e-14 (C, which is 4 inv_dx = 128 x
    # velocities); atol 1e-12 / 1e-11 is far below any wrong term. f32: rounding errors of
    # ~6e-8 relative carried through 39 steps; measured 1.8e-7 (x, scale 0.44), 4e-7 (v),
    # 1.6e-6 (F), 3e-5 (C: 128 x the velocities' error), 1e-7 (actuation), 2.5e-7 relative
    # (the loss); the bounds are ~4-10x.
    w0 = None
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        w0 = sim.weights()
        want, want_loss = reference(w0["weights"], w0["bias"])
        loss = sim.loss()
        got = sim.state()
        f32 = dtype == vkad.f32
        atol = ({"x": 2e-6, "v": 4e-6, "F": 2e-5, "C": 3e-4, "actuation": 1e-6} if f32 else
                {"x": 1e-12, "v": 1e-12, "F": 1e-12, "C": 1e-11, "actuation": 1e-12})
        for k, tol in atol.items():
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=f"{dtype} {k}")
        assert loss == pytest.approx(want_loss, rel=1e-6 if f32 else 1e-13), dtype
    # a simulation that does something: the particles moved, the actuation is there, the
    # elastic state changed, and the sticky floor stopped some nodes (not all)
    assert np.abs(want["x"][-1] - want["x"][0]).max() > 1e-4
    assert np.abs(want["actuation"]).max() > 0.01
    assert np.abs(want["F"][-1] - np.eye(3)).max() > 1e-3


# a weight of each sine wave's kind on legs far apart, and biases (waves 0 and 2 differ by pi:
# their gradients are opposite)
PICKS = [("weights", (1, 0)), ("weights", (6, 1)), ("weights", (12, 3)), ("bias", (0,)),
         ("bias", (3,)), ("bias", (13,))]


def test_loss_gradient_matches_central_differences(session):
    # Central differences of the f64 transcription with h = 1e-4: rounding ~eps |L| k / h =
    # 2e-16 x 0.17 x k / 1e-4 ~ 4e-13 k, truncation (h^2 / 6 |L'''|) below it; h = 1e-5 agrees to
    # its larger rounding (<= 2e-6 relative), h = 1e-3 does not everywhere (it steps over kinks:
    # a grid node in a wall band whose velocity changes sign). The gradients picked are 5e-7 ..
    # 6e-6. vkad's f64 gradient is measured within 1e-7 relative of them, f32's within 8e-6 (its
    # rounding through 39 steps' adjoints): rtol 1e-6 (f64) / 1e-4 (f32) with atol 1e-12, while
    # a wrong adjoint rule is off by O(1) of the gradient.
    w0 = _sim(session, graph=False, loop=False).weights()  # DiffTaichi's init, in f32
    h = 1e-4
    fd = []
    for name, idx in PICKS:
        d = 0.0
        for sign in (1, -1):
            w = {k: v.copy() for k, v in w0.items()}
            w[name][idx] += sign * h
            d += sign * reference(w["weights"], w["bias"])[1]
        fd.append(d / (2 * h))
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        sim.set_weights(w0)  # the f32 weights, exactly
        sim.forward_backward()
        g = sim.gradients()
        for (name, idx), want in zip(PICKS, fd):
            assert abs(want) > 1e-7, (name, idx)  # a gradient that is there
            np.testing.assert_allclose(g[name][idx], want, rtol=1e-4 if dtype == vkad.f32 else
                                       1e-6, atol=1e-12, err_msg=f"{dtype} {name}{list(idx)}")


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop) against every
    # launch made from Python: the same losses, gradients and updated weights to float rounding
    # (the grid's atomic adds may add in another order). Measured on lavapipe: equal losses,
    # gradients within 5e-7 of the largest, weights within 1e-9; on the H200 the losses 1.1e-6
    # apart: the grid's f32 atomic sums (a few hundred particles into shared cells) round in
    # another order at each of the 40 steps and the difference carries through the simulation.
    # The bounds are 2e-5 (loss), 1e-5 and 1e-8 (the update moves a weight by 30 x 5e-6).
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    before = session.stats()
    losses = replayed_and_launched(session, sims, iters=2)  # the capture's run, a replay
    np.testing.assert_allclose(losses[0], losses[1], rtol=2e-5)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol_of_max=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol=1e-8)
    # The capture ran the step loop as its prepared plan (docs/graphs.md). Its adjoint's plan
    # ran too when this file ran alone on lavapipe (2 reworked loops), not in the whole suite
    # there nor on the H200 (1): the adjoint's launches then run one by one, a loss of speed,
    # not of correctness (the values above are equal); not yet understood (noted).
    after = session.stats()
    assert after["reworked_loops"] + after["rolled_loops"] > (before["reworked_loops"] +
                                                              before["rolled_loops"])
    assert_graph_and_step_loop_in_the_first(sims)


def test_one_grid_in_a_memory_budget_has_the_time_axis_gradients(session):
    # Issue 57, point 5: DiffTaichi's layout (one grid cleared every step, two-row particle
    # rings) on a tape with a memory budget of half the time-axis version's particle and grid
    # bytes: f64, the same loss and gradients as the time-axis version to ~1e-12 (only the
    # grid's atomic sums may add in another order); rtol 1e-9 is far below a wrong
    # recomputation's O(1). Then captured and replayed in f32: the time version's losses.
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    full = _sim(session, vkad.f64, graph=False, loop=False)
    held = sum(full.arrays[k].nbytes for k in ("x", "v", "C", "F", "grid_v_in", "grid_m_in",
                                               "grid_v_out"))
    ring = _sim(session, vkad.f64, graph=False, memory_budget=held // 2)
    assert ring.arrays["x"].shape[0] == 2 and ring.arrays["grid_v_out"].shape[0] == 1
    for sim in (full, ring):
        sim.forward_backward()
    plan = ring.tape.checkpoint_plan()
    assert plan["peak_bytes"] <= held // 2 and plan["recompute"] >= 2, plan
    np.testing.assert_allclose(ring.arrays["loss"].numpy(), full.arrays["loss"].numpy(),
                               rtol=1e-12)
    want, got = full.gradients(), ring.gradients()
    for name in mpm.DiffMPM3D.PARAMS:
        assert np.abs(want[name]).max() > 1e-7, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9,
                                   atol=1e-9 * np.abs(want[name]).max(), err_msg=name)
    sims = [_sim(session, loop=False), _sim(session, memory_budget=held // 4)]
    losses = [[sim.iteration() for _ in range(3)] for sim in sims]
    assert sims[1]._graph is not None
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-5)


def test_training_lowers_the_loss(session):
    # DiffTaichi's learn: w -= 30 dL/dw. Its gradients are small here (<= 6e-6: 40 steps move
    # the robot ~1e-4), so each step lowers the loss by ~30 |g|^2 = 2e-8 (measured), at the f32
    # rounding of the loss (~4e-8): in f64, launched (the replay is the test above's, in f32).
    # Each of three iterations lowers the loss, the first by its first-order prediction 30 |g|^2
    # to 10% (the step moves the weights by ~1e-4, too little for the curvature to show).
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    sim = _sim(session, vkad.f64, graph=False)
    first, w0 = sim.loss(), sim.weights()
    losses = [sim.iteration()]
    g = sim.gradients()
    for name in mpm.DiffMPM3D.PARAMS:
        np.testing.assert_allclose(sim.weights()[name], w0[name] - mpm.LEARNING_RATE * g[name],
                                   rtol=1e-14, atol=1e-16)
    losses += [sim.iteration() for _ in range(2)]
    last = sim.loss()
    assert losses[0] == pytest.approx(first, rel=1e-13)
    assert all(b < a for a, b in zip(losses, losses[1:] + [last])), (losses, last)
    predicted = mpm.LEARNING_RATE * sum(float(np.sum(g[p] ** 2)) for p in g)
    assert losses[0] - losses[1] == pytest.approx(predicted, rel=0.1), (losses, predicted)
