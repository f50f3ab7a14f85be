"""DiffTaichi's gradient_explosion.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: scalar fields with a time axis x[t], v[t] and 0-d fields
a, damping, loss (needs_grad), advance(t) and compute_loss(t) kernels of top-level statements
(serial in Taichi), damping[None] = exp(-dt alpha) and a[None] = 1 written from Python scope,
then `ti.ad.Tape(loss=...)` around advance(1 .. num_steps - 1) and compute_loss(num_steps - 1).
Differences from DiffTaichi's file, none changing a result: the fields have `steps` rows
instead of max_timesteps = 2^20; num_steps = 0 reads x[0] (DiffTaichi's reads x[-1], outside
the field); advance reuses the velocity it stores (DiffTaichi reads v[t] back).

As in the vkad example (examples/difftaichi/gradient_explosion.py), DiffTaichi has no optimiser
here: iteration() is one evaluation at num_steps = `steps` for the next of its four alphas,
returning the loss; gradients() d loss / d a and d loss / d damping. The caller runs ti.init
(arch, default_fp = `real`) before constructing.
"""
import math
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

ge = load_example("gradient_explosion")


@ti.data_oriented
class TaichiGradientExplosion:
    PARAMS = ("a", "damping")

    def __init__(self, steps: int = ge.STEPS, seed: int = 0, real=ti.f32):
        # seed: the benchmarks' common interface; the program has nothing random
        self.steps, self.dt, self._next = steps, ge.DT, 0
        self.x = ti.field(real, shape=steps, needs_grad=True)
        self.v = ti.field(real, shape=steps, needs_grad=True)
        self.a = ti.field(real, shape=(), needs_grad=True)
        self.damping = ti.field(real, shape=(), needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def advance(self, t: ti.i32):
        self.v[t] = self.damping[None] * self.v[t - 1] + self.a[None]
        self.x[t] = self.x[t - 1] + self.dt * self.v[t]

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        self.loss[None] = self.x[t]

    # --- the program ---------------------------------------------------------------------------

    def gradient(self, alpha: float, num_steps: int) -> float:
        """DiffTaichi's gradient(alpha, num_steps): returns the loss (= d loss / d a)."""
        self.damping[None] = math.exp(-self.dt * alpha)
        self.a[None] = 1
        with ti.ad.Tape(loss=self.loss):
            for i in range(1, num_steps):
                self.advance(i)
            self.compute_loss(max(num_steps - 1, 0))
        return float(self.loss[None])

    def iteration(self) -> float:
        alpha = ge.ALPHAS[self._next % len(ge.ALPHAS)]
        self._next += 1
        return self.gradient(alpha, self.steps)

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: np.array([getattr(self, p).grad[None]]) for p in self.PARAMS}
