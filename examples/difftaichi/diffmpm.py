"""DiffTaichi's diffmpm.py on vkad: an MLS-MPM soft robot learns to walk right.

    python examples/difftaichi/diffmpm.py --iters 30      # robot scene, 1024 steps, 128^2 grid

The physics, parameters and optimisation loop are those of DiffTaichi's examples/diffmpm.py
(github.com/taichi-dev/difftaichi), and its kernels are written as DiffTaichi writes them, as
Python functions (`@vkad.kernel`: the outermost `for` the parallel loop, `vkad.static` loops
unrolled, `+=` on a grid cell an atomic add, runtime `if`s for the actuators and the fluid):

- the robot scene: particles placed on a lattice of two per grid cell in rectangles, four of
  them actuated legs under a passive body; a 128 x 128 grid, dt = 1e-3, p_vol = 1, E = mu =
  lambda = 10, gravity 3.8 (and DiffTaichi's fish, --scene fish, over a pool of fluid);
- particle state with a time axis, x[f, p], v[f, p] (2-vectors), the APIC affine matrix C[f, p]
  and deformation gradient F[f, p] (2x2 matrices), read at step f and written at f + 1 of the
  same array (reverse mode proves the rows disjoint);
- per step: compute_actuation (four sine waves through weights and a bias, tanh), p2g (the
  fixed corotated stress from vkad.polar_decompose plus the actuation stress F A F^T, scattered
  with quadratic B-spline weights into the grid), grid_op (momentum to velocity, gravity, sticky
  walls and floor) and g2p (velocity and C gathered back, x advected);
- the loss, minus the mean x of the solid particles at the last step, accumulated atomically
  into a rank-0 array; gradient descent with learning rate 0.1 (DiffTaichi's update).

**The grid has a time axis by default.** DiffTaichi clears and reuses one grid every step and
recomputes the grid in its hand-written `advance` gradient. A default vkad.Tape replays each
adjoint on the arrays as they are when backward runs, so it refuses a reused grid
(docs/tape.md): grid_v_in[f, i, j], grid_m_in[f, i, j] and grid_v_out[f, i, j] keep every step's
grid instead, zeroed once per simulation: 335 MB (f32) at the default size, and as much again
for their gradients; the price of recomputation-free reverse mode. **--memory-budget MIB**
writes DiffTaichi's layout instead: one grid, cleared before every step, and the particles in
rings of two rows (step f reads row f % 2 and writes row (f + 1) % 2), on a tape given that
memory budget: it keeps checkpoints within it and runs the forward again where it keeps none
(docs/tape.md, "A memory budget"); same gradients, at the price of that recomputation
(bench/diffmpm_budget.py measures both).

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop);
the whole iteration (zeroing, forward, backward) is captured once as a graph and replayed
(--no-graph launches the kernels one by one; the results are the same). Prints progress (tqdm
where installed), and with matplotlib writes diffmpm_loss.png and diffmpm_final.png into --out.
The DiffMPM class is what tests/python/test_difftaichi.py imports.
"""
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)
from vkad import Matrix, Vector

# DiffTaichi's constants (examples/diffmpm.py)
N_GRID = 128
DT = 1e-3
P_VOL = 1.0
E = 10.0
MU = E  # DiffTaichi: "TODO: update"
LA = E
STEPS = 1024
GRAVITY = 3.8
N_SIN_WAVES = 4
ACTUATION_OMEGA = 20.0
ACT_STRENGTH = 4.0
BOUND = 3  # cells of wall and floor on each side
LEARNING_RATE = 0.1


# --- scenes ---------------------------------------------------------------------------------------

class Scene:
    """Particles in rectangles, two per grid cell along each axis (DiffTaichi's Scene): their
    positions, actuator ids (-1: passive) and types (0: fluid, 1: solid)."""

    def __init__(self, n_grid: int = N_GRID):
        self.dx = 1.0 / n_grid
        self.x: List[List[float]] = []
        self.actuator_id: List[int] = []
        self.particle_type: List[int] = []
        self.offset = (0.0, 0.0)
        self.n_actuators = 0

    def add_rect(self, x: float, y: float, w: float, h: float, actuation: int,
                 ptype: int = 1) -> None:
        if ptype == 0 and actuation != -1:
            raise ValueError("fluid particles are not actuated")
        w_count, h_count = int(w / self.dx) * 2, int(h / self.dx) * 2
        real_dx, real_dy = w / w_count, h / h_count
        for i in range(w_count):
            for j in range(h_count):
                self.x.append([x + (i + 0.5) * real_dx + self.offset[0],
                               y + (j + 0.5) * real_dy + self.offset[1]])
                self.actuator_id.append(actuation)
                self.particle_type.append(ptype)

    def set_offset(self, x: float, y: float) -> None:
        self.offset = (x, y)

    @property
    def n_particles(self) -> int:
        return len(self.x)

    @property
    def n_solid_particles(self) -> int:
        return sum(1 for t in self.particle_type if t == 1)


