"""examples/difftaichi/billiards.py (DiffTaichi's billiards on vkad) at a small size: the forward
against a float64 numpy transcription of DiffTaichi's collide / advance / compute_loss (the same
collisions), the gradient of the loss w.r.t. the cue ball's init_x and init_v against central
differences of that transcription where no collision switches step within the difference, a
replayed (graph) iteration against a launched one, and training lowering the loss."""

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               assert_main_graph_equals_launches, assert_plots, dtypes,
                               load_example, replayed_and_launched, run_main)

billiards = load_example("billiards")

# 3 layers (7 balls; DiffTaichi's: 4, 11 balls) and 320 steps (DiffTaichi's: 1024), the cue ball
# 0.2 closer to the rack than DiffTaichi's (0.3, 0.5), at its velocity (0.3, 0): it reaches the
# rack at step 155, and seven collisions (cue -> 1 -> 2 -> 4, 1 -> 3 -> 5, 3 -> 6 the target at
# step 246, the cue again) move the target ball for the last 73 steps.
LAYERS = 3
STEPS = 320
INIT_X = (0.3, 0.5)
INIT_V = (0.3, 0.0)


def reference(init_x, init_v, layers=LAYERS, steps=STEPS, events=None):
    """DiffTaichi's initialize, collide(t - 1) / advance(t) for t = 1 .. steps - 1 and
    compute_loss in float64 numpy, every pair (i, j), i != j, at once: (x, v, loss). `events`,
    a list, gets (t, i, j) for every pair that collides in collide(t)."""
    n = billiards.n_balls(layers)
    r, dt, e = billiards.RADIUS, billiards.DT, billiards.ELASTICITY
    x = np.zeros((steps, n, 2))
    v = np.zeros((steps, n, 2))
    x[0, 1:] = billiards.rack(layers)
    x[0, 0], v[0, 0] = init_x, init_v
    other = ~np.eye(n, dtype=bool)
    for t in range(1, steps):
        s = t - 1  # collide(t - 1)
        ahead = x[s] + dt * v[s]
        dist = ahead[:, None] - ahead[None, :]  # [i, j]: ball i's position minus ball j's
        dist_norm = np.sqrt(np.sum(dist * dist, axis=-1))
        close = other & (dist_norm < 2 * r)
        direction = dist / np.where(close, dist_norm, 1.0)[..., None]
        projected_v = np.sum(direction * (v[s][:, None] - v[s][None, :]), axis=-1)
        hit = close & (projected_v < 0)
        imp = np.where(hit[..., None], -(1 + e) * 0.5 * projected_v[..., None] * direction, 0.0)
        toi = (dist_norm - 2 * r) / np.minimum(-1e-3, projected_v)
        x_inc = np.where(hit[..., None], np.minimum(toi - dt, 0.0)[..., None] * imp, 0.0)
        if events is not None:
            events.extend((s, int(i), int(j)) for i, j in zip(*np.nonzero(hit)))
        v[t] = v[t - 1] + imp.sum(axis=1)  # advance(t)
        x[t] = x[t - 1] + dt * v[t] + x_inc.sum(axis=1)
    goal = np.array(billiards.GOAL)
    return x, v, float(np.sum((x[steps - 1, n - 1] - goal) ** 2))


def _sim(session, dtype=vkad.f32, **kw):
    kw.setdefault("steps", STEPS)
    kw.setdefault("layers", LAYERS)
    kw.setdefault("init_x", INIT_X)
    kw.setdefault("init_v", INIT_V)
    return billiards.Billiards(session, dtype=dtype, **kw)


def test_the_reduced_scene_has_its_collisions():
    events = []
    x, _, loss = reference(INIT_X, INIT_V, events=events)
    pairs = sorted({(t, min(i, j), max(i, j)) for t, i, j in events})
    assert [p[1:] for p in pairs] == [(0, 1), (1, 2), (2, 4), (1, 3), (3, 5), (3, 6), (0, 1)]
    assert len(events) == 2 * len(pairs)  # each pair seen from both balls
    assert np.abs(x[STEPS - 1, -1] - x[0, -1]).max() > 5e-3  # the target ball moved
    assert loss == pytest.approx(0.100784233729318, rel=1e-12)


