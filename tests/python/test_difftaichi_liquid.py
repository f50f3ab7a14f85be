"""examples/difftaichi/liquid.py (DiffTaichi's liquid on vkad) at a small size: the forward against
a float64 numpy transcription of DiffTaichi's liquid.py (every particle field, the fluid's F reset,
the floor's friction branch as written), the gradient of the loss w.r.t. controller weights and
biases against central differences of that transcription (f32 and f64), a replayed (graph)
iteration against a launched one, and training lowering the loss."""
import functools
import math

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               dtypes, load_example)

liq = load_example("liquid")
mpm3d = liq.mpm3d

# A 16^3 grid (DiffTaichi's: 64^3), 30 steps, DiffTaichi's robot and fluid block at the density
# of three particles per cell side: 272 solid and 162 fluid particles. On this grid the walls
# (3 cells, 0.19) are 4x DiffTaichi's, so the scene moves: the robot 0.25 in from the left wall
# and standing on the floor's band as at 64^3 (its lowest particles' stencils reach the band's
# top node, j = 2, with weight 0.22), the fluid block laid on its body (y from 0.23, the body's
# top) so that the two meet within the 30 steps.
GRID = 16
STEPS = 30
SCENE = functools.partial(liq.liquid, offset=(0.25, 0.16, 0.3),
                          fluid=(0.1, 0.07, 0.1, 0.2, 0.05, 0.2))


def reference(weights, bias, n_grid=GRID, steps=STEPS, scene=SCENE, seed=0):
    """DiffTaichi's liquid.py in float64 numpy, every particle at once: compute_actuation, p2g,
    grid_op (its six ifs in turn and the floor's friction branch, coeff 1.5, as written), g2p
    for steps - 1 steps, then compute_x_avg / compute_loss. Returns (state dict, loss)."""
    sc = scene(mpm3d.Scene(n_grid, seed))
    dx, inv_dx, dt, E = 1.0 / n_grid, float(n_grid), 2e-3, 10.0
    mu = la = E
    bound, coeff = 3, 1.5
    n, eye = sc.n_particles, np.eye(3)
    aid, ptype = np.array(sc.actuator_id), np.array(sc.particle_type)
    fluid = ptype == 0
    x, v = np.zeros((steps, n, 3)), np.zeros((steps, n, 3))
    C, F = np.zeros((steps, n, 3, 3)), np.zeros((steps, n, 3, 3))
    x[0], F[0] = sc.x, eye
    act = np.zeros((steps, len(bias)))
    stencil = [np.array(o) for o in np.ndindex(3, 3, 3)]
    ijk = np.stack(np.meshgrid(*[np.arange(n_grid)] * 3, indexing="ij"), -1).reshape(-1, 3)
    rubbed = 0  # grid nodes where the friction branch changed the velocity
    for f in range(steps - 1):
        phase = 40 * f * dt + 2 * math.pi / 4 * np.arange(4)
        act[f] = np.tanh(weights @ np.sin(phase) + bias)
        base = (x[f] * inv_dx - 0.5).astype(int)  # truncation toward 0, as ti.cast
        fx = x[f] * inv_dx - base
        w = np.stack([0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2])
        new_F = (eye + dt * C[f]) @ F[f]
        J = np.linalg.det(new_F)
        sqrtJ = np.sqrt(np.where(fluid, J, 1.0))
        new_F[fluid] = 0.0
        new_F[fluid, 0, 0] = new_F[fluid, 1, 1] = sqrtJ[fluid]
        new_F[fluid, 2, 2] = 1.0
        F[f + 1] = new_F
        A = np.zeros((n, 3, 3))
        A[:, 2, 2] = np.where(aid == -1, 0.0, act[f, np.maximum(0, aid)] * 5)
        FT = new_F.transpose(0, 2, 1)
        solid = mu * new_F @ FT + eye * (la * np.log(np.where(fluid, 1.0, J)) - mu)[:, None, None]
        cauchy = np.where(fluid[:, None, None], eye * ((J - 1) * E)[:, None, None], solid)
        cauchy = cauchy + new_F @ A @ FT
        mass = np.where(fluid, 4.0, 1.0)
        affine = -(dt * 1 * 4 * inv_dx * inv_dx) * cauchy + mass[:, None, None] * C[f]
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
        v_out[:, 1] -= dt * 10
        i, j, k = ijk.T
        for axis, idx in ((0, i), (2, k)):  # the walls x and z, as DiffTaichi orders them
            v_out[(idx < bound) & (v_out[:, axis] < 0)] = 0
            v_out[(idx > n_grid - bound) & (v_out[:, axis] > 0)] = 0
        floor = (j < bound) & (v_out[:, 1] < 0)
        v_out[floor] = 0
        # the floor's friction, on the velocity the floor has just zeroed (normal (0, 1, 0))
        lin = v_out[:, 1]
        vit = v_out - lin[:, None] * np.array([0.0, 1.0, 0.0])
        lit = np.linalg.norm(vit, axis=1) + 1e-10
        rub = floor & (lin < 0)
        v_out[rub & (lit + coeff * lin <= 0)] = 0
        rubbed += int(rub.sum())
        slide = rub & (lit + coeff * lin > 0)
        v_out[slide] = ((1 + coeff * lin / lit)[:, None] * vit)[slide]
        v_out[(j > n_grid - bound) & (v_out[:, 1] > 0)] = 0
        v_out = v_out.reshape((n_grid,) * 3 + (3,))
        for o in stencil:  # g2p
            weight = w[o[0], :, 0] * w[o[1], :, 1] * w[o[2], :, 2]
            g_v = v_out[tuple((base + o).T)]
            v[f + 1] += weight[:, None] * g_v
            C[f + 1] += 4 * inv_dx * weight[:, None, None] * g_v[:, :, None] * (o - fx)[:, None]
        x[f + 1] = x[f] + dt * v[f + 1]
    solid = ptype == 1
    x_avg = np.sum(x[steps - 1, solid], axis=0) / max(1, solid.sum())
    return {"x": x, "v": v, "C": C, "F": F, "actuation": act, "rubbed": rubbed}, -x_avg[0]


