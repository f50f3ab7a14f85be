"""DiffTaichi's liquid.py on vkad: a 3-D MLS-MPM soft quadruped learns to walk right under a block
of liquid that falls on it.

    python examples/difftaichi/liquid.py --iters 50       # 64^3 grid, 512 steps: a GPU's size
    python examples/difftaichi/liquid.py --grid 32 --steps 100 --iters 10   # lavapipe's size

The physics, parameters and optimisation loop are those of DiffTaichi's examples/liquid.py
(github.com/taichi-dev/difftaichi): a 64^3 grid, dt = 2e-3, p_vol = 1, E = mu = lambda = 10,
gravity 10, 512 steps (511 simulated, the loss read at the last); the robot of diffmpm3d.py (a
body of three blocks between four legs of four actuated blocks each: 16 actuators, particles on
a lattice of three per grid cell side) and a block of fluid particles (0.2 x 0.05 x 0.2, at
(0.2, 0.2, 0.4) after the robot's offset, DiffTaichi's add_rect(0.1, 0.15, 0.1, ..., ptype=0))
0.08 above the robot, onto which it falls (in ~60 steps): 30,495 solid and 12,996 fluid
particles at the default size. Per step:
- compute_actuation: four sine waves (omega 40) through weights[16, 4] and bias[16], tanh;
- p2g: F' = (I + dt C) F; a solid's stress is neo-Hookean without a polar decomposition,
  mu F' F'^T + (lambda log J - mu) I, a fluid particle's (J - 1) E I, with mass 4 (solid 1), and
  its F' is reset to diag(sqrt J, sqrt J, 1) (DiffTaichi: "TODO: need pow(x, 1/3)"); plus the
  actuation stress F' A F'^T along z (strength 5); scattered with quadratic B-spline weights into
  the 27 nodes around the particle (`+=`, atomic adds);
- grid_op: momentum to velocity, gravity, walls 3 cells thick on every side (bound = 3) that
  stop what moves into them, and the floor's friction branch (coeff 1.5);
- g2p: velocity and the APIC matrix C gathered back, x advected;
- the loss: minus the mean x of the solid particles at the last step; gradient descent with
  learning rate 10 on weights and bias, on the host (DiffTaichi's, the host loop of its main()).

DiffTaichi's liquid.py is its diffmpm3d.py with that fluid block added and learning rate 10
(not 30): its kernels, Scene and robot are the same statement for statement (liquid.py spells
them in the Taichi of its time: ti.var, ti.sqr, ti.transposed, @ti.layout). So is this port:
examples/difftaichi/diffmpm3d.py's Scene, robot and kernels (build_kernels with its fluid
branches on; DiffMPM3D, its iteration() too) build it, and Liquid adds the scene (liquid()) and
the learning rate; tests/python/test_difftaichi_liquid.py checks it against a float64 numpy
transcription of liquid.py itself. The kernels are `@vkad.kernel` functions written as DiffTaichi
writes them: the outermost `for` the parallel loop, `vkad.static` loops unrolled, `+=` on a grid
cell an atomic add, runtime `if`s for the actuators and the fluid.

What vkad does instead of Taichi's behaviour:
- **The grid has a time axis by default.** DiffTaichi clears and reuses one grid every step,
  and its backward() recomputes each step's grid (clear_grid, p2g, grid_op) before that step's
  adjoints, "since we do not store the grid history (to save space)". A vkad.Tape replays each
  adjoint on the arrays as they are when backward runs, so a reused grid would give wrong
  gradients (docs/tape.md): grid_v_in[f, i, j, k], grid_m_in[f, i, j, k] and
  grid_v_out[f, i, j, k] keep every step's grid instead, zeroed once per simulation, as the
  diffmpm and diffmpm3d ports do. It is the fast layout (no step runs twice) where memory allows:
  3.75 GB (f32) at the default size and as much again for the gradients, plus 2.1 GB of particle
  state (43,491 particles x 512 steps) and its gradients: a GPU's, not lavapipe's (whose buffers
  stop at 128 MiB: --grid 32 --steps 100 fits). **--memory-budget MIB** writes DiffTaichi's
  layout instead (diffmpm3d's option): one grid cleared before every step, particle rings of two
  rows, and a tape whose checkpoints stay within the budget and which runs the forward again
  where it keeps none (docs/tape.md, "A memory budget"): vkad's form of DiffTaichi's
  recomputation, the tape choosing what to recompute.
- The fluid particles are placed with random.random() in DiffTaichi (Python's unseeded global
  generator, three draws per particle: x, y, z); here with numpy's RandomState(seed) in the same
  order (Scene), and the weights ~ N(0, 0.01^2) from another RandomState(seed) (DiffTaichi's
  unseeded np.random.randn), so that a run, its tests and the race's Taichi and Warp
  transcriptions start from the same scene and weights.
- `fx = x * inv_dx - ti.cast(base, ti.i32)` in DiffTaichi's p2g (g2p casts base to real): a
  float minus an i32 is promoted to float in Taichi, so both are x * inv_dx - float(base); here
  both cast base to the float type (ti.cast truncates toward 0, and so does vkad.cast).
- The floor's friction branch runs after the floor's own branch has zeroed v_out, so its normal
  velocity `lin` is 0, not < 0, and it changes nothing: the floor is sticky, as the walls. The
  port's grid_op (diffmpm3d's) is the six walls' test without the dead branch, chosen with
  vkad.select (a straight-line grid_op, which the graph rework recomputes in g2p:
  docs/graphs.md); the test's transcription keeps the branch and agrees.
- p2g computes the solid's stress (with log J) for every particle and the fluid's replaces it
  for fluid particles (DiffTaichi computes one or the other in an if / else): the same values;
  log J of a fluid particle is finite wherever its sqrt J is.
- compute_x_avg (an atomic add of x / n_solid over the solid particles into x_avg, DiffTaichi's
  `x_avg[None].atomic_add`) and compute_loss (loss = -x_avg[0]) are one kernel that adds
  -x[0] / n_solid into the rank-0 loss atomically (diffmpm3d's compute_loss): the sum may add in
  another order. ti.clear_all_gradients, loss.grad = 1 and backward() are the tape's backward
  (seed 1), which zeroes the gradients first (DiffTaichi's clear_grid also zeroes the grid's
  gradients, clear_particle_grad the particles').
- Unused in liquid.py and not ported: use_apic (False), target, clear_actuation_grad (which
  zeroes actuation, not its gradient, and is never called), splat / copy_back_and_clear / the
  GUI (declared, never called), and its particle dumps (`if iter % 50 == -1`: never true). With
  matplotlib, liquid_loss.png and liquid_final.png (side and top views, DiffTaichi's dump
  colours: fluid blue, actuated blocks by their actuation, the body grey) go into --out.

The step loop is said as one (Session.loop) and prepared at construction; the whole iteration
(zeroing, forward, backward) is captured once as a graph and replayed (--no-graph launches the
kernels one by one; the results are the same). DiffTaichi's main() runs 501 iterations (the
default here). The Liquid class is what tests/python/test_difftaichi_liquid.py and
bench/difftaichi_ports.py import.
"""
import os
import sys
from typing import List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffmpm3d as mpm3d  # noqa: E402  (DiffTaichi's diffmpm3d: the same kernels and robot)
from training import arguments, open_session  # noqa: E402  (the ports' shared parts)