def test_forward_matches_a_float64_transcription(session):
    # The same collisions in f32 and f64 (the scene has none within ~1e-4 of switching step,
    # the test below). Between collisions a ball moves linearly and its rounding is carried;
    # a collision scales it by O(1). f32: positions measured 3.2e-6 off (~319 steps x 1e-8 of
    # rounding each, through 7 collisions), tolerance 3e-5; the loss (0.10) rel 4e-6, tolerance
    # 5e-5. f64: the same operations in the same order (the pair sums too: zeros and one or two
    # contributions), measured equal to the last bit; tolerance 1e-12.
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        w = sim.weights()  # the f32 run starts from INIT_X / INIT_V rounded to f32
        want_x, want_v, want_loss = reference(w["init_x"], w["init_v"])
        loss = sim.loss()
        f32 = dtype == vkad.f32
        np.testing.assert_allclose(sim.positions(), want_x, rtol=0, atol=3e-5 if f32 else 1e-12,
                                   err_msg=str(dtype))
        np.testing.assert_allclose(sim.arrays["v"].numpy(), want_v, rtol=0,
                                   atol=3e-5 if f32 else 1e-12, err_msg=str(dtype))
        assert loss == pytest.approx(want_loss, rel=5e-5 if f32 else 1e-12), dtype


def test_forward_at_difftaichis_size(session):
    # DiffTaichi's scene as it is (11 balls, 1024 steps, its init_x and init_v): 14
    # collisions; the first iteration's loss. f32 measured 1.2e-5 off in position, 5e-5 in the
    # loss (0.045); f64 equal to the last bit.
    events = []
    want_x, _, want_loss = reference(billiards.INIT_X, billiards.INIT_V, billiards.BILLIARD_LAYERS,
                                     billiards.STEPS, events)
    assert len(events) == 2 * 14
    assert want_loss == pytest.approx(0.045415852505606556, rel=1e-12)
    for dtype in dtypes(session):
        sim = billiards.Billiards(session, dtype=dtype, graph=False)
        assert sim.n_balls == 11 and sim.steps == 1024
        loss = sim.loss()
        f32 = dtype == vkad.f32
        np.testing.assert_allclose(sim.positions(), want_x, rtol=0, atol=1e-4 if f32 else 1e-12,
                                   err_msg=str(dtype))
        assert loss == pytest.approx(want_loss, rel=5e-4 if f32 else 1e-12), dtype


def test_loss_gradient_matches_central_differences(session):
    # The loss is smooth where no collision moves to another step: within +-h every
    # perturbed run has the same collisions at the same steps as the unperturbed one (checked
    # here: at h = 1e-4 some already move by a step; at 1e-5 and 1e-6 none do). Central
    # differences of the f64 transcription at h = 1e-6 then err by truncation (measured 5.6e-8
    # of the largest gradient at h = 1e-5, so ~6e-10 at 1e-6) and rounding (~1e-14 of the loss
    # after 319 steps and 7 collisions, / 2h: measured <= 4e-9 of the largest gradient, 0.63).
    # vkad's f64 gradient: tolerance 1e-7 of the largest (25x the measured 3.8e-9). Its f32
    # gradient runs the adjoints of 319 steps in f32: measured <= 1.3e-5 of the largest;
    # tolerance 2e-4. A wrong adjoint (a dropped time-of-impact term, a missed pair) is off by
    # O(1e-2 .. 1) of the gradient.
    h = 1e-6
    p0 = np.array(INIT_X + INIT_V, np.float64)
    events0 = []
    reference(p0[:2], p0[2:], events=events0)
    fd = []
    for k in range(4):
        d = 0.0
        for sign in (1, -1):
            p = p0.copy()
            p[k] += sign * h
            events = []
            d += sign * reference(p[:2], p[2:], events=events)[2]
            assert events == events0, (k, sign)  # no collision switches step
        fd.append(d / (2 * h))
    fd = np.array(fd)
    scale = np.abs(fd).max()
    assert np.abs(fd).min() > 0.2 * scale  # all four are there (0.22 .. 0.63)
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        sim.forward_backward()
        g = sim.gradients()
        got = np.concatenate([g["init_x"], g["init_v"]]).astype(np.float64)
        tol = (2e-4 if dtype == vkad.f32 else 1e-7) * scale
        np.testing.assert_allclose(got, fd, rtol=0, atol=tol, err_msg=str(dtype))


