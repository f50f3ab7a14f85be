"""DiffTaichi's rigid_body_toi.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: state with a time axis (x[t, i], v[t, i] as vec2), initialize() copying the start
(init_x, init_v, uploaded before each evaluation) into row 0, advance(t) launched per step over
the objects (with time of impact, or naive with toi=False), compute_loss(t) storing the last
step's height, a wp.Tape around the forward and tape.backward(loss); on CUDA (graph=True) the
taped forward and the backward are captured once with wp.ScopedCapture and replayed with
wp.capture_launch (the gradients zeroed by tape.zero() before each replay, the next start
uploaded into the same arrays). The bounce reflects v_y by building a new vector (the same value
as DiffTaichi's `new_v[1] = -new_v[1]`).

Constants and the scan are examples/difftaichi/rigid_body_toi.py's, itself DiffTaichi's; as
there, DiffTaichi has no optimiser for this program: iteration() is the scan's next point (a
taped forward and backward), nothing is updated. Call wp.init() before constructing.
"""
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

rb = load_example("rigid_body_toi")
DT, GROUND = rb.DT, rb.GROUND_HEIGHT


@wp.kernel
def initialize(init_x: wp.array(dtype=wp.vec2), init_v: wp.array(dtype=wp.vec2),
               x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2)):
    i = wp.tid()
    x[0, i] = init_x[0]
    v[0, i] = init_v[0]


@wp.kernel
def advance_toi(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2)):
    i = wp.tid()
    old_v = v[t - 1, i]
    old_x = x[t - 1, i]
    new_v = old_v
    toi = float(0.0)
    if old_x[1] + DT * old_v[1] < GROUND and old_v[1] < 0.0:
        new_v = wp.vec2(old_v[0], -old_v[1])
        toi = -(old_x[1] - GROUND) / old_v[1]
    v[t, i] = new_v
    x[t, i] = old_x + toi * old_v + (DT - toi) * new_v


@wp.kernel
def advance_no_toi(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2)):
    i = wp.tid()
    old_v = v[t - 1, i]
    old_x = x[t - 1, i]
    new_v = old_v
    if old_x[1] < GROUND and old_v[1] < 0.0:
        new_v = wp.vec2(old_v[0], -old_v[1])
    v[t, i] = new_v
    x[t, i] = old_x + DT * new_v


@wp.kernel
def compute_loss(t: int, x: wp.array2d(dtype=wp.vec2), loss: wp.array(dtype=float)):
    loss[0] = x[t, 0][1]


class WarpRigidBodyTOI:
    PARAMS = ("init_x", "init_v")

    def __init__(self, steps: int = rb.STEPS, seed: int = 0, graph: bool = False, device=None,
                 toi: bool = True, zoom: bool = False):
        self.steps, self.toi = steps, toi
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.offsets, self._next = rb.offsets(zoom), 0
        d = self.device

        def zeros(shape, dtype=float):
            return wp.zeros(shape, dtype=dtype, device=d, requires_grad=True)

        self.x = zeros((steps, rb.N_OBJECTS), wp.vec2)
        self.v = zeros((steps, rb.N_OBJECTS), wp.vec2)
        self.init_x, self.init_v = zeros(1, wp.vec2), zeros(1, wp.vec2)
        self.loss = zeros(1)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        self._launch(initialize, rb.N_OBJECTS, self.init_x, self.init_v, self.x, self.v)
        advance = advance_toi if self.toi else advance_no_toi
        for t in range(1, self.steps):
            self._launch(advance, rb.N_OBJECTS, t, self.x, self.v)
        self._launch(compute_loss, 1, self.steps - 1, self.x, self.loss)

    def _forward_backward(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)

    def iteration(self) -> float:
        """The scan's next point: the start uploaded, the taped forward and backward (replayed
        from a CUDA graph with graph=True). Returns the loss."""
        dy = float(self.offsets[self._next % len(self.offsets)])
        self._next += 1
        self.init_x.assign(np.array([[rb.INIT_X[0], rb.INIT_X[1] + dy]], np.float32))
        self.init_v.assign(np.array([rb.INIT_V], np.float32))
        run_taped(self, self._forward_backward)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy()[0] for p in self.PARAMS}
