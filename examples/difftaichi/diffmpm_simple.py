"""DiffTaichi's diffmpm_simple.py on vkad: an elastic block's initial velocity learns to reach a point.

    python examples/difftaichi/diffmpm_simple.py --iters 30    # 3600 particles, 1024 steps, f32

The scene, constants, loss and optimiser are those of DiffTaichi's examples/diffmpm_simple.py
(github.com/taichi-dev/difftaichi), its kernels `@vkad.kernel` functions written as DiffTaichi
writes them:

- MLS-MPM in 2-D on a 120^2 grid (dx = 1 / 120), dt = 3e-4, steps = 1024, gravity 9.8; a block
  of N^2 = 3600 particles (N = 60), particle i * N + j at dx (0.7 i + 10, 0.7 j + 25), mass and
  volume 1, fixed corotated elasticity with E = mu = lambda = 100; F[0] = I;
- particle state x[f, p], v[f, p] (2-vectors), C[f, p], F[f, p] (2x2 matrices) and the grid
  grid_v_in[f, i, j], grid_m_in[f, i, j], grid_v_out[f, i, j], all with a time axis, as
  DiffTaichi has them; per step f = 0 .. steps - 2: p2g(f) (the 3x3 quadratic B-spline stencil,
  `grid_v_in[f, base + offset] += ...` atomic adds), grid_op(f) (momentum to velocity, gravity,
  walls 3 cells thick that stop what moves into them, runtime `if`s as DiffTaichi writes them),
  g2p(f) (velocity, C and the position of step f + 1);
- set_v() gives every particle the trained init_v (a rank-0 2-vector, from (0, 0)) at step 0;
  the loss is 0.5 |x_avg - (0.3, 0.6)|^2 with x_avg the mean position at the last step
  (compute_x_avg's atomic adds into a rank-0 array, then compute_loss); gradient descent on
  init_v, learning rate 10, 30 iterations.

What vkad does instead of Taichi's behaviour:
- DiffTaichi fills grid_v_in and grid_m_in with 0 and sets x_avg = 0 from Python before each
  tape (they accumulate atomic adds); here forward() zeroes them inside the tape's recording, so
  a replayed iteration zeroes them too. ti.Tape(loss) zeroes the gradients, seeds d loss = 1 and
  runs the kernels' gradients in reverse; here a vkad.Tape records set_v, the step loop,
  compute_x_avg and compute_loss, and backward() (seed 1) zeroes the gradients and runs the
  adjoints.
- DiffTaichi's g2p reads v[f + 1, p] back after storing it; here the stored value is reused (a
  vkad task may not read what it stored, docs/kernels.md).
- DiffTaichi allocates max_steps = 1024 grid rows; the last step's row is never written, so the
  grid has steps - 1 rows here (x, v, C, F have steps). At the default size a grid array is 118 MB
  (f32), under lavapipe's 128 MiB buffers; --f64 at the default size is not (use --grid / --n).
- DiffTaichi updates init_v from Python scope in f64 and stores f32; here apply_grad runs on the
  device in the simulation's dtype. DiffTaichi shows every 16th step in a GUI; here, with
  matplotlib, diffmpm_simple_loss.png (DiffTaichi's plot) and diffmpm_simple_final.png (the
  particles every 128th step of the last simulation and the target) go into --out.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop).
The whole iteration (zeroing, set_v, forward, backward, the update) is captured once as a graph
and replayed (--no-graph launches the kernels one by one; the results are the same). The
DiffMPMSimple class is what tests/python/test_difftaichi_diffmpm_simple.py and
bench/difftaichi.py import.
"""

import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared parts)
from vkad import Matrix, Vector

# DiffTaichi's constants (examples/diffmpm_simple.py)
N = 60  # particles per side of the block
N_GRID = 120
DT = 3e-4
P_MASS = 1.0
P_VOL = 1.0
E = 100.0
MU = E
LA = E
STEPS = 1024
GRAVITY = 9.8
TARGET = (0.3, 0.6)
BOUND = 3
LEARNING_RATE = 10.0
ITERS = 30


SPACING = 0.7  # cells between neighbouring particles


