"""DiffTaichi's mass_spring_simple.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: Vector fields with a time axis x[t, i], v[t, i],
force[t, i] (needs_grad), spring_anchor_a / _b and spring_length fields, apply_spring_force(t)
adding each spring's force into force[t, a] and force[t, b] with ti.atomic_add, time_integrate(t)
with the friction projection, compute_loss storing (area - 0.1)^2, clear_states() zeroing force
before each tape, `ti.ad.Tape(loss=...)` around the forward (which in Taichi 1.7 also zeroes the
gradients, the job of DiffTaichi's clear_tensors() in its older Taichi), and the update of
spring_length. Differences from DiffTaichi's file, none changing a result: the fields have
explicit shapes of `steps` rows; the update is a kernel (DiffTaichi updates from Python scope,
in f64, then stores f32); nothing is drawn.

Scene, constants, loss and update are examples/difftaichi/mass_spring_simple.py's, itself
DiffTaichi's. The caller runs ti.init (arch, default_fp = `real`) before constructing.
"""
import math
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

ms = load_example("mass_spring_simple")


@ti.data_oriented
class TaichiMassSpringSimple:
    PARAMS = ("spring_length",)

    def __init__(self, steps: int = ms.STEPS, seed: int = 0, real=ti.f32):
        # seed: the benchmarks' common interface; the scene has nothing random
        self.steps = steps
        self.dt, self.stiffness, self.mass = ms.DT, ms.SPRING_STIFFNESS, ms.MASS
        self.decay = math.exp(-ms.DT * ms.DAMPING)
        self.friction, self.target_area, self.lr = ms.FRICTION, ms.TARGET_AREA, ms.LEARNING_RATE
        self.n_objects, self.n_springs = ms.N_OBJECTS, ms.N_SPRINGS
        np_real = np.float64 if real == ti.f64 else np.float32
        shape = (steps, self.n_objects)
        self.x = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.v = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.force = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.spring_anchor_a = ti.field(ti.i32, shape=self.n_springs)
        self.spring_anchor_b = ti.field(ti.i32, shape=self.n_springs)
        self.spring_length = ti.field(real, shape=self.n_springs, needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)
        x0 = np.zeros((steps, self.n_objects, 2), np_real)
        x0[0] = ms.OBJECTS
        self.x.from_numpy(x0)
        self.spring_anchor_a.from_numpy(np.array([a for a, _, _ in ms.SPRINGS], np.int32))
        self.spring_anchor_b.from_numpy(np.array([b for _, b, _ in ms.SPRINGS], np.int32))
        self.spring_length.from_numpy(np.array([r for _, _, r in ms.SPRINGS], np_real))

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def apply_spring_force(self, t: ti.i32):
        for i in range(self.n_springs):
            a, b = self.spring_anchor_a[i], self.spring_anchor_b[i]
            x_a, x_b = self.x[t - 1, a], self.x[t - 1, b]
            dist = x_a - x_b
            length = dist.norm() + 1e-4
            F = (length - self.spring_length[i]) * self.stiffness * dist / length
            ti.atomic_add(self.force[t, a], -F)
            ti.atomic_add(self.force[t, b], F)

    @ti.kernel
    def time_integrate(self, t: ti.i32):
        for i in range(self.n_objects):
            new_v = self.decay * self.v[t - 1, i] + self.dt * self.force[t, i] / self.mass
            new_x = self.x[t - 1, i] + self.dt * new_v
            if new_x[0] > 0.4 and new_v[0] > 0:
                if new_v[1] > 0:
                    new_v[1] -= ti.min(new_v[1], self.friction * new_v[0])
                if new_v[1] < 0:
                    new_v[1] += ti.min(-new_v[1], self.friction * new_v[0])
                new_v[0] = 0
            self.v[t, i] = new_v
            self.x[t, i] = new_x

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        x01 = self.x[t, 0] - self.x[t, 1]
        x02 = self.x[t, 0] - self.x[t, 2]
        area = ti.abs(0.5 * (x01[0] * x02[1] - x01[1] * x02[0]))
        self.loss[None] = (area - self.target_area) ** 2

    @ti.kernel
    def clear_states(self):
        for t, i in self.force:
            self.force[t, i] = ti.Vector([0.0, 0.0])

    @ti.kernel
    def apply_grad(self):
        for i in range(self.n_springs):
            self.spring_length[i] -= self.lr * self.spring_length.grad[i]

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        for t in range(1, self.steps):
            self.apply_spring_force(t)
            self.time_integrate(t)
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """force cleared, the forward on a tape, then DiffTaichi's update. Returns the loss."""
        self.clear_states()
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"spring_length": self.spring_length.grad.to_numpy()}
