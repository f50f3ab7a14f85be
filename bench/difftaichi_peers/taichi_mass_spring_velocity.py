"""DiffTaichi's mass_spring_velocity.py in Taichi 1.7, for bench/difftaichi.py.

taichi_mass_spring.py's robot, fields and kernels (compute_center, nn2, apply_spring_force),
with this program's: a target_v[t] field (a new target every iteration, written from Python
scope), nn1 taking it as its last two inputs, advance with gravity -1.8, compute_loss adding
dt (target_v[t].x - v[t, head].x)^2 at every step inside the step loop, the robot placed 0.4 to
the right, and the update with the gradient scaled to norm 0.1. As in the vkad example
(examples/difftaichi/mass_spring_velocity.py, which says why): nn1 reads v[t, j], not DiffTaichi's
v[t, i]; the target pools come from numpy's RandomState(seed + 1). `ti.ad.Tape` zeroes the loss
and the gradients; v_inc is zeroed before it (DiffTaichi's clear()). The caller runs ti.init
(arch, default_fp = `real`) before constructing.
"""
import math

import numpy as np
import taichi as ti

from . import load_example
from .taichi_mass_spring import TaichiMassSpring

msv = load_example("mass_spring_velocity")
ms = msv.mass_spring
DT, GROUND_HEIGHT, GRAVITY, DAMPING = msv.DT, msv.GROUND_HEIGHT, msv.GRAVITY, msv.DAMPING
N_SIN_WAVES, N_HIDDEN, SPRING_OMEGA = ms.N_SIN_WAVES, ms.N_HIDDEN, ms.SPRING_OMEGA


@ti.data_oriented
class TaichiMassSpringVelocity(TaichiMassSpring):
    def __init__(self, steps: int = msv.STEPS, robot_id: int = msv.ROBOT, seed: int = 0,
                 toi: bool = True, real=ti.f32):
        super().__init__(steps=steps, robot_id=robot_id, seed=seed, toi=toi, real=real)
        objects, _ = ms.robot(robot_id)
        x0 = np.zeros((steps, len(objects), 2), self._np_real)
        x0[0] = objects + np.array([msv.X_OFFSET, 0.0])  # DiffTaichi's setup_robot
        self.x.from_numpy(x0)
        self.target_v = ti.Vector.field(2, real, shape=steps)
        self.tasks = np.random.RandomState(seed + 1)

    @ti.kernel
    def nn1(self, t: ti.i32):
        for i in range(N_HIDDEN):
            phase = ti.cast(t, float) * (SPRING_OMEGA * DT)
            act = self.weights1[i, 0] * ti.sin(phase)
            for j in ti.static(range(1, N_SIN_WAVES)):
                act += self.weights1[i, j] * ti.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
            c = self.center[t]
            for j in ti.static(range(self.n_objects)):
                offset, vel = self.x[t, j] - c, self.v[t, j]
                k = N_SIN_WAVES + 4 * j
                act = (act + self.weights1[i, k] * offset[0] * 0.05
                       + self.weights1[i, k + 1] * offset[1] * 0.05)
                act = (act + self.weights1[i, k + 2] * vel[0] * 0.05
                       + self.weights1[i, k + 3] * vel[1] * 0.05)
            k = N_SIN_WAVES + 4 * self.n_objects
            act = (act + self.weights1[i, k] * self.target_v[t][0]
                   + self.weights1[i, k + 1] * self.target_v[t][1])
            self.hidden[t, i] = ti.tanh(act + self.bias1[i])

    @ti.kernel
    def advance_toi(self, t: ti.i32):
        for i in range(self.n_objects):
            old_v = (math.exp(-DT * DAMPING) * self.v[t - 1, i] + ti.Vector([0.0, DT * GRAVITY])
                     + self.v_inc[t, i])
            old_x = self.x[t - 1, i]
            new_x = old_x + DT * old_v
            toi = 0.0
            new_v = old_v
            if new_x[1] < GROUND_HEIGHT and old_v[1] < -1e-4:
                toi = -(old_x[1] - GROUND_HEIGHT) / old_v[1]
                new_v = ti.Vector([0.0, 0.0])
            self.v[t, i] = new_v
            self.x[t, i] = old_x + toi * old_v + (DT - toi) * new_v

    @ti.kernel
    def advance_no_toi(self, t: ti.i32):
        for i in range(self.n_objects):
            old_v = (math.exp(-DT * DAMPING) * self.v[t - 1, i] + ti.Vector([0.0, DT * GRAVITY])
                     + self.v_inc[t, i])
            old_x = self.x[t - 1, i]
            new_v = old_v
            if old_x[1] - GROUND_HEIGHT < 0 and new_v[1] < 0:  # friction projection
                new_v = ti.Vector([0.0, 0.0])
            self.v[t, i] = new_v
            self.x[t, i] = old_x + DT * new_v

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        self.loss[None] += DT * (self.target_v[t][0] - self.v[t, msv.HEAD_ID][0]) ** 2

    def forward(self) -> None:
        """DiffTaichi's forward(): steps - 1 steps from x[0], v[0] = 0, each adding its loss."""
        for t in range(1, self.steps):
            self.compute_center(t - 1)
            self.nn1(t - 1)
            self.nn2(t - 1)
            self.apply_spring_force(t - 1)
            if self.toi:
                self.advance_toi(t)
            else:
                self.advance_no_toi(t)
            self.compute_loss(t)

    def iteration(self) -> float:
        """A new target, DiffTaichi's clear(), the forward on a tape, then the update: the
        gradient scaled to norm 0.1. Returns the loss the forward computed."""
        self.target_v.from_numpy(
            msv.target_velocities(self.tasks, self.steps).astype(self._np_real))
        self.v_inc.fill(0)
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        grads = self.gradients()
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = msv.GRADIENT_CLIP / (norm + 1e-6)
        w = self.params()
        self.set_params({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss
