"""DiffTaichi's diffmpm_simple.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: Vector and Matrix fields with a time axis (x[f, p],
v[f, p], C[f, p], F[f, p], and the grid grid_v_in[f, i, j], grid_m_in[f, i, j], grid_v_out[f,
i, j]), init_v and x_avg 0-d fields, p2g(f) / grid_op(f) / g2p(f) launched per step, set_v,
compute_x_avg and compute_loss, grid_v_in / grid_m_in filled with 0 and x_avg set to 0 before
`ti.ad.Tape(loss=...)` (which zeroes the gradients and seeds d loss = 1), and the update of
init_v. Differences from DiffTaichi's file, none changing a result: the fields have `steps` rows
(`steps - 1` for the grid) instead of max_steps = 1024; g2p reuses the velocity it stores (the
vkad example's spelling; DiffTaichi reads v[f + 1, p] back); the update is a kernel (DiffTaichi
updates from Python scope in f64); nothing is drawn.

Scene, constants, loss and update are examples/difftaichi/diffmpm_simple.py's, itself
DiffTaichi's. The caller runs ti.init (arch, default_fp = `real`) before constructing.
"""
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

mpm = load_example("diffmpm_simple")


@ti.data_oriented
class TaichiDiffMPMSimple:
    PARAMS = ("init_v",)

    def __init__(self, steps: int = mpm.STEPS, n_grid: int = mpm.N_GRID, n: int = mpm.N,
                 seed: int = 0, real=ti.f32):
        # seed: the benchmarks' common interface; the scene has nothing random
        self.steps, self.n_grid, self.n_particles = steps, n_grid, n * n
        self.dx, self.inv_dx = 1.0 / n_grid, float(n_grid)
        self.real = real
        np_real = np.float64 if real == ti.f64 else np.float32
        shape = (steps, self.n_particles)
        grid = (steps - 1, n_grid, n_grid)
        self.x = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.v = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.C = ti.Matrix.field(2, 2, real, shape=shape, needs_grad=True)
        self.F = ti.Matrix.field(2, 2, real, shape=shape, needs_grad=True)
        self.grid_v_in = ti.Vector.field(2, real, shape=grid, needs_grad=True)
        self.grid_m_in = ti.field(real, shape=grid, needs_grad=True)
        self.grid_v_out = ti.Vector.field(2, real, shape=grid, needs_grad=True)
        self.init_v = ti.Vector.field(2, real, shape=(), needs_grad=True)
        self.x_avg = ti.Vector.field(2, real, shape=(), needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)
        x0 = np.zeros((steps, self.n_particles, 2), np_real)
        x0[0] = mpm.block(n, n_grid)
        self.x.from_numpy(x0)
        F0 = np.zeros((steps, self.n_particles, 2, 2), np_real)
        F0[0] = np.eye(2)
        self.F.from_numpy(F0)
        self.init_v[None] = [0, 0]

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def set_v(self):
        for i in range(self.n_particles):
            self.v[0, i] = self.init_v[None]

    @ti.kernel
    def p2g(self, f: ti.i32):
        for p in range(self.n_particles):
            base = ti.cast(self.x[f, p] * self.inv_dx - 0.5, ti.i32)
            fx = self.x[f, p] * self.inv_dx - ti.cast(base, ti.i32)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_F = (ti.Matrix.diag(dim=2, val=1) + mpm.DT * self.C[f, p]) @ self.F[f, p]
            self.F[f + 1, p] = new_F
            J = new_F.determinant()
            r, s = ti.polar_decompose(new_F)
            cauchy = 2 * mpm.MU * (new_F - r) @ new_F.transpose() + \
                ti.Matrix.diag(2, mpm.LA * (J - 1) * J)
            stress = -(mpm.DT * mpm.P_VOL * 4 * self.inv_dx * self.inv_dx) * cauchy
            affine = stress + mpm.P_MASS * self.C[f, p]
            for i in ti.static(range(3)):
                for j in ti.static(range(3)):
                    offset = ti.Vector([i, j])
                    dpos = (ti.cast(ti.Vector([i, j]), self.real) - fx) * self.dx
                    weight = w[i][0] * w[j][1]
                    self.grid_v_in[f, base + offset] += weight * (
                        mpm.P_MASS * self.v[f, p] + affine @ dpos)
                    self.grid_m_in[f, base + offset] += weight * mpm.P_MASS

    @ti.kernel
    def grid_op(self, f: ti.i32):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            inv_m = 1 / (self.grid_m_in[f, i, j] + 1e-10)
            v_out = inv_m * self.grid_v_in[f, i, j]
            v_out[1] -= mpm.DT * mpm.GRAVITY
            if i < mpm.BOUND and v_out[0] < 0:
                v_out[0] = 0
            if i > self.n_grid - mpm.BOUND and v_out[0] > 0:
                v_out[0] = 0
            if j < mpm.BOUND and v_out[1] < 0:
                v_out[1] = 0
            if j > self.n_grid - mpm.BOUND and v_out[1] > 0:
                v_out[1] = 0
            self.grid_v_out[f, i, j] = v_out

    @ti.kernel
    def g2p(self, f: ti.i32):
        for p in range(self.n_particles):
            base = ti.cast(self.x[f, p] * self.inv_dx - 0.5, ti.i32)
            fx = self.x[f, p] * self.inv_dx - ti.cast(base, self.real)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector([0.0, 0.0])
            new_C = ti.Matrix([[0.0, 0.0], [0.0, 0.0]])
            for i in ti.static(range(3)):
                for j in ti.static(range(3)):
                    dpos = ti.cast(ti.Vector([i, j]), self.real) - fx
                    g_v = self.grid_v_out[f, base[0] + i, base[1] + j]
                    weight = w[i][0] * w[j][1]
                    new_v += weight * g_v
                    new_C += 4 * weight * g_v.outer_product(dpos) * self.inv_dx
            self.v[f + 1, p] = new_v
            self.x[f + 1, p] = self.x[f, p] + mpm.DT * new_v
            self.C[f + 1, p] = new_C

    @ti.kernel
    def compute_x_avg(self):
        for i in range(self.n_particles):
            self.x_avg[None] += (1 / self.n_particles) * self.x[self.steps - 1, i]

    @ti.kernel
    def compute_loss(self):
        dist = (self.x_avg[None] - ti.Vector(mpm.TARGET)) ** 2
        self.loss[None] = 0.5 * (dist[0] + dist[1])

    @ti.kernel
    def apply_grad(self):
        self.init_v[None] -= mpm.LEARNING_RATE * self.init_v.grad[None]

    # --- the program ---------------------------------------------------------------------------

    def iteration(self) -> float:
        """The grid's accumulators and x_avg cleared, the taped forward, DiffTaichi's update.
        Returns the loss."""
        self.grid_v_in.fill(0)
        self.grid_m_in.fill(0)
        self.x_avg[None] = [0, 0]
        with ti.ad.Tape(loss=self.loss):
            self.set_v()
            for f in range(self.steps - 1):
                self.p2g(f)
                self.grid_op(f)
                self.g2p(f)
            self.compute_x_avg()
            self.compute_loss()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"init_v": self.init_v.grad.to_numpy()}
