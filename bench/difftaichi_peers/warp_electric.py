"""DiffTaichi's electric.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: arrays with a time axis (x[t], v[t] as vec2, hidden[t, i], gravitation[t, i]),
nn1(t), nn2(t), advance(t) and compute_loss(t) launched per step, a wp.Tape around the forward
and tape.backward(loss); on CUDA (graph=True) the zeroing of the loss, the taped forward, the
backward and the update are captured once with wp.ScopedCapture and replayed with
wp.capture_launch (the gradients are zeroed by tape.zero() before each replay, the goal path
uploaded into the same arrays). The sums over the 8 inputs, the 64 hidden units and the 8
electrodes are unrolled (wp.static bounds, the module's max_unroll raised), as the vkad example
and DiffTaichi (ti.static) unroll them.

Constants, the controller's initial weights, the goal paths (one per iteration, drawn from
random.Random(seed) in the example's order), the loss and the update (each array -= rate *
gradient, kernels) are examples/difftaichi/electric.py's, itself DiffTaichi's, including its one
change: nn1(t) reads x[t - 1] and v[t - 1] (the state advance(t) starts from). Checked against
the vkad example on Warp's CPU device (losses and gradients at iteration 0 to f32 rounding).
Call wp.init() before constructing.
"""
import math
import random
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

el = load_example("electric")
DT, DAMPING, K = el.DT, el.DAMPING, el.K
N_HIDDEN, N_GRAVITATION = el.N_HIDDEN, el.N_GRAVITATION

wp.set_module_options({"max_unroll": 128})


def build_kernels():
    decay = math.exp(-DT * DAMPING)
    lr = el.LEARNING_RATE

    @wp.kernel
    def initialize(x: wp.array(dtype=wp.vec2), goal: wp.array(dtype=wp.vec2)):
        x[0] = goal[0]

    @wp.kernel
    def nn1(t: int, x: wp.array(dtype=wp.vec2), v: wp.array(dtype=wp.vec2),
            goal: wp.array(dtype=wp.vec2), goal_v: wp.array(dtype=wp.vec2),
            weight1: wp.array2d(dtype=float), bias1: wp.array(dtype=float),
            hidden: wp.array2d(dtype=float)):
        i = wp.tid()
        p = x[t - 1]
        u = v[t - 1]
        g = goal[t]
        gv = goal_v[t]
        act = (p[0] - 0.5) * weight1[0, i]
        act += (p[1] - 0.5) * weight1[1, i]
        act += u[0] * weight1[2, i]
        act += u[1] * weight1[3, i]
        act += (g[0] - 0.5) * weight1[4, i]
        act += (g[1] - 0.5) * weight1[5, i]
        act += (gv[0] - 0.5) * weight1[6, i]
        act += (gv[1] - 0.5) * weight1[7, i]
        act += bias1[i]
        hidden[t, i] = wp.tanh(act)

    @wp.kernel
    def nn2(t: int, hidden: wp.array2d(dtype=float), weight2: wp.array2d(dtype=float),
            bias2: wp.array(dtype=float), gravitation: wp.array2d(dtype=float)):
        i = wp.tid()
        act = float(0.0)
        for j in range(wp.static(N_HIDDEN)):
            act += hidden[t, j] * weight2[j, i]
        act += bias2[i]
        gravitation[t, i] = wp.tanh(act)

    @wp.kernel
    def advance(t: int, x: wp.array(dtype=wp.vec2), v: wp.array(dtype=wp.vec2),
                gravitation: wp.array2d(dtype=float), electrodes: wp.array(dtype=wp.vec2)):
        force = wp.vec2(0.0, 0.0)
        for i in range(wp.static(N_GRAVITATION)):
            r = x[t - 1] - electrodes[i]
            len_r = wp.max(wp.length(r), 0.1)
            force += K * gravitation[t, i] / (len_r * len_r * len_r) * r
        new_v = v[t - 1] * wp.static(decay) + DT * force
        v[t] = new_v
        x[t] = x[t - 1] + DT * new_v

    @wp.kernel
    def compute_loss(t: int, x: wp.array(dtype=wp.vec2), goal: wp.array(dtype=wp.vec2),
                     loss: wp.array(dtype=float)):
        wp.atomic_add(loss, 0, DT * wp.length_sq(x[t] - goal[t]))

    @wp.kernel
    def update2d(w: wp.array2d(dtype=float), grad: wp.array2d(dtype=float)):
        i, j = wp.tid()
        w[i, j] = w[i, j] - grad[i, j] * wp.static(lr)

    @wp.kernel
    def update1d(w: wp.array(dtype=float), grad: wp.array(dtype=float)):
        i = wp.tid()
        w[i] = w[i] - grad[i] * wp.static(lr)

    return dict(initialize=initialize, nn1=nn1, nn2=nn2, advance=advance,
                compute_loss=compute_loss, update2d=update2d, update1d=update1d)


