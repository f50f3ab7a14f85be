"""examples/difftaichi/electric.py (DiffTaichi's electric on vkad) at a small size: the forward
against a float64 numpy transcription of DiffTaichi's nn1 / nn2 / advance / compute_loss, the
gradient of the loss w.r.t. a few controller weights against central differences of that
transcription, a replayed (graph) iteration against a launched one, and training lowering the
loss."""
import math
import random

import numpy as np
import pytest

import vkad
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               assert_main_graph_equals_launches, assert_plots, dtypes,
                               load_example, replayed_and_launched)

electric = load_example("electric")

# 96 steps in 3 segments of 32 (DiffTaichi's: 512 in 2 of 256), the full controller
STEPS = 96
SEG_SIZE = 32


def reference(w, goal, goal_v, steps=STEPS):
    """DiffTaichi's step loop in float64 numpy, nn1 reading the state advance starts from
    (x[t - 1], v[t - 1], the port's one change): (x, gravitation, loss)."""
    pos = np.array(electric.GRAVITATION_POSITION)
    x, v = np.zeros((steps, 2)), np.zeros((steps, 2))
    q = np.zeros((steps, electric.N_GRAVITATION))
    x[0] = goal[0]
    dt, loss = electric.DT, 0.0
    for t in range(1, steps):
        inputs = np.concatenate([x[t - 1] - 0.5, v[t - 1], goal[t] - 0.5, goal_v[t] - 0.5])
        hidden = np.tanh(inputs @ w["weight1"] + w["bias1"])  # nn1(t)
        q[t] = np.tanh(hidden @ w["weight2"] + w["bias2"])  # nn2(t)
        r = x[t - 1] - pos  # advance(t)
        len_r = np.maximum(np.sqrt(np.sum(r * r, axis=1)), 0.1)
        force = np.sum((electric.K * q[t] / len_r ** 3)[:, None] * r, axis=0)
        v[t] = v[t - 1] * math.exp(-dt * electric.DAMPING) + dt * force
        x[t] = x[t - 1] + dt * v[t]
        loss += dt * np.sum((x[t] - goal[t]) ** 2)  # compute_loss(t)
    return x, q, loss


def _sim(session, dtype=vkad.f32, **kw):
    kw.setdefault("steps", STEPS)
    kw.setdefault("seg_size", SEG_SIZE)
    return electric.Electric(session, dtype=dtype, **kw)


def test_the_goal_path_is_difftaichis():
    # DiffTaichi's initialize(): straight segments through random points in [0.2, 0.8]^2,
    # goal_v the segment's direction; the same random stream draws the same path.
    goal, goal_v = electric.task(random.Random(3), STEPS, SEG_SIZE)
    rng = random.Random(3)
    points = np.array([[0.2 + rng.random() * 0.6, 0.2 + rng.random() * 0.6] for _ in range(4)])
    for i in range(3):
        seg = slice(SEG_SIZE * i, SEG_SIZE * (i + 1))
        np.testing.assert_allclose(goal[SEG_SIZE * i], points[i], rtol=0, atol=1e-15)
        np.testing.assert_allclose(goal_v[seg], np.tile(points[i + 1] - points[i], (32, 1)))
        step = np.diff(goal[seg], axis=0)  # a straight line, 1 / seg_size of it per step
        np.testing.assert_allclose(step, np.tile((points[i + 1] - points[i]) / 32, (31, 1)),
                                   rtol=0, atol=1e-14)
    assert np.all((goal >= 0.2) & (goal <= 0.8))


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations, the hidden layer's sums in another order; measured equal to
    # ~1e-16, tolerance 1e-12. f32: the particle moves 2.3e-3 in 95 steps (the charges' force,
    # K = 1e-3, is weak); measured 3.2e-7 off in position (1.4e-4 of that motion), 1.2e-7 in
    # the charges and 1.3e-6 relative in the loss; tolerances 2e-6 (1e-3 of the motion), 1e-6
    # and 2e-5.
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        w = sim.weights()
        goal = sim.arrays["goal"].numpy().astype(np.float64)  # the path rounded to the dtype
        goal_v = sim.arrays["goal_v"].numpy().astype(np.float64)
        want_x, want_q, want_loss = reference(w, goal, goal_v)
        assert np.abs(want_x[-1] - want_x[0]).max() > 2e-3  # the particle moved
        loss = sim.loss()
        f32 = dtype == vkad.f32
        np.testing.assert_allclose(sim.positions(), want_x, rtol=0, atol=2e-6 if f32 else 1e-12,
                                   err_msg=str(dtype))
        np.testing.assert_allclose(sim.arrays["gravitation"].numpy(), want_q, rtol=0,
                                   atol=1e-6 if f32 else 1e-12, err_msg=str(dtype))
        assert loss == pytest.approx(want_loss, rel=2e-5 if f32 else 1e-12), dtype