# DiffTaichi's constants (examples/liquid.py; its max_steps = steps), diffmpm3d's but the rate
N_GRID = mpm3d.N_GRID  # 64
DT = mpm3d.DT  # 2e-3
E = mpm3d.E  # 10, = mu = lambda
STEPS = mpm3d.STEPS  # 512
LEARNING_RATE = 10.0
ITERS = 501  # DiffTaichi's main(): `for iter in range(501)`
FLUID_MASS = 4.0  # p2g's `mass = 4` for ptype 0 (solids: 1)
Scene = mpm3d.Scene


def liquid(scene: Scene, block_size: float = 0.1, offset=(0.1, 0.05, 0.3),
           fluid=(0.1, 0.15, 0.1, 0.2, 0.05, 0.2)) -> Scene:
    """DiffTaichi's liquid scene: diffmpm3d's robot at `offset`, then, with that offset still
    set, a block of fluid (x, y, z, w, h, d) = `fluid`, placed at random (the scene's seeded
    generator). DiffTaichi's: the fluid 0.2 x 0.05 x 0.2 at x in [0.2, 0.4], y in [0.2, 0.25],
    z in [0.4, 0.6], 0.08 above the robot (its top at y = 0.12). The tests move both on a
    coarser grid (their walls are thicker)."""
    mpm3d.robot(scene, block_size, offset)
    scene.add_rect(*fluid, -1, 0)
    return scene


