"""DiffTaichi's diffmpm3d.py on vkad: a 3-D MLS-MPM soft quadruped learns to walk right.

    python examples/difftaichi/diffmpm3d.py --iters 30     # robot, 512 steps, 64^3 grid
    python examples/difftaichi/diffmpm3d.py --grid 32 --steps 100 --iters 10   # small

The physics, parameters and optimisation loop are those of DiffTaichi's examples/diffmpm3d.py
(github.com/taichi-dev/difftaichi), and its kernels are written as DiffTaichi writes them, as
Python functions (`@vkad.kernel`: the outermost `for` the parallel loop, `vkad.static` loops
unrolled, `+=` on a grid cell an atomic add, runtime `if`s for the actuators and the fluid), as
examples/difftaichi/diffmpm.py (the 2-D port) does:

- the robot: a body of three blocks between four legs of four actuated blocks each (16
  actuators), particles placed on a lattice of three per grid cell side; a 64^3 grid, dt = 2e-3,
  p_vol = 1, E = mu = lambda = 10, gravity 10, 512 steps (30,495 particles);
- particle state with a time axis, x[f, p], v[f, p] (3-vectors), the APIC affine matrix C[f, p]
  and deformation gradient F[f, p] (3x3), read at step f and written at f + 1 of the same array;
- per step: compute_actuation (four sine waves through weights and a bias, tanh), p2g (a
  neo-Hookean stress mu F F^T + (lambda log J - mu) I plus the actuation stress F A F^T along z,
  scattered with quadratic B-spline weights into the 27 nodes around the particle), grid_op
  (momentum to velocity, gravity, sticky walls, floor and ceiling) and g2p (velocity and C
  gathered back, x advected);
- the loss, minus the mean x of the solid particles at the last step, accumulated atomically
  into a rank-0 array (DiffTaichi's compute_x_avg and compute_loss in one kernel); gradient
  descent with learning rate 30 (DiffTaichi's `learn`), on the host.

**The grid has a time axis by default**, as in the 2-D port: DiffTaichi clears and reuses one grid
every step, and its backward() recomputes each step's grid (clear_grid, p2g, grid_op) before
that step's adjoints. A vkad.Tape replays each adjoint on the arrays as they are when backward
runs, so a reused grid would give wrong gradients (docs/tape.md): grid_v_in[f, i, j, k],
grid_m_in[f, i, j, k] and grid_v_out[f, i, j, k] keep every step's grid instead, zeroed once per
simulation: 3.75 GB (f32) at the default size, and as much again for their gradients (the
particle state is another 1.5 GB, and its gradients): a GPU's memory, not lavapipe's (whose
buffers stop at 128 MiB: --grid 32 --steps 100 fits). DiffTaichi's clear_particle_grad /
ti.ad.clear_all_gradients are the tape's zeroing of its gradients at each backward.
**--memory-budget MIB** writes DiffTaichi's layout instead, as the 2-D port's does: one grid
cleared before every step, particle rings of two rows, a tape whose checkpoints stay within the
budget and which runs the forward again where it keeps none (docs/tape.md, "A memory budget"):
2,048 steps on a 64^3 grid, whose time-axis tape would take 42 GB, train in a few GB.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop);
the whole iteration (zeroing, forward, backward) is captured once as a graph and replayed
(--no-graph launches the kernels one by one; the results are the same). Prints progress (tqdm
where installed), and with matplotlib writes diffmpm3d_loss.png and diffmpm3d_final.png (side
and top views) into --out, where DiffTaichi writes particle files for its renderer every 20
iterations. The DiffMPM3D class is what tests/python/test_difftaichi_diffmpm3d.py imports.
"""
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)
from vkad import Matrix, Vector

# DiffTaichi's constants (examples/diffmpm3d.py; its max_steps = steps)
N_GRID = 64
DT = 2e-3
P_VOL = 1.0
E = 10.0
MU = E  # DiffTaichi: "TODO: update"
LA = E
STEPS = 512
GRAVITY = 10.0
N_SIN_WAVES = 4
ACTUATION_OMEGA = 40.0
ACT_STRENGTH = 5.0
BOUND = 3  # cells of wall, floor and ceiling on each side
DENSITY = 3  # particles per grid cell side
LEARNING_RATE = 30.0