_SIMS = {}


def _sim(session, dtype=vkad.f32, graph=False):
    """One Liquid per (dtype, graph) for the module (its kernels compile once), at DiffTaichi's
    initial weights; graph=False launches every kernel from Python (no Session.loop)."""
    key = (id(session), dtype, graph)
    if key not in _SIMS:
        _SIMS[key] = liq.Liquid(session, steps=STEPS, n_grid=GRID, dtype=dtype, seed=0,
                                graph=graph, loop=graph, scene=SCENE)
        _SIMS[key].initial = _SIMS[key].weights()
    sim = _SIMS[key]
    sim.set_weights(sim.initial)
    return sim


def test_the_scene_is_difftaichis():
    # DiffTaichi's add_rect puts int(w / dx * 3) x int(h / dx * 3) x int(d / dx * 3) particles in
    # a box. On its 64^3 grid: the robot's 30,495 (diffmpm3d's) and the fluid block 0.2 x 0.05 x
    # 0.2 -> 38 x 9 x 38 = 12,996, at random in x [0.2, 0.4], y [0.2, 0.25], z [0.4, 0.6].
    sc = liq.liquid(mpm3d.Scene(64))
    pt = np.array(sc.particle_type)
    assert (sc.n_particles, sc.n_solid_particles, sc.n_actuators) == (43491, 30495, 16)
    assert pt[:30495].tolist() == [1] * 30495 and pt[30495:].tolist() == [0] * 12996
    assert sc.actuator_id[30495:] == [-1] * 12996
    xf = np.array(sc.x)[pt == 0]
    assert (xf.min(0) >= [0.2, 0.2, 0.4]).all() and (xf.max(0) <= [0.4, 0.25, 0.6]).all()
    assert xf.min(0) == pytest.approx([0.2, 0.2, 0.4], abs=2e-3)  # fills its box
    assert xf.max(0) == pytest.approx([0.4, 0.25, 0.6], abs=2e-3)
    # the seed places it: the same seed, the same particles; another, others
    assert sc.x == liq.liquid(mpm3d.Scene(64, seed=0)).x
    assert sc.x[30495:] != liq.liquid(mpm3d.Scene(64, seed=1)).x[30495:]
    small = SCENE(mpm3d.Scene(GRID))  # the tests': 16 x (2 x 1 x 4) + 3 x (4 x 3 x 4) + 9 x 2 x 9
    assert (small.n_particles, small.particle_type.count(0)) == (434, 162)


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations but for the order of the grid's atomic adds and numpy's
    # determinant: measured equal to 1e-16 (x), 9e-16 (v), 1.1e-15 (F), 1.1e-14 (C, which is
    # 4 inv_dx = 64 x velocities), 6e-16 relative (the loss); the bounds are 10x, far below any
    # wrong term. f32: rounding of ~6e-8 relative carried through 29 steps; measured 2.9e-7 (x,
    # scale 0.6), 6.5e-7 (v), 1.0e-6 (F), 1.1e-5 (C), 9e-8 (actuation), 1.8e-7 relative (the
    # loss); the bounds are ~5-10x.
    want = None
    for dtype in dtypes(session):
        sim = _sim(session, dtype)
        w0 = sim.weights()
        want, want_loss = reference(w0["weights"], w0["bias"])
        loss = sim.loss()
        got = sim.state()
        f32 = dtype == vkad.f32
        atol = ({"x": 2e-6, "v": 4e-6, "F": 1e-5, "C": 1e-4, "actuation": 1e-6} if f32 else
                {"x": 1e-14, "v": 1e-14, "F": 1e-14, "C": 1e-13, "actuation": 1e-15})
        for k, tol in atol.items():
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=f"{dtype} {k}")
        assert loss == pytest.approx(want_loss, rel=1e-6 if f32 else 1e-14), dtype
    # a simulation that does something: the particles moved, the actuation is there, the
    # solids' and the fluid's F changed, the fluid's F is DiffTaichi's diag(sqrt J, sqrt J, 1),
    # and the fluid pushes the robot: without it the loss differs by far more than f32's error.
    # DiffTaichi's floor friction never acts (it sees the velocity the floor has just zeroed).
    fluid = np.array(SCENE(mpm3d.Scene(GRID)).particle_type) == 0
    assert np.abs(want["x"][-1] - want["x"][0]).max() > 1e-2
    assert np.abs(want["actuation"]).max() > 0.01
    for part in (fluid, ~fluid):
        assert np.abs(want["F"][-1, part] - np.eye(3)).max() > 1e-3
    Ff = want["F"][1:, fluid]
    assert (Ff[..., 0, 0] == Ff[..., 1, 1]).all() and (Ff[..., 2, 2] == 1).all()
    assert (Ff[..., [0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]] == 0).all()
    dry = functools.partial(mpm3d.robot, offset=(0.25, 0.16, 0.3))
    assert abs(reference(w0["weights"], w0["bias"], scene=dry)[1] - want_loss) > 1e-5
    assert want["rubbed"] == 0


