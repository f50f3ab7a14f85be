"""DiffTaichi's wave.py in Taichi 1.7, for bench/difftaichi.py.
Checked against the vkad example on Taichi's CPU backend (64 steps, 64^2: gradient
within 9.6e-7) and in the H200 races (docs/benchmarks.md).

DiffTaichi's idiom: the height with a time axis in one field p[t, i, j] (needs_grad), get_p and
the laplacian as ti.func, one fdtd kernel launched per step, `ti.ad.Tape(loss=...)` around the
forward (it zeroes the loss and the gradients and seeds d loss = 1), apply_grad as a kernel.
Two differences from DiffTaichi's file, neither changing a result: the fields have explicit
shapes (steps, n, n) instead of max_steps = 512 rows kept for its video frames (none here), and
the cell loops are `for i, j in ti.ndrange(n, n)` where DiffTaichi nests `for i in range(n):
for j in range(n):` -- Taichi parallelises only the outer loop of those (n threads, j serial
in each), the ndrange all n^2 cells, as the vkad example's 2-d tasks do.

Equations, constants, target, initialisation (initial = 0), loss and update are
examples/difftaichi/wave.py's, itself DiffTaichi's; with alpha = 0 the damping term is left out
(ti.static) as there. The caller runs ti.init (arch, default_fp = `real`) before constructing.
"""
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

wv = load_example("wave")


@ti.data_oriented
class TaichiWave:
    PARAMS = ("initial",)

    def __init__(self, steps: int = wv.STEPS, n_grid: int = wv.N_GRID, seed: int = 0,
                 real=ti.f32):
        # seed: the benchmarks' common interface; DiffTaichi starts from initial = 0
        self.steps, self.n_grid = steps, n_grid
        k = wv.constants(n_grid)
        self.dx, self.inv_dx2, self.k_q, self.k_p = k["dx"], k["inv_dx2"], k["k_q"], k["k_p"]
        self.damped, self.lr = wv.ALPHA != 0.0, wv.LEARNING_RATE
        self._np_real = np.float64 if real == ti.f64 else np.float32
        self.p = ti.field(real, shape=(steps, n_grid, n_grid), needs_grad=True)
        self.initial = ti.field(real, shape=(n_grid, n_grid), needs_grad=True)
        self.target = ti.field(real, shape=(n_grid, n_grid))
        self.loss = ti.field(real, shape=(), needs_grad=True)
        self.target.from_numpy(wv.taichi_logo(n_grid).astype(self._np_real))

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.func
    def get_p(self, t, i, j):
        n = ti.static(self.n_grid)
        return self.p[t, i, j] if 0 <= i < n and 0 <= j < n else 0.0

    @ti.func
    def laplacian(self, t, i, j):
        return self.inv_dx2 * (-4 * self.get_p(t, i, j) + self.get_p(t, i, j - 1)
                               + self.get_p(t, i, j + 1) + self.get_p(t, i + 1, j)
                               + self.get_p(t, i - 1, j))

    @ti.kernel
    def initialize(self):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            self.p[0, i, j] = self.initial[i, j]

    @ti.kernel
    def fdtd(self, t: ti.i32):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            new_p = 2 * self.p[t - 1, i, j] + self.k_q * self.laplacian(t - 1, i, j) \
                - self.p[t - 2, i, j]
            if ti.static(self.damped):
                new_p -= self.k_p * self.laplacian(t - 2, i, j)
            self.p[t, i, j] = new_p

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            self.loss[None] += self.dx * self.dx * (self.target[i, j] - self.p[t, i, j]) ** 2

    @ti.kernel
    def apply_grad(self):
        for i, j in self.initial.grad:
            self.initial[i, j] -= self.lr * self.initial.grad[i, j]

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        """DiffTaichi's forward(): p[0] = initial (p[1] stays 0), fdtd for t = 2 .. steps - 1,
        then the loss at the last step."""
        self.initialize()
        for t in range(2, self.steps):
            self.fdtd(t)
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """The forward on a tape (which zeroes the loss and every gradient first), then
        DiffTaichi's apply_grad. Returns the loss the forward computed."""
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).to_numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).from_numpy(np.asarray(value, self._np_real))
