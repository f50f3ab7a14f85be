"""DiffTaichi's electric.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: fields with a time axis (x[t], v[t] Vector fields,
hidden[t, i], gravitation[t, i]) and the controller's fields (needs_grad), nn1(t), nn2(t),
advance(t) and compute_loss(t) kernels launched per step, `ti.ad.Tape(loss=...)` around the
forward (it zeroes the gradients and seeds d loss = 1), the sums over the 64 hidden units and
the 8 electrodes unrolled with ti.static. Differences from DiffTaichi's file: nn1(t) reads
x[t - 1] and v[t - 1], the state advance(t) starts from (the vkad example's change, which it
explains: DiffTaichi's reads x[t], which advance(t) writes after it); the fields have `steps`
rows instead of max_steps = 2048; the update is a kernel (DiffTaichi updates from Python scope,
element by element, in f64); nothing is drawn on a GUI.

Constants, the controller's initial weights, the goal paths (one per iteration, drawn from
random.Random(seed) in the example's order), the loss and the update are
examples/difftaichi/electric.py's. Checked against the vkad example on Taichi's CPU backend
(losses and gradients at iteration 0 to f32 rounding). The caller runs ti.init (arch,
default_fp = `real`) before constructing.
"""
import math
import random
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

el = load_example("electric")


@ti.data_oriented
class TaichiElectric:
    PARAMS = el.Electric.PARAMS  # weight1, bias1, weight2, bias2

    def __init__(self, steps: int = el.STEPS, seed: int = 0, real=ti.f32,
                 seg_size: int = el.SEG_SIZE):
        self.steps, self.seg_size = steps, min(seg_size, steps)
        self.dt, self.k_force, self.lr = el.DT, el.K, el.LEARNING_RATE
        self.decay = math.exp(-el.DT * el.DAMPING)
        self.n_hidden, self.n_gravitation = el.N_HIDDEN, el.N_GRAVITATION
        self.positions = el.GRAVITATION_POSITION
        self._np_real = np.float64 if real == ti.f64 else np.float32
        self.x = ti.Vector.field(2, real, shape=steps, needs_grad=True)
        self.v = ti.Vector.field(2, real, shape=steps, needs_grad=True)
        self.goal = ti.Vector.field(2, real, shape=steps)
        self.goal_v = ti.Vector.field(2, real, shape=steps)
        self.hidden = ti.field(real, shape=(steps, self.n_hidden), needs_grad=True)
        self.gravitation = ti.field(real, shape=(steps, self.n_gravitation), needs_grad=True)
        self.weight1 = ti.field(real, shape=(8, self.n_hidden), needs_grad=True)
        self.bias1 = ti.field(real, shape=self.n_hidden, needs_grad=True)
        self.weight2 = ti.field(real, shape=(self.n_hidden, self.n_gravitation), needs_grad=True)
        self.bias2 = ti.field(real, shape=self.n_gravitation, needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)
        self.rng = random.Random(seed)  # the example's draws, in its order
        for name, value in el.init_weights(self.rng).items():
            getattr(self, name).from_numpy(value.astype(self._np_real))
        self._iterations = 0
        self.set_task(*el.task(self.rng, steps, self.seg_size))

    def set_task(self, goal: np.ndarray, goal_v: np.ndarray) -> None:
        self.goal.from_numpy(np.asarray(goal, self._np_real))
        self.goal_v.from_numpy(np.asarray(goal_v, self._np_real))

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def nn1(self, t: ti.i32):
        for i in range(self.n_hidden):
            act = 0.0
            act += (self.x[t - 1][0] - 0.5) * self.weight1[0, i]
            act += (self.x[t - 1][1] - 0.5) * self.weight1[1, i]
            act += self.v[t - 1][0] * self.weight1[2, i]
            act += self.v[t - 1][1] * self.weight1[3, i]
            act += (self.goal[t][0] - 0.5) * self.weight1[4, i]
            act += (self.goal[t][1] - 0.5) * self.weight1[5, i]
            act += (self.goal_v[t][0] - 0.5) * self.weight1[6, i]
            act += (self.goal_v[t][1] - 0.5) * self.weight1[7, i]
            act += self.bias1[i]
            self.hidden[t, i] = ti.tanh(act)

    @ti.kernel
    def nn2(self, t: ti.i32):
        for i in range(self.n_gravitation):
            act = 0.0
            for j in ti.static(range(self.n_hidden)):
                act += self.hidden[t, j] * self.weight2[j, i]
            act += self.bias2[i]
            self.gravitation[t, i] = ti.tanh(act)

    @ti.kernel
    def advance(self, t: ti.i32):
        for _ in range(1):  # DiffTaichi: "parallelize this loop"
            gravitational_force = ti.Vector([0.0, 0.0])
            for i in ti.static(range(self.n_gravitation)):  # "instead of this one"
                r = self.x[t - 1] - ti.Vector(self.positions[i])
                len_r = ti.max(r.norm(), 1e-1)
                gravitational_force += self.k_force * self.gravitation[t, i] / (
                    len_r * len_r * len_r) * r
            self.v[t] = self.v[t - 1] * self.decay + self.dt * gravitational_force
            self.x[t] = self.x[t - 1] + self.dt * self.v[t]

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        ti.atomic_add(self.loss[None], self.dt * (self.x[t] - self.goal[t]).norm_sqr())

    @ti.kernel
    def initialize(self):
        self.x[0] = self.goal[0]  # DiffTaichi: x[0] = points[0]

    @ti.kernel
    def apply_grad(self):
        for i, j in self.weight1:
            self.weight1[i, j] -= self.lr * self.weight1.grad[i, j]
        for j in self.bias1:
            self.bias1[j] -= self.lr * self.bias1.grad[j]
        for i, j in self.weight2:
            self.weight2[i, j] -= self.lr * self.weight2.grad[i, j]
        for j in self.bias2:
            self.bias2[j] -= self.lr * self.bias2.grad[j]

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        for t in range(1, self.steps):
            self.nn1(t)
            self.nn2(t)
            self.advance(t)
            self.compute_loss(t)

    def iteration(self) -> float:
        """A new goal path (the first iteration uses the constructor's), x[0] = goal[0], the
        forward on a tape (which zeroes every gradient first), then DiffTaichi's update.
        Returns the loss the forward computed."""
        if self._iterations:
            self.set_task(*el.task(self.rng, self.steps, self.seg_size))
        self._iterations += 1
        self.initialize()
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy() for p in self.PARAMS}
