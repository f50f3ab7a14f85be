"""DiffTaichi's rigid_body_toi.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: Vector fields with a time axis x[t, i], v[t, i]
(needs_grad), the start written into x[0, 0] and v[0, 0] from Python scope before each tape,
advance(t) launched per step (advance_toi, or advance_no_toi with toi=False), compute_loss
storing the last step's height into loss[None], `ti.ad.Tape(loss=...)` around the forward (it
zeroes the gradients and seeds d loss = 1), and the gradient read as x.grad[0, 0] (and v.grad[0,
0]). Differences from DiffTaichi's file, none changing a result: the fields have `steps` rows
instead of max_steps = 4096 (kept there for a video at twice the steps); nothing is drawn.

As in the vkad example (examples/difftaichi/rigid_body_toi.py), DiffTaichi has no optimiser here:
iteration() is the next point of its scan (the start (0.7, 0.5 + dy), dy = 0, 0.02, ..), a taped
forward and backward, returning the loss; nothing is updated. The caller runs ti.init (arch,
default_fp = `real`) before constructing.
"""
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

rb = load_example("rigid_body_toi")


@ti.data_oriented
class TaichiRigidBodyTOI:
    PARAMS = ("init_x", "init_v")  # the example's names for x[0, 0] and v[0, 0]

    def __init__(self, steps: int = rb.STEPS, seed: int = 0, real=ti.f32, toi: bool = True,
                 zoom: bool = False):
        # seed: the benchmarks' common interface; the scene has nothing random
        self.steps, self.toi = steps, toi
        self.dt, self.ground = rb.DT, rb.GROUND_HEIGHT
        self.offsets, self._next = rb.offsets(zoom), 0
        self.x = ti.Vector.field(2, real, shape=(steps, rb.N_OBJECTS), needs_grad=True)
        self.v = ti.Vector.field(2, real, shape=(steps, rb.N_OBJECTS), needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def advance_toi(self, t: ti.i32):
        for i in range(rb.N_OBJECTS):
            old_v = self.v[t - 1, i]
            new_v = old_v
            old_x = self.x[t - 1, i]
            new_x = old_x + self.dt * new_v
            toi = 0.0
            if new_x[1] < self.ground and new_v[1] < 0:
                new_v[1] = -new_v[1]
                toi = -(old_x[1] - self.ground) / old_v[1]
            self.v[t, i] = new_v
            self.x[t, i] = self.x[t - 1, i] + toi * old_v + (self.dt - toi) * new_v

    @ti.kernel
    def advance_no_toi(self, t: ti.i32):
        for i in range(rb.N_OBJECTS):
            new_v = self.v[t - 1, i]
            if self.x[t - 1, i][1] < self.ground and new_v[1] < 0:
                new_v[1] = -new_v[1]
            self.v[t, i] = new_v
            self.x[t, i] = self.x[t - 1, i] + self.dt * new_v

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        self.loss[None] = self.x[t, 0][1]

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        advance = self.advance_toi if self.toi else self.advance_no_toi
        for t in range(1, self.steps):
            advance(t)
        self.loss[None] = 0
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """The scan's next point: the start written into row 0, the taped forward and backward.
        Returns the loss."""
        dy = float(self.offsets[self._next % len(self.offsets)])
        self._next += 1
        self.x[0, 0] = [rb.INIT_X[0], rb.INIT_X[1] + dy]
        self.v[0, 0] = list(rb.INIT_V)
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        return float(self.loss[None])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"init_x": self.x.grad.to_numpy()[0, 0], "init_v": self.v.grad.to_numpy()[0, 0]}
