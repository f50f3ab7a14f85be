"""DiffTaichi's wave.py on vkad: the initial height of a 2-D wave learns to make a target picture.

    python examples/difftaichi/wave.py --iters 20        # 256^2 grid, 256 steps, f32

The equations, parameters and optimisation loop are those of DiffTaichi's examples/wave.py
(github.com/taichi-dev/difftaichi), written in its idiom with vkad's Python front door:

- the height field with a time axis, p[t, i, j] on an n_grid x n_grid grid (256^2, dx = 1 /
  n_grid), c = 340, damping alpha = 0, dt = (sqrt(alpha^2 + dx^2 / 3) - alpha) / c;
- initialize: p[0] = initial; fdtd(t) for t = 2 .. steps - 1 (steps = 256): the 5-point
  laplacian of rows t - 1 and t - 2 (a neighbour outside the grid reads 0, DiffTaichi's get_p),
  p[t] = 2 p[t-1] + (c^2 dt^2 + c alpha dt) lap(p[t-1]) - p[t-2] - c alpha dt lap(p[t-2]);
  p[1] is never written and stays 0, as in DiffTaichi;
- the loss, dx^2 * sum over the grid of (target - p[steps - 1])^2, accumulated with an atomic
  add into a rank-0 array; plain gradient descent with learning rate 1 on `initial`
  (DiffTaichi's apply_grad, a kernel here too), from initial = 0.

**The target is drawn here.** DiffTaichi reads taichi.png (1500^2, Taichi's logo: a yin-yang in a
black ring on white), takes its first channel / 255, subtracts the mean and resizes it to the
grid. taichi_logo() draws the same figure procedurally -- white 1 outside the ring and in the
yin half, black 0 in the ring and the yang half, the two dots -- supersampled 4x4 per cell,
then subtracts the mean: the same kind of target (within the anti-aliasing of its edges), with
no image file or OpenCV.

What vkad does instead of Taichi's behaviour:
- DiffTaichi's `for i in range(n): for j in range(n)` parallelises the outer loop only (256
  threads, j serial in each); here every kernel is a 2-d task over the grid
  (kb.parallel_for_nd). No cell reads another cell's result of the same launch, so the results
  are the same; the loss's atomic sum may add in another order.
- get_p's `p[t, i, j] if 0 <= i < n and 0 <= j < n else 0` loads only inside the grid; here the
  neighbour's index is clamped into the grid and vkad.select picks 0 outside it (select
  evaluates both sides; the clamped load's adjoint gets the 0 select gives the unused side).
- with alpha = 0 (DiffTaichi's) the damping term c alpha dt lap(p[t-2]) is 0 * a finite number,
  and is left out at build time (ti.static would keep it): the same result, 5 loads fewer.
- DiffTaichi allocates max_steps = 512 rows so that every 20th iteration can simulate twice as
  long for its video frames (cv2.imshow / imwrite); the loss is at row steps - 1 either way and
  those extra steps change neither the loss nor the gradient. Here p has `steps` rows and no
  frames are shown; with matplotlib, wave_loss.png and wave_final.png (target, learned initial
  height, final wave) are written into --out.
- ti.ad.Tape(loss) zeroes the loss and every gradient, seeds d loss = 1 and runs the kernels'
  gradients in reverse; here the loss is zeroed with the forward, a vkad.Tape records
  initialize, the step loop and compute_loss, and backward() (seed 1) zeroes the gradients and
  runs the adjoints.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop);
each step stays one dispatch (see the constructor).
The whole iteration (zeroing, forward, backward, the update) is captured once as a graph and
replayed (--no-graph launches the kernels one by one; the results are the same). The Wave class
is what tests/python/test_difftaichi_wave.py and bench/difftaichi_ports.py import.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)

# DiffTaichi's constants (examples/wave.py)
N_GRID = 256
STEPS = 256
C = 340.0
ALPHA = 0.0  # damping
LEARNING_RATE = 1.0


def constants(n_grid: int = N_GRID) -> Dict[str, float]:
    """dx, inv_dx2, dt and the update's two coefficients, in Python floats (f64) as DiffTaichi
    computes them before they reach the kernel."""
    dx = 1.0 / n_grid
    inv_dx = 1.0 / dx
    dt = (math.sqrt(ALPHA * ALPHA + dx * dx / 3) - ALPHA) / C
    return {"dx": dx, "inv_dx2": inv_dx * inv_dx, "dt": dt,
            "k_q": C * C * dt * dt + C * ALPHA * dt, "k_p": C * ALPHA * dt}


def taichi_logo(n_grid: int = N_GRID, supersample: int = 4) -> np.ndarray:
    """DiffTaichi's target: taichi.png's first channel / 255 minus its mean, on the grid (row i,
    column j), drawn rather than read (see the docstring). Float64, mean 0."""
    s = supersample
    u = (np.arange(n_grid * s) + 0.5) / (n_grid * s)  # cell centres of the fine samples
    y, x = np.meshgrid(u, u, indexing="ij")  # y: row (down), x: column
    r = np.hypot(x - 0.5, y - 0.5)
    R = 0.457  # inside the black ring (taichi.png: ring 0.457..0.5 of the width)
    upper = np.hypot(x - 0.5, y - (0.5 - R / 2))  # the two bulges' centres, radius R / 2
    lower = np.hypot(x - 0.5, y - (0.5 + R / 2))
    dot = 0.13 * R
    img = np.where(x < 0.5, 1.0, 0.0)  # the white (left) and black (right) halves
    img = np.where(upper < R / 2, 1.0, img)
    img = np.where(lower < R / 2, 0.0, img)
    img = np.where(upper < dot, 0.0, img)
    img = np.where(lower < dot, 1.0, img)
    img = np.where(r > R, 0.0, img)  # the ring
    img = np.where(r > 0.5, 1.0, img)  # white outside it
    img = img.reshape(n_grid, s, n_grid, s).mean(axis=(1, 3))
    return img - img.mean()


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_grid: int):
    """DiffTaichi's kernels, one KernelBuilder each; fdtd and compute_loss take the step t (an
    i32 parameter). The laplacian's neighbours are unrolled at build time (ti.func)."""
    k = constants(n_grid)
    kernels = {}

    def array(kb, name, rank, grad=True):
        return kb.ndarray(name, ft, rank, grad=grad, readonly=not grad)

    kb = vkad.KernelBuilder("initialize")
    initial, p = array(kb, "initial", 2), array(kb, "p", 3)
    with kb.parallel_for_nd("cells", p.shape[1], p.shape[2]) as (i, j):
        p[0, i, j] = initial[i, j]
    kernels["initialize"] = kb

    kb = vkad.KernelBuilder("fdtd")
    t = kb.scalar("t", vkad.i32)
    p = array(kb, "p", 3)
    with kb.parallel_for_nd("cells", p.shape[1], p.shape[2]) as (i, j):
        def get_p(s, di, dj):
            """p[s, i + di, j + dj], 0 outside the grid (DiffTaichi's get_p)."""
            if di == 0 and dj == 0:
                return p[s, i, j]
            a, b = i, j
            if di < 0:
                inside, a = i >= 1, vkad.max(i - 1, 0)
            elif di > 0:
                inside, a = i < n_grid - 1, vkad.min(i + 1, n_grid - 1)
            elif dj < 0:
                inside, b = j >= 1, vkad.max(j - 1, 0)
            else:
                inside, b = j < n_grid - 1, vkad.min(j + 1, n_grid - 1)
            return vkad.select(inside, p[s, a, b], 0.0)

        def laplacian(s):  # DiffTaichi's order of the terms
            return k["inv_dx2"] * (-4 * get_p(s, 0, 0) + get_p(s, 0, -1) + get_p(s, 0, 1)
                                   + get_p(s, 1, 0) + get_p(s, -1, 0))

        new_p = 2 * p[t - 1, i, j] + k["k_q"] * laplacian(t - 1) - p[t - 2, i, j]
        if ALPHA != 0.0:  # (k_p = 0 with DiffTaichi's alpha: the term is left out)
            new_p = new_p - k["k_p"] * laplacian(t - 2)
        p[t, i, j] = new_p
    kernels["fdtd"] = kb

    kb = vkad.KernelBuilder("compute_loss")
    t = kb.scalar("t", vkad.i32)
    p, target, loss = array(kb, "p", 3), array(kb, "target", 2, grad=False), array(kb, "loss", 0)
    with kb.parallel_for_nd("cells", p.shape[1], p.shape[2]) as (i, j):
        loss.atomic_add(None, k["dx"] * k["dx"] * (target[i, j] - p[t, i, j]) ** 2)
    kernels["compute_loss"] = kb
    return kernels