# weights of each sine wave on legs far apart, and biases, whose gradients are 3e-6 .. 8e-5
PICKS = [("weights", (1, 1)), ("weights", (5, 0)), ("weights", (10, 3)), ("weights", (14, 2)),
         ("bias", (2,)), ("bias", (7,)), ("bias", (12,))]


def test_loss_gradient_matches_central_differences(session):
    # Central differences of the f64 transcription with h = 1e-4: rounding ~eps |L| / h =
    # 2e-16 x 0.4 / 1e-4 ~ 1e-12 (3e-7 of the smallest gradient picked), truncation below it:
    # measured over every weight and bias, h = 1e-4 and 1e-5 agree to 1e-6 relative, and 1e-3
    # too (no kink crossed). vkad's f64 gradient is measured within 5.5e-7 relative of them
    # (all 80), f32's within 3e-6 (its rounding through 29 steps' adjoints): rtol 3e-6 (f64) /
    # 3e-5 (f32), while a wrong adjoint rule is off by O(1) of the gradient.
    w0 = _sim(session).weights()  # DiffTaichi's init, in f32
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
        sim = _sim(session, dtype)
        sim.set_weights(w0)  # the f32 weights, exactly
        sim.forward_backward()
        g = sim.gradients()
        for (name, idx), want in zip(PICKS, fd):
            assert abs(want) > 2e-6, (name, idx)  # a gradient that is there
            np.testing.assert_allclose(g[name][idx], want, rtol=3e-5 if dtype == vkad.f32 else
                                       3e-6, atol=0, err_msg=f"{dtype} {name}{list(idx)}")


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop) against every
    # launch made from Python, two iterations (the capture's run, then the reworked graph's
    # replay): the same losses, gradients and updated weights to float rounding (the grid's
    # atomic adds may add in another order). Measured on lavapipe: equal losses, gradients within
    # 3.5e-7 of the largest, weights within 5e-10; the bounds are 2e-6 (loss: f32's error
    # through the steps, as the forward test's), 1e-5 of the largest gradient and 1e-8 (the
    # update moves a weight by 10 x 8e-5).
    sims = [_sim(session, graph=g) for g in (True, False)]
    losses = [[sim.iteration()] for sim in sims]
    session.finish_rework(sims[0]._graph)
    grads = [[sim.gradients()] for sim in sims]
    for sim, ls, gs in zip(sims, losses, grads):
        ls.append(sim.iteration())
        gs.append(sim.gradients())
    np.testing.assert_allclose(losses[0], losses[1], rtol=2e-6)
    assert losses[1][1] < losses[1][0]
    for g0, g1 in zip(*grads):
        assert_close_by_name(g0, g1, atol_of_max=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol=1e-8)
    assert_graph_and_step_loop_in_the_first(sims)


