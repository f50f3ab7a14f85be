"""DiffTaichi's diffmpm3d.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as taichi_diffmpm.py (the 2-D program): particle state in fields with a
time axis (x[f, p], v, C, F), one grid (grid_v_in, grid_m_in, grid_v_out, n_grid^3) cleared and
reused by every step, and a step function `advance` marked @ti.ad.grad_replaced whose
@ti.ad.grad_for gradient clears the grid, recomputes that step's grid forward (p2g, grid_op),
then runs the adjoints of g2p, grid_op, p2g and compute_actuation, as DiffTaichi's backward()
does: the grid is recomputed in the backward instead of stored per step. `ti.ad.Tape(loss=...)`
around the forward (DiffTaichi's diffmpm3d calls the kernels' .grad by hand after
ti.ad.clear_all_gradients; the tape runs the same adjoints). Fields have explicit shapes.

Physics, constants, the robot, initialisation, loss and update are
examples/difftaichi/diffmpm3d.py's (itself DiffTaichi's). DiffTaichi's floor branch zeroes the
velocity before its friction code, which then changes nothing; the floor is sticky here as
there, without the dead branch. The update runs on the host in numpy, as the vkad example's
does. The caller runs ti.init (arch, default_fp = `real`) before constructing. Not run in the
repository's tests (Taichi is not installed there): a transcription of taichi_diffmpm.py.
"""
import math
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

mpm = load_example("diffmpm3d")
DT, P_VOL, E, MU, LA = mpm.DT, mpm.P_VOL, mpm.E, mpm.MU, mpm.LA
GRAVITY, N_SIN_WAVES, ACTUATION_OMEGA = mpm.GRAVITY, mpm.N_SIN_WAVES, mpm.ACTUATION_OMEGA
ACT_STRENGTH, BOUND = mpm.ACT_STRENGTH, mpm.BOUND