def build_apply_grad(ft: vkad.DType) -> vkad.KernelBuilder:
    """DiffTaichi's apply_grad: initial -= learning_rate * initial.grad (not differentiated)."""
    kb = vkad.KernelBuilder("apply_grad")
    initial = kb.ndarray("initial", ft, 2)
    grad = kb.ndarray("initial_grad", ft, 2, readonly=True)
    with kb.parallel_for_nd("cells", initial.shape[0], initial.shape[1]) as (i, j):
        initial[i, j] = initial[i, j] - LEARNING_RATE * grad[i, j]
    return kb


class Wave(Simulation):
    """The wave, its target and the differentiated simulation on one session.

    forward() launches one simulation (on the tape when recording); iteration() runs one
    training iteration (forward, backward, DiffTaichi's update) and returns its loss (before
    the update); loss() the current loss; weights() / set_weights() the initial height as
    numpy. `seed` is accepted for the benchmarks' common interface and unused: DiffTaichi
    starts from initial = 0."""

    PARAMS = ("initial",)
    NAME = "wave"

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 loop: bool = True, target: Optional[np.ndarray] = None):
        if steps < 3:
            raise ValueError(f"steps={steps}: the simulation needs at least 3 steps")
        if n_grid < 2:
            raise ValueError(f"n_grid={n_grid}: the grid needs at least 2 cells per side")
        super().__init__(session, dtype, graph)
        self.steps, self.n_grid = steps, n_grid
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        kbs = build_kernels(dtype, n_grid)
        self.kernels = {name: session.differentiate(kb) for name, kb in kbs.items()}
        self.apply_grad_kernel = session.compile(build_apply_grad(dtype))
        npt = vkad.numpy_dtype(dtype)
        if target is None:
            target = taichi_logo(n_grid)
        self.target = np.asarray(target, np.float64)
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            "p": s.zeros((steps, n_grid, n_grid), dtype, "p"),
            "initial": s.zeros((n_grid, n_grid), dtype, "initial"),
            "target": s.ndarray(self.target, npt, "target"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        self._apply_grad = self.bind_update(self.apply_grad_kernel)
        # loop=True: the step loop said as one (Session.loop), prepared here (the tape's check of
        # the loop made now). Its 2-d tasks of n_grid^2 cells are too wide to roll into a
        # resident kernel, and each step reads its neighbours in the last two rows, so the graph
        # rework's plan is the launches as they are (no gather recompute or fusion applies): the
        # loop saves the Python calls, and the steps run as one dispatch each.
        if loop:
            self.s.prepare_loop(2, steps, self._step(True))

    # launches
    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        fdtd = self.launcher("fdtd", recorded)

        def step(t):
            fdtd(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation from p[0] = initial, p[1] = 0: DiffTaichi's forward() (fdtd for t =
        2 .. steps - 1, then the loss at the last step). Asynchronous."""
        self.s.zero(self.arrays["loss"])  # ti.ad.Tape(loss) zeroes the loss
        self.launcher("initialize", recorded)()
        step = self._step(recorded)
        self.step_loop(2, self.steps, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update: initial -= LEARNING_RATE * dL/d
        initial, on the device. Returns the loss the forward computed."""
        return self.run_iteration(self.forward_backward, self._apply_grad)  # update off the tape

    def heights(self) -> np.ndarray:
        """p[t, i, j] of the last simulation."""
        return self.arrays["p"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(sim: Wave, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve, and the target, the learned initial height and the last step's wave
    (shown as DiffTaichi shows p: p + 0.5); [] without matplotlib."""
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
    ax.set_xlabel("iteration"), ax.set_ylabel("loss")
    ax.set_title("wave on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "wave_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    p = sim.heights()
    panels = [("target", sim.target), ("initial height (learned)", p[0]),
              (f"p at step {sim.steps - 1}", p[sim.steps - 1])]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    for ax, (title, img) in zip(axes, panels):
        ax.imshow(np.clip(img + 0.5, 0, 1), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title), ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    written.append(os.path.join(out, "wave_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=200, seed=False)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID}; dx = 1 / grid)")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = Wave(s, a.steps, a.grid, vkad.f64 if a.f64 else vkad.f32, graph=not a.no_graph,
                   loop=not a.no_loop)
        print(f"{s.device_name}: {a.grid}^2 grid, {a.steps} steps, {a.iters} iterations")
        losses = train(sim, a.iters, "wave", profile=a.profile,
                       session=s)
        final = sim.loss()
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f}")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