# --- the scene -----------------------------------------------------------------------------------

class Scene:
    """Particles in boxes, DENSITY per grid cell side along each axis (DiffTaichi's Scene):
    their positions, actuator ids (-1: passive) and types (0: fluid, placed at random in its
    box as DiffTaichi does, from `seed`; 1: solid, on a lattice)."""

    def __init__(self, n_grid: int = N_GRID, seed: int = 0):
        self.dx = 1.0 / n_grid
        self.rng = np.random.RandomState(seed)
        self.x: List[List[float]] = []
        self.actuator_id: List[int] = []
        self.particle_type: List[int] = []
        self.offset = (0.0, 0.0, 0.0)
        self.n_actuators = 0

    def new_actuator(self) -> int:
        self.n_actuators += 1
        return self.n_actuators - 1

    def add_rect(self, x: float, y: float, z: float, w: float, h: float, d: float,
                 actuation: int, ptype: int = 1) -> None:
        if ptype == 0 and actuation != -1:
            raise ValueError("fluid particles are not actuated")
        counts = [int(size / self.dx * DENSITY) for size in (w, h, d)]
        spacing = [size / c for size, c in zip((w, h, d), counts)]
        for i in range(counts[0]):
            for j in range(counts[1]):
                for k in range(counts[2]):
                    if ptype == 1:
                        local = [(n + 0.5) * s for n, s in zip((i, j, k), spacing)]
                    else:
                        local = list(self.rng.random_sample(3) * (w, h, d))
                    self.x.append([c + q + o for c, q, o in zip((x, y, z), local, self.offset)])
                    self.actuator_id.append(actuation)
                    self.particle_type.append(ptype)

    def set_offset(self, x: float, y: float, z: float) -> None:
        self.offset = (x, y, z)

    @property
    def n_particles(self) -> int:
        return len(self.x)

    @property
    def n_solid_particles(self) -> int:  # DiffTaichi: max(..., 1)
        return max(1, sum(1 for t in self.particle_type if t == 1))