# (array, index) of the weights the gradient test differences: inputs of nn1 from the position
# and the goal, a hidden unit's bias, a charge's weight and bias; and every weight at once, along
# a random direction (the last entry)
PICKS = [("weight1", (0, 3)), ("weight1", (5, 17)), ("weight1", (6, 40)), ("bias1", (9,)),
         ("weight2", (12, 5)), ("weight2", (50, 0)), ("bias2", (2,)), ("bias2", (7,))]


def test_loss_gradient_matches_central_differences(session):
    # The dynamics are smooth (no contact; the particle stays > 0.105 from every electrode, where
    # max(|r|, 0.1) would kink): central differences of the f64 transcription at h = 1e-5 err
    # by truncation ~h^2 and rounding ~1e-16 / h (measured against vkad's f64 gradient: 9e-10
    # of the largest of the nine, 0.024). Tolerance 1e-8 of the largest in f64; in f32 (the
    # adjoint of 95 steps in f32, measured 8e-7, per entry <= 6e-6 relative) 2e-5. A wrong
    # adjoint (a dropped force term, the loss's factor dt, the damping) is off by O(1e-1 .. 1).
    h = 1e-5
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        w0 = sim.weights()
        goal, goal_v = (sim.arrays[n].numpy().astype(np.float64) for n in ("goal", "goal_v"))
        x = reference(w0, goal, goal_v)[0]
        r = x[:, None] - np.array(electric.GRAVITATION_POSITION)[None]
        assert np.sqrt(np.sum(r * r, axis=-1)).min() > 0.105  # 0.109 here
        fd = []
        for name, idx in PICKS:
            d = 0.0
            for sign in (1, -1):
                w = {k: a.copy() for k, a in w0.items()}
                w[name][idx] += sign * h
                d += sign * reference(w, goal, goal_v)[2]
            fd.append(d / (2 * h))
        direction = {k: np.random.RandomState(1).randn(*a.shape) for k, a in w0.items()}
        fd.append((reference({k: a + h * direction[k] for k, a in w0.items()}, goal, goal_v)[2]
                   - reference({k: a - h * direction[k] for k, a in w0.items()}, goal,
                               goal_v)[2]) / (2 * h))
        fd = np.array(fd)
        scale = np.abs(fd).max()
        assert np.abs(fd).min() > 5e-3 * scale, fd  # each picked weight matters
        sim.forward_backward()
        g = sim.gradients()
        got = np.array([g[name][idx] for name, idx in PICKS]
                       + [sum(np.sum(g[k] * direction[k]) for k in w0)], np.float64)
        tol = (2e-5 if dtype == vkad.f32 else 1e-8) * scale
        np.testing.assert_allclose(got, fd, rtol=0, atol=tol, err_msg=str(dtype))


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop, rolled; a new
    # goal path drawn before each; the update on the device) against every launch made from
    # Python: the same seed draws the same weights and paths, the same arithmetic gives the
    # same losses, gradients and updated weights to f32 rounding.
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    assert len(set(np.round(losses[1], 6))) == 3  # three paths, three losses
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol=1e-6)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol_of_max=1e-5)
    assert_graph_and_step_loop_in_the_first(sims)
    # a replay: initialize, the rolled loop, its adjoint, apply_grad
    before = session.stats()["launches"]
    sims[0].iteration()
    assert session.stats()["launches"] - before == 4


def test_training_lowers_the_loss(session):
    # DiffTaichi's update (rate 2e-2) on one goal path (same_task): each of six iterations
    # lowers the loss (by ~0.6% each: 0.1529 -> 0.1475 measured after six), and the update is
    # w -= 2e-2 dL/dw to f32 rounding.
    sim = _sim(session, same_task=True)
    first = sim.loss()
    w0 = sim.weights()
    losses = [sim.iteration()]
    g = sim.gradients()
    w1 = sim.weights()
    for p in electric.Electric.PARAMS:
        want = w0[p] - electric.LEARNING_RATE * g[p].astype(np.float64)
        np.testing.assert_allclose(w1[p], want, rtol=0, atol=1e-7)
    losses += [sim.iteration() for _ in range(5)]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < 0.98 * first, (first, losses)


def test_main_runs_writes_plots_and_its_graph_equals_launches(tmp_path, capsys):
    # over three goal paths
    args = ["--iters", "3", "--steps", "48", "--seg-size", "16", "--out", str(tmp_path)]
    out = assert_main_graph_equals_launches(electric.main, args, capsys)
    assert "48 steps, 3 iterations" in out
    assert_plots(tmp_path, "electric")