class Liquid(mpm3d.DiffMPM3D):
    """The liquid scene, its controller and the differentiated simulation on one session:
    diffmpm3d's DiffMPM3D with the fluid block and DiffTaichi's learning rate 10. forward()
    launches one simulation (on the tape when recording); forward_backward() records it and runs
    its backward; iteration() runs one training iteration and returns its loss (before the
    update); loss() the current loss; weights() / set_weights() the controller as numpy arrays;
    state() the particles of every step."""

    PARAMS = ("weights", "bias")
    LEARNING_RATE = LEARNING_RATE  # DiffMPM3D.iteration's update
    NAME = "liquid"

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 loop: bool = True, memory_budget: Optional[int] = None, scene=liquid):
        # memory_budget: bytes for the tape's checkpoints, DiffTaichi's one grid (docstring)
        super().__init__(session, steps=steps, n_grid=n_grid, dtype=dtype, scene=scene,
                         seed=seed, graph=graph, loop=loop, memory_budget=memory_budget)


# --- the program ---------------------------------------------------------------------------------

def plot(sim: Liquid, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve and the particles at the last step from the side (x, y) and from above
    (x, z) in DiffTaichi's dump colours (fluid blue, actuated blocks by their actuation, the
    body grey); [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(losses)
    ax.set_xlabel("iteration"), ax.set_ylabel("loss (-mean x of the solids)")
    ax.set_title("liquid on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "liquid_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    last = sim.steps - 1
    st = sim.state()
    x, act = st["x"][last % len(st["x"])], st["actuation"][last - 1]
    aid, ptype = np.array(sim.scene.actuator_id), np.array(sim.scene.particle_type)
    colors = np.full((len(aid), 3), 0.4)
    on = aid >= 0
    a = act[aid[on]] * 0.5
    colors[on] = np.clip(np.stack([0.5 - a, 0.5 - np.abs(a), 0.5 + a], axis=1), 0, 1)
    colors[ptype == 0] = (0.3, 0.3, 1.0)
    start = np.array(sim.scene.x)
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for ax, c, name in zip(axes, (1, 2), ("side (x, y)", "top (x, z)")):
        ax.scatter(start[:, 0], start[:, c], color="#ddd", s=1)  # where it started
        ax.scatter(x[:, 0], x[:, c], c=colors, s=1)
        ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal")
        ax.set_title(f"{name}, step {last} after training")
    fig.tight_layout()
    written.append(os.path.join(out, "liquid_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID}; particles: {mpm3d.DENSITY} per "
                         "cell side)")
    ap.add_argument("--memory-budget", type=float, default=None, metavar="MIB",
                    help="one grid and two-row particle rings, the tape's checkpoints within "
                         "this many MiB (default: every step's grid and particles kept)")
    a = ap.parse_args(argv)
    budget = None if a.memory_budget is None else int(a.memory_budget * (1 << 20))
    with open_session(a) as s:
        sim = Liquid(s, a.steps, a.grid, vkad.f64 if a.f64 else vkad.f32, seed=a.seed,
                     graph=not a.no_graph, memory_budget=budget)
        sc = sim.scene
        n_fluid = sc.particle_type.count(0)
        print(f"{s.device_name}: robot and liquid ({sc.n_particles - n_fluid} solid and "
              f"{n_fluid} fluid particles, {sc.n_actuators} actuators), {a.grid}^3 grid, "
              f"{a.steps} steps, {a.iters} iterations")
        mpm3d.train_and_report(s, sim, a, "liquid", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
