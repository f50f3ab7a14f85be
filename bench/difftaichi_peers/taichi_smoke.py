"""DiffTaichi's smoke_taichi.py in Taichi 1.7, for bench/difftaichi.py.
Checked against the vkad example on Taichi's CPU backend (16 steps, 32^2: gradient
within 1.1e-7) and in the H200 races (docs/benchmarks.md).

DiffTaichi's idiom: every field with a time axis (v, v_updated, div, smoke: `steps` rows; p:
rows a = k + 10 t of the Jacobi iterations), dec_index / inc_index / imod and the bilinear fetch
as ti.func, advect as one kernel taking its fields as ti.template(), the other kernels launched
per step with t (compute_p with t and k), `ti.ad.Tape(loss=...)` around the forward (it zeroes
the loss and the gradients and seeds d loss = 1), apply_grad as a kernel on v[0]. Differences
from DiffTaichi's file, none changing a result: the fields have explicit shapes, p with
10 * steps + 1 rows (DiffTaichi's steps * 11 holds rows never touched); the cell loops are
`for y, x in ti.ndrange(n, n)` where DiffTaichi nests `for y in range(n): for x in range(n):`
(Taichi parallelises only the outer loop of those, the ndrange all n^2 cells, as the vkad
example's 2-d tasks do); the index wraps use ti.select instead of `if`s (DiffTaichi's ti.init
sets flatten_if=True, which bench/difftaichi.py's does not); no frames are shown.

Equations, constants, target (drawn: examples/difftaichi/smoke.py's taichi_image), initialisation
(v[0] = 0, smoke[0] the 16-cell checkerboard), loss and update (rate 400) are
examples/difftaichi/smoke.py's, itself DiffTaichi's. The caller runs ti.init (arch, default_fp =
`real`) before constructing.
"""
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

sm = load_example("smoke")


@ti.data_oriented
class TaichiSmoke:
    PARAMS = ("v",)  # its row 0

    def __init__(self, steps: int = sm.STEPS, n_grid: int = sm.N_GRID, seed: int = 0,
                 real=ti.f32, learning_rate: float = sm.LEARNING_RATE):
        # seed: the benchmarks' common interface; DiffTaichi starts from v[0] = 0
        self.steps, self.n_grid, self.nj = steps, n_grid, sm.NUM_JACOBI
        self.dx, self.lr = 1.0 / n_grid, learning_rate
        self._np_real = np.float64 if real == ti.f64 else np.float32
        g = (n_grid, n_grid)
        self.v = ti.Vector.field(2, real, shape=(steps,) + g, needs_grad=True)
        self.v_updated = ti.Vector.field(2, real, shape=(steps,) + g, needs_grad=True)
        self.div = ti.field(real, shape=(steps,) + g, needs_grad=True)
        self.p = ti.field(real, shape=(self.nj * steps + 1,) + g, needs_grad=True)
        self.smoke = ti.field(real, shape=(steps,) + g, needs_grad=True)
        self.target = ti.field(real, shape=g)
        self.loss = ti.field(real, shape=(), needs_grad=True)
        self.target.from_numpy(sm.taichi_image(n_grid).astype(self._np_real))
        smoke0 = np.zeros((steps,) + g, self._np_real)
        smoke0[0] = sm.initial_smoke(n_grid)  # DiffTaichi's init()
        self.smoke.from_numpy(smoke0)

    # --- DiffTaichi's functions and kernels ----------------------------------------------------

    @ti.func
    def imod(self, n, divisor):
        ret = n % divisor
        return ti.select(ret < 0, ret + divisor, ret)

    @ti.func
    def dec_index(self, index):
        return ti.select(index - 1 < 0, ti.static(self.n_grid) - 1, index - 1)

    @ti.func
    def inc_index(self, index):
        return ti.select(index + 1 >= ti.static(self.n_grid), 0, index + 1)

    @ti.kernel
    def compute_div(self, t: ti.i32):
        for y, x in ti.ndrange(self.n_grid, self.n_grid):
            self.div[t, y, x] = -0.5 * self.dx * (
                self.v_updated[t, self.inc_index(y), x][0]
                - self.v_updated[t, self.dec_index(y), x][0]
                + self.v_updated[t, y, self.inc_index(x)][1]
                - self.v_updated[t, y, self.dec_index(x)][1])

    @ti.kernel
    def compute_p(self, t: ti.i32, k: ti.i32):
        for y, x in ti.ndrange(self.n_grid, self.n_grid):
            a = k + t * ti.static(self.nj)
            self.p[a + 1, y, x] = (self.div[t, y, x] + self.p[a, self.dec_index(y), x]
                                   + self.p[a, self.inc_index(y), x]
                                   + self.p[a, y, self.dec_index(x)]
                                   + self.p[a, y, self.inc_index(x)]) / 4.0

    @ti.kernel
    def update_v(self, t: ti.i32):
        for y, x in ti.ndrange(self.n_grid, self.n_grid):
            a = ti.static(self.nj) * t - 1
            self.v[t, y, x][0] = self.v_updated[t, y, x][0] - 0.5 * (
                self.p[a, self.inc_index(y), x] - self.p[a, self.dec_index(y), x]) / self.dx
            self.v[t, y, x][1] = self.v_updated[t, y, x][1] - 0.5 * (
                self.p[a, y, self.inc_index(x)] - self.p[a, y, self.dec_index(x)]) / self.dx

    @ti.kernel
    def advect(self, field: ti.template(), field_out: ti.template(),
               t_offset: ti.template(), t: ti.i32):
        n = ti.static(self.n_grid)
        for y, x in ti.ndrange(n, n):
            center_x = y - self.v[t + t_offset, y, x][0]
            center_y = x - self.v[t + t_offset, y, x][1]
            left_ix = ti.cast(ti.floor(center_x), ti.i32)
            top_ix = ti.cast(ti.floor(center_y), ti.i32)
            rw = center_x - left_ix  # relative weight of the right-hand cell
            bw = center_y - top_ix  # relative weight of the bottom cell
            left_ix = self.imod(left_ix, n)
            right_ix = self.inc_index(left_ix)
            top_ix = self.imod(top_ix, n)
            bot_ix = self.inc_index(top_ix)
            field_out[t, y, x] = (1 - rw) * (
                (1 - bw) * field[t - 1, left_ix, top_ix] + bw * field[t - 1, left_ix, bot_ix]) \
                + rw * ((1 - bw) * field[t - 1, right_ix, top_ix]
                        + bw * field[t - 1, right_ix, bot_ix])

    @ti.kernel
    def compute_loss(self):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            self.loss[None] += (self.target[i, j] - self.smoke[self.steps - 1, i, j]) ** 2 \
                * (1 / self.n_grid ** 2)

    @ti.kernel
    def apply_grad(self):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            self.v[0, i, j] -= self.lr * self.v.grad[0, i, j]

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        """DiffTaichi's forward(): the step for t = 1 .. steps - 1, then the loss."""
        for t in range(1, self.steps):
            self.advect(self.v, self.v_updated, -1, t)
            self.compute_div(t)
            for k in range(self.nj):
                self.compute_p(t, k)
            self.update_v(t)
            self.advect(self.smoke, self.smoke, 0, t)
        self.compute_loss()

    def iteration(self) -> float:
        """The forward on a tape (which zeroes the loss and every gradient first), then
        DiffTaichi's apply_grad. Returns the loss the forward computed."""
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy()[0] for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).to_numpy()[0].astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            field = getattr(self, p)
            a = field.to_numpy()
            a[0] = value
            field.from_numpy(a.astype(self._np_real))
