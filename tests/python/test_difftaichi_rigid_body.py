"""examples/difftaichi/rigid_body.py (DiffTaichi's rigid_body on vkad) at a small size: the
forward against a float64 numpy transcription of DiffTaichi's nn1 / nn2 / collide /
apply_spring_force / advance_toi / compute_loss (robot A, its legs reaching the ground), the
gradient of the loss w.r.t. a few controller weights against central differences of that
transcription (in f64: contacts make f32 runs part), a replayed (graph) iteration against a
launched one, and training lowering the loss."""
import math

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               assert_main_graph_equals_launches, assert_plots, load_example,
                               replayed_and_launched)

rb = load_example("rigid_body")

STEPS = 200  # DiffTaichi's: 2048. Robot A's feet reach the ground at step ~80.


def reference(w, robot_id=0, steps=STEPS, toi=True, contacts=None):
    """DiffTaichi's step loop in float64 numpy, box by box and corner by corner: (x, loss).
    `contacts`, a list, gets (t, box, corner) for every corner with a ground impulse."""
    objects, springs, head = rb.robot(robot_id)
    n, dt = len(objects), rb.DT
    hs = np.array([o[1] for o in objects])
    inv_m = 1.0 / (4 * hs[:, 0] * hs[:, 1])
    inv_i = 1.0 / (4 / 3 * hs[:, 0] * hs[:, 1] * (hs[:, 0] ** 2 + hs[:, 1] ** 2))
    x, v = np.zeros((steps, n, 2)), np.zeros((steps, n, 2))
    rot, omega = np.zeros((steps, n)), np.zeros((steps, n))
    x[0] = [o[0] for o in objects]
    rot[0] = [o[2] for o in objects]
    x_inc, v_inc = np.zeros((steps, n, 2)), np.zeros((steps, n, 2))
    rot_inc, omega_inc = np.zeros((steps, n)), np.zeros((steps, n))
    cross = lambda a, b: a[0] * b[1] - a[1] * b[0]  # noqa: E731

    def to_world(t, i, rela):
        c, s = math.cos(rot[t, i]), math.sin(rot[t, i])
        rp = np.array([[c, -s], [s, c]]) @ rela
        return x[t, i] + rp, v[t, i] + omega[t, i] * np.array([-rp[1], rp[0]]), rp

    def apply_impulse(t, i, imp, loc, toi_in):
        dv, dw = imp * inv_m[i], cross(loc - x[t, i], imp) * inv_i[i]
        toi_ = min(max(0.0, toi_in), dt)
        x_inc[t + 1, i] -= toi_ * dv
        rot_inc[t + 1, i] -= toi_ * dw
        v_inc[t + 1, i] += dv
        omega_inc[t + 1, i] += dw

    goal = np.array(rb.GOAL)
    for t in range(1, steps):
        s = t - 1
        inputs = [math.sin(rb.SPRING_OMEGA * s * dt + 2 * math.pi / rb.N_SIN_WAVES * j)
                  for j in range(rb.N_SIN_WAVES)]
        for j in range(n):
            inputs += list((x[s, j] - x[s, head]) * 0.05) + list(v[s, j] * 0.05)
            inputs += [rot[s, j] * 0.05, omega[s, j] * 0.05]
        hidden = np.tanh(w["weights1"] @ np.array(inputs + list(goal)) + w["bias1"])  # nn1
        act = np.tanh(w["weights2"] @ hidden + w["bias2"])  # nn2
        for i in range(n):  # collide
            for k in range(4):
                scale = np.array([k % 2 * 2 - 1.0, k // 2 % 2 * 2 - 1.0])
                cx, cv, rp = to_world(s, i, scale * hs[i])
                cv = cv + dt * rb.GRAVITY * np.array([0.0, 1.0])
                ic = inv_m[i] + cross(rp, [0.0, 1.0]) ** 2 * inv_i[i]
                tc = inv_m[i] + cross(rp, [1.0, 0.0]) ** 2 * inv_i[i]
                imp, timp, toi_ = 0.0, 0.0, 0.0
                new_cx = cx + dt * cv
                if cv[1] < 0 and new_cx[1] < rb.GROUND_HEIGHT:
                    imp = -(1 + rb.ELASTICITY) * cv[1] / ic
                    if imp > 0:
                        timp = min(rb.FRICTION * imp, max(-rb.FRICTION * imp, -cv[0] / tc))
                        if cx[1] > rb.GROUND_HEIGHT:
                            toi_ = -(cx[1] - rb.GROUND_HEIGHT) / min(cv[1], -1e-3)
                    if contacts is not None:
                        contacts.append((s, i, k))
                apply_impulse(s, i, np.array([timp, imp]), new_cx, toi_)
                # DiffTaichi's penalty impulse is 0 (its local shadows the constant): left out
        for i, (a, b, oa, ob, length, stiffness, actuation) in enumerate(springs):
            pa, va, ra = to_world(s, a, np.array(oa))
            pb, vb, rbb = to_world(s, b, np.array(ob))
            dist = pa - pb
            ln = np.sqrt(dist @ dist) + 1e-4
            target = 0.0 if length == -1 else length * (1.0 + actuation * act[i])
            impulse = dt * (ln - target) * stiffness / ln * dist
            if length == -1:
                rv = va - vb
                rvn = np.sqrt(rv @ rv) + 1e-1
                d = rv / rvn
                c = inv_m[a] + cross(d, ra) ** 2 * inv_i[a] \
                    + inv_m[b] + cross(d, rbb) ** 2 * inv_i[b]
                impulse = impulse + rvn / c * d
            apply_impulse(s, a, -impulse, pa, 0.0)
            apply_impulse(s, b, impulse, pb, 0.0)
        e = math.exp(-dt * rb.DAMPING)  # advance_toi(t)
        v[t] = e * v[t - 1] + v_inc[t] + dt * rb.GRAVITY * np.array([0.0, 1.0])
        omega[t] = e * omega[t - 1] + omega_inc[t]
        x[t] = x[t - 1] + dt * v[t] + (x_inc[t] if toi else 0.0)
        rot[t] = rot[t - 1] + dt * omega[t] + (rot_inc[t] if toi else 0.0)
    d = x[steps - 1, head] - goal
    return x, float(np.sqrt(d @ d))


def _sim(session, dtype=vkad.f32, **kw):
    kw.setdefault("steps", STEPS)
    return rb.RigidBody(session, dtype=dtype, **kw)


def test_the_robots_are_difftaichis():
    # robot_config.py's robots: boxes, springs (joints have length -1), heads
    for robot_id, n_obj, n_spr, n_joints, head in ((0, 5, 7, 1, 0), (1, 3, 4, 2, 0),
                                                    (2, 7, 12, 6, 3)):
        objects, springs, h = rb.robot(robot_id)
        assert (len(objects), len(springs), h) == (n_obj, n_spr, head)
        assert sum(sp[4] == -1 for sp in springs) == n_joints
        assert all(sp[6] > 0 for sp in springs)  # actuation 0 -> DiffTaichi's default 0.05
    objects, springs, _ = rb.robot(2)
    assert objects[1][2] == pytest.approx(math.radians(10))  # the thighs' angles
    assert springs[1][6] == 0.08 and springs[0][6] == rb.DEFAULT_ACTUATION


def test_forward_matches_a_float64_transcription(session):
    # 558 ground impulses at 6 corners (the four feet's lower corners, from step ~80). f64: the
    # same operations, the impulses summed in another order (atomic adds); measured 1.1e-16 off
    # in position, 2e-16 relative in the loss; tolerance 1e-12. f32: at 200 steps every contact
    # is taken alike (measured 2e-7 off in position, 9e-8 relative in the loss); tolerances
    # 2e-6 and 2e-6. Without the time of impact (advance_no_toi) the positions move 1.4e-3.
    for dtype in [vkad.f32] + ([vkad.f64] if f64_ok(session) else []):
        sim = _sim(session, dtype, graph=False)
        contacts = []
        want_x, want_loss = reference(sim.weights(), contacts=contacts)
        loss = sim.loss()
        f32 = dtype == vkad.f32
        np.testing.assert_allclose(sim.arrays["x"].numpy(), want_x, rtol=0,
                                   atol=2e-6 if f32 else 1e-12, err_msg=str(dtype))
        assert loss == pytest.approx(want_loss, rel=2e-6 if f32 else 1e-12), dtype
    assert len({(i, k) for _, i, k in contacts}) >= 4  # the feet's corners touched the ground
    assert len(contacts) > 2 * 100


# (array, index) of the weights differenced: a sine wave's, a box's offset, a rotation, the
# goal's, a hidden and an actuator's bias (bias2[6], the joint's, has gradient 0); and every
# weight along a random direction (the last entry)
PICKS = [("weights1", (0, 2)), ("weights1", (5, 10 + 6 * 1)), ("weights1", (7, 10 + 6 * 2 + 4)),
         ("weights1", (3, 10 + 6 * 5)), ("bias1", (4,)), ("weights2", (2, 7)), ("bias2", (3,))]


def test_loss_gradient_matches_central_differences(session):
    # In f64 only (contacts: a corner's branch flips with a rounding, so f32 runs part from the
    # f64 one after the feet land). Central differences of the f64 transcription at h = 1e-6
    # (no contact changes step within +-h: checked); vkad's f64 gradient against them: measured
    # <= 3e-8 of the largest (1.7e-3), tolerance 1e-6. A dropped term (the time of impact,
    # friction, a joint's projection) moves the gradient by far more.
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    h = 1e-6
    sim = _sim(session, vkad.f64, graph=False)
    w0 = sim.weights()
    contacts0 = []
    reference(w0, contacts=contacts0)
    direction = {k: np.random.RandomState(1).randn(*a.shape) for k, a in w0.items()}

    def moved(sign, name=None, idx=None):
        w = {k: a.copy() for k, a in w0.items()}
        if name is None:
            w = {k: a + sign * h * direction[k] for k, a in w.items()}
        else:
            w[name][idx] += sign * h
        contacts = []
        loss = reference(w, contacts=contacts)[1]
        assert contacts == contacts0, (name, idx, sign)
        return loss

    fd = [(moved(1, n, i) - moved(-1, n, i)) / (2 * h) for n, i in PICKS]
    fd = np.array(fd + [(moved(1) - moved(-1)) / (2 * h)])
    scale = np.abs(fd).max()
    sim.forward_backward()
    g = sim.gradients()
    got = np.array([g[n][i] for n, i in PICKS] + [sum(np.sum(g[k] * direction[k]) for k in w0)])
    assert np.abs(fd).min() > 0  # each pick matters
    np.testing.assert_allclose(got, fd, rtol=0, atol=1e-6 * scale)


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop) against every
    # launch made from Python, over three iterations with DiffTaichi's update between.
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol=1e-5)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol_of_max=1e-3)
    assert_graph_and_step_loop_in_the_first(sims)


def test_training_lowers_the_loss(session):
    # DiffTaichi's update (the gradient scaled to norm 0.2 at most, rate 1): each of five
    # iterations lowers the loss, the head's distance to the goal.
    sim = _sim(session)
    first = sim.loss()
    losses = [sim.iteration() for _ in range(5)]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < losses[-1]


def test_main_runs_writes_plots_and_its_graph_equals_launches(tmp_path, capsys):
    args = ["--iters", "2", "--steps", "60", "--robot", "1", "--out", str(tmp_path)]
    out = assert_main_graph_equals_launches(rb.main, args, capsys)
    assert "robot 1 (3 boxes, 4 springs), 60 steps, 2 iterations" in out
    assert_plots(tmp_path, "rigid_body")
