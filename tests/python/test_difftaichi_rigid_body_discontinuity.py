"""examples/difftaichi/rigid_body_discontinuity.py (DiffTaichi's box landing at angles around 0,
friction 0 and 1) at DiffTaichi's own size -- one box, 2048 steps, already small: the forward
against a float64 transcription of initialize_properties / collide / advance / compute_loss, the
gradient against central differences of that transcription (f32 and f64), a replayed (graph)
evaluation against a launched one, and DiffTaichi's scan (its result: with friction the loss
jumps at angle 0, which its gradient does not show). DiffTaichi has no optimiser for this
program, so there is no training to test."""
import math

import numpy as np
import pytest

import vkad
from difftaichi_checks import (assert_graph_and_step_loop_in_the_first, dtypes, load_example,
                               run_main)

rbd = load_example("rigid_body_discontinuity")
STEPS = rbd.STEPS
# Points of DiffTaichi's scan: both sides of the jump, friction 0 and 1
POINTS = ((1.0, -0.0195), (1.0, -0.0005), (1.0, 0.0005), (1.0, 0.0125), (0.0, 0.0055))


def reference(friction, init_x, init_v, rotation, omega, steps=STEPS, halfsize=rbd.HALFSIZE):
    """DiffTaichi's forward in float64 Python: (x, v, rotation, omega of every step, loss)."""
    dt, ground = rbd.DT, rbd.GROUND_HEIGHT
    w, h = halfsize
    inv_mass = 1.0 / (4 * w * h)
    inv_inertia = 1.0 / (4 / 3 * w * h * (w * w + h * h))
    x, v = np.zeros((steps, 2)), np.zeros((steps, 2))
    rot, om = np.zeros(steps), np.zeros(steps)
    x[0], v[0], rot[0], om[0] = init_x, init_v, rotation, omega
    for t in range(1, steps):
        c, s = math.cos(rot[t - 1]), math.sin(rot[t - 1])
        dv, dom = np.zeros(2), 0.0
        for k in range(4):  # collide(t - 1)
            lx, ly = (k % 2 * 2 - 1) * w, (k // 2 % 2 * 2 - 1) * h
            px, py = c * lx - s * ly, s * lx + c * ly
            cx, cy = x[t - 1, 0] + px, x[t - 1, 1] + py
            vx, vy = v[t - 1, 0] - om[t - 1] * py, v[t - 1, 1] + om[t - 1] * px
            vy += dt * rbd.GRAVITY
            kn = inv_mass + px ** 2 * inv_inertia  # rn = cross(rela_pos, (0, 1)) = px
            kt = inv_mass + py ** 2 * inv_inertia  # rt = cross(rela_pos, (1, 0)) = -py
            impulse = timpulse = 0.0
            if vy < 0 and cy < ground:
                impulse = -(1 + rbd.ELASTICITY) * vy / kn
                if impulse > 0:
                    timpulse = min(friction * impulse, max(-friction * impulse, -vx / kt))
            if cy < ground:
                impulse -= dt * rbd.PENALTY * (cy - ground) / kn
            dv += np.array([timpulse, impulse]) * inv_mass
            dom += ((cx - x[t - 1, 0]) * impulse - (cy - x[t - 1, 1]) * timpulse) * inv_inertia
        damp = math.exp(-dt * rbd.DAMPING)  # advance(t)
        v[t] = damp * v[t - 1] + dv + dt * rbd.GRAVITY * np.array([0.0, 1.0])
        x[t] = x[t - 1] + dt * v[t]
        om[t] = damp * om[t - 1] + dom
        rot[t] = rot[t - 1] + dt * om[t]
    return x, v, rot, om, x[-1, 0]


def _start(angle):
    return np.array(rbd.INIT_X), np.array(rbd.INIT_V), angle, 0.0


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations in the same order: equal (measured 0; tolerance 1e-12). f32: 2047
    # steps each add dt v (~2e-4) to positions below 1, rounding by <= 6e-8 each; the contacts'
    # impulses, quotients of such values, carry that into the velocities. With friction 1
    # (measured: x, rotation <= 6e-5, v 4.4e-5, omega 4.2e-4 of ~15): tolerances 2e-4 on x and
    # the angle, 1e-4 on v, 2e-3 on omega. Without friction the box spins on its bounces, and
    # f32 rounding decides a corner's contact a step apart from f64 at one of them (omega off by
    # 0.32, 2%); x, which no impulse moves without friction, is still checked (measured 4.3e-5).
    for dtype in dtypes(session):
        sim = rbd.RigidBodyDiscontinuity(session, dtype=dtype, graph=False)
        for friction, angle in POINTS:
            sim.set_start(friction, angle)
            loss = sim.loss()
            x, v, rot, om, want = reference(friction, *_start(angle))
            assert x[:, 1].min() < rbd.GROUND_HEIGHT + rbd.HALFSIZE[1] * 1.5  # it landed
            got = sim.state()
            if dtype == vkad.f64:
                tols = {"x": 1e-12, "rotation": 1e-12, "v": 1e-12, "omega": 1e-12}
            elif friction:
                tols = {"x": 2e-4, "rotation": 2e-4, "v": 1e-4, "omega": 2e-3}
            else:
                tols = {"x": 2e-4}
            for name, ref in (("x", x), ("rotation", rot), ("v", v), ("omega", om)):
                if name in tols:
                    np.testing.assert_allclose(got[name], ref, rtol=0, atol=tols[name],
                                               err_msg=f"{dtype} {friction} {angle} {name}")
            assert loss == pytest.approx(want, abs=tols["x"])


def test_gradient_matches_central_differences(session):
    # Central differences of the f64 transcription at h = 1e-7 in the start's 6 numbers. The
    # branches (a corner below the ground, moving into it, the friction cone) are decided at
    # step boundaries, so the loss is piecewise smooth: a step of h moves a crossing by ~h / |v|
    # ~ 1e-7 of a step's 4e-4 travel, and no branch flips at these points (the differences at h
    # and h / 10 agree to 1e-5, checked below). f64: measured 2.6e-7 of the largest gradient
    # (1, d loss / d x0), tolerance 2e-6. f32: the adjoint runs back through the same contacts
    # with the forward's rounding (measured 8e-6 of the largest): tolerance 1e-4. A dropped
    # friction or torque term moves the angle's and omega's gradients (0.02 .. 0.6) by O(1).
    h = 1e-7
    for dtype in dtypes(session):
        # (in f64 the adjoint's atomic adds are compare-and-swap loops on lavapipe: its step
        # loop stays launches there, past the device's loop cap rolled)
        sim = rbd.RigidBodyDiscontinuity(session, dtype=dtype, graph=False)
        for friction, angle in POINTS[1:4]:
            x0, v0, r0, o0 = _start(angle)
            start = np.concatenate([x0, v0, [r0, o0]])
            fd = []
            for which in range(6):
                diffs = []
                for step in (h, h / 10):
                    d = np.zeros(6)
                    d[which] = step
                    plus, minus = start + d, start - d
                    diffs.append((reference(friction, plus[:2], plus[2:4], *plus[4:])[4]
                                  - reference(friction, minus[:2], minus[2:4], *minus[4:])[4])
                                 / (2 * step))
                assert diffs[0] == pytest.approx(diffs[1], abs=1e-5)  # smooth here
                fd.append(diffs[0])
            fd = np.array(fd)
            sim.evaluate(angle, friction)
            g = sim.gradients()
            got = np.concatenate([g[p] for p in sim.PARAMS]).astype(np.float64)
            tol = (1e-4 if dtype == vkad.f32 else 2e-6) * np.abs(fd).max()
            np.testing.assert_allclose(got, fd, rtol=0, atol=tol,
                                       err_msg=f"{dtype} friction={friction} angle={angle}")


def test_a_replayed_evaluation_equals_a_launched_one(session):
    # The captured and replayed evaluation (the step loop rolled, the start and friction
    # uploaded before each replay) against every launch made from Python: the same operations,
    # so the same losses and gradients to f32 rounding (1e-5 of O(1) values), over the points.
    sims = [rbd.RigidBodyDiscontinuity(session, graph=g, loop=g) for g in (True, False)]
    results = [[], []]
    for k, (friction, angle) in enumerate(POINTS):
        for sim, out in zip(sims, results):
            loss = sim.evaluate(angle, friction)
            g = sim.gradients()
            out.append(np.concatenate([[loss]] + [g[p] for p in sim.PARAMS]))
        if k == 0:
            session.finish_rework(sims[0]._graph)
    scale = np.abs(results[1]).max(0)
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=1e-5 * scale.max())
    assert_graph_and_step_loop_in_the_first(sims)
    # a replay: the zeroing fills aside, initialize, the rolled loop, compute_loss and their
    # three adjoints
    before = session.stats()["launches"]
    sims[0].evaluate(*POINTS[0][::-1])
    assert session.stats()["launches"] - before == 6


def test_difftaichis_scan_shows_the_jump(session):
    # DiffTaichi's figure: without friction the box slides, x at the last step 0.7 - 2047 dt
    # whatever the angle, and the gradient in the angle is 0; with friction 1 the loss changes
    # smoothly on each side of 0 but jumps across it (the box lands on its left or right corner
    # first and is turned the other way), by more than it changes over either side, and the
    # gradient d loss / d omega0 is finite on both sides: it does not see the jump.
    sim = rbd.RigidBodyDiscontinuity(session)
    losses, grads = rbd.scan(sim, 0.0)
    assert len(losses) == 40
    np.testing.assert_allclose(losses, 0.7 - (STEPS - 1) * rbd.DT, rtol=0, atol=2e-4)
    np.testing.assert_allclose(grads, 0.0, atol=1e-3)
    losses, grads = rbd.scan(sim, 1.0)
    losses = np.array(losses)
    left, right = losses[:20], losses[20:]
    jump = right[0] - left[-1]
    assert jump > 0.05
    assert jump > 5 * max(np.ptp(left), np.ptp(right))
    assert np.abs(grads).max() < 0.1  # d loss / d omega0, measured 0.022 .. 0.055
    # the gradient in the angle either side of 0 predicts a change across the 0.001 rad between
    # them of < 1e-3 (measured |d loss / d angle| 0.15 .. 0.34): a hundredth of the jump
    for angle in (-0.0005, 0.0005):
        sim.evaluate(angle, 1.0)
        assert abs(sim.gradients()["init_rotation"][0]) * 0.001 < jump / 100
    want = [reference(1.0, *_start(a))[4] for a in rbd.angles()[[0, 19, 20, 39]]]
    np.testing.assert_allclose(losses[[0, 19, 20, 39]], want, rtol=0, atol=2e-4)
    # iteration() walks the same scan, from its first point (friction 0)
    sim._next = 0
    assert sim.iteration() == pytest.approx(0.7 - (STEPS - 1) * rbd.DT, abs=2e-4)


def test_main_runs_and_writes_its_plot(tmp_path, capsys):
    out = run_main(rbd.main, ["--steps", "600", "--out", str(tmp_path)], capsys)
    assert "600 steps, 40 starting angles, frictions 0, 1" in out
    assert "friction 0: " in out and "friction 1: " in out
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        assert not list(tmp_path.iterdir())
        return
    assert (tmp_path / "rigid_body_discontinuity_scan.png").stat().st_size > 0
