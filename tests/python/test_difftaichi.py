"""examples/difftaichi/mass_spring.py and diffmpm.py (DiffTaichi's mass_spring and diffmpm on
vkad), at small sizes: the gradient of the loss w.r.t. controller weights against central finite
differences of the loss, a replayed (graph) iteration against a launched one, and training
lowers the loss."""

import numpy as np
import pytest

import vkad
from conftest import f64_ok
from difftaichi_checks import (assert_close_by_name, assert_main_graph_equals_launches,
                               assert_plots, load_example, replayed_and_launched, run_main)

mass_spring = load_example("mass_spring")
diffmpm = load_example("diffmpm")

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
    rolled = session.stats()["rolled_loops"]
    # the example's step loop (Session.loop, rolled) captured, against a Python loop of launches
    sims = [mass_spring.MassSpring(session, steps=STEPS, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    # The step loop and its adjoint ran as resident kernels (docs/graphs.md, "Step loops"), so this
    # compares them with the launches.
    assert session.stats()["rolled_loops"] - rolled == 2
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), rtol=1e-4, atol=1e-5)
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
    out = run_main(mass_spring.main, ["--iters", "2", "--steps", "20", "--out", str(tmp_path)],
                   capsys)
    assert "robot 0 (6 masses, 11 springs), 20 steps, 2 iterations" in out
    assert "loss " in out
    assert_plots(tmp_path, "mass_spring")


@pytest.mark.parametrize("example", ["mass_spring", "diffmpm"])
def test_f64_main_with_its_graph_equals_without(session, example, tmp_path, capsys):
    # --f64 with the default graph: the captured backward seeds the f64 loss gradient with 1.0,
    # a fill whose 8-byte halves differ (once refused: "needs host staging ..., which graph ...
    # cannot capture"). The graph's losses are the launched ones, to the digits printed.
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    mod = mass_spring if example == "mass_spring" else diffmpm
    args = ["--f64", "--iters", "2", "--steps", "12", "--out", str(tmp_path)]
    if example == "diffmpm":
        args += ["--grid", "32"]
    assert_main_graph_equals_launches(mod.main, args, capsys, launched=["--no-graph"])


def test_robots_are_difftaichis():
    # (masses, springs, muscles) of DiffTaichi's mass_spring_robot_config.py robots A-D, counted
    # by running that file (its masses and springs were also compared one by one once).
    for rid, (masses, springs, muscles) in enumerate([(6, 11, 11), (14, 30, 4), (20, 46, 8),
                                                       (26, 61, 11)]):
        objects, sp = mass_spring.robot(rid)
        assert (len(objects), len(sp), sum(1 for s in sp if s[4])) == (masses, springs, muscles)
    with pytest.raises(ValueError, match="robots 0-3"):
        mass_spring.robot(4)


# --- diffmpm -------------------------------------------------------------------------------------

# A 32^2 grid (DiffTaichi's: 128^2) places DiffTaichi's robot with 156 particles (two per cell
# side); 60 steps are 0.06 s of simulated time, enough for the legs' actuation to move the body.
MPM_GRID = 32
MPM_STEPS = 60


@pytest.mark.parametrize("scene,grid", [("robot", MPM_GRID), ("fish", 64)])
def test_diffmpm_loss_gradient_matches_finite_differences(session, scene, grid):
    # In f64, as for mass_spring. Central differences err by h^2/6 |L'''| (truncation) plus
    # ~eps |L| k / h (rounding, k the amplification of a rounding error through the steps).
    # With |L| ~ 0.25 and h = 1e-6 the rounding term is ~6e-11 k; measured differences are
    # <= 1.5e-10 (k ~ 3), truncation far below (h = 1e-4 agrees as well where no kink is near).
    # atol 1e-9 leaves 7x margin; the gradients picked are 9e-5 .. 5e-4, so rtol 1e-5 is the
    # binding bound at about 1% of what a wrong adjoint rule gives (O(1) of the gradient).
    # The loss has kinks where a grid node's velocity changes sign inside the sticky walls (the
    # floor's select): bias[1] of the robot has one within 1e-5 (h = 1e-5 is 4% off there), none
    # within h = 1e-6 at these fixed weights. The fish (grid 64: its thinnest rectangle needs
    # >= 40 cells) runs p2g's fluid branch.
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    sim = diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=grid, dtype=vkad.f64, scene=scene,
                          graph=False)
    sim.forward_backward()
    grads = sim.gradients()
    w0 = sim.weights()
    picks = [("weights", (0, 0)), ("weights", (2, 1)), ("weights", (3, 3)), ("bias", (1,))]
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
                                   err_msg=f"{scene}: d loss / d {name}{list(idx)}")
        assert abs(grads[name][idx]) > 5e-5, (name, idx)  # a gradient that is there


