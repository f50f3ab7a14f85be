"""DiffTaichi's rigid_body_discountinuity.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: state with a time axis (x[t, i], v[t, i], v_inc[t, i] as vec2; rotation, omega,
omega_inc as floats), initialize() computing the box's inverse mass and inertia and copying the
start (init_x, init_v, init_rotation, init_omega, uploaded before each evaluation) into row 0,
collide(t - 1) (the 4 corners unrolled, impulses wp.atomic_add'ed into step t's increments) and
advance(t) launched per step over the objects, compute_loss(t) storing object 0's x (DiffTaichi's
head_id read as object 0: examples/difftaichi/rigid_body_discontinuity.py says why), the
increments zeroed before a wp.Tape around the forward, tape.backward(loss); on CUDA (graph=True)
the zeroing, the taped forward and the backward are captured once with wp.ScopedCapture and
replayed with wp.capture_launch.

Constants and the scan are examples/difftaichi/rigid_body_discontinuity.py's, itself
DiffTaichi's; DiffTaichi has no optimiser for this program: iteration() is the scan's next point
(a taped forward and backward), nothing is updated. Call wp.init() before constructing.
"""
import math
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

rb = load_example("rigid_body_discontinuity")
DT, GROUND, ELASTICITY, PENALTY = rb.DT, rb.GROUND_HEIGHT, rb.ELASTICITY, rb.PENALTY
GRAVITY, DAMPING = rb.GRAVITY, rb.DAMPING


@wp.func
def cross2(a: wp.vec2, b: wp.vec2):
    return a[0] * b[1] - a[1] * b[0]


@wp.kernel
def initialize(halfsize: wp.array(dtype=wp.vec2), inverse_mass: wp.array(dtype=float),
               inverse_inertia: wp.array(dtype=float), init_x: wp.array(dtype=wp.vec2),
               init_v: wp.array(dtype=wp.vec2), init_rotation: wp.array(dtype=float),
               init_omega: wp.array(dtype=float), x: wp.array2d(dtype=wp.vec2),
               v: wp.array2d(dtype=wp.vec2), rotation: wp.array2d(dtype=float),
               omega: wp.array2d(dtype=float)):
    i = wp.tid()
    hs = halfsize[i]
    inverse_mass[i] = 1.0 / (4.0 * hs[0] * hs[1])
    inverse_inertia[i] = 1.0 / (4.0 / 3.0 * hs[0] * hs[1] * (hs[0] * hs[0] + hs[1] * hs[1]))
    x[0, i] = init_x[0]
    v[0, i] = init_v[0]
    rotation[0, i] = init_rotation[0]
    omega[0, i] = init_omega[0]


