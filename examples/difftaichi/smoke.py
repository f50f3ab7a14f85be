"""DiffTaichi's smoke_taichi.py on vkad: the initial velocity of a 2-D fluid learns to carry smoke
into a target picture.

    python examples/difftaichi/smoke.py --iters 20        # 128^2 grid, 100 steps, f32

The equations, parameters and optimisation loop are those of DiffTaichi's
examples/smoke_taichi.py (github.com/taichi-dev/difftaichi), written in its idiom with vkad's
Python front door -- stable fluids on a periodic n_grid x n_grid grid (128^2, dx = 1 / n_grid),
every field with a time axis:

- v[t, y, x] (a 2-vector, in cells per step; component 0 along y, 1 along x), v_updated,
  div and smoke with `steps` rows (100), the pressure p with rows a = k + 10 t (10 Jacobi
  iterations per step); every index wraps around the grid (dec_index / inc_index / imod);
- forward: for t = 1 .. steps - 1: advect(v, v_updated, -1, t) (semi-Lagrangian: the cell
  (y, x) fetches, bilinearly, field[t - 1] at (y - v[t - 1, y, x][0], x - v[t - 1, y, x][1]));
  compute_div(t), div = -0.5 dx (central differences of v_updated[t]); compute_p(t, k) for
  k = 0 .. 9, the Jacobi iteration p[a + 1] = (div[t] + the 4 neighbours of p[a]) / 4 with
  a = k + 10 t; update_v(t), v[t] = v_updated[t] - 0.5 (central difference of p[10 t - 1]) / dx;
  advect(smoke, smoke, 0, t) (smoke[t - 1] fetched at v[t]); then compute_loss, the mean over
  the grid of (target - smoke[steps - 1])^2, accumulated with an atomic add into a rank-0 array;
- the optimised quantity is the initial velocity v[0] (from 0), updated by plain gradient
  descent with learning rate 400 (DiffTaichi's apply_grad, a kernel here too), 240 iterations;
  smoke[0] is DiffTaichi's checkerboard of 16-cell squares, (i // 16 + j // 16) % 2.

Two quirks of DiffTaichi's indices are kept, since they are its program: each step's Jacobi
iterations start from the last step's final pressure (row 10 t, written by step t - 1; row 10
is never written and reads 0), and update_v subtracts the gradient of p[10 t - 1] -- step t - 1's
second-to-last iterate, not step t's result (row 9, read by step 1, is never written: v[1] =
v_updated[1]). So the projection lags one step behind the velocity it corrects.

**The target is drawn here.** DiffTaichi reads taichi.png (1500^2, Taichi's logo: a yin-yang in a
black ring on white), resizes it to the grid (cv2.resize, bilinear) and takes its first channel
/ 255 -- values in [0, 1], with no mean taken off (wave.py's target takes it off). taichi_image()
draws the same figure procedurally as examples/difftaichi/wave.py's taichi_logo does (white 1
outside the ring and in the yin half, black 0 in the ring and the yang half, the two dots),
supersampled 4x4 per cell, without the mean subtraction: the same target within the
anti-aliasing of its edges (cv2's bilinear resize samples the picture, without averaging), and no
image file or OpenCV. Against taichi.png resized as cv2.INTER_LINEAR does (decoded and resized in
numpy, once, to check): at 128^2 the cells differ by 0.016 on average, 141 of 16384 (on edges)
by more than 0.5, and the loss at v[0] = 0 is 0.4917 here against 0.4986 with the picture.

What vkad does instead of Taichi's behaviour:
- DiffTaichi's `for y in range(n): for x in range(n)` parallelises the outer loop only (n
  threads, x serial in each); here every kernel is a 2-d task over the grid
  (kb.parallel_for_nd). No cell reads another cell's result of the same launch, so the results
  are the same; the loss's atomic sum may add in another order.
- advect is one Taichi kernel taking its fields as ti.template(); here it is two kernels built by
  one Python function (advect_v for the 2-vector velocity, advect_smoke for the scalar smoke),
  as Taichi instantiates the template twice. advect(smoke, smoke, 0, t) passes one field as
  input and output: advect_smoke has one `smoke` parameter, read at row t - 1 and written at
  row t, which vkad's tape accepts because both rows are launch-uniform and differ (docs/tape.md,
  "In place"; a kernel reading and writing one array at rows that may overlap is refused).
  dec_index / inc_index are vkad.select on the index
  (Taichi's `if`, flattened); imod is the integer `%`, which in vkad, as in Python and Taichi,
  takes the divisor's sign. floor has derivative 0, so the bilinear weights' derivatives are
  those of center - floor(center), as in Taichi (rw = center_x - left_ix).
- compute_p(t, k) and update_v(t) compute the pressure row a from the step t inside the kernel
  (t and k are i32 parameters, as in DiffTaichi): inside Session.loop t is symbolic and may only
  be passed to a kernel (plus or minus an int), not multiplied in Python.
- DiffTaichi places p with steps * 11 rows; rows 0 .. 9 and past 10 * (steps - 1) + 10 are never
  touched, so here p has 10 * steps + 1 rows (rows 0 .. 9 stay zero, as there).
- DiffTaichi's fields persist across iterations and forward() overwrites rows 1 .. steps - 1 of
  each before reading them, so nothing stale is read; here the same arrays are reused the same
  way. A vkad tape would refuse a recorded launch that overwrites a row an earlier one read; the
  time axes (and p's Jacobi rows) are what make every write land on a fresh row, as in Taichi.
- DiffTaichi shows and writes frames (cv2.imshow / imwrite) every 10th iteration, and the
  velocity field; here nothing is shown; with matplotlib, smoke_loss.png and smoke_final.png
  (target, initial smoke, learned initial velocity, last step's smoke) are written into --out.
- ti.ad.Tape(loss) zeroes the loss and every gradient, seeds d loss = 1 and runs the kernels'
  gradients in reverse; here the loss is zeroed with the forward, a vkad.Tape records the step
  loop and compute_loss, and backward() (seed 1) zeroes the gradients and runs the adjoints.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop);
its 2-d tasks of n_grid^2 cells are too wide to roll, so each step stays 14 dispatches (advect_v,
compute_div, 10 x compute_p, update_v, advect_smoke): 1386 per forward at 100 steps, as many
adjoints. The whole iteration (zeroing, forward, backward, the update) is captured once as a
graph and replayed (--no-graph launches the kernels one by one; the results are the same). The
Smoke class is what tests/python/test_difftaichi_smoke.py and bench/difftaichi_ports.py import.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)

# DiffTaichi's constants (examples/smoke_taichi.py)
N_GRID = 128
STEPS = 100
NUM_JACOBI = 10  # DiffTaichi's num_iterations_gauss_seidel (the iteration is Jacobi's)
LEARNING_RATE = 400.0
ITERS = 240
CHECKER = 16  # smoke[0, i, j] = (i // 16 + j // 16) % 2


def taichi_image(n_grid: int = N_GRID, supersample: int = 4) -> np.ndarray:
    """DiffTaichi's target: taichi.png's first channel / 255 on the grid (row i, column j), in
    [0, 1], drawn rather than read (see the docstring; wave.py's taichi_logo's figure). Float64."""
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
    return img.reshape(n_grid, s, n_grid, s).mean(axis=(1, 3))


def initial_smoke(n_grid: int = N_GRID) -> np.ndarray:
    """DiffTaichi's smoke[0]: (i // 16 + j // 16) % 2. Float64."""
    i = np.arange(n_grid)
    return ((i[:, None] // CHECKER + i[None, :] // CHECKER) % 2).astype(np.float64)


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_grid: int):
    """DiffTaichi's kernels, one KernelBuilder each, taking the step t (and compute_p the
    iteration k) as i32 parameters. dec_index / inc_index / imod and the bilinear fetch are
    unrolled at build time (ti.func)."""
    n = n_grid
    dx = 1.0 / n_grid
    kernels = {}

    def array(kb, name, rank, element=(), grad=True):
        return kb.ndarray(name, ft, rank, grad=grad, readonly=not grad, element=element)

    def dec_index(i):
        return vkad.select(i - 1 < 0, n - 1, i - 1)

    def inc_index(i):
        return vkad.select(i + 1 >= n, 0, i + 1)

    def advect(name, element):
        """DiffTaichi's advect(field, field_out, t_offset, t): advect_v is advect(v, v_updated,
        -1, t), advect_smoke advect(smoke, smoke, 0, t)."""
        kb = vkad.KernelBuilder(name)
        t = kb.scalar("t", vkad.i32)
        if element:  # the velocity advects itself: field = v, field_out = v_updated
            v = array(kb, "v", 3, (2,))
            field, field_out, t_offset = v, array(kb, "v_updated", 3, (2,)), -1
        else:  # one array for field and field_out: read at t - 1, written at t
            v = array(kb, "v", 3, (2,))
            field = field_out = array(kb, "smoke", 3)
            t_offset = 0
        with kb.parallel_for_nd("cells", n, n) as (y, x):
            vel = v[t + t_offset, y, x]
            center_x = y.cast(ft) - vel[0]
            center_y = x.cast(ft) - vel[1]
            left, top = vkad.floor(center_x), vkad.floor(center_y)
            rw = center_x - left  # relative weight of the right-hand cell
            bw = center_y - top  # relative weight of the bottom cell
            left_ix = left.cast(vkad.i32) % n  # imod: wrap around the edges
            right_ix = inc_index(left_ix)
            top_ix = top.cast(vkad.i32) % n
            bot_ix = inc_index(top_ix)
            s = t - 1
            field_out[t, y, x] = (1 - rw) * ((1 - bw) * field[s, left_ix, top_ix]
                                             + bw * field[s, left_ix, bot_ix]) \
                + rw * ((1 - bw) * field[s, right_ix, top_ix] + bw * field[s, right_ix, bot_ix])
        return kb

    kernels["advect_v"] = advect("advect_v", True)
    kernels["advect_smoke"] = advect("advect_smoke", False)

    kb = vkad.KernelBuilder("compute_div")
    t = kb.scalar("t", vkad.i32)
    v_updated, div = array(kb, "v_updated", 3, (2,)), array(kb, "div", 3)
    with kb.parallel_for_nd("cells", n, n) as (y, x):
        div[t, y, x] = -0.5 * dx * (v_updated[t, inc_index(y), x, 0]
                                    - v_updated[t, dec_index(y), x, 0]
                                    + v_updated[t, y, inc_index(x), 1]
                                    - v_updated[t, y, dec_index(x), 1])
    kernels["compute_div"] = kb

    kb = vkad.KernelBuilder("compute_p")
    t, k = kb.scalar("t", vkad.i32), kb.scalar("k", vkad.i32)
    div, p = array(kb, "div", 3), array(kb, "p", 3)
    with kb.parallel_for_nd("cells", n, n) as (y, x):
        a = k + t * NUM_JACOBI
        p[a + 1, y, x] = (div[t, y, x] + p[a, dec_index(y), x] + p[a, inc_index(y), x]
                          + p[a, y, dec_index(x)] + p[a, y, inc_index(x)]) / 4.0
    kernels["compute_p"] = kb

    kb = vkad.KernelBuilder("update_v")
    t = kb.scalar("t", vkad.i32)
    v, v_updated, p = array(kb, "v", 3, (2,)), array(kb, "v_updated", 3, (2,)), array(kb, "p", 3)
    with kb.parallel_for_nd("cells", n, n) as (y, x):
        a = t * NUM_JACOBI - 1
        v[t, y, x, 0] = v_updated[t, y, x, 0] - 0.5 * (p[a, inc_index(y), x]
                                                       - p[a, dec_index(y), x]) / dx
        v[t, y, x, 1] = v_updated[t, y, x, 1] - 0.5 * (p[a, y, inc_index(x)]
                                                       - p[a, y, dec_index(x)]) / dx
    kernels["update_v"] = kb

    kb = vkad.KernelBuilder("compute_loss")
    t = kb.scalar("t", vkad.i32)
    smoke, target, loss = array(kb, "smoke", 3), array(kb, "target", 2, grad=False), \
        array(kb, "loss", 0)
    with kb.parallel_for_nd("cells", n, n) as (i, j):
        loss.atomic_add(None, (target[i, j] - smoke[t, i, j]) ** 2 * (1 / n_grid ** 2))
    kernels["compute_loss"] = kb
    return kernels


def build_apply_grad(ft: vkad.DType, n_grid: int,
                     learning_rate: float = LEARNING_RATE) -> vkad.KernelBuilder:
    """DiffTaichi's apply_grad: v[0] -= learning_rate * v.grad[0] (not differentiated)."""
    kb = vkad.KernelBuilder("apply_grad")
    v = kb.ndarray("v", ft, 3, element=(2,))
    grad = kb.ndarray("v_grad", ft, 3, readonly=True, element=(2,))
    with kb.parallel_for_nd("cells", n_grid, n_grid) as (i, j):
        v[0, i, j] = v[0, i, j] - learning_rate * grad[0, i, j]
    return kb


STEP_KERNELS = ("advect_v", "compute_div", "compute_p", "update_v", "advect_smoke")


class Smoke(Simulation):
    """The fluid, its smoke, the target and the differentiated simulation on one session.

    forward() launches one simulation (on the tape when recording); iteration() runs one
    training iteration (forward, backward, DiffTaichi's update) and returns its loss (before
    the update); loss() the current loss; weights() / set_weights() the initial velocity v[0]
    as numpy ({"v": (n, n, 2)}). `seed` is accepted for the benchmarks' common interface and
    unused: DiffTaichi starts from v[0] = 0. `learning_rate` is DiffTaichi's 400 unless given
    (the loss is a mean over the cells, so one cell's gradient grows as 1 / n_grid^2 on a
    smaller grid: 400 (n_grid / 128)^2 takes DiffTaichi's steps there; the tests do)."""

    PARAMS = ("v",)  # its row 0, DiffTaichi's v[0]: hence gradients() and weights() of its own
    NAME = "smoke"
    LAUNCH_ARGS = ("t", "k")

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 loop: bool = True, target: Optional[np.ndarray] = None,
                 learning_rate: float = LEARNING_RATE):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        if n_grid < 2:
            raise ValueError(f"n_grid={n_grid}: the grid needs at least 2 cells per side")
        super().__init__(session, dtype, graph)
        self.steps, self.n_grid = steps, n_grid
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        kbs = build_kernels(dtype, n_grid)
        self.kernels = {name: session.differentiate(kb) for name, kb in kbs.items()}
        self.learning_rate = learning_rate
        self.apply_grad_kernel = session.compile(build_apply_grad(dtype, n_grid, learning_rate))
        npt = vkad.numpy_dtype(dtype)
        if target is None:
            target = taichi_image(n_grid)
        self.target = np.asarray(target, np.float64)
        self.smoke0 = initial_smoke(n_grid)
        s, g = session, (n_grid, n_grid)
        smoke = np.zeros((steps,) + g, npt)
        smoke[0] = self.smoke0  # DiffTaichi's init(): the checkerboard, once
        self.arrays: Dict[str, vkad.NdArray] = {
            "v": s.zeros((steps,) + g + (2,), dtype, "v"),
            "v_updated": s.zeros((steps,) + g + (2,), dtype, "v_updated"),
            "div": s.zeros((steps,) + g, dtype, "div"),
            "p": s.zeros((NUM_JACOBI * steps + 1,) + g, dtype, "p"),
            "smoke": s.ndarray(smoke, npt, "smoke"),
            "target": s.ndarray(self.target, npt, "target"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        self._apply_grad = self.bind_update(self.apply_grad_kernel)
        # loop=True: the step loop said as one (Session.loop), prepared here (the tape's check of
        # the loop made now). Its 2-d tasks of n_grid^2 cells are too wide to roll into a
        # resident kernel, so the prepare makes the graph rework's plan of the loop's launches.
        if loop:
            self.s.prepare_loop(1, steps, self._step(True))

    # launches
    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        advect_v, compute_div, compute_p, update_v, advect_smoke = (
            self.launcher(name, recorded) for name in STEP_KERNELS)

        def step(t):
            advect_v(t)
            compute_div(t)
            for k in range(NUM_JACOBI):
                compute_p(t, k)
            update_v(t)
            advect_smoke(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation from v[0] and smoke[0]: DiffTaichi's forward() (the step for t = 1 ..
        steps - 1, then the loss at the last step). Asynchronous."""
        self.s.zero(self.arrays["loss"])  # ti.ad.Tape(loss) zeroes the loss
        step = self._step(recorded)
        self.step_loop(1, self.steps, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def gradients(self) -> Dict[str, np.ndarray]:
        """d loss / d v[0] (n, n, 2), after an iteration's backward (the update leaves it)."""
        return {p: self.tape.grad(self.arrays[p]).numpy()[0] for p in self.PARAMS}

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update: v[0] -= learning_rate * dL/dv[0], on
        the device. Returns the loss the forward computed."""
        return self.run_iteration(self.forward_backward, self._apply_grad)  # update off the tape

    def weights(self) -> Dict[str, np.ndarray]:
        return {p: self.arrays[p].numpy()[0].astype(np.float64) for p in self.PARAMS}

    def set_weights(self, w: Dict[str, np.ndarray]) -> None:
        """Sets row 0 of each parameter (the rest are overwritten by every forward)."""
        for p, value in w.items():
            a = self.arrays[p].numpy()
            a[0] = value
            self.arrays[p].upload(a)

    def fields(self) -> Dict[str, np.ndarray]:
        """v, v_updated, div, p and smoke of the last simulation, as numpy."""
        return {name: self.arrays[name].numpy() for name in
                ("v", "v_updated", "div", "p", "smoke")}


# --- the program ---------------------------------------------------------------------------------

def plot(sim: Smoke, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve, and the target, the initial smoke, the learned initial velocity (shown
    as DiffTaichi shows it: v * 0.2 + 0.5 in two colour channels) and the last step's smoke;
    [] without matplotlib."""
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
    ax.set_title("smoke on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "smoke_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    f = sim.fields()
    velocity = np.ones((sim.n_grid, sim.n_grid, 3))
    velocity[..., :2] = np.clip(f["v"][0] * 0.2 + 0.5, 0, 1)
    panels = [("target", sim.target), ("smoke at step 0", f["smoke"][0]),
              ("initial velocity (learned)", velocity),
              (f"smoke at step {sim.steps - 1}", f["smoke"][sim.steps - 1])]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    for ax, (title, img) in zip(axes, panels):
        if img.ndim == 3:
            ax.imshow(img)
        else:
            ax.imshow(np.clip(img, 0, 1), cmap="gray", vmin=0, vmax=1)
        ax.set_title(title), ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    written.append(os.path.join(out, "smoke_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS, seed=False)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID}; dx = 1 / grid)")
    ap.add_argument("--lr", type=float, default=LEARNING_RATE,
                    help=f"learning rate (default DiffTaichi's {LEARNING_RATE:g}, for its 128^2 "
                         "grid; on a grid of n cells per side 400 (n / 128)^2 takes the same "
                         "steps)")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = Smoke(s, a.steps, a.grid, vkad.f64 if a.f64 else vkad.f32, graph=not a.no_graph,
                    loop=not a.no_loop, learning_rate=a.lr)
        print(f"{s.device_name}: {a.grid}^2 grid, {a.steps} steps, {a.iters} iterations")
        losses = train(sim, a.iters, "smoke", profile=a.profile,
                       session=s)
        final = sim.loss()
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f}")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