def test_training_lowers_the_loss(session):
    # DiffTaichi's update: w -= 10 dL/dw on weights and bias. In f64, launched (the replay is the
    # test above's, in f32). Each of three iterations lowers the loss, the first by its
    # first-order prediction 10 |g|^2 = 5.8e-7 to 1% (measured: 2e-4; the step moves the weights
    # by ~8e-4, too little for the curvature to show). f32 would see it too (its loss rounds at
    # ~3e-8), but not to 1%.
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    sim = _sim(session, vkad.f64)
    first, w0 = sim.loss(), sim.weights()
    losses = [sim.iteration()]
    g = sim.gradients()
    for name in liq.Liquid.PARAMS:
        np.testing.assert_allclose(sim.weights()[name], w0[name] - 10 * g[name],
                                   rtol=1e-14, atol=1e-16)
    losses += [sim.iteration() for _ in range(2)]
    last = sim.loss()
    assert losses[0] == pytest.approx(first, rel=1e-13)
    assert all(b < a for a, b in zip(losses, losses[1:] + [last])), (losses, last)
    predicted = liq.LEARNING_RATE * sum(float(np.sum(g[p] ** 2)) for p in g)
    assert losses[0] - losses[1] == pytest.approx(predicted, rel=0.01), (losses, predicted)


def test_one_grid_in_a_memory_budget_has_the_time_axis_gradients(session):
    # --memory-budget: DiffTaichi's layout (one grid cleared every step, two-row particle rings)
    # on a tape whose checkpoints hold 3/4 of the time-axis version's particle and grid bytes
    # (half is below the least this small grid's checkpoints need, 5.9 of 8.7 MiB), so
    # that it runs parts of the forward again in the backward, as DiffTaichi's backward()
    # recomputes each step's grid. f64: the same loss and gradients as the time-axis version to
    # rounding (only the grid's atomic sums may add in another order); rtol 1e-9 is far below a
    # wrong recomputation's O(1).
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    full = _sim(session, vkad.f64)
    held = sum(full.arrays[k].nbytes for k in ("x", "v", "C", "F", "grid_v_in", "grid_m_in",
                                               "grid_v_out"))
    ring = liq.Liquid(session, steps=STEPS, n_grid=GRID, dtype=vkad.f64, graph=False,
                      scene=SCENE, memory_budget=held * 3 // 4)
    assert ring.arrays["x"].shape[0] == 2 and ring.arrays["grid_v_out"].shape[0] == 1
    for sim in (full, ring):
        sim.forward_backward()
    plan = ring.tape.checkpoint_plan()
    assert plan["peak_bytes"] <= held * 3 // 4 and plan["recompute"] >= 2, plan
    np.testing.assert_allclose(ring.arrays["loss"].numpy(), full.arrays["loss"].numpy(),
                               rtol=1e-12)
    want, got = full.gradients(), ring.gradients()
    for name in liq.Liquid.PARAMS:
        assert np.abs(want[name]).max() > 1e-5, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9,
                                   atol=1e-9 * np.abs(want[name]).max(), err_msg=name)