def test_loss_gradient_at_difftaichis_size(session):
    # DiffTaichi's scene: its first iteration's gradient. The loss depends on the target
    # ball's path alone, which is fixed by the collisions up to the target's last one (step
    # 560; after it the target moves in a straight line): those stay at their steps within
    # +-h (checked). One later collision (balls 2 and 4, step 1012) moves a step at -h in
    # init_x[0] and init_v[0]; it does not reach the target. f32 only (the f64 rolled adjoint
    # of 1023 steps passes lavapipe's loop limit, see the example's docstring): measured <= 8e-5
    # of the largest gradient (1.28), through 14 collisions; tolerance 1e-3.
    h = 1e-6
    layers, steps = billiards.BILLIARD_LAYERS, billiards.STEPS
    target = billiards.n_balls(layers) - 1

    def run(p):
        events = []
        loss = reference(p[:2], p[2:], layers, steps, events)[2]
        last = max(t for t, i, j in events if target in (i, j))
        return loss, [e for e in events if e[0] <= last]

    p0 = np.array(billiards.INIT_X + billiards.INIT_V, np.float64)
    events0 = run(p0)[1]
    assert len(events0) == 2 * 11  # 11 collisions up to the target's, at step 560
    fd = []
    for k in range(4):
        d = 0.0
        for sign in (1, -1):
            p = p0.copy()
            p[k] += sign * h
            loss, events = run(p)
            assert events == events0, (k, sign)
            d += sign * loss
        fd.append(d / (2 * h))
    fd = np.array(fd)
    sim = billiards.Billiards(session, graph=False)
    sim.forward_backward()
    g = sim.gradients()
    got = np.concatenate([g["init_x"], g["init_v"]]).astype(np.float64)
    np.testing.assert_allclose(got, fd, rtol=0, atol=1e-3 * np.abs(fd).max())


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (the step loop through Session.loop, rolled; the
    # update on the device) against every launch made from Python: the same arithmetic, so
    # the losses, gradients and updated init_x / init_v agree to f32 rounding.
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol=1e-6)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol=1e-5)
    assert_graph_and_step_loop_in_the_first(sims)
    # a replay: initialize, the rolled loop, compute_loss, their three adjoints, apply_grad
    before = session.stats()["launches"]
    sims[0].iteration()
    assert session.stats()["launches"] - before == 7


def test_training_lowers_the_loss(session):
    # DiffTaichi's update (rate 0.01): here each of five iterations lowers the loss (0.1008 ->
    # 0.0875 measured), and the update is init -= 0.01 dL/dinit to f32 rounding (~3e-8 at 0.3).
    sim = _sim(session)
    first = sim.loss()
    w0 = sim.weights()
    losses = [sim.iteration()]
    g = sim.gradients()
    w1 = sim.weights()
    for p in billiards.Billiards.PARAMS:
        np.testing.assert_allclose(w1[p], w0[p] - billiards.LEARNING_RATE * g[p].astype(np.float64),
                                   rtol=0, atol=1e-7)
    losses += [sim.iteration() for _ in range(4)]
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < 0.9 * first, (first, losses)


def test_main_runs_and_writes_plots(tmp_path, capsys):
    args = ["--iters", "2", "--steps", "40", "--layers", "2", "--out", str(tmp_path)]
    out = run_main(billiards.main, args, capsys)
    assert "4 balls, 40 steps, 2 iterations" in out
    assert "loss " in out
    assert_plots(tmp_path, "billiards")


@pytest.mark.parametrize("f64", [False, True], ids=["f32", "f64"])
def test_main_with_its_graph_and_loop_equals_launches(session, f64, tmp_path, capsys):
    # in f64 the captured backward seeds the f64 loss gradient with 1.0 (a fill whose 8-byte
    # halves differ)
    if f64 and not f64_ok(session):
        pytest.skip("the device has no f64")
    # One layer (the cue and the target) and 400 steps: DiffTaichi's cue reaches the target at
    # step 377, so the losses printed move (0.209, 0.197, 0.185, then 0.173).
    args = ["--iters", "3", "--steps", "400", "--layers", "1", "--out", str(tmp_path)]
    assert_main_graph_equals_launches(billiards.main, args + (["--f64"] if f64 else []), capsys)
