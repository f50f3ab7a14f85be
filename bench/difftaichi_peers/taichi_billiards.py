"""DiffTaichi's billiards.py in Taichi 1.7, for bench/difftaichi.py.
Checked against the vkad example on Taichi's CPU backend (1,024 steps: losses within
2e-4, iteration-0 gradient within 9.3e-5) and in the H200 races (docs/benchmarks.md).

DiffTaichi's idiom, as its file has it: Vector fields with a time axis x[t, i], v[t, i],
x_inc[t, i], impulse[t, i] (needs_grad), collide_pair as a ti.func adding each pair's impulse
and time-of-impact correction into x_inc[t + 1, i] and impulse[t + 1, i] with `+=`, collide's
two loops (`for j in range(i)`, `for j in range(i + 1, n)`), a clear() kernel zeroing x_inc and
impulse before each taped forward, `ti.ad.Tape(loss=...)` around the forward (it zeroes the
gradients and seeds d loss = 1), the update of init_x and init_v. Differences from DiffTaichi's
file, none changing a result: the fields have explicit shapes (steps, n) instead of max_steps =
2048 rows kept for its scan and videos; the rack is written once at construction (DiffTaichi
writes the same values every forward; no kernel writes them); the update is a kernel (DiffTaichi
updates from Python scope, in f64, then stores f32); DiffTaichi's newer file runs ti.init with
flatten_if=True (branches made selects for its older autodiff) -- bench/difftaichi.py's
ti.init does not pass it, Taichi 1.7 differentiating the branches as they are.

Scene, constants, initialisation, loss and update are examples/difftaichi/billiards.py's,
itself DiffTaichi's. The caller runs ti.init (arch, default_fp = `real`) before constructing.
"""
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

bl = load_example("billiards")


@ti.data_oriented
class TaichiBilliards:
    PARAMS = ("init_x", "init_v")

    def __init__(self, steps: int = bl.STEPS, seed: int = 0, real=ti.f32,
                 layers: int = bl.BILLIARD_LAYERS):
        # seed: the benchmarks' common interface; DiffTaichi starts from fixed values
        self.steps, self.n_balls = steps, bl.n_balls(layers)
        self.target_ball = self.n_balls - 1
        self.dt, self.radius, self.elasticity = bl.DT, bl.RADIUS, bl.ELASTICITY
        self.goal_x, self.goal_y = bl.GOAL
        self.lr = bl.LEARNING_RATE
        self._np_real = np.float64 if real == ti.f64 else np.float32
        shape = (steps, self.n_balls)
        self.x = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.v = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.x_inc = ti.Vector.field(2, real, shape=shape, needs_grad=True)  # for TOI
        self.impulse = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.init_x = ti.Vector.field(2, real, shape=(), needs_grad=True)
        self.init_v = ti.Vector.field(2, real, shape=(), needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)
        x0 = np.zeros((steps, self.n_balls, 2), self._np_real)
        x0[0, 1:] = bl.rack(layers)
        self.x.from_numpy(x0)
        self.init_x.from_numpy(np.array(bl.INIT_X, self._np_real))
        self.init_v.from_numpy(np.array(bl.INIT_V, self._np_real))

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.func
    def collide_pair(self, t, i, j):
        imp = ti.Vector([0.0, 0.0])
        x_inc_contrib = ti.Vector([0.0, 0.0])
        if i != j:
            dist = (self.x[t, i] + self.dt * self.v[t, i]) - (self.x[t, j]
                                                              + self.dt * self.v[t, j])
            dist_norm = dist.norm()
            rela_v = self.v[t, i] - self.v[t, j]
            if dist_norm < 2 * self.radius:
                direction = dist.normalized()
                projected_v = direction.dot(rela_v)
                if projected_v < 0:
                    imp = -(1 + self.elasticity) * 0.5 * projected_v * direction
                    toi = (dist_norm - 2 * self.radius) / ti.min(-1e-3, projected_v)
                    x_inc_contrib = ti.min(toi - self.dt, 0) * imp
        self.x_inc[t + 1, i] += x_inc_contrib
        self.impulse[t + 1, i] += imp

    @ti.kernel
    def collide(self, t: ti.i32):
        for i in range(self.n_balls):
            for j in range(i):
                self.collide_pair(t, i, j)
        for i in range(self.n_balls):
            for j in range(i + 1, self.n_balls):
                self.collide_pair(t, i, j)

    @ti.kernel
    def advance(self, t: ti.i32):
        for i in range(self.n_balls):
            self.v[t, i] = self.v[t - 1, i] + self.impulse[t, i]
            self.x[t, i] = self.x[t - 1, i] + self.dt * self.v[t, i] + self.x_inc[t, i]

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        self.loss[None] = (self.x[t, self.target_ball][0] - self.goal_x) ** 2 + \
            (self.x[t, self.target_ball][1] - self.goal_y) ** 2

    @ti.kernel
    def initialize(self):
        self.x[0, 0] = self.init_x[None]
        self.v[0, 0] = self.init_v[None]

    @ti.kernel
    def clear(self):
        for t, i in ti.ndrange(self.steps, self.n_balls):
            self.impulse[t, i] = ti.Vector([0.0, 0.0])
            self.x_inc[t, i] = ti.Vector([0.0, 0.0])

    @ti.kernel
    def apply_grad(self):
        self.init_x[None] -= self.lr * self.init_x.grad[None]
        self.init_v[None] -= self.lr * self.init_v.grad[None]

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        """DiffTaichi's forward(): initialize, collide(t - 1) and advance(t) for t = 1 ..
        steps - 1, then the loss at the last step."""
        self.initialize()
        for t in range(1, self.steps):
            self.collide(t - 1)
            self.advance(t)
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """clear(), the forward on a tape (which zeroes every gradient first), then DiffTaichi's
        update. Returns the loss the forward computed."""
        self.clear()
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy().reshape(2) for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).to_numpy().reshape(2).astype(np.float64)
                for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).from_numpy(np.asarray(value, self._np_real).reshape(2))