def robot(scene: Scene, block_size: float = 0.1, offset=(0.1, 0.05, 0.3)) -> Scene:
    """DiffTaichi's robot: four legs of four actuated blocks around a body of three blocks.
    DiffTaichi: "change the block_size to 0.05 if run out of GPU memory" (the tests do)."""
    scene.set_offset(*offset)

    def add_leg(x, y, z):
        for i in range(4):
            scene.add_rect(x + block_size / 2 * (i // 2), y + 0.7 * block_size / 2 * (i % 2), z,
                           block_size / 2, 0.7 * block_size / 2, block_size,
                           scene.new_actuator())

    for i in range(4):
        add_leg(i // 2 * block_size * 2, 0.0, i % 2 * block_size * 2)
    for i in range(3):
        scene.add_rect(block_size * i, 0, block_size, block_size, block_size * 0.7, block_size,
                       -1, 1)
    return scene


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_grid: int, n_solid: int, fluid: bool, ring: bool = False):
    """DiffTaichi's kernels as @vkad.kernel functions, launched with the step f. The 3x3x3
    stencil and the sine waves are unrolled (vkad.static, DiffTaichi's ti.static), `+=` on a grid
    cell is an atomic add; `fluid` adds p2g's fluid branches for scenes that have fluid. grid_op
    and compute_loss choose with vkad.select, not `if`: the graph rework recomputes a
    straight-line grid_op in g2p (docs/graphs.md) and fuses compute_loss's adjoint with g2p's.
    `ring` (--memory-budget): the particle arrays hold two rows, step f reading row f % 2 and
    writing row (f + 1) % 2, and the grid one, cleared every step (the 2-D port's)."""
    dx, inv_dx = 1.0 / n_grid, float(n_grid)

    @vkad.func
    def rows(f):  # the particles' rows step f reads and writes, and its grid's
        if vkad.static(ring):
            return f % 2, (f + 1) % 2, 0 * f
        return f, f + 1, f

    particles = vkad.array(vkad.vec(3, ft), ndim=2, grad=True)     # x[f, p], v[f, p]
    matrices = vkad.array(vkad.mat(3, 3, ft), ndim=2, grad=True)   # C[f, p], F[f, p]
    grid_v = vkad.array(vkad.vec(3, ft), ndim=4, grad=True)        # grid_v_in[f, i, j, k], ...
    grid_m = vkad.array(ft, ndim=4, grad=True)
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
            new_F = (Matrix.identity(3) + DT * C[fr, p]) @ F[fr, p]
            J = new_F.determinant()
            if vkad.static(fluid) and particle_type[p] == 0:  # DiffTaichi: "need pow(x, 1/3)"
                sqrtJ = vkad.sqrt(J)
                new_F = Matrix([[sqrtJ, 0.0, 0.0], [0.0, sqrtJ, 0.0], [0.0, 0.0, 1.0]])
            F[fw, p] = new_F
            act = actuation[f, vkad.max(0, actuator_id[p])] * ACT_STRENGTH
            if actuator_id[p] == -1:
                act = 0.0
            A = Matrix([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]) * act
            # solid: neo-Hookean; fluid: pressure from the volume change
            cauchy = MU * (new_F @ new_F.T) + Matrix.identity(3) * (LA * vkad.log(J) - MU)
            mass = 1.0
            if vkad.static(fluid) and particle_type[p] == 0:
                cauchy = Matrix.identity(3) * (J - 1) * E
                mass = 4.0
            cauchy += new_F @ A @ new_F.T
            stress = -(DT * P_VOL * 4 * inv_dx * inv_dx) * cauchy
            affine = stress + mass * C[fr, p]
            momentum = mass * v[fr, p]
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    for k in vkad.static(range(3)):
                        offset = Vector([i, j, k])
                        dpos = (offset - fx) * dx
                        weight = w[i][0] * w[j][1] * w[k][2]
                        grid_v_in[g, base + offset] += weight * (momentum + affine @ dpos)
                        grid_m_in[g, base + offset] += weight * mass

    @vkad.kernel
    def grid_op(f: vkad.i32, grid_v_in: grid_v, grid_m_in: grid_m, grid_v_out: grid_v):
        for i, j, k in vkad.ndrange(grid_m_in.shape[1], grid_m_in.shape[2], grid_m_in.shape[3]):
            _, _, g = rows(f)
            inv_m = 1 / (grid_m_in[g, i, j, k] + 1e-10)
            v_out = inv_m * grid_v_in[g, i, j, k] - Vector([0.0, DT * GRAVITY, 0.0])
            # DiffTaichi's six ifs in turn: each zeroes v_out, after which none fires again, so
            # their `or` on the first v_out. Its floor friction (coeff 1.5) sees the velocity
            # its floor branch has just zeroed and changes nothing: the floor is sticky.
            stop = ((i < BOUND and v_out[0] < 0) or (i > n_grid - BOUND and v_out[0] > 0)
                    or (k < BOUND and v_out[2] < 0) or (k > n_grid - BOUND and v_out[2] > 0)
                    or (j < BOUND and v_out[1] < 0) or (j > n_grid - BOUND and v_out[1] > 0))
            grid_v_out[g, i, j, k] = vkad.select(stop, Vector.zero(3), v_out)

    @vkad.kernel
    def g2p(f: vkad.i32, x: particles, v: particles, C: matrices, grid_v_out: grid_v):
        for p in range(x.shape[1]):
            fr, fw, g = rows(f)
            xp = x[fr, p]
            base, fx, w = stencil(xp)
            new_v, new_C = Vector.zero(3), Matrix.zero(3)
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    for k in vkad.static(range(3)):
                        dpos = Vector([i, j, k]) - fx
                        g_v = grid_v_out[g, base[0] + i, base[1] + j, base[2] + k]
                        weight = w[i][0] * w[j][1] * w[k][2]
                        new_v += weight * g_v
                        new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
            v[fw, p] = new_v
            x[fw, p] = xp + DT * new_v
            C[fw, p] = new_C

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: particles, loss: vkad.array(ft, ndim=0, grad=True),
                     particle_type: ids):
        for p in range(x.shape[1]):  # DiffTaichi's x_avg and loss = -x_avg[0], in one
            tr, _, _ = rows(t)
            solid = vkad.select(particle_type[p] == 1, 1.0 / n_solid, 0.0)
            loss[None] += -solid * x[tr, p][0]

    return {"compute_actuation": compute_actuation, "p2g": p2g, "grid_op": grid_op, "g2p": g2p,
            "compute_loss": compute_loss}


