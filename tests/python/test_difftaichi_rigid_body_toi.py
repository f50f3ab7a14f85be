"""examples/difftaichi/rigid_body_toi.py (DiffTaichi's bouncing ball, naive and with time of
impact) at DiffTaichi's own size -- one ball, 204 steps, already small: the forward against a
float64 numpy transcription of advance_toi / advance_no_toi / compute_loss, the gradient against
central differences of that transcription (f32 and f64), a replayed (graph) evaluation against a
launched one, and DiffTaichi's scan (its result: the naive gradient +1, the one with time of
impact -1, the loss's slope over the scan -1). DiffTaichi has no optimiser for this program, so
there is no training to test."""

import numpy as np
import pytest

import vkad
from difftaichi_checks import assert_graph_and_step_loop_in_the_first, dtypes, load_example

rbt = load_example("rigid_body_toi")
STEPS = rbt.STEPS
# Starting offsets for the comparisons: DiffTaichi's scan points dy = 0.02 k put the impact
# exactly on a step boundary (the ball falls 0.004 a step, 0.4 + 0.02 k to the ground), where the
# naive kernel's `y < ground` is decided by rounding and the f32 and f64 runs may bounce a step
# apart (0.008 in the loss). Half a step off (dy = 0.02 k + 0.002) every test is decided with a
# margin of 0.002 in y, ~10^4 times the f32 rounding of the positions.
DYS = (0.002, 0.102, 0.202, 0.262)


def reference(init_x, init_v, toi, steps=STEPS):
    """DiffTaichi's forward in float64 numpy: (x, v, loss)."""
    dt, ground = rbt.DT, rbt.GROUND_HEIGHT
    x, v = np.zeros((steps, 2)), np.zeros((steps, 2))
    x[0], v[0] = init_x, init_v
    for t in range(1, steps):
        old_x, old_v = x[t - 1], v[t - 1]
        new_v = old_v.copy()
        if toi:
            impact = 0.0
            if old_x[1] + dt * old_v[1] < ground and old_v[1] < 0:
                new_v[1] = -new_v[1]
                impact = -(old_x[1] - ground) / old_v[1]
            x[t] = old_x + impact * old_v + (dt - impact) * new_v
        else:
            if old_x[1] < ground and new_v[1] < 0:
                new_v[1] = -new_v[1]
            x[t] = old_x + dt * new_v
        v[t] = new_v
    return x, v, x[-1, 1]


def _start(dy):
    return np.array([rbt.INIT_X[0], rbt.INIT_X[1] + dy]), np.array(rbt.INIT_V)


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations in the same order; tolerance 1e-12 (~1e4 ulps of the O(1)
    # positions, for a contracted multiply-add here and there). f32: each of the 203 steps adds
    # dt v (~4e-3) to a position below 1, rounding by <= 2^-24 each: <= 203 * 6e-8 = 1.2e-5
    # after the last; the bounce's time of impact is a quotient of such values, good to ~1e-7
    # relative, moving the position by less. Tolerance 2e-5.
    for dtype in dtypes(session):
        for toi in (False, True):
            sim = rbt.RigidBodyTOI(session, dtype=dtype, toi=toi, graph=False)
            for dy in DYS:
                sim.set_start(dy)
                loss = sim.loss()
                x, v, want = reference(*_start(dy), toi)
                assert x[:, 1].min() < rbt.GROUND_HEIGHT + 1e-3 or toi  # naive: it bounced
                assert v[-1, 1] > 0  # the ball bounced before the last step
                tol = 2e-5 if dtype == vkad.f32 else 1e-12
                got = sim.positions()[:, 0]
                np.testing.assert_allclose(got, x, rtol=0, atol=tol, err_msg=f"{dtype} {toi}")
                np.testing.assert_allclose(sim.arrays["v"].numpy()[:, 0], v, rtol=0,
                                           atol=0 if dtype == vkad.f64 else 1e-7)
                assert loss == pytest.approx(want, abs=tol)


def test_gradient_matches_central_differences(session):
    # Central differences of the f64 transcription, d loss / d init_x and d init_v, at h =
    # 1e-6 (the start moves 1e-6, a 2000th of a step's fall: no bounce changes step, so the
    # differenced function is smooth -- with time of impact everywhere, naive within one step).
    # Truncation ~h^2 x the curvature (the loss is linear in the start position, and in the
    # velocity through the quotient toi: < 1e-10), rounding ~1e-16 / h = 1e-10: tolerance 1e-8
    # in f64. In f32 the adjoint runs the 203 steps back with the same roundings as the forward
    # (<= 1.2e-5, above): tolerance 2e-5. The gradients are O(1e-1 .. 1); a dropped time of
    # impact flips d / d y0 from -1 to +1.
    h = 1e-6
    for dtype in dtypes(session):
        for toi in (False, True):
            sim = rbt.RigidBodyTOI(session, dtype=dtype, toi=toi, graph=False)
            for dy in DYS:
                x0, v0 = _start(dy)
                fd = []
                for which in range(4):
                    d = np.zeros(4)
                    d[which] = h
                    plus = reference(x0 + d[:2], v0 + d[2:], toi)[2]
                    minus = reference(x0 - d[:2], v0 - d[2:], toi)[2]
                    fd.append((plus - minus) / (2 * h))
                sim.evaluate(dy)
                g = sim.gradients()
                got = np.concatenate([g["init_x"], g["init_v"]]).astype(np.float64)
                tol = 2e-5 if dtype == vkad.f32 else 1e-8
                np.testing.assert_allclose(got, fd, rtol=0, atol=tol,
                                           err_msg=f"{dtype} toi={toi} dy={dy}")
                assert got[1] == pytest.approx(-1.0 if toi else 1.0, abs=tol)


def test_a_replayed_evaluation_equals_a_launched_one(session):
    # The captured and replayed evaluation (the step loop rolled, the start uploaded before
    # each replay) against every launch made from Python: the same operations, so the same
    # losses and gradients to f32 rounding (1e-6 of O(1) values), over four scan points.
    sims = [rbt.RigidBodyTOI(session, graph=g, loop=g) for g in (True, False)]
    results = [[], []]
    for k, dy in enumerate(DYS):
        for sim, out in zip(sims, results):
            loss = sim.evaluate(dy)
            g = sim.gradients()
            out.append(np.concatenate([[loss], g["init_x"], g["init_v"]]))
        if k == 0:
            session.finish_rework(sims[0]._graph)
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=1e-6)
    assert len({round(float(r[0]), 4) for r in results[1]}) == len(DYS)  # four starts
    assert_graph_and_step_loop_in_the_first(sims)
    # a replay: initialize, the rolled loop, compute_loss and their three adjoints
    before = session.stats()["launches"]
    sims[0].evaluate(DYS[0])
    assert session.stats()["launches"] - before == 6