def block(n: int = N, n_grid: int = N_GRID, spacing: float = SPACING) -> np.ndarray:
    """DiffTaichi's particles: i * n + j at dx (0.7 i + 10, 0.7 j + 25), (n^2, 2) float64
    (diffmpm_checkpointing.py's spacing is 0.5)."""
    dx = 1.0 / n_grid
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.stack([dx * (i * spacing + 10), dx * (j * spacing + 25)], -1).reshape(-1, 2)


def block_side(n_grid: int = N_GRID, n: int = N, spacing: float = SPACING) -> int:
    """The most particles per side (n at most) whose block, placed in DiffTaichi's cells,
    keeps its stencils clear of the walls on an n_grid^2 grid: N at 120, 49 at 64, 3 at 32."""
    # the most n with 25 + spacing (n - 1) + 2 < n_grid - BOUND (the constructor's check)
    return max(1, min(n, math.ceil((n_grid - BOUND - 27) / spacing)))


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_grid: int, ring: bool = False):
    """DiffTaichi's kernels as @vkad.kernel functions: set_v, p2g(f), grid_op(f), g2p(f),
    compute_x_avg(t), compute_loss; and its update, apply_grad. The 3x3 stencil is unrolled
    (vkad.static, DiffTaichi's ti.static); `+=` on a grid cell or x_avg is an atomic add.
    `ring` (diffmpm_checkpointing.py): the particle arrays hold two rows, step f reading row f % 2
    and writing row (f + 1) % 2, and the grid one, which every step reuses."""
    dx, inv_dx = 1.0 / n_grid, float(n_grid)

    @vkad.func
    def rows(f):  # the particles' rows step f reads and writes, and its grid's
        if vkad.static(ring):
            return f % 2, (f + 1) % 2, 0 * f
        return f, f + 1, f

    vec, mat = vkad.vec(2, ft), vkad.mat(2, 2, ft)
    particles = vkad.array(vec, ndim=2, grad=True)  # x[f, p], v[f, p]
    matrices = vkad.array(mat, ndim=2, grad=True)   # C[f, p], F[f, p]
    grid_v = vkad.array(vec, ndim=3, grad=True)     # grid_v_in[f, i, j], grid_v_out[f, i, j]
    grid_m = vkad.array(ft, ndim=3, grad=True)      # grid_m_in[f, i, j]
    point = vkad.array(vec, ndim=0, grad=True)      # init_v, x_avg

    @vkad.kernel
    def set_v(init_v: point, v: particles):
        for i in range(v.shape[1]):
            v[0, i] = init_v[None]

    @vkad.kernel
    def p2g(f: vkad.i32, x: particles, v: particles, C: matrices, F: matrices,
            grid_v_in: grid_v, grid_m_in: grid_m):
        for p in range(x.shape[1]):
            fr, fw, g = rows(f)
            base = vkad.cast(x[fr, p] * inv_dx - 0.5, vkad.i32)  # truncated, as ti.cast
            fx = x[fr, p] * inv_dx - vkad.cast(base, ft)
            w = (0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2)
            new_F = (Matrix.diag(2, 1.0) + DT * C[fr, p]) @ F[fr, p]
            F[fw, p] = new_F
            J = new_F.determinant()
            r, s = vkad.polar_decompose(new_F)
            cauchy = 2 * MU * (new_F - r) @ new_F.transpose() + Matrix.diag(2, LA * (J - 1) * J)
            stress = -(DT * P_VOL * 4 * inv_dx * inv_dx) * cauchy
            affine = stress + P_MASS * C[fr, p]
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    offset = Vector([i, j])
                    dpos = (offset - fx) * dx
                    weight = w[i][0] * w[j][1]
                    grid_v_in[g, base + offset] += weight * (P_MASS * v[fr, p] + affine @ dpos)
                    grid_m_in[g, base + offset] += weight * P_MASS

    @vkad.kernel
    def grid_op(f: vkad.i32, grid_v_in: grid_v, grid_m_in: grid_m, grid_v_out: grid_v):
        for i, j in vkad.ndrange(n_grid, n_grid):
            _, _, g = rows(f)
            inv_m = 1 / (grid_m_in[g, i, j] + 1e-10)
            v_out = inv_m * grid_v_in[g, i, j]
            v_out[1] -= DT * GRAVITY
            # the walls: a node within BOUND cells of one stops what moves into it
            if i < BOUND and v_out[0] < 0:
                v_out[0] = 0.0
            if i > n_grid - BOUND and v_out[0] > 0:
                v_out[0] = 0.0
            if j < BOUND and v_out[1] < 0:
                v_out[1] = 0.0
            if j > n_grid - BOUND and v_out[1] > 0:
                v_out[1] = 0.0
            grid_v_out[g, i, j] = v_out

    @vkad.kernel
    def g2p(f: vkad.i32, x: particles, v: particles, C: matrices, grid_v_out: grid_v):
        for p in range(x.shape[1]):
            fr, fw, g = rows(f)
            base = vkad.cast(x[fr, p] * inv_dx - 0.5, vkad.i32)
            fx = x[fr, p] * inv_dx - vkad.cast(base, ft)
            w = (0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2)
            new_v = Vector([0.0, 0.0])
            new_C = Matrix([[0.0, 0.0], [0.0, 0.0]])
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    dpos = Vector([i, j]) - fx
                    g_v = grid_v_out[g, base[0] + i, base[1] + j]
                    weight = w[i][0] * w[j][1]
                    new_v += weight * g_v
                    new_C += 4 * weight * g_v.outer_product(dpos) * inv_dx
            v[fw, p] = new_v
            x[fw, p] = x[fr, p] + DT * new_v  # DiffTaichi reads v[f + 1, p] back
            C[fw, p] = new_C

    @vkad.kernel
    def compute_x_avg(t: vkad.i32, x: particles, x_avg: point):
        for i in range(x.shape[1]):
            tr, _, _ = rows(t)
            x_avg[None] += (1 / x.shape[1]) * x[tr, i]

    @vkad.kernel
    def compute_loss(x_avg: point, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            dist = (x_avg[None] - Vector(TARGET)) ** 2
            loss[None] = 0.5 * (dist[0] + dist[1])

    @vkad.kernel
    def apply_grad(init_v: vkad.array(vec, ndim=0),
                   init_v_grad: vkad.array(vec, ndim=0, readonly=True)):
        for _ in range(1):  # DiffTaichi's update (not differentiated)
            init_v[None] = init_v[None] - LEARNING_RATE * init_v_grad[None]

    return {"set_v": set_v, "p2g": p2g, "grid_op": grid_op, "g2p": g2p,
            "compute_x_avg": compute_x_avg, "compute_loss": compute_loss}, apply_grad


class DiffMPMSimple(Simulation):
    """The block, the grid and the differentiated simulation on one session.

    iteration() runs forward, backward and DiffTaichi's update and returns the loss (before the
    update); loss() the current init_v's loss; weights() / set_weights() init_v as numpy.
    `n` (particles per side) and `n_grid` shrink the scene for tests (DiffTaichi places the
    block in grid cells, so it stays in the same cells of a smaller grid). `seed` is accepted for
    the benchmarks' common interface and unused: DiffTaichi's scene has nothing random."""

    PARAMS = ("init_v",)
    NAME = "diffmpm_simple"
    LAUNCH_ARGS = ("t", "f")
    SPACING = SPACING  # the block's, in cells
    RING = False       # True (diffmpm_checkpointing.py): two particle rows and one grid row

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 n: int = N, dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 loop: bool = True):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        spacing = self.SPACING
        if 25 + spacing * (n - 1) + 2 >= n_grid - BOUND:  # the top row's stencil, in cells
            raise ValueError(f"n={n} particles per side on a {n_grid}^2 grid: the block "
                             f"(DiffTaichi's cells 10 and 25 onwards, {spacing} apart) reaches "
                             f"the walls; {block_side(n_grid, n, spacing)} per side fits")
        super().__init__(session, dtype, graph)
        self.steps, self.n_grid, self.n = steps, n_grid, n * n
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        kernels, apply_grad = build_kernels(dtype, n_grid, self.RING)
        self.kernels = {name: session.differentiate(k) for name, k in kernels.items()}
        npt = vkad.numpy_dtype(dtype)
        s = session
        rows = 2 if self.RING else steps  # the particles' rows: a ring of two, or every step's
        x0 = np.zeros((rows, n * n, 2))
        x0[0] = block(n, n_grid, spacing)
        F0 = np.zeros((rows, n * n, 2, 2))
        F0[0] = np.eye(2)
        grid = (1 if self.RING else steps - 1, n_grid, n_grid)  # step f's grid in row f
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.ndarray(x0, npt, "x"),
            "v": s.zeros((rows, n * n, 2), dtype, "v"),
            "C": s.zeros((rows, n * n, 2, 2), dtype, "C"),
            "F": s.ndarray(F0, npt, "F"),
            "grid_v_in": s.zeros(grid + (2,), dtype, "grid_v_in"),
            "grid_m_in": s.zeros(grid, dtype, "grid_m_in"),
            "grid_v_out": s.zeros(grid + (2,), dtype, "grid_v_out"),
            "init_v": s.zeros(2, dtype, "init_v"),  # DiffTaichi: init_v[None] = [0, 0]
            "x_avg": s.zeros(2, dtype, "x_avg"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        self._apply_grad = self.bind_update(s.compile(apply_grad))
        if loop:  # the step loop (and its adjoint) made now, not in the first iteration
            self.s.prepare_loop(0, steps - 1, self._step(True))

    def _step(self, recorded: bool):
        """DiffTaichi's substep(f) (symbolic inside Session.loop, which traces it once)."""
        p2g, grid_op, g2p = (self.launcher(k, recorded) for k in ("p2g", "grid_op", "g2p"))

        def substep(f):
            p2g(f)
            grid_op(f)
            g2p(f)
        return substep

    def forward(self, recorded: bool = True) -> None:
        """DiffTaichi's taped block: set_v, steps - 1 substeps, compute_x_avg, compute_loss,
        after zeroing the grid's accumulators and x_avg (DiffTaichi does it before its tape).
        Asynchronous."""
        a = self.arrays
        self.s.zero_many([a["grid_v_in"], a["grid_m_in"], a["x_avg"]])
        self.launcher("set_v", recorded)()
        substep = self._step(recorded)
        if self.loop:
            self.s.loop(0, self.steps - 1, substep)
        else:
            for f in range(self.steps - 1):
                substep(f)
        self.launcher("compute_x_avg", recorded)(self.steps - 1)
        self.launcher("compute_loss", recorded)()

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update (init_v -= 10 d loss / d init_v) on
        the device. Returns the loss the forward computed."""
        return self.run_iteration(self.forward_backward, self._apply_grad)

    def positions(self) -> np.ndarray:
        """x[f, p] of the last simulation, every step."""
        return self.arrays["x"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(sim: DiffMPMSimple, losses: Sequence[float], out: str) -> List[str]:
    """DiffTaichi's loss plot, and the particles every 128th step of the last simulation with
    the target; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(losses)
    ax.set_title("Optimization of Initial Velocity")
    ax.set_ylabel("Loss"), ax.set_xlabel("Gradient Descent Iterations")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm_simple_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    x = sim.positions()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.set_facecolor("#AAAAAA")  # DiffTaichi's GUI
    shown = list(range(0, sim.steps, 128)) + [sim.steps - 1]
    for k, f in enumerate(shown):
        ax.scatter(x[f, :, 0], x[f, :, 1], s=0.3, color="#112233",
                   alpha=0.15 + 0.85 * k / max(1, len(shown) - 1))
    ax.add_patch(plt.Circle(TARGET, 0.008, color="white"))
    ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal")
    ax.set_title(f"every 128th step of {sim.steps}; the target white")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm_simple_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS, seed=False)
    ap.add_argument("--grid", type=int, default=N_GRID, help=f"grid cells per side (default "
                    f"{N_GRID})")
    ap.add_argument("--n", type=int, default=N, help=f"particles per side of the block (default "
                    f"{N})")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = DiffMPMSimple(s, a.steps, a.grid, a.n, vkad.f64 if a.f64 else vkad.f32,
                            graph=not a.no_graph, loop=not a.no_loop)
        print(f"{s.device_name}: {sim.n} particles, {a.grid}^2 grid, {a.steps} steps, "
              f"{a.iters} iterations")
        losses = train(sim, a.iters, "diffmpm_simple", profile=a.profile, session=s)
        final = sim.loss()
        init_v = sim.weights()["init_v"]
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f}; init_v "
              f"({init_v[0]:.4f}, {init_v[1]:.4f})")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
