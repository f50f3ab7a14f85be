"""DiffTaichi's diffmpm_checkpointing.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's own checkpointing, as its file writes it: the particle state with a time axis (x[f,
p], v[f, p], C[f, p], F[f, p]: every step kept, the checkpoints), one grid (grid_v_in[i, j],
grid_m_in[i, j], grid_v_out[i, j]) cleared with its gradients by clear_grid at the start of every
substep, and the substep a `ti.ad.grad_replaced` function whose gradient (`ti.ad.grad_for`)
rebuilds the step's grid -- clear_grid, p2g, grid_op again -- before g2p.grad, grid_op.grad and
p2g.grad. Inside `ti.ad.Tape(loss=...)` the tape records the substep and calls that gradient in
reverse. Differences from DiffTaichi's file, none changing a result: the particle fields have
`steps` rows instead of max_steps = 1024; g2p reuses the velocity it stores; x_avg is zeroed
before the tape, not inside it (a Python-scope write inside ti.ad.Tape is not recorded either
way); the update is a kernel (DiffTaichi updates from Python scope in f64); nothing is drawn.

Scene, constants, loss and update are examples/difftaichi/diffmpm_checkpointing.py's (N = 80 at
spacing 0.5 on diffmpm_simple's constants), itself DiffTaichi's; set_v, compute_x_avg,
compute_loss and apply_grad are taichi_diffmpm_simple.py's. The caller runs ti.init (arch,
default_fp = `real`) before constructing.
"""
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example
from .taichi_diffmpm_simple import TaichiDiffMPMSimple

ck = load_example("diffmpm_checkpointing")
mpm = ck.simple


@ti.data_oriented
class TaichiDiffMPMCheckpointing(TaichiDiffMPMSimple):
    PARAMS = ("init_v",)

    def __init__(self, steps: int = ck.STEPS, n_grid: int = ck.N_GRID, n: int = ck.N,
                 seed: int = 0, real=ti.f32):
        # seed: the benchmarks' common interface; the scene has nothing random
        self.steps, self.n_grid, self.n_particles = steps, n_grid, n * n
        self.dx, self.inv_dx = 1.0 / n_grid, float(n_grid)
        self.real = real
        np_real = np.float64 if real == ti.f64 else np.float32
        shape = (steps, self.n_particles)
        grid = (n_grid, n_grid)  # one grid, rebuilt by substep_grad
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
        x0[0] = mpm.block(n, n_grid, ck.SPACING)
        self.x.from_numpy(x0)
        F0 = np.zeros((steps, self.n_particles, 2, 2), np_real)
        F0[0] = np.eye(2)
        self.F.from_numpy(F0)
        self.init_v[None] = [0, 0]

    # --- DiffTaichi's kernels on one grid ------------------------------------------------------

    @ti.kernel
    def clear_grid(self):
        for i, j in self.grid_m_in:
            self.grid_v_in[i, j] = [0, 0]
            self.grid_m_in[i, j] = 0
            self.grid_v_in.grad[i, j] = [0, 0]
            self.grid_m_in.grad[i, j] = 0
            self.grid_v_out.grad[i, j] = [0, 0]

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
                    self.grid_v_in[base + offset] += weight * (
                        mpm.P_MASS * self.v[f, p] + affine @ dpos)
                    self.grid_m_in[base + offset] += weight * mpm.P_MASS

    @ti.kernel
    def grid_op(self):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            inv_m = 1 / (self.grid_m_in[i, j] + 1e-10)
            v_out = inv_m * self.grid_v_in[i, j]
            v_out[1] -= mpm.DT * mpm.GRAVITY
            if i < mpm.BOUND and v_out[0] < 0:
                v_out[0] = 0
            if i > self.n_grid - mpm.BOUND and v_out[0] > 0:
                v_out[0] = 0
            if j < mpm.BOUND and v_out[1] < 0:
                v_out[1] = 0
            if j > self.n_grid - mpm.BOUND and v_out[1] > 0:
                v_out[1] = 0
            self.grid_v_out[i, j] = v_out

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
                    g_v = self.grid_v_out[base[0] + i, base[1] + j]
                    weight = w[i][0] * w[j][1]
                    new_v += weight * g_v
                    new_C += 4 * weight * g_v.outer_product(dpos) * self.inv_dx
            self.v[f + 1, p] = new_v
            self.x[f + 1, p] = self.x[f, p] + mpm.DT * new_v
            self.C[f + 1, p] = new_C

    # --- DiffTaichi's checkpointed substep ---------------------------------------------------

    @ti.ad.grad_replaced
    def substep(self, f):
        self.clear_grid()
        self.p2g(f)
        self.grid_op()
        self.g2p(f)

    @ti.ad.grad_for(substep)
    def substep_grad(self, f):
        self.clear_grid()  # the step's grid again, from its particles (kept at every step)
        self.p2g(f)
        self.grid_op()
        self.g2p.grad(f)
        self.grid_op.grad()
        self.p2g.grad(f)

    def iteration(self) -> float:
        """x_avg cleared, the taped forward (checkpointed substeps), DiffTaichi's update.
        Returns the loss."""
        self.x_avg[None] = [0, 0]
        with ti.ad.Tape(loss=self.loss):
            self.set_v()
            for f in range(self.steps - 1):
                self.substep(f)
            self.compute_x_avg()
            self.compute_loss()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"init_v": self.init_v.grad.to_numpy()}