def robot(scene: Scene) -> Scene:
    """DiffTaichi's robot: a body on four legs, each leg one actuator."""
    scene.set_offset(0.1, 0.03)
    scene.add_rect(0.0, 0.1, 0.3, 0.1, -1)
    scene.add_rect(0.0, 0.0, 0.05, 0.1, 0)
    scene.add_rect(0.05, 0.0, 0.05, 0.1, 1)
    scene.add_rect(0.2, 0.0, 0.05, 0.1, 2)
    scene.add_rect(0.25, 0.0, 0.05, 0.1, 3)
    scene.n_actuators = 4
    return scene


def fish(scene: Scene) -> Scene:
    """DiffTaichi's fish: an actuated body over a pool of fluid particles."""
    scene.add_rect(0.025, 0.025, 0.95, 0.1, -1, ptype=0)
    scene.add_rect(0.1, 0.2, 0.15, 0.05, -1)
    scene.add_rect(0.1, 0.15, 0.025, 0.05, 0)
    scene.add_rect(0.125, 0.15, 0.025, 0.05, 1)
    scene.add_rect(0.2, 0.15, 0.025, 0.05, 2)
    scene.add_rect(0.225, 0.15, 0.025, 0.05, 3)
    scene.n_actuators = 4
    return scene


SCENES = {"robot": robot, "fish": fish}


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_grid: int, n_solid: int, fluid: bool, debug: bool = False,
                  ring: bool = False):
    """DiffTaichi's kernels as @vkad.kernel functions, launched with the step f. The 3x3 stencil
    and the sine waves are unrolled (vkad.static, DiffTaichi's ti.static), `+=` on a grid cell is
    an atomic add; `fluid` adds p2g's fluid branches for scenes that have fluid. grid_op and
    compute_loss choose with vkad.select, not `if`: the graph rework recomputes a straight-line
    grid_op in g2p (docs/graphs.md) and fuses compute_loss's adjoint with g2p's. `debug`
    (--debug) adds p2g's asserts that each particle's stencil stays on the grid. `ring`
    (--memory-budget): the particle arrays hold two rows, step f reading row f % 2 and writing
    row (f + 1) % 2, and the grid one, cleared every step, as DiffTaichi's; the tape's
    checkpoints keep what backward needs."""
    dx, inv_dx = 1.0 / n_grid, float(n_grid)

    @vkad.func
    def rows(f):  # the particles' rows step f reads and writes, and its grid's
        if vkad.static(ring):
            return f % 2, (f + 1) % 2, 0 * f
        return f, f + 1, f

    particles = vkad.array(vkad.vec(2, ft), ndim=2, grad=True)     # x[f, p], v[f, p]
    matrices = vkad.array(vkad.mat(2, 2, ft), ndim=2, grad=True)   # C[f, p], F[f, p]
    grid_v = vkad.array(vkad.vec(2, ft), ndim=3, grad=True)        # grid_v_in[f, i, j], ...
    grid_m = vkad.array(ft, ndim=3, grad=True)
    field = vkad.array(ft, ndim=2, grad=True)
    ids = vkad.array(vkad.i32, ndim=1, readonly=True)

    @vkad.func
    def stencil(xp):  # Taichi's base cell, the position in it, the quadratic B-spline weights
        base = vkad.cast(xp * inv_dx - 0.5, vkad.i32)  # truncates toward 0, as ti.cast
        fx = xp * inv_dx - vkad.cast(base, ft)
        return base, fx, (0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2)

    @vkad.kernel
    def compute_actuation(t: vkad.i32, weights: field, bias: vkad.array(ft, grad=True),
                          actuation: field):
        for i in range(weights.shape[0]):
            phase = vkad.cast(t, ft) * (ACTUATION_OMEGA * DT)
            act = weights[i, 0] * vkad.sin(phase)
            for j in vkad.static(range(1, N_SIN_WAVES)):
                act += weights[i, j] * vkad.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
            actuation[t, i] = vkad.tanh(act + bias[i])

    @vkad.kernel
    def p2g(f: vkad.i32, x: particles, v: particles, C: matrices, F: matrices, actuation: field,
            actuator_id: ids, particle_type: ids, grid_v_in: grid_v, grid_m_in: grid_m):
        for p in range(x.shape[1]):
            fr, fw, g = rows(f)
            base, fx, w = stencil(x[fr, p])
            if vkad.static(debug):  # the 3x3 stencil from base stays on the grid
                assert vkad.min(base[0], base[1]) >= 0, "a particle left the grid"
                assert vkad.max(base[0], base[1]) < n_grid - 2, "a particle left the grid"
            new_F = (Matrix.identity(2) + DT * C[fr, p]) @ F[fr, p]
            J = new_F.determinant()
            if vkad.static(fluid) and particle_type[p] == 0:  # a fluid keeps its volume change
                new_F = Matrix.diag(2, vkad.sqrt(J))
            F[fw, p] = new_F
            r, _ = vkad.polar_decompose(new_F)
            act = actuation[f, vkad.max(0, actuator_id[p])] * ACT_STRENGTH
            if actuator_id[p] == -1:
                act = 0.0
            A = Matrix([[0.0, 0.0], [0.0, 1.0]]) * act
            # solid: fixed corotated elasticity; fluid: pressure from the volume change
            cauchy = 2 * MU * (new_F - r) @ new_F.T + Matrix.diag(2, LA * (J - 1) * J)
            mass = 1.0
            if vkad.static(fluid) and particle_type[p] == 0:
                cauchy = Matrix([[1.0, 0.0], [0.0, 0.1]]) * (J - 1) * E
                mass = 4.0
            cauchy += new_F @ A @ new_F.T
            stress = -(DT * P_VOL * 4 * inv_dx * inv_dx) * cauchy
            affine = stress + mass * C[fr, p]
            momentum = mass * v[fr, p]
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    offset = Vector([i, j])
                    dpos = (offset - fx) * dx
                    weight = w[i][0] * w[j][1]
                    grid_v_in[g, base + offset] += weight * (momentum + affine @ dpos)
                    grid_m_in[g, base + offset] += weight * mass

    @vkad.kernel
    def grid_op(f: vkad.i32, grid_v_in: grid_v, grid_m_in: grid_m, grid_v_out: grid_v):
        for i, j in vkad.ndrange(grid_m_in.shape[1], grid_m_in.shape[2]):
            _, _, g = rows(f)
            inv_m = 1 / (grid_m_in[g, i, j] + 1e-10)
            v_out = inv_m * grid_v_in[g, i, j] - Vector([0.0, DT * GRAVITY])
            # walls and floor stop what moves into them (DiffTaichi's floor friction sees the
            # velocity its floor branch has just zeroed and changes nothing: the floor is sticky)
            stop = ((i < BOUND and v_out[0] < 0) or (i > n_grid - BOUND and v_out[0] > 0)
                    or (j < BOUND and v_out[1] < 0) or (j > n_grid - BOUND and v_out[1] > 0))
            grid_v_out[g, i, j] = vkad.select(stop, Vector([0.0, 0.0]), v_out)

    @vkad.kernel
    def g2p(f: vkad.i32, x: particles, v: particles, C: matrices, grid_v_out: grid_v):
        for p in range(x.shape[1]):
            fr, fw, g = rows(f)
            xp = x[fr, p]
            base, fx, w = stencil(xp)
            new_v, new_C = Vector.zero(2), Matrix.zero(2)
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    dpos = Vector([i, j]) - fx
                    g_v = grid_v_out[g, base[0] + i, base[1] + j]
                    weight = w[i][0] * w[j][1]
                    new_v += weight * g_v
                    new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
            v[fw, p] = new_v
            x[fw, p] = xp + DT * new_v
            C[fw, p] = new_C

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: particles, loss: vkad.array(ft, ndim=0, grad=True),
                     particle_type: ids):
        for p in range(x.shape[1]):  # DiffTaichi: loss = -(mean x of the solid particles)
            tr, _, _ = rows(t)
            solid = vkad.select(particle_type[p] == 1, 1.0 / n_solid, 0.0)
            loss[None] += -solid * x[tr, p][0]

    return {"compute_actuation": compute_actuation, "p2g": p2g, "grid_op": grid_op, "g2p": g2p,
            "compute_loss": compute_loss}