def test_diffmpm_replayed_iteration_equals_a_launched_one(session):
    # As for mass_spring: one simulation replays a captured iteration, the other launches every
    # kernel; the step loop as a Python loop of launches (loop=False), so that the capture's own
    # rework recomputes the gathers (a prepared Session.loop has its plan made ahead). The grid is summed by float atomics (order may differ), hence tolerances: losses
    # ~0.25 to f32 rounding of the sum; the updates are 0.1 x gradients ~1e-3, so a gradient
    # that differs by 1e-3 relative moves a weight by ~1e-7 (atol 1e-6).
    sims = [diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID, graph=g, loop=False)
            for g in (True, False)]
    recomputed = session.stats()["recomputed_launches"]
    losses = replayed_and_launched(session, sims)
    # Gather recompute rewrote the graph (docs/graphs.md, "Gather recompute"): per step g2p computes
    # the grid_op cells it reads, and the adjoint of p2g those of grid_op's adjoint.
    assert session.stats()["recomputed_launches"] - recomputed >= 2 * (MPM_STEPS - 1)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), rtol=1e-3, atol=1e-7)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), rtol=1e-4, atol=1e-6)
    assert sims[0]._graph is not None and sims[1]._graph is None


def test_diffmpm_as_a_step_loop_trains_as_its_python_loop(session):
    # loop=True: the step loop through Session.loop (prepared at construction: the tape's check
    # kept, the graph rework's plan of the loop and of its adjoint made), its reworked launches
    # from C++, captured and replayed; against the Python loop of launches: the same losses and
    # gradients (float atomics: tolerances as above).
    sims = [diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID, loop=lp)
            for lp in (True, False)]
    reworked = session.stats()["reworked_loops"]
    losses = [[sim.iteration() for _ in range(2)] for sim in sims]
    # The first iteration (captured) ran both loops as their plans: the adjoint's relies on the
    # gradients the tape zeroed in the capture (gather recompute of an accumulating producer).
    assert session.stats()["reworked_loops"] - reworked == 2
    assert isinstance(sims[0].tape.launches[0], vkad.LoopRecord)
    assert not isinstance(sims[1].tape.launches[0], vkad.LoopRecord)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    grads = [sim.gradients() for sim in sims]
    for name in diffmpm.DiffMPM.PARAMS:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-3, atol=1e-7,
                                   err_msg=name)


def test_diffmpm_step_loop_launched_eagerly_trains_as_its_python_loop(session):
    # graph=False: every iteration launched, not captured. The prepared loop's plan runs where
    # it assumes nothing (the forward); the adjoint's rests on zeroed gradients, which only a
    # capture's log can show, so it runs its launches one by one. Same results as the Python
    # loop (float atomics: tolerances as above).
    sims = [diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID, graph=False, loop=lp)
            for lp in (True, False)]
    reworked = session.stats()["reworked_loops"]
    losses = [[sim.iteration() for _ in range(2)] for sim in sims]
    assert session.stats()["reworked_loops"] - reworked == 2  # the forward loop, twice
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    grads = [sim.gradients() for sim in sims]
    for name in diffmpm.DiffMPM.PARAMS:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-3, atol=1e-7,
                                   err_msg=name)


def _mpm_full_bytes(sim):
    """What the time-axis version keeps for backward: the particle and grid arrays (their
    gradients as much again, in both versions)."""
    return sum(sim.arrays[k].nbytes for k in ("x", "v", "C", "F", "grid_v_in", "grid_m_in",
                                              "grid_v_out"))