class WarpElectric:
    PARAMS = el.Electric.PARAMS  # weight1, bias1, weight2, bias2

    def __init__(self, steps: int = el.STEPS, seed: int = 0, graph: bool = False, device=None,
                 seg_size: int = el.SEG_SIZE):
        self.steps, self.seg_size = steps, min(seg_size, steps)
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.k = build_kernels()
        self.rng = random.Random(seed)  # the example's draws, in its order
        d = self.device

        def zeros(shape, dtype=float):
            return wp.zeros(shape, dtype=dtype, device=d, requires_grad=True)

        self.x, self.v = zeros(steps, wp.vec2), zeros(steps, wp.vec2)
        self.hidden, self.gravitation = zeros((steps, N_HIDDEN)), zeros((steps, N_GRAVITATION))
        self.goal = wp.zeros(steps, dtype=wp.vec2, device=d)
        self.goal_v = wp.zeros(steps, dtype=wp.vec2, device=d)
        self.electrodes = wp.array(np.array(el.GRAVITATION_POSITION, np.float32), dtype=wp.vec2,
                                   device=d)
        self.loss = zeros(1)
        for name, value in el.init_weights(self.rng).items():
            setattr(self, name, wp.array(value.astype(np.float32), dtype=float, device=d,
                                         requires_grad=True))
        self._iterations = 0
        self.set_task(*el.task(self.rng, steps, self.seg_size))
        self.tape = None
        self._graph = None

    def set_task(self, goal: np.ndarray, goal_v: np.ndarray) -> None:
        self.goal.assign(np.asarray(goal, np.float32))
        self.goal_v.assign(np.asarray(goal_v, np.float32))

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        """The example's forward(): x[0] = goal[0], then per step nn1, nn2, advance and the
        loss's term."""
        k = self.k
        self.loss.zero_()
        self._launch(k["initialize"], 1, self.x, self.goal)
        for t in range(1, self.steps):
            self._launch(k["nn1"], N_HIDDEN, t, self.x, self.v, self.goal, self.goal_v,
                         self.weight1, self.bias1, self.hidden)
            self._launch(k["nn2"], N_GRAVITATION, t, self.hidden, self.weight2, self.bias2,
                         self.gravitation)
            self._launch(k["advance"], 1, t, self.x, self.v, self.gravitation, self.electrodes)
            self._launch(k["compute_loss"], 1, t, self.x, self.goal, self.loss)

    def _forward_backward_update(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        for p in self.PARAMS:  # the update, off the tape
            a = getattr(self, p)
            self._launch(self.k["update2d" if a.ndim == 2 else "update1d"], a.shape, a, a.grad)

    def iteration(self) -> float:
        """A new goal path (the first iteration uses the constructor's), forward on the tape,
        backward and the update (replayed from a CUDA graph with graph=True). Returns the
        forward's loss."""
        if self._iterations:
            self.set_task(*el.task(self.rng, self.steps, self.seg_size))
        self._iterations += 1
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}
