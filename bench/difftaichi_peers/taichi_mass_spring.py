"""DiffTaichi's mass_spring.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom: fields with a time axis (x[t, i], v[t, i], v_inc[t, i], hidden[t, i], ...),
one kernel per stage launched per step with the step as an argument, static (unrolled) loops over
masses, sine waves and hidden units, and `ti.ad.Tape(loss=...)` around the forward. Fields are
allocated with explicit shapes: in Taichi 1.7 `ti.root.dense(ti.i, T).dense(ti.j, N)` still gives
(T, N), but the explicit form says which axis is time.

Physics, constants, robots, initialisation, loss and update are examples/difftaichi/
mass_spring.py's (itself DiffTaichi's); where the two differ only in the order of f32 operations
this follows the vkad example, so the implementations agree to rounding. The update runs on the
host in numpy, as the vkad example's does: DiffTaichi's Python-scope loop over field elements
would cost a device round trip per weight and measure that instead of the simulation.

The caller runs ti.init (arch, default_fp) before constructing, with default_fp = `real` (the
fields' type; kernel literals and `float` take default_fp).
"""

import math
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

ms = load_example("mass_spring")
DT, GROUND_HEIGHT, GRAVITY = ms.DT, ms.GROUND_HEIGHT, ms.GRAVITY
SPRING_OMEGA, DAMPING = ms.SPRING_OMEGA, ms.DAMPING
N_SIN_WAVES, N_HIDDEN, HEAD_ID = ms.N_SIN_WAVES, ms.N_HIDDEN, ms.HEAD_ID


@ti.data_oriented
class TaichiMassSpring:
    PARAMS = ("weights1", "bias1", "weights2", "bias2")

    def __init__(self, steps: int = ms.STEPS, robot_id: int = 0, seed: int = 0,
                 toi: bool = True, real=ti.f32):
        objects, springs = ms.robot(robot_id)
        self.steps, self.toi = steps, toi
        self.n_objects, self.n_springs = n_obj, n_spr = len(objects), len(springs)
        self.n_input = N_SIN_WAVES + 4 * n_obj + 2

        def vec(shape):
            return ti.Vector.field(2, real, shape=shape, needs_grad=True)

        def scalar(shape):
            return ti.field(real, shape=shape, needs_grad=True)

        self.x, self.v, self.v_inc = vec((steps, n_obj)), vec((steps, n_obj)), vec((steps, n_obj))
        self.center = vec(steps)
        self.hidden, self.act = scalar((steps, N_HIDDEN)), scalar((steps, n_spr))
        self.weights1, self.bias1 = scalar((N_HIDDEN, self.n_input)), scalar(N_HIDDEN)
        self.weights2, self.bias2 = scalar((n_spr, N_HIDDEN)), scalar(n_spr)
        self.loss = scalar(())
        self.goal = ti.Vector.field(2, real, shape=())
        self.anchor_a, self.anchor_b = ti.field(ti.i32, n_spr), ti.field(ti.i32, n_spr)
        self.spring_length, self.spring_stiffness, self.spring_actuation = (
            ti.field(real, n_spr) for _ in range(3))

        self._np_real = np.float64 if real == ti.f64 else np.float32
        self.goal[None] = ms.GOAL
        x0 = np.zeros((steps, n_obj, 2), self._np_real)
        x0[0] = objects
        self.x.from_numpy(x0)
        sp = np.array(springs, np.float64)
        self.anchor_a.from_numpy(sp[:, 0].astype(np.int32))
        self.anchor_b.from_numpy(sp[:, 1].astype(np.int32))
        self.spring_length.from_numpy(sp[:, 2].astype(self._np_real))
        self.spring_stiffness.from_numpy(sp[:, 3].astype(self._np_real))
        self.spring_actuation.from_numpy(sp[:, 4].astype(self._np_real))

        # DiffTaichi's initialisation, draws in its order: weights1, then weights2; zero biases.
        rng = np.random.RandomState(seed)
        w1 = rng.randn(N_HIDDEN, self.n_input) * math.sqrt(2 / (N_HIDDEN + self.n_input)) * 2
        w2 = rng.randn(n_spr, N_HIDDEN) * math.sqrt(2 / (N_HIDDEN + n_spr)) * 3
        self.set_params({"weights1": w1, "bias1": np.zeros(N_HIDDEN), "weights2": w2,
                          "bias2": np.zeros(n_spr)})

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def compute_center(self, t: ti.i32):
        for _ in range(1):
            c = self.x[t, 0]
            for i in ti.static(range(1, self.n_objects)):
                c += self.x[t, i]
            self.center[t] = c * (1.0 / self.n_objects)

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
                k = N_SIN_WAVES + 4 * j  # offsets and velocities get smaller weights
                act = (act + self.weights1[i, k] * offset[0] * 0.05
                       + self.weights1[i, k + 1] * offset[1] * 0.05)
                act = (act + self.weights1[i, k + 2] * vel[0] * 0.05
                       + self.weights1[i, k + 3] * vel[1] * 0.05)
            to_goal = self.goal[None] - c
            k = N_SIN_WAVES + 4 * self.n_objects
            act = act + self.weights1[i, k] * to_goal[0] + self.weights1[i, k + 1] * to_goal[1]
            self.hidden[t, i] = ti.tanh(act + self.bias1[i])

    @ti.kernel
    def nn2(self, t: ti.i32):
        for i in range(self.n_springs):
            a = self.weights2[i, 0] * self.hidden[t, 0]
            for j in ti.static(range(1, N_HIDDEN)):
                a += self.weights2[i, j] * self.hidden[t, j]
            self.act[t, i] = ti.tanh(a + self.bias2[i])

    @ti.kernel
    def apply_spring_force(self, t: ti.i32):
        for i in range(self.n_springs):
            a, b = self.anchor_a[i], self.anchor_b[i]
            dist = self.x[t, a] - self.x[t, b]
            length = dist.norm() + 1e-4
            target = self.spring_length[i] * (1.0 + self.spring_actuation[i] * self.act[t, i])
            impulse = DT * (length - target) * self.spring_stiffness[i] / length * dist
            self.v_inc[t + 1, a] += -impulse
            self.v_inc[t + 1, b] += impulse

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
        self.loss[None] = -self.x[t, HEAD_ID][0]

    # --- the program -----------------------------------------------------------------------

    def forward(self) -> None:
        """DiffTaichi's forward(): steps - 1 steps from x[0], v[0] = 0, then the loss."""
        for t in range(1, self.steps):
            self.compute_center(t - 1)
            self.nn1(t - 1)
            self.nn2(t - 1)
            self.apply_spring_force(t - 1)
            if self.toi:
                self.advance_toi(t)
            else:
                self.advance_no_toi(t)
        self.loss[None] = 0
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """DiffTaichi's clear(), the forward on a tape (which clears every gradient first and
        runs the adjoints at its end), then the update: the gradient scaled to norm
        GRADIENT_CLIP. Returns the loss the forward computed."""
        self.v_inc.fill(0)
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        grads = self.gradients()
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = ms.GRADIENT_CLIP / (norm + 1e-6)
        w = self.params()
        self.set_params({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).to_numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).from_numpy(np.asarray(value, self._np_real))