@pytest.mark.parametrize("scene,grid", [("robot", MPM_GRID), ("fish", 64)])
def test_diffmpm_in_a_memory_budget_has_the_time_axis_gradients(session, scene, grid):
    # Issue 57, point 4: one grid cleared every step and two-row particle rings, under a budget
    # of half what the time-axis version keeps (at this size the ring's state is a sixth of
    # it and ~10 levels of it is the least; at 1024 steps and 128^2 cells the least is ~1/60):
    # the same loss and gradients. In f64 both run
    # the same operations on the same values except the grid's atomic sums (order), so they
    # agree to ~1e-12 relative; rtol 1e-9 is far below what a wrong or missing recomputation
    # gives (the gradient of another step's state: O(1) of the gradient).
    if not f64_ok(session):
        pytest.skip("the device has no f64")
    full = diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=grid, dtype=vkad.f64, scene=scene,
                           graph=False, loop=False)
    budget = _mpm_full_bytes(full) // 2
    ring = diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=grid, dtype=vkad.f64, scene=scene,
                           graph=False, memory_budget=budget)
    assert ring.arrays["x"].shape[0] == 2 and ring.arrays["grid_m_in"].shape[0] == 1
    for sim in (full, ring):
        sim.forward_backward()
    plan = ring.tape.checkpoint_plan()
    # four launches a step, the loss, and two grid fills a step after the first (which fill
    # arrays no recorded launch touched yet: plain fills)
    n = MPM_STEPS - 1
    assert plan["peak_bytes"] <= budget and plan["launches"] == 4 * n + 1 + 2 * (n - 1), plan
    assert plan["recompute"] >= 2, plan  # the forward runs again at least once
    assert ring.tape.checkpoint_bytes <= budget
    np.testing.assert_allclose(ring.arrays["loss"].numpy(), full.arrays["loss"].numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose(ring.positions(), full.positions(), rtol=0, atol=1e-12)
    want, got = full.gradients(), ring.gradients()
    for name in diffmpm.DiffMPM.PARAMS:
        assert np.abs(want[name]).max() > 1e-5, name  # gradients that are there
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-15,
                                   err_msg=f"{scene}: d loss / d {name}")


