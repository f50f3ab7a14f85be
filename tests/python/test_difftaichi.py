"""examples/difftaichi/mass_spring.py (DiffTaichi's mass_spring on vkad), at small sizes: the
gradient of the loss w.r.t. controller weights against central finite differences of the loss,
a replayed (graph) iteration against a launched one, and training lowers the loss."""
import importlib.util
import pathlib

import numpy as np
import pytest

import vkad
from conftest import f64_ok

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "difftaichi" / "mass_spring.py"
_spec = importlib.util.spec_from_file_location("mass_spring", EXAMPLE)
mass_spring = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mass_spring)

STEPS = 40  # 0.16 s of simulated time: the robot falls, lands and its springs work


@pytest.mark.parametrize("toi", [True, False], ids=["toi", "no_toi"])
def test_loss_gradient_matches_finite_differences(session, toi):
    # In f64 (f32 finite differences of a 40-step stiff simulation are too noisy to say much):
    # central differences err by h^2/6 |L'''| (truncation) plus ~eps |L| k / h (rounding; k the
    # amplification of a rounding error through the steps). With |L| ~ 0.2 and h = 1e-6 the
    # rounding term is ~2e-11 k; measured differences are ~1e-10 (k ~ 5), truncation far below.
    # atol 1e-9 leaves 10x margin, rtol 1e-5 covers the larger gradients; the gradients picked
    # are 7e-6 .. 3e-3, each >= 100x atol, so every comparison is tight to 1% or better while a
    # wrong adjoint rule is off by O(1) of the gradient. A perturbation that crossed a contact
    # event (where L has a kink) would fail it; none does at these fixed weights.
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    sim = mass_spring.MassSpring(session, robot_id=0, steps=STEPS, dtype=vkad.f64, toi=toi,
                                 graph=False)
    sim.forward_backward()
    grads = sim.gradients()
    w0 = sim.weights()
    # a sine-wave weight, a centre-offset weight, a goal weight, biases, an output weight
    n_in = sim.n_input
    picks = [("weights1", (0, 0)), ("weights1", (3, mass_spring.N_SIN_WAVES)),
             ("weights1", (7, n_in - 1)), ("bias1", (5,)), ("weights2", (2, 9)),
             ("bias2", (4,))]
    h = 1e-6
    for name, idx in picks:
        fd = 0.0
        for sign in (1, -1):
            w = {k: v.copy() for k, v in w0.items()}
            w[name][idx] += sign * h
            sim.set_weights(w)
            fd += sign * sim.loss()
        fd /= 2 * h
        np.testing.assert_allclose(grads[name][idx], fd, rtol=1e-5, atol=1e-9,
                                   err_msg=f"d loss / d {name}{list(idx)}")
        # a gradient that is there: comparing ~0 with ~0 would prove nothing
        assert abs(grads[name][idx]) > 1e-7, (name, idx)


def test_a_replayed_iteration_equals_a_launched_one(session):
    # Same weights, same iterations: one simulation captures its iteration as a graph and
    # replays it, the other launches every kernel; losses and updated weights agree (float
    # atomics may add in another order, hence a tolerance rather than equality).
    sims = [mass_spring.MassSpring(session, steps=STEPS, graph=g) for g in (True, False)]
    losses = [[sim.iteration() for _ in range(3)] for sim in sims]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    w = [sim.weights() for sim in sims]
    for name in mass_spring.MassSpring.PARAMS:
        np.testing.assert_allclose(w[0][name], w[1][name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert sims[0]._graph is not None and sims[1]._graph is None


def test_training_moves_the_robot_forward(session):
    # The loss is -x of the head mass at the last step. DiffTaichi's update is a step of fixed
    # length 0.2 along the gradient, so single iterations may overshoot; over five the head
    # must end up at least 1 cm further right (the starting weights reach ~0.06 less here).
    sim = mass_spring.MassSpring(session, steps=100)
    first = sim.loss()
    for _ in range(5):
        sim.iteration()
    last = sim.loss()
    assert last < first - 0.01, (first, last)


def test_main_runs_and_writes_plots(tmp_path, capsys):
    assert mass_spring.main(["--iters", "2", "--steps", "20", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "robot 0 (6 masses, 11 springs), 20 steps, 2 iterations" in out
    assert "loss " in out
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        assert not list(tmp_path.iterdir())  # skipped quietly
        return
    assert (tmp_path / "mass_spring_loss.png").stat().st_size > 0
    assert (tmp_path / "mass_spring_final.png").stat().st_size > 0


def test_robots_are_difftaichis():
    # (masses, springs, muscles) of DiffTaichi's mass_spring_robot_config.py robots A-D, counted
    # by running that file (its masses and springs were also compared one by one once).
    for rid, (masses, springs, muscles) in enumerate([(6, 11, 11), (14, 30, 4), (20, 46, 8),
                                                       (26, 61, 11)]):
        objects, sp = mass_spring.robot(rid)
        assert (len(objects), len(sp), sum(1 for s in sp if s[4])) == (masses, springs, muscles)
    with pytest.raises(ValueError, match="robots 0-3"):
        mass_spring.robot(4)