@wp.kernel
def collide(t: int, halfsize: wp.array(dtype=wp.vec2), inverse_mass: wp.array(dtype=float),
            inverse_inertia: wp.array(dtype=float), friction: wp.array(dtype=float),
            x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
            rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float),
            v_inc: wp.array2d(dtype=wp.vec2), omega_inc: wp.array2d(dtype=float)):
    i = wp.tid()
    hs = halfsize[i]
    rot = rotation[t, i]
    c = wp.cos(rot)
    s = wp.sin(rot)
    for k in range(wp.static(4)):
        f = friction[0]
        local = wp.vec2(float(k % 2 * 2 - 1) * hs[0], float(k // 2 % 2 * 2 - 1) * hs[1])
        rela_pos = wp.vec2(c * local[0] - s * local[1], s * local[0] + c * local[1])
        corner_x = x[t, i] + rela_pos
        corner_v = v[t, i] + omega[t, i] * wp.vec2(-rela_pos[1], rela_pos[0])
        corner_v = corner_v + DT * GRAVITY * wp.vec2(0.0, 1.0)
        normal = wp.vec2(0.0, 1.0)
        tao = wp.vec2(1.0, 0.0)
        rn = cross2(rela_pos, normal)
        rt = cross2(rela_pos, tao)
        impulse_contribution = inverse_mass[i] + rn * rn * inverse_inertia[i]
        timpulse_contribution = inverse_mass[i] + rt * rt * inverse_inertia[i]
        rela_v_ground = wp.dot(normal, corner_v)
        impulse = float(0.0)
        timpulse = float(0.0)
        if rela_v_ground < 0.0 and corner_x[1] < GROUND:
            impulse = -(1.0 + ELASTICITY) * rela_v_ground / impulse_contribution
            if impulse > 0.0:
                timpulse = -wp.dot(corner_v, tao) / timpulse_contribution
                timpulse = wp.min(f * impulse, wp.max(-f * impulse, timpulse))
        if corner_x[1] < GROUND:
            impulse = impulse - DT * PENALTY * (corner_x[1] - GROUND) / impulse_contribution
        j = impulse * normal + timpulse * tao
        wp.atomic_add(v_inc, t + 1, i, j * inverse_mass[i])
        wp.atomic_add(omega_inc, t + 1, i, cross2(corner_x - x[t, i], j) * inverse_inertia[i])


@wp.kernel
def advance(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
            rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float),
            v_inc: wp.array2d(dtype=wp.vec2), omega_inc: wp.array2d(dtype=float)):
    i = wp.tid()
    s = wp.static(math.exp(-DT * DAMPING))
    new_v = s * v[t - 1, i] + v_inc[t, i] + DT * GRAVITY * wp.vec2(0.0, 1.0)
    new_omega = s * omega[t - 1, i] + omega_inc[t, i]
    v[t, i] = new_v
    x[t, i] = x[t - 1, i] + DT * new_v
    omega[t, i] = new_omega
    rotation[t, i] = rotation[t - 1, i] + DT * new_omega


@wp.kernel
def compute_loss(t: int, x: wp.array2d(dtype=wp.vec2), loss: wp.array(dtype=float)):
    loss[0] = x[t, 0][0]


class WarpRigidBodyDiscontinuity:
    PARAMS = rb.RigidBodyDiscontinuity.PARAMS

    def __init__(self, steps: int = rb.STEPS, seed: int = 0, graph: bool = False, device=None):
        self.steps = steps
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.points, self._next = rb.scan_points(), 0
        d, n = self.device, rb.N_OBJECTS

        def zeros(shape, dtype=float):
            return wp.zeros(shape, dtype=dtype, device=d, requires_grad=True)

        self.x, self.v, self.v_inc = (zeros((steps, n), wp.vec2) for _ in range(3))
        self.rotation, self.omega, self.omega_inc = (zeros((steps, n)) for _ in range(3))
        self.halfsize = wp.array(np.array([rb.HALFSIZE], np.float32), dtype=wp.vec2, device=d,
                                 requires_grad=True)
        self.inverse_mass, self.inverse_inertia = zeros(n), zeros(n)
        self.friction = zeros(1)
        self.init_x, self.init_v = zeros(1, wp.vec2), zeros(1, wp.vec2)
        self.init_rotation, self.init_omega = zeros(1), zeros(1)
        self.loss = zeros(1)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        n = rb.N_OBJECTS
        self._launch(initialize, n, self.halfsize, self.inverse_mass, self.inverse_inertia,
                     self.init_x, self.init_v, self.init_rotation, self.init_omega, self.x,
                     self.v, self.rotation, self.omega)
        for t in range(1, self.steps):
            self._launch(collide, n, t - 1, self.halfsize, self.inverse_mass,
                         self.inverse_inertia, self.friction, self.x, self.v, self.rotation,
                         self.omega, self.v_inc, self.omega_inc)
            self._launch(advance, n, t, self.x, self.v, self.rotation, self.omega, self.v_inc,
                         self.omega_inc)
        self._launch(compute_loss, 1, self.steps - 1, self.x, self.loss)

    def _forward_backward(self) -> None:
        self.v_inc.zero_()  # DiffTaichi's clear_states()
        self.omega_inc.zero_()
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)

    def iteration(self) -> float:
        """The scan's next point: the start and friction uploaded, the taped forward and
        backward (replayed from a CUDA graph with graph=True). Returns the loss."""
        friction, angle = self.points[self._next % len(self.points)]
        self._next += 1
        self.friction.assign(np.array([friction], np.float32))
        self.init_x.assign(np.array([rb.INIT_X], np.float32))
        self.init_v.assign(np.array([rb.INIT_V], np.float32))
        self.init_rotation.assign(np.array([angle], np.float32))
        self.init_omega.assign(np.zeros(1, np.float32))
        run_taped(self, self._forward_backward)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy().reshape(-1) for p in self.PARAMS}
