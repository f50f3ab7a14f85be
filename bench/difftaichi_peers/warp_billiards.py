"""DiffTaichi's billiards.py in Warp 1.19, for bench/difftaichi.py.
Checked against the vkad example on Warp's CPU device (1,024 steps: losses equal,
iteration-0 gradient within 2.7e-7) and in the H200 races (docs/benchmarks.md).

Warp's idiom: state with a time axis (x[t, i], v[t, i], x_inc[t, i], impulse[t, i] as vec2),
collide(t - 1) and advance(t) launched per step over the balls, a wp.Tape around the forward and
tape.backward(loss); on CUDA (graph=True) the zeroing of the loss, the taped forward, the
backward and the update are captured once with wp.ScopedCapture and replayed with
wp.capture_launch (the gradients are zeroed by tape.zero() before each replay, as in
warp_wave.py). The pair loop over j is unrolled (wp.static bound, the module's max_unroll
raised): Warp does not differentiate a variable carried through a dynamic loop, and the vkad
example unrolls it too; each ball sums its pairs' contributions (j ascending) and stores them
once, as the vkad example does (DiffTaichi adds each with `+=` into cleared fields: the same
sums).

Scene, constants, initialisation, loss and update (init -= learning_rate * grad, a kernel) are
examples/difftaichi/billiards.py's, itself DiffTaichi's. Call wp.init() before constructing.
"""
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

bl = load_example("billiards")
DT, RADIUS, ELASTICITY = bl.DT, bl.RADIUS, bl.ELASTICITY
GOAL_X, GOAL_Y = bl.GOAL

wp.set_module_options({"max_unroll": 64})


def build_kernels(n_balls: int):
    target, lr = n_balls - 1, bl.LEARNING_RATE

    @wp.kernel
    def initialize(init_x: wp.array(dtype=wp.vec2), init_v: wp.array(dtype=wp.vec2),
                   x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2)):
        x[0, 0] = init_x[0]
        v[0, 0] = init_v[0]

    @wp.kernel
    def collide(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                x_inc: wp.array2d(dtype=wp.vec2), impulse: wp.array2d(dtype=wp.vec2)):
        i = wp.tid()
        imp = wp.vec2(0.0, 0.0)
        inc = wp.vec2(0.0, 0.0)
        xi = x[t, i]
        vi = v[t, i]
        for j in range(wp.static(n_balls)):
            if i != j:
                dist = (xi + DT * vi) - (x[t, j] + DT * v[t, j])
                dist_norm = wp.length(dist)
                rela_v = vi - v[t, j]
                if dist_norm < 2.0 * RADIUS:
                    direction = dist / dist_norm  # ti.Vector.normalized
                    projected_v = wp.dot(direction, rela_v)
                    if projected_v < 0.0:
                        pair = -(1.0 + ELASTICITY) * 0.5 * projected_v * direction
                        toi = (dist_norm - 2.0 * RADIUS) / wp.min(-1e-3, projected_v)
                        imp = imp + pair
                        inc = inc + wp.min(toi - DT, 0.0) * pair
        x_inc[t + 1, i] = inc
        impulse[t + 1, i] = imp

    @wp.kernel
    def advance(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                x_inc: wp.array2d(dtype=wp.vec2), impulse: wp.array2d(dtype=wp.vec2)):
        i = wp.tid()
        new_v = v[t - 1, i] + impulse[t, i]
        v[t, i] = new_v
        x[t, i] = x[t - 1, i] + DT * new_v + x_inc[t, i]

    @wp.kernel
    def compute_loss(t: int, x: wp.array2d(dtype=wp.vec2), loss: wp.array(dtype=float)):
        p = x[t, wp.static(target)]
        dx = p[0] - GOAL_X
        dy = p[1] - GOAL_Y
        wp.atomic_add(loss, 0, dx * dx + dy * dy)

    @wp.kernel
    def apply_grad(init_x: wp.array(dtype=wp.vec2), init_v: wp.array(dtype=wp.vec2),
                   grad_x: wp.array(dtype=wp.vec2), grad_v: wp.array(dtype=wp.vec2)):
        init_x[0] = init_x[0] - wp.static(lr) * grad_x[0]
        init_v[0] = init_v[0] - wp.static(lr) * grad_v[0]

    return initialize, collide, advance, compute_loss, apply_grad


class WarpBilliards:
    PARAMS = ("init_x", "init_v")

    def __init__(self, steps: int = bl.STEPS, seed: int = 0, graph: bool = False, device=None,
                 layers: int = bl.BILLIARD_LAYERS):
        # seed: the benchmarks' common interface; DiffTaichi starts from fixed values
        self.steps, self.n_balls = steps, bl.n_balls(layers)
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        (self.k_initialize, self.k_collide, self.k_advance, self.k_loss,
         self.k_apply_grad) = build_kernels(self.n_balls)

        def state(host=None):
            if host is None:
                host = np.zeros((steps, self.n_balls, 2), np.float32)
            return wp.array(host, dtype=wp.vec2, device=self.device, requires_grad=True)

        x0 = np.zeros((steps, self.n_balls, 2), np.float32)
        x0[0, 1:] = bl.rack(layers)  # the rack, once (DiffTaichi writes it every forward)
        self.x, self.v, self.x_inc, self.impulse = state(x0), state(), state(), state()
        self.init_x = wp.array(np.array([bl.INIT_X], np.float32), dtype=wp.vec2,
                               device=self.device, requires_grad=True)
        self.init_v = wp.array(np.array([bl.INIT_V], np.float32), dtype=wp.vec2,
                               device=self.device, requires_grad=True)
        self.loss = wp.zeros(1, dtype=float, device=self.device, requires_grad=True)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        """DiffTaichi's forward(): initialize, collide(t - 1) and advance(t) for t = 1 ..
        steps - 1, then the loss at the last step."""
        self.loss.zero_()
        self._launch(self.k_initialize, 1, self.init_x, self.init_v, self.x, self.v)
        n = self.n_balls
        for t in range(1, self.steps):
            self._launch(self.k_collide, n, t - 1, self.x, self.v, self.x_inc, self.impulse)
            self._launch(self.k_advance, n, t, self.x, self.v, self.x_inc, self.impulse)
        self._launch(self.k_loss, 1, self.steps - 1, self.x, self.loss)

    def _forward_backward_update(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        self._launch(self.k_apply_grad, 1, self.init_x, self.init_v, self.init_x.grad,
                     self.init_v.grad)  # off the tape

    def iteration(self) -> float:
        """Forward on the tape, backward and DiffTaichi's update (replayed from a CUDA graph
        with graph=True). Returns the forward's loss."""
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy().reshape(2) for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).numpy().reshape(2).astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).assign(np.asarray(value, np.float32).reshape(1, 2))