class DiffMPM3D(Simulation):
    """The scene, its controller and the differentiated simulation on one session (the 2-D
    port's DiffMPM, in 3-D). forward() launches one simulation (on the tape when recording);
    iteration() runs one training iteration and returns its loss (before the update); loss() the
    current loss; weights() / set_weights() the controller as numpy arrays. forward_backward() is
    DiffTaichi's clear_all_gradients, forward(), loss.grad = 1 and backward(), whose recomputed
    grids are the kept ones here."""

    PARAMS = ("weights", "bias")
    LEARNING_RATE = LEARNING_RATE
    NAME = "diffmpm3d"  # the captured graph is "<NAME> iteration"
    LAUNCH_ARGS = ("t", "f")

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 dtype: vkad.DType = vkad.f32, scene=robot, seed: int = 0, graph: bool = True,
                 loop: bool = True, memory_budget: Optional[int] = None):
        # memory_budget: bytes for the tape's checkpoints; the particles then keep two rows and
        # the grid one, cleared every step, on a Python loop of launches (the 2-D port's)
        # scene: a function that fills a Scene (robot, DiffTaichi's only one; the tests add theirs)
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        if n_grid < 2 * BOUND + 3:
            raise ValueError(f"n_grid={n_grid}: the grid needs more than its walls")
        super().__init__(session, dtype, graph)
        self.steps, self.n_grid = steps, n_grid
        self.budget = memory_budget
        ring = memory_budget is not None
        # the step loop as one Session.loop, prepared here (as the 2-D port's)
        self.loop = loop and not ring
        self.scene = scene(Scene(n_grid, seed))
        sc = self.scene
        n, n_act = sc.n_particles, sc.n_actuators
        fluid = any(t == 0 for t in sc.particle_type)
        kbs = build_kernels(dtype, n_grid, sc.n_solid_particles, fluid, ring=ring)
        self.kernels = {name: session.differentiate(kb) for name, kb in kbs.items()}
        npt = vkad.numpy_dtype(dtype)

        # DiffTaichi's init: weights ~ N(0, 0.01^2), zero bias; F = identity.
        rng = np.random.RandomState(seed)
        rows = 2 if ring else steps  # the particles' rows: a ring of two, or every step's
        x0 = np.zeros((rows, n, 3))
        x0[0] = sc.x
        F0 = np.zeros((rows, n, 3, 3))
        F0[0] = np.eye(3)
        s = session
        # one grid per step (see the docstring), or one for all
        grid = (1 if ring else steps - 1, n_grid, n_grid, n_grid)
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.ndarray(x0, npt, "x"),
            "v": s.zeros((rows, n, 3), dtype, "v"),
            "C": s.zeros((rows, n, 3, 3), dtype, "C"),
            "F": s.ndarray(F0, npt, "F"),
            "grid_v_in": s.zeros(grid + (3,), dtype, "grid_v_in"),
            "grid_m_in": s.zeros(grid, dtype, "grid_m_in"),
            "grid_v_out": s.zeros(grid + (3,), dtype, "grid_v_out"),
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
        """DiffTaichi's loop body, step f, without its clear_grid (each step has its grid)."""
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
        if self.budget is not None:  # the rings' start, and clear_grid before every step
            for name, start in self._start.items():
                self.s.copy(start, a[name])
            self.s.zero_many([a["v"], a["C"], a["loss"]])
            for f in range(self.steps - 1):
                self.s.zero_many([a["grid_v_in"], a["grid_m_in"]])
                step(f)
            self.launcher("compute_loss", recorded)(self.steps - 1)
            return
        self.s.zero_many([a["grid_v_in"], a["grid_m_in"], a["loss"]])  # clear_grid, all steps
        self.step_loop(0, self.steps - 1, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward (captured as a graph the first time, replayed after), then
        DiffTaichi's learn: w -= LEARNING_RATE * dL/dw (the class's: liquid's is 10). Returns the
        loss the forward computed."""
        if self.budget is not None and not self._planned:
            # budget: the first recording runs as launched, so that the tape plans its cut, and
            # the graph captures the next (docs/tape.md)
            self.forward_backward()
            self._planned = True
            loss = self.read_loss()
        else:
            loss = self.run_iteration(self.forward_backward)
        grads = self.gradients()
        w = self.weights()
        self.set_weights({p: w[p] - self.LEARNING_RATE * grads[p] for p in self.PARAMS})
        return loss

    def state(self) -> Dict[str, np.ndarray]:
        """The particle state of every step (with a memory budget: the rings' two rows, the
        last step's at (steps - 1) % 2) and the actuation, as numpy arrays."""
        return {k: self.arrays[k].numpy() for k in ("x", "v", "C", "F", "actuation")}


# --- the program ---------------------------------------------------------------------------------

def plot(sim: DiffMPM3D, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve and the particles at the last step from the side (x, y) and from above
    (x, z), actuated ones coloured by their actuation as DiffTaichi does; [] without
    matplotlib."""
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
    ax.set_title("diffmpm3d on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm3d_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    last = sim.steps - 1
    st = sim.state()
    x, act = st["x"][last % len(st["x"])], st["actuation"][last - 1]
    aid = np.array(sim.scene.actuator_id)
    colors = np.full((len(aid), 3), 0.4)
    on = aid >= 0
    a = act[aid[on]] * 0.5
    colors[on] = np.clip(np.stack([0.5 - a, 0.5 - np.abs(a), 0.5 + a], axis=1), 0, 1)
    start = np.array(sim.scene.x)
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for ax, c, name in zip(axes, (1, 2), ("side (x, y)", "top (x, z)")):
        ax.scatter(start[:, 0], start[:, c], color="#ddd", s=1)  # where it started
        ax.scatter(x[:, 0], x[:, c], c=colors, s=1)
        ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal")
        ax.set_title(f"{name}, step {last} after training")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm3d_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def train_and_report(s: vkad.Session, sim: DiffMPM3D, a, name: str, plot_fn) -> None:
    """main()'s run of a built simulation (liquid.py's too): `a.iters` training iterations, the
    loss line with how far the solid particles' mean x moved, then `plot_fn`'s plots."""
    losses = train(sim, a.iters, name, bar_digits=6, line_digits=7, profile=a.profile, session=s)
    final = sim.loss()
    sc = sim.scene
    start = -float(np.mean([p[0] for p, t in zip(sc.x, sc.particle_type) if t == 1]))
    print(f"loss {losses[0] if losses else final:.7f} -> {final:.7f} (the solid particles' "
          f"mean x moved {start - final:+.7f} from its start)")
    for path in plot_fn(sim, losses + [final], a.out):
        print(f"wrote {path}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=100)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID}; particles: {DENSITY} per cell "
                         "side)")
    ap.add_argument("--memory-budget", type=float, default=None, metavar="MIB",
                    help="one grid and two-row particle rings, the tape's checkpoints within "
                         "this many MiB (default: every step's grid and particles kept)")
    a = ap.parse_args(argv)
    budget = None if a.memory_budget is None else int(a.memory_budget * (1 << 20))
    with open_session(a) as s:
        sim = DiffMPM3D(s, a.steps, a.grid, vkad.f64 if a.f64 else vkad.f32, seed=a.seed,
                        graph=not a.no_graph, memory_budget=budget)
        sc = sim.scene
        print(f"{s.device_name}: robot ({sc.n_particles} particles, {sc.n_actuators} "
              f"actuators), {a.grid}^3 grid, {a.steps} steps, {a.iters} iterations")
        train_and_report(s, sim, a, "diffmpm3d", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
