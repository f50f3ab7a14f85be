"""DiffTaichi's mass_spring_velocity.py in Warp 1.19, for bench/difftaichi.py.

warp_mass_spring.py's robot, arrays and kernels (compute_center, nn2, apply_spring_force), with
this program's: a target_v[t] array (a new target uploaded every iteration, outside the CUDA
graph with graph=True), nn1 taking it as its last two inputs, advance with gravity -1.8,
compute_loss adding dt (target_v[t].x - v[t, head].x)^2 at every step inside the step loop, the
robot placed 0.4 to the right, and the update with the gradient scaled to norm 0.1. As in the
vkad example (examples/difftaichi/mass_spring_velocity.py, which says why): nn1 reads v[t, j],
not DiffTaichi's v[t, i]; the target pools come from numpy's RandomState(seed + 1). Call
wp.init() before constructing.
"""
import math

import numpy as np
import warp as wp

from . import load_example
from .warp_mass_spring import WarpMassSpring
from .warp_mass_spring import build_kernels as build_mass_spring_kernels
from .warp_taped import run_taped

msv = load_example("mass_spring_velocity")
ms = msv.mass_spring
DT, GROUND_HEIGHT, GRAVITY, DAMPING = msv.DT, msv.GROUND_HEIGHT, msv.GRAVITY, msv.DAMPING
N_SIN_WAVES, N_HIDDEN, SPRING_OMEGA = ms.N_SIN_WAVES, ms.N_HIDDEN, ms.SPRING_OMEGA
HEAD_ID = msv.HEAD_ID


def build_kernels(n_objects: int):
    """nn1 and compute_loss of this program, advance_toi and advance_no_toi mass_spring's."""

    @wp.kernel
    def nn1(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
            center: wp.array(dtype=wp.vec2), target_v: wp.array(dtype=wp.vec2),
            weights1: wp.array2d(dtype=float), bias1: wp.array(dtype=float),
            hidden: wp.array2d(dtype=float)):
        i = wp.tid()
        phase = float(t) * wp.static(SPRING_OMEGA * DT)
        act = weights1[i, 0] * wp.sin(phase)
        for j in range(1, wp.static(N_SIN_WAVES)):
            act += weights1[i, j] * wp.sin(phase + wp.static(2.0 * math.pi / N_SIN_WAVES)
                                           * float(j))
        c = center[t]
        for j in range(wp.static(n_objects)):
            offset = x[t, j] - c
            vel = v[t, j]
            k = N_SIN_WAVES + 4 * j
            act = act + weights1[i, k] * offset[0] * 0.05 + weights1[i, k + 1] * offset[1] * 0.05
            act = act + weights1[i, k + 2] * vel[0] * 0.05 + weights1[i, k + 3] * vel[1] * 0.05
        k = wp.static(N_SIN_WAVES + 4 * n_objects)
        tv = target_v[t]
        act = act + weights1[i, k] * tv[0] + weights1[i, k + 1] * tv[1]
        hidden[t, i] = wp.tanh(act + bias1[i])

    # mass_spring's advance kernels with this program's gravity
    advance_toi, advance_no_toi = build_mass_spring_kernels(n_objects, GRAVITY)[4:6]

    @wp.kernel
    def compute_loss(t: int, v: wp.array2d(dtype=wp.vec2), target_v: wp.array(dtype=wp.vec2),
                     loss: wp.array(dtype=float)):
        d = target_v[t][0] - v[t, HEAD_ID][0]
        wp.atomic_add(loss, 0, DT * d * d)

    return nn1, advance_toi, advance_no_toi, compute_loss


class WarpMassSpringVelocity(WarpMassSpring):
    def __init__(self, steps: int = msv.STEPS, robot_id: int = msv.ROBOT, seed: int = 0,
                 toi: bool = True, graph: bool = False, device=None):
        super().__init__(steps=steps, robot_id=robot_id, seed=seed, toi=toi, graph=graph,
                         device=device)
        objects, _ = ms.robot(robot_id)
        self.k_nn1, self.k_advance_toi, self.k_advance_no_toi, self.k_loss = \
            build_kernels(len(objects))
        x0 = np.zeros((steps, len(objects), 2), np.float32)
        x0[0] = objects + np.array([msv.X_OFFSET, 0.0])  # DiffTaichi's setup_robot
        self.x = wp.array(x0, dtype=wp.vec2, device=self.device, requires_grad=True)
        self.target_v = wp.zeros(steps, dtype=wp.vec2, device=self.device)
        self.tasks = np.random.RandomState(seed + 1)

    def forward(self) -> None:
        """DiffTaichi's forward(): steps - 1 steps from x[0], v[0] = 0, each adding its loss
        (the loss and v_inc zeroed first: ti.Tape's and DiffTaichi's clear())."""
        self.v_inc.zero_()
        self.loss.zero_()
        advance = self.k_advance_toi if self.toi else self.k_advance_no_toi
        for t in range(1, self.steps):
            self._launch(self.k_center, 1, t - 1, self.x, self.center)
            self._launch(self.k_nn1, N_HIDDEN, t - 1, self.x, self.v, self.center,
                         self.target_v, self.weights1, self.bias1, self.hidden)
            self._launch(self.k_nn2, self.n_springs, t - 1, self.hidden, self.weights2,
                         self.bias2, self.act)
            self._launch(self.k_spring, self.n_springs, t - 1, self.x, self.act, self.anchor_a,
                         self.anchor_b, self.spring_length, self.spring_stiffness,
                         self.spring_actuation, self.v_inc)
            self._launch(advance, self.n_objects, t, self.v_inc, self.x, self.v)
            self._launch(self.k_loss, 1, t, self.v, self.target_v, self.loss)

    def iteration(self) -> float:
        """A new target uploaded, forward on the tape and backward (replayed from a CUDA graph
        with graph=True), then the update: the gradient scaled to norm 0.1. Returns the loss."""
        self.target_v.assign(msv.target_velocities(self.tasks, self.steps).astype(np.float32))
        run_taped(self, self._forward_backward)
        loss = float(self.loss.numpy()[0])
        grads = self.gradients()
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = msv.GRADIENT_CLIP / (norm + 1e-6)
        w = self.params()
        self.set_params({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss
