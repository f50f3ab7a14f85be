"""DiffTaichi's mass_spring.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom for a differentiable simulation (its examples/optim): arrays with a time axis
(x[t, i], v[t, i], ...), one kernel per stage launched per step, a wp.Tape around the forward and
tape.backward(loss); on CUDA (graph=True) the zeroing, the taped forward and the backward are
captured once with wp.ScopedCapture and replayed with wp.capture_launch, as example_diffray does.
Loops over masses, sine waves and hidden units are unrolled (wp.static bounds and the module's
max_unroll raised, see below): Warp does not differentiate a variable carried through a dynamic
loop, and unrolling is what DiffTaichi's ti.static does. The kernels close over the robot's sizes, so they are built per robot.

Physics, constants, robots, initialisation, loss and update are examples/difftaichi/
mass_spring.py's; where DiffTaichi and the vkad example differ only in the order of f32
operations this follows the vkad example. The update runs on the host in numpy, as the vkad
example's does. Call wp.init() before constructing.
"""
import math
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

ms = load_example("mass_spring")
DT, GROUND_HEIGHT, GRAVITY = ms.DT, ms.GROUND_HEIGHT, ms.GRAVITY
SPRING_OMEGA, DAMPING = ms.SPRING_OMEGA, ms.DAMPING
N_SIN_WAVES, N_HIDDEN, HEAD_ID = ms.N_SIN_WAVES, ms.N_HIDDEN, ms.HEAD_ID

# Every loop here must unroll. A constant-bound loop longer than max_unroll (default 16; nn2's
# runs over 31 hidden units) stays a dynamic loop even with a wp.static bound (seen in the
# generated C++), and Warp's reverse mode does not carry a variable mutated across a dynamic
# loop: nn2's bias2 gradient came out 5x too large. 64 covers DiffTaichi's largest robot (26
# masses).
wp.set_module_options({"max_unroll": 64})


def build_kernels(n_objects: int, gravity: float = GRAVITY):
    """The program's kernels; `gravity`: the advance kernels' (mass_spring_velocity's differs)."""
    @wp.kernel
    def compute_center(t: int, x: wp.array2d(dtype=wp.vec2), center: wp.array(dtype=wp.vec2)):
        c = x[t, 0]
        for i in range(1, wp.static(n_objects)):
            c += x[t, i]
        center[t] = c * wp.static(1.0 / n_objects)

    @wp.kernel
    def nn1(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
            center: wp.array(dtype=wp.vec2), goal: wp.array(dtype=wp.vec2),
            weights1: wp.array2d(dtype=float), bias1: wp.array(dtype=float),
            hidden: wp.array2d(dtype=float)):
        i = wp.tid()
        phase = float(t) * wp.static(SPRING_OMEGA * DT)
        act = weights1[i, 0] * wp.sin(phase)
        for j in range(1, wp.static(N_SIN_WAVES)):
            act += weights1[i, j] * wp.sin(phase + wp.static(2.0 * math.pi / N_SIN_WAVES) * float(j))
        c = center[t]
        for j in range(wp.static(n_objects)):
            offset = x[t, j] - c
            vel = v[t, j]
            k = N_SIN_WAVES + 4 * j  # offsets and velocities get smaller weights
            act = act + weights1[i, k] * offset[0] * 0.05 + weights1[i, k + 1] * offset[1] * 0.05
            act = act + weights1[i, k + 2] * vel[0] * 0.05 + weights1[i, k + 3] * vel[1] * 0.05
        to_goal = goal[0] - c
        k = wp.static(N_SIN_WAVES + 4 * n_objects)
        act = act + weights1[i, k] * to_goal[0] + weights1[i, k + 1] * to_goal[1]
        hidden[t, i] = wp.tanh(act + bias1[i])

    @wp.kernel
    def nn2(t: int, hidden: wp.array2d(dtype=float), weights2: wp.array2d(dtype=float),
            bias2: wp.array(dtype=float), act: wp.array2d(dtype=float)):
        i = wp.tid()
        a = weights2[i, 0] * hidden[t, 0]
        for j in range(1, wp.static(N_HIDDEN)):
            a += weights2[i, j] * hidden[t, j]
        act[t, i] = wp.tanh(a + bias2[i])

    @wp.kernel
    def apply_spring_force(t: int, x: wp.array2d(dtype=wp.vec2), act: wp.array2d(dtype=float),
                           anchor_a: wp.array(dtype=int), anchor_b: wp.array(dtype=int),
                           spring_length: wp.array(dtype=float),
                           spring_stiffness: wp.array(dtype=float),
                           spring_actuation: wp.array(dtype=float),
                           v_inc: wp.array2d(dtype=wp.vec2)):
        i = wp.tid()
        a = anchor_a[i]
        b = anchor_b[i]
        dist = x[t, a] - x[t, b]
        length = wp.length(dist) + 1e-4
        target = spring_length[i] * (1.0 + spring_actuation[i] * act[t, i])
        impulse = DT * (length - target) * spring_stiffness[i] / length * dist
        wp.atomic_add(v_inc, t + 1, a, -impulse)
        wp.atomic_add(v_inc, t + 1, b, impulse)

    @wp.kernel
    def advance_toi(t: int, v_inc: wp.array2d(dtype=wp.vec2), x: wp.array2d(dtype=wp.vec2),
                    v: wp.array2d(dtype=wp.vec2)):
        i = wp.tid()
        old_v = (wp.static(math.exp(-DT * DAMPING)) * v[t - 1, i]
                 + wp.vec2(0.0, wp.static(DT * gravity)) + v_inc[t, i])
        old_x = x[t - 1, i]
        new_x = old_x + DT * old_v
        toi = float(0.0)
        new_v = old_v
        if new_x[1] < GROUND_HEIGHT and old_v[1] < -1e-4:
            toi = -(old_x[1] - GROUND_HEIGHT) / old_v[1]
            new_v = wp.vec2(0.0, 0.0)
        v[t, i] = new_v
        x[t, i] = old_x + toi * old_v + (DT - toi) * new_v

    @wp.kernel
    def advance_no_toi(t: int, v_inc: wp.array2d(dtype=wp.vec2), x: wp.array2d(dtype=wp.vec2),
                       v: wp.array2d(dtype=wp.vec2)):
        i = wp.tid()
        old_v = (wp.static(math.exp(-DT * DAMPING)) * v[t - 1, i]
                 + wp.vec2(0.0, wp.static(DT * gravity)) + v_inc[t, i])
        old_x = x[t - 1, i]
        new_v = old_v
        if old_x[1] - GROUND_HEIGHT < 0.0 and new_v[1] < 0.0:  # friction projection
            new_v = wp.vec2(0.0, 0.0)
        v[t, i] = new_v
        x[t, i] = old_x + DT * new_v

    @wp.kernel
    def compute_loss(t: int, x: wp.array2d(dtype=wp.vec2), loss: wp.array(dtype=float)):
        wp.atomic_add(loss, 0, -x[t, HEAD_ID][0])

    return (compute_center, nn1, nn2, apply_spring_force, advance_toi, advance_no_toi,
            compute_loss)


class WarpMassSpring:
    PARAMS = ("weights1", "bias1", "weights2", "bias2")

    def __init__(self, steps: int = ms.STEPS, robot_id: int = 0, seed: int = 0,
                 toi: bool = True, graph: bool = False, device=None):
        objects, springs = ms.robot(robot_id)
        self.steps, self.toi = steps, toi
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        n_obj, n_spr = len(objects), len(springs)
        self.n_input = N_SIN_WAVES + 4 * n_obj + 2
        (self.k_center, self.k_nn1, self.k_nn2, self.k_spring, self.k_advance_toi,
         self.k_advance_no_toi, self.k_loss) = build_kernels(n_obj)
        self.n_objects, self.n_springs = n_obj, n_spr

        def zeros(shape, dtype=float):
            return wp.zeros(shape, dtype=dtype, device=self.device, requires_grad=True)

        def const(values, dtype):
            return wp.array(values, dtype=dtype, device=self.device)

        x0 = np.zeros((steps, n_obj, 2), np.float32)
        x0[0] = objects
        self.x = wp.array(x0, dtype=wp.vec2, device=self.device, requires_grad=True)
        self.v, self.v_inc = zeros((steps, n_obj), wp.vec2), zeros((steps, n_obj), wp.vec2)
        self.center = zeros(steps, wp.vec2)
        self.hidden, self.act = zeros((steps, N_HIDDEN)), zeros((steps, n_spr))
        self.loss = zeros(1)
        self.goal = const(np.array([ms.GOAL], np.float32), wp.vec2)
        sp = np.array(springs, np.float64)
        self.anchor_a = const(sp[:, 0].astype(np.int32), int)
        self.anchor_b = const(sp[:, 1].astype(np.int32), int)
        self.spring_length = const(sp[:, 2].astype(np.float32), float)
        self.spring_stiffness = const(sp[:, 3].astype(np.float32), float)
        self.spring_actuation = const(sp[:, 4].astype(np.float32), float)

        # DiffTaichi's initialisation, draws in its order: weights1, then weights2; zero biases.
        rng = np.random.RandomState(seed)
        w1 = rng.randn(N_HIDDEN, self.n_input) * math.sqrt(2 / (N_HIDDEN + self.n_input)) * 2
        w2 = rng.randn(n_spr, N_HIDDEN) * math.sqrt(2 / (N_HIDDEN + n_spr)) * 3
        self.weights1, self.bias1 = zeros((N_HIDDEN, self.n_input)), zeros(N_HIDDEN)
        self.weights2, self.bias2 = zeros((n_spr, N_HIDDEN)), zeros(n_spr)
        self.set_params({"weights1": w1, "weights2": w2})
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        """DiffTaichi's forward(): steps - 1 steps from x[0], v[0] = 0, then the loss (zeroed
        first, with v_inc: DiffTaichi's clear())."""
        self.v_inc.zero_()
        self.loss.zero_()
        advance = self.k_advance_toi if self.toi else self.k_advance_no_toi
        for t in range(1, self.steps):
            self._launch(self.k_center, 1, t - 1, self.x, self.center)
            self._launch(self.k_nn1, N_HIDDEN, t - 1, self.x, self.v, self.center, self.goal,
                         self.weights1, self.bias1, self.hidden)
            self._launch(self.k_nn2, self.n_springs, t - 1, self.hidden, self.weights2,
                         self.bias2, self.act)
            self._launch(self.k_spring, self.n_springs, t - 1, self.x, self.act, self.anchor_a,
                         self.anchor_b, self.spring_length, self.spring_stiffness,
                         self.spring_actuation, self.v_inc)
            self._launch(advance, self.n_objects, t, self.v_inc, self.x, self.v)
        self._launch(self.k_loss, 1, self.steps - 1, self.x, self.loss)

    def _forward_backward(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)

    def iteration(self) -> float:
        """Forward on the tape and backward (replayed from a CUDA graph with graph=True), then
        the update: the gradient scaled to norm GRADIENT_CLIP. Returns the forward's loss."""
        run_taped(self, self._forward_backward)
        loss = float(self.loss.numpy()[0])
        grads = self.gradients()
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = ms.GRADIENT_CLIP / (norm + 1e-6)
        w = self.params()
        self.set_params({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).assign(np.asarray(value, np.float32))