def test_difftaichis_scan_shows_the_naive_gradient_wrong(session):
    # DiffTaichi's main(): over dy = 0, 0.02, .. 0.28 the loss (the height at the last step)
    # falls with the start, slope -1 (a higher start bounces later, so rises less); the naive
    # gradient says +1 at every point, the one with time of impact -1. The losses are those of
    # the transcription (the scan's points put the impact on a step boundary: with time of
    # impact that does not matter, naive it may bounce a step apart, 0.008: checked with it).
    for toi in (False, True):
        sim = rbt.RigidBodyTOI(session, toi=toi)
        y0, losses, grads = rbt.scan(sim)
        assert len(losses) == 15 and y0[0] == 0.5
        want = [reference(*_start(dy), toi)[2] for dy in sim.offsets]
        np.testing.assert_allclose(losses, want, rtol=0, atol=2e-5 if toi else 8.1e-3)
        slope = np.polyfit(y0, losses, 1)[0]
        assert slope == pytest.approx(-1.0, abs=0.01)
        np.testing.assert_allclose(grads, -1.0 if toi else 1.0, rtol=0, atol=2e-5)
        # iteration() walks the same scan, from its first point
        assert sim.iteration() == pytest.approx(losses[0], abs=1e-6)
        assert sim.iteration() == pytest.approx(losses[1], abs=1e-6)


def test_zoomed_scan_naive_loss_jumps_where_toi_is_continuous(session):
    # DiffTaichi's zoomed plot (`rigid_body_toi.py 1`), over 40 of its points (0.26 .. 0.264,
    # one step's fall, 0.004): naive, the loss rises with slope +1 and drops by ~2 * 0.004 where
    # the bounce moves a step earlier; with time of impact it falls smoothly (slope -1).
    zoom = rbt.offsets(zoom=True)
    assert len(zoom) == 400 and zoom[0] == 0.26
    for toi in (False, True):
        sim = rbt.RigidBodyTOI(session, toi=toi)
        sim.offsets = zoom[:41]
        losses = np.array(rbt.scan(sim)[1])
        steps = np.diff(losses)
        if toi:
            np.testing.assert_allclose(steps, -1e-4, rtol=0, atol=2e-6)
        else:
            jumps = steps < -1e-3
            assert 1 <= jumps.sum() <= 2, steps
            np.testing.assert_allclose(steps[~jumps], 1e-4, rtol=0, atol=2e-6)
            np.testing.assert_allclose(steps[jumps], 1e-4 - 0.008, rtol=0, atol=1e-4)


def test_main_runs_and_writes_its_plot(tmp_path, capsys):
    assert rbt.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "204 steps, 15 starting heights" in out
    assert "naive: " in out and "+TOI : " in out
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        assert not list(tmp_path.iterdir())
        return
    assert (tmp_path / "rigid_body_toi_scan.png").stat().st_size > 0
