"""examples/difftaichi/mass_spring_simple.py (DiffTaichi's three masses and springs learning rest
lengths) at DiffTaichi's own size, already small (3 masses, 1024 steps, ~5 ms an iteration on
lavapipe): the forward against a float64 numpy transcription of apply_spring_force /
time_integrate / compute_loss, the gradient against central differences of that transcription
(f32 and f64), a replayed (graph) iteration against a launched one, and training lowering the
loss."""
import math

import numpy as np
import pytest

import vkad
from difftaichi_checks import (assert_close_by_name, assert_graph_and_step_loop_in_the_first,
                               assert_plots, dtypes, load_example, loss_line,
                               replayed_and_launched, run_main)

mss = load_example("mass_spring_simple")
STEPS = mss.STEPS
REST = np.array([r for _, _, r in mss.SPRINGS])
# Rest lengths two of DiffTaichi's updates away from its start (measured on the transcription):
# the triangle then grows, mass 2 crosses x = 0.4 moving right, and the friction projection acts
# at every step -- the branch DiffTaichi's start (springs at rest, nothing moving) never takes.
TRAINED = REST + np.array([0.0595, 0.0508, 0.0237])


def reference(lengths, steps=STEPS):
    """DiffTaichi's forward in float64 numpy: (x, v, loss, steps at which the friction
    projection acted on some mass)."""
    x, v = np.zeros((steps, 3, 2)), np.zeros((steps, 3, 2))
    x[0] = mss.OBJECTS
    projected = 0
    for t in range(1, steps):
        force = np.zeros((3, 2))
        for k, (a, b, _) in enumerate(mss.SPRINGS):  # apply_spring_force(t)
            d = x[t - 1, a] - x[t - 1, b]
            stretched = math.sqrt(d @ d) + 1e-4
            f = (stretched - lengths[k]) * mss.SPRING_STIFFNESS * d / stretched
            force[a] -= f
            force[b] += f
        for i in range(3):  # time_integrate(t)
            vel = math.exp(-mss.DT * mss.DAMPING) * v[t - 1, i] + mss.DT * force[i] / mss.MASS
            pos = x[t - 1, i] + mss.DT * vel
            if pos[0] > 0.4 and vel[0] > 0:
                projected += 1
                if vel[1] > 0:
                    vel[1] -= min(vel[1], mss.FRICTION * vel[0])
                if vel[1] < 0:
                    vel[1] += min(-vel[1], mss.FRICTION * vel[0])
                vel[0] = 0.0
            v[t, i], x[t, i] = vel, pos
    e1, e2 = x[-1, 0] - x[-1, 1], x[-1, 0] - x[-1, 2]
    area = abs(0.5 * (e1[0] * e2[1] - e1[1] * e2[0]))
    return x, v, (area - mss.TARGET_AREA) ** 2, projected


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations (the springs' atomic adds in another order: ~1e-17); tolerance
    # 1e-13 on positions < 1. f32: 1023 steps each add dt v to a position below 1 (rounding <=
    # 2^-24 = 6e-8 each, <= 6e-5 in all); measured 3.4e-6 in the positions and the velocities
    # (the springs' stiff forces pass a position's error on to the velocity), 1e-6 relative in
    # the loss. Tolerance 1e-5 on both and 1e-4 relative on the loss, whose area is a
    # difference of products of positions ~0.1 apart (an error of 1e-5 in a position moves it by
    # ~1e-6 of ~0.005, and (area - 0.1)^2 doubles that relatively: ~5e-5).
    for dtype in dtypes(session):
        sim = mss.MassSpringSimple(session, dtype=dtype, graph=False)
        for lengths in (REST, TRAINED):
            sim.set_weights({"spring_length": lengths})
            loss = sim.loss()
            x, v, want, projected = reference(sim.weights()["spring_length"])
            assert projected == (0 if lengths is REST else STEPS - 1)
            f32 = dtype == vkad.f32
            np.testing.assert_allclose(sim.positions(), x, rtol=0, atol=1e-5 if f32 else 1e-13,
                                       err_msg=str(dtype))
            np.testing.assert_allclose(sim.arrays["v"].numpy(), v, rtol=0,
                                       atol=1e-5 if f32 else 1e-12, err_msg=str(dtype))
            assert loss == pytest.approx(want, rel=1e-4 if f32 else 1e-11), dtype


def test_loss_gradient_matches_central_differences(session):
    # Central differences of the f64 transcription at h = 1e-6: the loss is smooth in the rest
    # lengths except where the friction branch flips at some step; at both points no step's
    # branch changes within +-h (checked: the projection count is the same at both ends).
    # Truncation ~h^2 * the third derivative (~1e-1 here: 1e-13); rounding: the transcription's
    # positions carry ~1023 * 5e-17 = 5e-14 after the last step, the area ~0.1 of that, the loss
    # 2 |area - 0.1| = 0.19 of that: ~1e-15 / (2 h) = 5e-10 at most, ~1e-11 measured (2e-9 of the
    # largest gradient, ~6e-3); tolerance 1e-8 of the largest in f64. In
    # f32 the adjoint of 1023 steps rounds as the forward does, relative ~1e-4 of the loss's
    # terms (above) -- measured 2e-5 of the largest; tolerance 5e-4 of it. A dropped term (a
    # spring's force on one end, the projection's velocity) is off by O(1) of it.
    h = 1e-6
    for dtype in dtypes(session):
        sim = mss.MassSpringSimple(session, dtype=dtype, graph=False)
        for lengths in (REST, TRAINED):
            sim.set_weights({"spring_length": lengths})
            at = sim.weights()["spring_length"]
            fd = []
            for k in range(3):
                d = np.zeros(3)
                d[k] = h
                plus, minus = reference(at + d), reference(at - d)
                assert plus[3] == minus[3] == reference(at)[3]  # no branch flips within h
                fd.append((plus[2] - minus[2]) / (2 * h))
            fd = np.array(fd)
            sim.forward_backward()
            got = sim.gradients()["spring_length"].astype(np.float64)
            scale = np.abs(fd).max()
            assert np.abs(fd).min() > 0.2 * scale  # every spring matters
            tol = (5e-4 if dtype == vkad.f32 else 1e-8) * scale
            np.testing.assert_allclose(got, fd, rtol=0, atol=tol, err_msg=f"{dtype} {lengths}")


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (force zeroed, the step loop rolled, the update on the
    # device) against every launch made from Python: the same operations give the same losses,
    # gradients and rest lengths to f32 rounding (1e-6 relative), over three iterations that
    # change the lengths.
    sims = [mss.MassSpringSimple(session, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    assert losses[1][2] < losses[1][0]  # the updates changed the lengths
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol=1e-6)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol_of_max=1e-4)
    assert_graph_and_step_loop_in_the_first(sims)
    # a replay: the rolled loop, compute_loss, their adjoints and apply_grad
    before = session.stats()["launches"]
    sims[0].iteration()
    assert session.stats()["launches"] - before == 5


def test_training_lowers_the_loss(session):
    # DiffTaichi's update (rate 5), 8 of its 25 iterations: each lowers the loss (measured
    # 0.00903 -> ~0.0067), and the update is length -= 5 dL/dlength to f32 rounding (the
    # lengths ~0.1, their ulp 7e-9).
    sim = mss.MassSpringSimple(session)
    first = sim.loss()
    w0 = sim.weights()["spring_length"]
    losses = [sim.iteration()]
    g = sim.gradients()["spring_length"].astype(np.float64)
    np.testing.assert_allclose(sim.weights()["spring_length"], w0 - mss.LEARNING_RATE * g,
                               rtol=0, atol=1e-7)
    losses += [sim.iteration() for _ in range(7)]
    assert losses[0] == pytest.approx(first, rel=1e-6)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < 0.8 * first, (first, losses)


def test_main_runs_and_writes_plots(tmp_path, capsys):
    # DiffTaichi's 25 iterations at its size: the loss falls by two orders of magnitude
    # (measured 0.00903 -> 3.0e-5).
    out = run_main(mss.main, ["--out", str(tmp_path)], capsys)
    assert "1024 steps, 25 iterations" in out
    line = loss_line(out)
    first, final = (float(s) for s in line.split(";")[0][5:].split(" -> "))
    assert final < 0.01 * first, line
    assert_plots(tmp_path, "mass_spring_simple")