@ti.data_oriented
class TaichiDiffMPM3D:
    PARAMS = ("weights", "bias")
    LEARNING_RATE = mpm.LEARNING_RATE
    SCENE = staticmethod(mpm.robot)  # fills a Scene: the robot (taichi_liquid's adds its fluid)

    def __init__(self, steps: int = mpm.STEPS, n_grid: int = mpm.N_GRID, seed: int = 0,
                 real=ti.f32, scene=None):
        self.steps, self.n_grid = steps, n_grid
        self.dx, self.inv_dx = 1.0 / n_grid, float(n_grid)
        # scene: a function that fills a Scene (default SCENE; tests move it on a coarse grid)
        sc = self.scene = (scene or self.SCENE)(mpm.Scene(n_grid, seed))
        self.n_particles, self.n_actuators = n, n_act = sc.n_particles, sc.n_actuators
        self.n_solid = sc.n_solid_particles
        np_real = self._np_real = np.float64 if real == ti.f64 else np.float32

        def vec(shape):
            return ti.Vector.field(3, real, shape=shape, needs_grad=True)

        def mat(shape):
            return ti.Matrix.field(3, 3, real, shape=shape, needs_grad=True)

        def scalar(shape):
            return ti.field(real, shape=shape, needs_grad=True)

        grid = (n_grid, n_grid, n_grid)
        self.x, self.v = vec((steps, n)), vec((steps, n))
        self.C, self.F = mat((steps, n)), mat((steps, n))
        self.grid_v_in, self.grid_m_in, self.grid_v_out = vec(grid), scalar(grid), vec(grid)
        self.actuation = scalar((steps, n_act))
        self.weights, self.bias = scalar((n_act, N_SIN_WAVES)), scalar(n_act)
        self.x_avg, self.loss = vec(()), scalar(())
        self.actuator_id, self.particle_type = ti.field(ti.i32, n), ti.field(ti.i32, n)

        x0 = np.zeros((steps, n, 3), np_real)
        x0[0] = sc.x
        self.x.from_numpy(x0)
        F0 = np.zeros((steps, n, 3, 3), np_real)
        F0[0] = np.eye(3)
        self.F.from_numpy(F0)
        self.actuator_id.from_numpy(np.array(sc.actuator_id, np.int32))
        self.particle_type.from_numpy(np.array(sc.particle_type, np.int32))
        # DiffTaichi's initialisation: weights ~ N(0, 0.01^2), zero bias.
        rng = np.random.RandomState(seed)
        self.set_params({"weights": rng.randn(n_act, N_SIN_WAVES) * 0.01,
                          "bias": np.zeros(n_act)})

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def clear_grid(self):
        for i, j, k in self.grid_m_in:
            self.grid_v_in[i, j, k] = [0, 0, 0]
            self.grid_m_in[i, j, k] = 0
            self.grid_v_in.grad[i, j, k] = [0, 0, 0]
            self.grid_m_in.grad[i, j, k] = 0
            self.grid_v_out.grad[i, j, k] = [0, 0, 0]

    @ti.kernel
    def compute_actuation(self, t: ti.i32):
        for i in range(self.n_actuators):
            phase = ti.cast(t, float) * (ACTUATION_OMEGA * DT)
            act = self.weights[i, 0] * ti.sin(phase)
            for j in ti.static(range(1, N_SIN_WAVES)):
                act += self.weights[i, j] * ti.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
            self.actuation[t, i] = ti.tanh(act + self.bias[i])

    @ti.kernel
    def p2g(self, f: ti.i32):
        for p in range(self.n_particles):
            base = ti.cast(self.x[f, p] * self.inv_dx - 0.5, ti.i32)
            fx = self.x[f, p] * self.inv_dx - ti.cast(base, float)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            Cp = self.C[f, p]
            new_F = (ti.Matrix.identity(float, 3) + DT * Cp) @ self.F[f, p]
            J = new_F.determinant()
            if self.particle_type[p] == 0:  # fluid (DiffTaichi: "need pow(x, 1/3)")
                sqrtJ = ti.sqrt(J)
                new_F = ti.Matrix([[sqrtJ, 0.0, 0.0], [0.0, sqrtJ, 0.0], [0.0, 0.0, 1.0]])
            self.F[f + 1, p] = new_F

            act_id = self.actuator_id[p]
            act = self.actuation[f, ti.max(0, act_id)] * ACT_STRENGTH
            if act_id == -1:
                act = 0.0
            A = ti.Matrix([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]) * act

            cauchy = ti.Matrix.zero(float, 3, 3)
            mass = 0.0
            ident = ti.Matrix.identity(float, 3)
            if self.particle_type[p] == 0:
                mass = 4.0
                cauchy = ident * (J - 1) * E
            else:  # neo-Hookean
                mass = 1.0
                cauchy = MU * (new_F @ new_F.transpose()) + ident * (LA * ti.log(J) - MU)
            cauchy += new_F @ A @ new_F.transpose()
            stress = -(DT * P_VOL * 4 * self.inv_dx * self.inv_dx) * cauchy
            affine = stress + mass * Cp
            momentum = mass * self.v[f, p]
            for i in ti.static(range(3)):
                for j in ti.static(range(3)):
                    for k in ti.static(range(3)):
                        offset = ti.Vector([i, j, k])
                        dpos = (ti.cast(offset, float) - fx) * self.dx
                        weight = w[i][0] * w[j][1] * w[k][2]
                        self.grid_v_in[base + offset] += weight * (momentum + affine @ dpos)
                        self.grid_m_in[base + offset] += weight * mass

    @ti.kernel
    def grid_op(self):
        for i, j, k in self.grid_m_in:
            inv_m = 1 / (self.grid_m_in[i, j, k] + 1e-10)
            v_out = inv_m * self.grid_v_in[i, j, k] - ti.Vector([0.0, DT * GRAVITY, 0.0])
            # walls, floor and ceiling stop what moves into them (the floor is sticky, see above)
            if i < BOUND and v_out[0] < 0:
                v_out = ti.Vector([0.0, 0.0, 0.0])
            if i > self.n_grid - BOUND and v_out[0] > 0:
                v_out = ti.Vector([0.0, 0.0, 0.0])
            if k < BOUND and v_out[2] < 0:
                v_out = ti.Vector([0.0, 0.0, 0.0])
            if k > self.n_grid - BOUND and v_out[2] > 0:
                v_out = ti.Vector([0.0, 0.0, 0.0])
            if j < BOUND and v_out[1] < 0:
                v_out = ti.Vector([0.0, 0.0, 0.0])
            if j > self.n_grid - BOUND and v_out[1] > 0:
                v_out = ti.Vector([0.0, 0.0, 0.0])
            self.grid_v_out[i, j, k] = v_out

    @ti.kernel
    def g2p(self, f: ti.i32):
        for p in range(self.n_particles):
            xp = self.x[f, p]
            base = ti.cast(xp * self.inv_dx - 0.5, ti.i32)
            fx = xp * self.inv_dx - ti.cast(base, float)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = ti.Vector.zero(float, 3)
            new_C = ti.Matrix.zero(float, 3, 3)
            for i in ti.static(range(3)):
                for j in ti.static(range(3)):
                    for k in ti.static(range(3)):
                        dpos = ti.cast(ti.Vector([i, j, k]), float) - fx
                        g_v = self.grid_v_out[base[0] + i, base[1] + j, base[2] + k]
                        weight = w[i][0] * w[j][1] * w[k][2]
                        new_v += weight * g_v
                        new_C += 4 * self.inv_dx * weight * g_v.outer_product(dpos)
            self.v[f + 1, p] = new_v
            self.x[f + 1, p] = xp + DT * new_v
            self.C[f + 1, p] = new_C

    @ti.kernel
    def compute_x_avg(self, t: ti.i32):
        for i in range(self.n_particles):
            contrib = 0.0
            if self.particle_type[i] == 1:
                contrib = 1.0 / self.n_solid
            self.x_avg[None] += contrib * self.x[t, i]

    @ti.kernel
    def compute_loss(self):
        self.loss[None] = -self.x_avg[None][0]

    # --- the step, its hand-written gradient, the program ------------------------------------

    @ti.ad.grad_replaced
    def advance(self, s):
        self.clear_grid()
        self.compute_actuation(s)
        self.p2g(s)
        self.grid_op()
        self.g2p(s)

    @ti.ad.grad_for(advance)
    def advance_grad(self, s):
        self.clear_grid()  # the grid of step s again, forward: the tape did not keep it
        self.p2g(s)
        self.grid_op()

        self.g2p.grad(s)
        self.grid_op.grad()
        self.p2g.grad(s)
        self.compute_actuation.grad(s)

    def forward(self) -> None:
        """DiffTaichi's forward(): steps - 1 steps, then the loss at the last step."""
        for s in range(self.steps - 1):
            self.advance(s)
        self.x_avg[None] = [0, 0, 0]
        self.compute_x_avg(self.steps - 1)
        self.compute_loss()

    def iteration(self) -> float:
        """The forward on a tape (which clears every gradient first), then DiffTaichi's
        learn w -= LEARNING_RATE * dL/dw. Returns the loss the forward computed."""
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        grads = self.gradients()
        w = self.params()
        self.set_params({p: w[p] - self.LEARNING_RATE * grads[p] for p in self.PARAMS})
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).to_numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).from_numpy(np.asarray(value, self._np_real))