def test_diffmpm_in_a_memory_budget_trains_as_a_graph_like_the_time_axis_version(session):
    # f32, captured and replayed (the checkpoints' copies, fills and recomputed launches are
    # graph steps): three iterations give the time-axis graph's losses and weights (float
    # atomics sum the grid in another order: tolerances as for the replay test above).
    full = diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID, loop=False)
    ring = diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID,
                           memory_budget=_mpm_full_bytes(full) // 2)
    losses = [[sim.iteration() for _ in range(3)] for sim in (full, ring)]
    assert ring._graph is not None
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert losses[1][2] < losses[1][0]  # it trains
    grads = [sim.gradients() for sim in (full, ring)]
    w = [sim.weights() for sim in (full, ring)]
    for name in diffmpm.DiffMPM.PARAMS:
        np.testing.assert_allclose(grads[1][name], grads[0][name], rtol=1e-3, atol=1e-7,
                                   err_msg=name)
        np.testing.assert_allclose(w[1][name], w[0][name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_diffmpm_in_a_memory_budget_copies_its_rings_inside_the_steps(session, monkeypatch):
    # The budget's deepest level keeps each step's particle rings by copying them before the g2p
    # and p2g that write one row of them: the slice graph pass gives each copy the particle
    # kernel's task, so it runs inside that kernel (docs/graphs.md, "Copies sliced for fusion").
    # A replay of the reworked graph then issues at least one dispatch a step fewer than with the
    # pass off (VKAD_GRAPH_SLICE=0, read when a session is made), and trains the same.
    budget = _mpm_full_bytes(diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID)) // 2
    out = {}
    for off in (False, True):
        if off:
            monkeypatch.setenv("VKAD_GRAPH_SLICE", "0")
        with vkad.Session() as s:
            sim = diffmpm.DiffMPM(s, steps=MPM_STEPS, n_grid=MPM_GRID, memory_budget=budget)
            losses = [sim.iteration() for _ in range(2)]
            assert sim._graph is not None
            s.finish_rework(sim._graph)
            losses.append(sim.iteration())  # the reworked graph's first replay
            d0 = s.stats()["dispatches"]
            losses.append(sim.iteration())
            out[off] = (s.stats()["dispatches"] - d0, losses, sim.gradients())
            assert s.validation_messages() == []
    (on, on_losses, on_grads), (plain, off_losses, off_grads) = out[False], out[True]
    assert on <= plain - MPM_STEPS, (on, plain)
    np.testing.assert_allclose(on_losses, off_losses, rtol=1e-5)
    for name in diffmpm.DiffMPM.PARAMS:
        np.testing.assert_allclose(on_grads[name], off_grads[name], rtol=1e-3, atol=1e-7,
                                   err_msg=name)


def test_diffmpm_training_lowers_the_loss(session):
    # The loss is -(mean x of the solid particles) at the last step. DiffTaichi's update (rate
    # 0.1, gradients ~2e-3 here) is small: over 100 steps each iteration lowers the loss by
    # ~2.6e-6 (measured), steadily; five must lower it by 5e-6 at least, far above the f32
    # rounding of the loss (~1e-7).
    sim = diffmpm.DiffMPM(session, steps=100, n_grid=MPM_GRID)
    first = sim.loss()
    losses = [sim.iteration() for _ in range(5)]
    last = sim.loss()
    assert losses[0] == pytest.approx(first, rel=1e-5)
    assert last < first - 5e-6, (first, losses, last)


def test_diffmpm_main_runs_and_writes_plots(tmp_path, capsys):
    out = run_main(diffmpm.main, ["--iters", "2", "--steps", "20", "--grid", "32",
                                  "--out", str(tmp_path)], capsys)
    assert "robot (156 particles, 4 actuators), 32^2 grid, 20 steps, 2 iterations" in out
    assert "loss " in out
    assert_plots(tmp_path, "diffmpm")


def test_diffmpm_main_with_a_memory_budget_runs_and_writes_plots(tmp_path, capsys):
    # --memory-budget: the one-grid layout from the command line, the plot of the last step read
    # from the particles' ring (row (steps - 1) % 2).
    assert diffmpm.main(["--iters", "2", "--steps", "20", "--grid", "32", "--memory-budget", "1",
                         "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "memory budget 1 MiB: one grid, particle rings, checkpoints" in out
    assert "loss " in out
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        return
    assert (tmp_path / "diffmpm_final.png").stat().st_size > 0


def test_diffmpm_scenes_are_difftaichis():
    # DiffTaichi's Scene.add_rect puts int(w / dx) * 2 x int(h / dx) * 2 particles in a
    # rectangle. The robot on the 128^2 grid: body 0.3 x 0.1 -> 76 x 24 = 1824, four legs
    # 0.05 x 0.1 -> 12 x 24 = 288 each: 2976 particles, all solid, 4 actuators; the fish: a
    # fluid pool 0.95 x 0.1 -> 242 x 24 = 5808 under a body of 38 x 12 + 4 x 6 x 12 = 744.
    robot = diffmpm.robot(diffmpm.Scene(128))
    assert (robot.n_particles, robot.n_solid_particles, robot.n_actuators) == (2976, 2976, 4)
    assert sorted(set(robot.actuator_id)) == [-1, 0, 1, 2, 3]
    assert robot.actuator_id.count(-1) == 1824
    x = np.array(robot.x)
    assert x.min(0) == pytest.approx([0.1 + 0.3 / 152, 0.03 + 0.1 / 48])  # half a spacing in
    fish = diffmpm.fish(diffmpm.Scene(128))
    assert (fish.n_particles, fish.n_solid_particles) == (5808 + 744, 744)


def test_diffmpm_debug_asserts_are_silent_and_catch_a_particle_off_the_grid(session):
    # --debug (issue 56): p2g asserts each particle's stencil stays on the grid. Compiled in
    # but silent, the iteration is the same; a particle moved off the grid is named.
    sims = [diffmpm.DiffMPM(session, steps=MPM_STEPS, n_grid=MPM_GRID, graph=False, loop=False,
                            debug=d) for d in (False, True)]
    assert "assert" in diffmpm.build_kernels(vkad.f32, MPM_GRID, 1, False, debug=True)["p2g"].ir()
    losses = [sim.iteration() for sim in sims]
    session.synchronize()
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    sim = sims[1]
    x = sim.arrays["x"].numpy()
    x[0, 3] = [-0.5, 0.3]  # particle 3 starts left of the grid
    sim.arrays["x"].upload(x)
    with pytest.raises(vkad.DeviceError, match=r"kernel 'p2g.*assertion failed: a particle left "
                                               r"the grid.*thread \(3\) with -"):
        sim.forward(recorded=False)
        session.synchronize()
