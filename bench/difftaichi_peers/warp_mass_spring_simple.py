"""DiffTaichi's mass_spring_simple.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: state with a time axis (x[t, i], v[t, i], force[t, i] as vec2),
apply_spring_force(t) over the springs with wp.atomic_add / wp.atomic_sub into force[t],
time_integrate(t) over the masses with the friction projection, compute_loss(t) storing
(area - 0.1)^2, a wp.Tape around the forward and tape.backward(loss); on CUDA (graph=True) the
zeroing of force, the taped forward, the backward and the update are captured once with
wp.ScopedCapture and replayed with wp.capture_launch (the gradients zeroed by tape.zero() before
each replay). The projection's component updates build new vectors (the same values as
DiffTaichi's in-place `new_v[1] -= ...`).

Scene, constants, loss and update (spring_length -= rate * gradient, a kernel) are
examples/difftaichi/mass_spring_simple.py's, itself DiffTaichi's. Call wp.init() before
constructing.
"""
import math
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

ms = load_example("mass_spring_simple")
DT, STIFFNESS, MASS, FRICTION = ms.DT, ms.SPRING_STIFFNESS, ms.MASS, ms.FRICTION
DECAY = math.exp(-ms.DT * ms.DAMPING)
TARGET_AREA, LR = ms.TARGET_AREA, ms.LEARNING_RATE


@wp.kernel
def apply_spring_force(t: int, x: wp.array2d(dtype=wp.vec2), anchor_a: wp.array(dtype=int),
                       anchor_b: wp.array(dtype=int), spring_length: wp.array(dtype=float),
                       force: wp.array2d(dtype=wp.vec2)):
    i = wp.tid()
    a = anchor_a[i]
    b = anchor_b[i]
    dist = x[t - 1, a] - x[t - 1, b]
    length = wp.length(dist) + 1e-4
    f = (length - spring_length[i]) * STIFFNESS * dist / length
    wp.atomic_sub(force, t, a, f)
    wp.atomic_add(force, t, b, f)


@wp.kernel
def time_integrate(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                   force: wp.array2d(dtype=wp.vec2)):
    i = wp.tid()
    new_v = DECAY * v[t - 1, i] + DT * force[t, i] / MASS
    new_x = x[t - 1, i] + DT * new_v
    if new_x[0] > 0.4 and new_v[0] > 0.0:
        vy = new_v[1]
        if vy > 0.0:
            vy = vy - wp.min(vy, FRICTION * new_v[0])
        if vy < 0.0:
            vy = vy + wp.min(-vy, FRICTION * new_v[0])
        new_v = wp.vec2(0.0, vy)
    v[t, i] = new_v
    x[t, i] = new_x


@wp.kernel
def compute_loss(t: int, x: wp.array2d(dtype=wp.vec2), loss: wp.array(dtype=float)):
    x01 = x[t, 0] - x[t, 1]
    x02 = x[t, 0] - x[t, 2]
    area = wp.abs(0.5 * (x01[0] * x02[1] - x01[1] * x02[0]))
    loss[0] = (area - TARGET_AREA) * (area - TARGET_AREA)


@wp.kernel
def apply_grad(spring_length: wp.array(dtype=float), grad: wp.array(dtype=float)):
    i = wp.tid()
    spring_length[i] = spring_length[i] - LR * grad[i]


class WarpMassSpringSimple:
    PARAMS = ("spring_length",)

    def __init__(self, steps: int = ms.STEPS, seed: int = 0, graph: bool = False, device=None):
        self.steps = steps
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        d = self.device
        x0 = np.zeros((steps, ms.N_OBJECTS, 2), np.float32)
        x0[0] = ms.OBJECTS
        self.x = wp.array(x0, dtype=wp.vec2, device=d, requires_grad=True)
        self.v = wp.zeros((steps, ms.N_OBJECTS), dtype=wp.vec2, device=d, requires_grad=True)
        self.force = wp.zeros((steps, ms.N_OBJECTS), dtype=wp.vec2, device=d,
                              requires_grad=True)
        self.anchor_a = wp.array([a for a, _, _ in ms.SPRINGS], dtype=int, device=d)
        self.anchor_b = wp.array([b for _, b, _ in ms.SPRINGS], dtype=int, device=d)
        self.spring_length = wp.array(np.array([r for _, _, r in ms.SPRINGS], np.float32),
                                      dtype=float, device=d, requires_grad=True)
        self.loss = wp.zeros(1, dtype=float, device=d, requires_grad=True)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        self.force.zero_()  # DiffTaichi's clear_states()
        for t in range(1, self.steps):
            self._launch(apply_spring_force, ms.N_SPRINGS, t, self.x, self.anchor_a,
                         self.anchor_b, self.spring_length, self.force)
            self._launch(time_integrate, ms.N_OBJECTS, t, self.x, self.v, self.force)
        self._launch(compute_loss, 1, self.steps - 1, self.x, self.loss)

    def _forward_backward_update(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        self._launch(apply_grad, ms.N_SPRINGS, self.spring_length, self.spring_length.grad)

    def iteration(self) -> float:
        """Forward on the tape, backward and the update (replayed from a CUDA graph with
        graph=True). Returns the forward's loss."""
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"spring_length": self.spring_length.grad.numpy()}