class DiffMPM(Simulation):
    """A scene, its controller and the differentiated simulation on one session.

    forward() launches one simulation (on the tape when recording); iteration() runs one
    training iteration and returns its loss (before the update); loss() the current loss;
    weights() / set_weights() the controller as numpy arrays."""

    PARAMS = ("weights", "bias")
    NAME = "diffmpm"
    LAUNCH_ARGS = ("t", "f")

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 dtype: vkad.DType = vkad.f32, scene: str = "robot", seed: int = 0,
                 graph: bool = True, loop: bool = True, build=None, debug: bool = False,
                 memory_budget: Optional[int] = None, shift: Tuple[float, float] = (0.0, 0.0)):
        # build: another maker of the kernels, build_kernels's signature (the tests pass the
        # KernelBuilder spelling, tests/python/difftaichi_builder_kernels.py)
        # memory_budget: bytes for the tape's checkpoints (Tape.memory_budget). The particles
        # then keep two rows and the grid one, cleared every step as DiffTaichi clears it, and
        # the tape recomputes what backward needs; the step loop is a Python loop of launches
        # (a budgeted tape records launches, not a Session.loop).
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        if n_grid < 2 * BOUND + 3:
            raise ValueError(f"n_grid={n_grid}: the grid needs more than its walls")
        super().__init__(session, dtype, graph)
        self.steps, self.n_grid = steps, n_grid
        # loop=True: the step loop said as one (Session.loop), prepared here (prepare_loop,
        # ~100-200 ms): its ranges are too wide for a resident kernel, so the first iteration
        # runs the graph rework's plan of the loop and its adjoint (H100: 1.3-1.4x the steady
        # 17 ms, against 2.1-2.4x as a Python loop of launches; docs/benchmarks-log.md).
        self.budget = memory_budget
        self.loop = loop and memory_budget is None
        ring = memory_budget is not None
        self.scene = SCENES[scene](Scene(n_grid))
        sc = self.scene
        # shift: the scene moved by (dx, dy), one of a batch of scenes
        # (examples/multi_gpu/diffmpm_batch.py)
        sc.x = [[px + shift[0], py + shift[1]] for px, py in sc.x]
        n, n_act = sc.n_particles, sc.n_actuators
        fluid = any(t == 0 for t in sc.particle_type)
        kbs = (build or build_kernels)(dtype, n_grid, sc.n_solid_particles, fluid,
                                       **({"debug": True} if debug else {}),
                                       **({"ring": True} if ring else {}))
        self.kernels = {name: session.differentiate(kb) for name, kb in kbs.items()}
        npt = vkad.numpy_dtype(dtype)

        # DiffTaichi's initialisation: weights ~ N(0, 0.01^2), zero bias; F = identity.
        rng = np.random.RandomState(seed)
        rows = 2 if ring else steps  # the particles' rows: a ring of two, or every step's
        x0 = np.zeros((rows, n, 2))
        x0[0] = sc.x
        F0 = np.zeros((rows, n, 2, 2))
        F0[0] = np.eye(2)
        s = session
        # one grid per step (see the docstring), or one for all
        grid = (1 if ring else steps - 1, n_grid, n_grid)
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.ndarray(x0, npt, "x"),
            "v": s.zeros((rows, n, 2), dtype, "v"),
            "C": s.zeros((rows, n, 2, 2), dtype, "C"),
            "F": s.ndarray(F0, npt, "F"),
            "grid_v_in": s.zeros(grid + (2,), dtype, "grid_v_in"),
            "grid_m_in": s.zeros(grid, dtype, "grid_m_in"),
            "grid_v_out": s.zeros(grid + (2,), dtype, "grid_v_out"),
            "actuation": s.zeros((steps, n_act), dtype, "actuation"),
            "actuator_id": s.ndarray(np.array(sc.actuator_id, np.int32), name="actuator_id"),
            "particle_type": s.ndarray(np.array(sc.particle_type, np.int32), name="particle_type"),
            "weights": s.ndarray(rng.randn(n_act, N_SIN_WAVES) * 0.01, npt, "weights"),
            "bias": s.zeros(n_act, dtype, "bias"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        self._planned = False  # a budgeted tape's first recording ran (iteration())
        if ring:  # the first state, copied into the rings at the start of every simulation
            self._start = {"x": s.ndarray(x0, npt, "x_start"), "F": s.ndarray(F0, npt, "F_start")}
            self.tape.memory_budget = memory_budget
        if self.loop:  # the loop's and its adjoint's plans and the tape's check, made now
            self.s.prepare_loop(0, steps - 1, self._step(True))

    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step f (symbolic inside Session.loop, which traces it once)."""
        act, p2g, grid_op, g2p = (self.launcher(name, recorded)
                                  for name in ("compute_actuation", "p2g", "grid_op", "g2p"))

        def step(f):
            act(f)
            p2g(f)
            grid_op(f)
            g2p(f)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation from x[0], F[0] = I, v[0] = C[0] = 0: DiffTaichi's forward()
        (steps - 1 steps, then the loss at the last step). Asynchronous."""
        a = self.arrays
        step = self._step(recorded)
        if self.budget is not None:
            # The rings start from x[0], F[0] = I, v = C = 0; DiffTaichi's clear_grid before
            # every step (on a recording tape: recorded, and run again by backward).
            for name, start in self._start.items():
                self.s.copy(start, a[name])
            self.s.zero_many([a["v"], a["C"], a["loss"]])
            for f in range(self.steps - 1):
                self.s.zero_many([a["grid_v_in"], a["grid_m_in"]])
                step(f)
            self.launcher("compute_loss", recorded)(self.steps - 1)
            return
        # DiffTaichi's clear_grid, once for all the steps' grids
        self.s.zero_many([a["grid_v_in"], a["grid_m_in"], a["loss"]])
        # loop=True: one step loop, launched as the plan prepare_loop made (above).
        self.step_loop(0, self.steps - 1, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update: w -= LEARNING_RATE * dL/dw.
        Returns the loss the forward computed."""
        if self.budget is not None and not self._planned:
            # budget: the first recording runs as launched, so that the tape plans its cut for
            # this length, and the graph captures the next, planned one (docs/tape.md)
            self.forward_backward()
            self._planned = True
            loss = self.read_loss()
        else:
            loss = self.run_iteration(self.forward_backward)
        grads = self.gradients()
        w = self.weights()
        self.set_weights({p: w[p] - LEARNING_RATE * grads[p] for p in self.PARAMS})
        return loss

    def positions(self) -> np.ndarray:
        """The particles' positions at the last step."""
        x = self.arrays["x"]
        return x.numpy()[(self.steps - 1) % x.shape[0]]

    def actuations(self) -> np.ndarray:
        return self.arrays["actuation"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(sim: DiffMPM, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve and the particles at the last step (actuated ones coloured by their
    actuation as DiffTaichi does, the start faint grey); [] without matplotlib."""
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
    ax.set_xlabel("iteration"), ax.set_ylabel("loss (-mean x)")
    ax.set_title("diffmpm on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    last = sim.steps - 1
    x, act = sim.positions(), sim.actuations()[last - 1]
    aid = np.array(sim.scene.actuator_id)
    colors = np.full((len(aid), 3), 0.07)
    on = aid >= 0
    a = act[aid[on]]
    colors[on] = np.clip(np.stack([0.5 - a, 0.5 - np.abs(a), 0.5 + a], axis=1), 0, 1)
    fig, ax = plt.subplots(figsize=(6, 6))
    start = np.array(sim.scene.x)
    ax.scatter(start[:, 0], start[:, 1], color="#ddd", s=2)  # where it started
    ax.scatter(x[:, 0], x[:, 1], c=colors, s=2)
    ax.plot([0.05, 0.95], [0.02, 0.02], color="k", lw=2)
    ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal")
    ax.set_title(f"step {last} after training")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID}; particles: 2 per cell side)")
    ap.add_argument("--scene", choices=sorted(SCENES), default="robot",
                    help="DiffTaichi's scene (default robot)")
    ap.add_argument("--memory-budget", type=float, default=None, metavar="MIB",
                    help="one grid and two-row particle rings, the tape's checkpoints within "
                         "this many MiB (default: every step's grid and particles kept)")
    a = ap.parse_args(argv)  # --debug: also asserts that particles stay on the grid
    budget = None if a.memory_budget is None else int(a.memory_budget * (1 << 20))
    with open_session(a) as s:
        sim = DiffMPM(s, a.steps, a.grid, vkad.f64 if a.f64 else vkad.f32, scene=a.scene,
                      seed=a.seed, graph=not a.no_graph, debug=a.debug, memory_budget=budget)
        sc = sim.scene
        print(f"{s.device_name}: {a.scene} ({sc.n_particles} particles, {sc.n_actuators} "
              f"actuators), {a.grid}^2 grid, {a.steps} steps, {a.iters} iterations")
        if budget is not None:
            print(f"memory budget {a.memory_budget:g} MiB: one grid, particle rings, checkpoints")
        losses = train(sim, a.iters, "diffmpm", bar_digits=4, line_digits=5,
                       profile=a.profile, session=s)
        final = sim.loss()
        start = -float(np.mean([p[0] for p, t in zip(sc.x, sc.particle_type) if t == 1]))
        print(f"loss {losses[0] if losses else final:.5f} -> {final:.5f} (the solid particles' "
              f"mean x moved {start - final:+.4f} from its start)")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
