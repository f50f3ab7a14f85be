"""DiffTaichi's gradient_explosion.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: x[t], v[t] arrays with a time axis and a, damping, loss arrays of one element,
advance(t) and compute_loss(t) launched on one thread per step, damping = exp(-dt alpha) and
a = 1 uploaded before each evaluation, a wp.Tape around the forward and tape.backward(loss); on
CUDA (graph=True) the taped forward and the backward are captured once with wp.ScopedCapture
and replayed with wp.capture_launch (the gradients zeroed by tape.zero() before each replay,
damping uploaded into the same array).

Constants and the evaluation are examples/difftaichi/gradient_explosion.py's, itself
DiffTaichi's; as there, DiffTaichi has no optimiser here: iteration() is one evaluation at
num_steps = `steps` for the next of its four alphas, nothing updated. Call wp.init() before
constructing.
"""
import math
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

ge = load_example("gradient_explosion")
DT = ge.DT


@wp.kernel
def advance(t: int, x: wp.array(dtype=float), v: wp.array(dtype=float),
            a: wp.array(dtype=float), damping: wp.array(dtype=float)):
    speed = damping[0] * v[t - 1] + a[0]
    v[t] = speed
    x[t] = x[t - 1] + DT * speed


@wp.kernel
def compute_loss(t: int, x: wp.array(dtype=float), loss: wp.array(dtype=float)):
    loss[0] = x[t]


class WarpGradientExplosion:
    PARAMS = ("a", "damping")

    def __init__(self, steps: int = ge.STEPS, seed: int = 0, graph: bool = False, device=None):
        self.steps, self._next = steps, 0
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        d = self.device

        def zeros(n):
            return wp.zeros(n, dtype=float, device=d, requires_grad=True)

        self.x, self.v = zeros(steps), zeros(steps)
        self.a, self.damping, self.loss = zeros(1), zeros(1), zeros(1)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, *args):
        wp.launch(kernel, dim=1, inputs=list(args), device=self.device)

    def _forward_backward(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            for t in range(1, self.steps):
                self._launch(advance, t, self.x, self.v, self.a, self.damping)
            self._launch(compute_loss, self.steps - 1, self.x, self.loss)
        self.tape.backward(self.loss)

    def iteration(self) -> float:
        """One evaluation at num_steps = steps for the next alpha (replayed from a CUDA graph
        with graph=True). Returns the loss."""
        alpha = ge.ALPHAS[self._next % len(ge.ALPHAS)]
        self._next += 1
        self.damping.assign(np.array([math.exp(-DT * alpha)], np.float32))
        self.a.assign(np.array([1.0], np.float32))
        run_taped(self, self._forward_backward)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}
