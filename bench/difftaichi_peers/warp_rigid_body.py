"""DiffTaichi's rigid_body.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: the boxes' state with a time axis (x[t, i], v[t, i] as vec2, rotation[t, i],
omega[t, i]) and the increments collide and apply_spring_force add impulses into (x_inc, v_inc,
rotation_inc, omega_inc[t + 1, i], `+=` on an array element: an atomic add), to_world and
apply_impulse as @wp.func, nn1(t - 1), nn2(t - 1), collide(t - 1), apply_spring_force(t - 1)
and advance(t) launched per step, a wp.Tape around the forward and tape.backward(loss); on CUDA
(graph=True) the zeroing, the taped forward and the backward are captured once with
wp.ScopedCapture and replayed with wp.capture_launch (the gradients zeroed by tape.zero()
before each replay). The sums over sine waves, boxes, corners and hidden units are unrolled
(wp.static bounds, the module's max_unroll raised), as the vkad example and DiffTaichi
(ti.static) unroll them. The update runs on the host, as DiffTaichi's and the example's do.

Robot 0, constants, the controller's initial weights (RandomState(seed)), the loss and the
clipped update are examples/difftaichi/rigid_body.py's, itself DiffTaichi's. Checked against the
vkad example on Warp's CPU device (see bench/difftaichi_peers/__init__.py). Call wp.init()
before constructing.
"""
import math
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

rb = load_example("rigid_body")
DT, GRAVITY, DAMPING, FRICTION = rb.DT, rb.GRAVITY, rb.DAMPING, rb.FRICTION
ELASTICITY, GROUND_HEIGHT = rb.ELASTICITY, rb.GROUND_HEIGHT
N_SIN_WAVES, N_HIDDEN, SPRING_OMEGA = rb.N_SIN_WAVES, rb.N_HIDDEN, rb.SPRING_OMEGA

wp.set_module_options({"max_unroll": 128})


def build_kernels(n_objects: int, n_springs: int, head_id: int):
    decay = math.exp(-DT * DAMPING)
    n_input = N_SIN_WAVES + 6 * n_objects + 2

    @wp.func
    def to_world(x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                 rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float), t: int,
                 i: int, rela_x: wp.vec2):
        rot = rotation[t, i]
        rela_pos = wp.vec2(wp.cos(rot) * rela_x[0] - wp.sin(rot) * rela_x[1],
                           wp.sin(rot) * rela_x[0] + wp.cos(rot) * rela_x[1])
        rela_v = omega[t, i] * wp.vec2(-rela_pos[1], rela_pos[0])
        return x[t, i] + rela_pos, v[t, i] + rela_v, rela_pos

    @wp.func
    def cross2(a: wp.vec2, b: wp.vec2):
        return a[0] * b[1] - a[1] * b[0]

    @wp.func
    def apply_impulse(x: wp.array2d(dtype=wp.vec2), inverse_mass: wp.array(dtype=float),
                      inverse_inertia: wp.array(dtype=float), x_inc: wp.array2d(dtype=wp.vec2),
                      v_inc: wp.array2d(dtype=wp.vec2), rotation_inc: wp.array2d(dtype=float),
                      omega_inc: wp.array2d(dtype=float), t: int, i: int, impulse: wp.vec2,
                      location: wp.vec2, toi_input: float):
        delta_v = impulse * inverse_mass[i]
        delta_omega = cross2(location - x[t, i], impulse) * inverse_inertia[i]
        toi = wp.min(wp.max(0.0, toi_input), DT)
        wp.atomic_add(x_inc, t + 1, i, toi * (-delta_v))
        wp.atomic_add(rotation_inc, t + 1, i, toi * (-delta_omega))
        wp.atomic_add(v_inc, t + 1, i, delta_v)
        wp.atomic_add(omega_inc, t + 1, i, delta_omega)

    @wp.kernel
    def nn1(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
            rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float),
            goal: wp.array(dtype=wp.vec2), phase: wp.array(dtype=float),
            weights1: wp.array2d(dtype=float), bias1: wp.array(dtype=float),
            hidden: wp.array2d(dtype=float)):
        i = wp.tid()
        act = float(0.0)
        time = float(SPRING_OMEGA * t) * DT
        for j in range(wp.static(N_SIN_WAVES)):
            act += weights1[i, j] * wp.sin(time + phase[j])
        for j in range(wp.static(n_objects)):
            offset = x[t, j] - x[t, wp.static(head_id)]
            vel = v[t, j]
            k = j * 6 + N_SIN_WAVES
            act += weights1[i, k] * offset[0] * 0.05
            act += weights1[i, k + 1] * offset[1] * 0.05
            act += weights1[i, k + 2] * vel[0] * 0.05
            act += weights1[i, k + 3] * vel[1] * 0.05
            act += weights1[i, k + 4] * rotation[t, j] * 0.05
            act += weights1[i, k + 5] * omega[t, j] * 0.05
        g = goal[0]
        act += weights1[i, wp.static(n_input - 2)] * g[0]
        act += weights1[i, wp.static(n_input - 1)] * g[1]
        act += bias1[i]
        hidden[t, i] = wp.tanh(act)

    @wp.kernel
    def nn2(t: int, hidden: wp.array2d(dtype=float), weights2: wp.array2d(dtype=float),
            bias2: wp.array(dtype=float), actuation: wp.array2d(dtype=float)):
        i = wp.tid()
        act = float(0.0)
        for j in range(wp.static(N_HIDDEN)):
            act += weights2[i, j] * hidden[t, j]
        act += bias2[i]
        actuation[t, i] = wp.tanh(act)

    @wp.kernel
    def collide(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float),
                halfsize: wp.array(dtype=wp.vec2), inverse_mass: wp.array(dtype=float),
                inverse_inertia: wp.array(dtype=float), x_inc: wp.array2d(dtype=wp.vec2),
                v_inc: wp.array2d(dtype=wp.vec2), rotation_inc: wp.array2d(dtype=float),
                omega_inc: wp.array2d(dtype=float)):
        i = wp.tid()
        hs = halfsize[i]
        for k in range(wp.static(4)):
            # the corner for collision detection
            offset_scale = wp.vec2(float(k % 2 * 2) - 1.0, float(k // 2 % 2 * 2) - 1.0)
            corner_x, corner_v, rela_pos = to_world(x, v, rotation, omega, t, i,
                                                    wp.cw_mul(offset_scale, hs))
            corner_v = corner_v + DT * GRAVITY * wp.vec2(0.0, 1.0)
            # apply an impulse so that there is no sinking
            normal = wp.vec2(0.0, 1.0)
            tao = wp.vec2(1.0, 0.0)
            rn = cross2(rela_pos, normal)
            rt = cross2(rela_pos, tao)
            impulse_contribution = inverse_mass[i] + rn * rn * inverse_inertia[i]
            timpulse_contribution = inverse_mass[i] + rt * rt * inverse_inertia[i]
            rela_v_ground = wp.dot(normal, corner_v)
            impulse = float(0.0)
            timpulse = float(0.0)
            toi = float(0.0)
            new_corner_x = corner_x + DT * corner_v
            if rela_v_ground < 0.0 and new_corner_x[1] < GROUND_HEIGHT:
                impulse = -(1.0 + ELASTICITY) * rela_v_ground / impulse_contribution
                if impulse > 0.0:  # friction
                    timpulse = wp.min(FRICTION * impulse, wp.max(
                        -FRICTION * impulse, -wp.dot(corner_v, tao) / timpulse_contribution))
                    if corner_x[1] > GROUND_HEIGHT:
                        toi = -(corner_x[1] - GROUND_HEIGHT) / wp.min(corner_v[1], -1e-3)
            apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc,
                          omega_inc, t, i, impulse * normal + timpulse * tao, new_corner_x,
                          toi)
            # DiffTaichi's penalty impulse is 0 (its local `penalty` shadows the global: the
            # vkad example says more); applied as it applies it
            penalty = float(0.0)
            if new_corner_x[1] < GROUND_HEIGHT:
                penalty = -DT * penalty * (new_corner_x[1] - GROUND_HEIGHT) / impulse_contribution
            apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc,
                          omega_inc, t, i, penalty * normal, new_corner_x, 0.0)

    @wp.kernel
    def apply_spring_force(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                           rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float),
                           actuation: wp.array2d(dtype=float), anchor_a: wp.array(dtype=int),
                           anchor_b: wp.array(dtype=int), offset_a: wp.array(dtype=wp.vec2),
                           offset_b: wp.array(dtype=wp.vec2),
                           spring_length: wp.array(dtype=float),
                           spring_stiffness: wp.array(dtype=float),
                           spring_actuation: wp.array(dtype=float),
                           inverse_mass: wp.array(dtype=float),
                           inverse_inertia: wp.array(dtype=float),
                           x_inc: wp.array2d(dtype=wp.vec2), v_inc: wp.array2d(dtype=wp.vec2),
                           rotation_inc: wp.array2d(dtype=float),
                           omega_inc: wp.array2d(dtype=float)):
        i = wp.tid()
        a = anchor_a[i]
        b = anchor_b[i]
        pos_a, vel_a, rela_a = to_world(x, v, rotation, omega, t, a, offset_a[i])
        pos_b, vel_b, rela_b = to_world(x, v, rotation, omega, t, b, offset_b[i])
        dist = pos_a - pos_b
        length = wp.length(dist) + 1e-4
        is_joint = spring_length[i] == -1.0
        target_length = spring_length[i] * (1.0 + spring_actuation[i] * actuation[t, i])
        if is_joint:
            target_length = 0.0
        impulse = DT * (length - target_length) * spring_stiffness[i] / length * dist
        if is_joint:  # project the relative velocity out
            rela_vel = vel_a - vel_b
            rela_vel_norm = wp.length(rela_vel) + 1e-1
            impulse_dir = rela_vel / rela_vel_norm
            ca = cross2(impulse_dir, rela_a)
            cb = cross2(impulse_dir, rela_b)
            impulse_contribution = inverse_mass[a] + ca * ca * inverse_inertia[a] \
                + inverse_mass[b] + cb * cb * inverse_inertia[b]
            impulse = impulse + rela_vel_norm / impulse_contribution * impulse_dir
        apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc, omega_inc,
                      t, a, -impulse, pos_a, 0.0)
        apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc, omega_inc,
                      t, b, impulse, pos_b, 0.0)

    @wp.kernel
    def advance(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                rotation: wp.array2d(dtype=float), omega: wp.array2d(dtype=float),
                x_inc: wp.array2d(dtype=wp.vec2), v_inc: wp.array2d(dtype=wp.vec2),
                rotation_inc: wp.array2d(dtype=float), omega_inc: wp.array2d(dtype=float)):
        i = wp.tid()  # DiffTaichi's advance_toi
        new_v = wp.static(decay) * v[t - 1, i] + v_inc[t, i] + DT * GRAVITY * wp.vec2(0.0, 1.0)
        new_omega = wp.static(decay) * omega[t - 1, i] + omega_inc[t, i]
        v[t, i] = new_v
        omega[t, i] = new_omega
        x[t, i] = x[t - 1, i] + DT * new_v + x_inc[t, i]
        rotation[t, i] = rotation[t - 1, i] + DT * new_omega + rotation_inc[t, i]

    @wp.kernel
    def compute_loss(t: int, x: wp.array2d(dtype=wp.vec2), goal: wp.array(dtype=wp.vec2),
                     loss: wp.array(dtype=float)):
        wp.atomic_add(loss, 0, wp.length(x[t, wp.static(head_id)] - goal[0]))

    return dict(nn1=nn1, nn2=nn2, collide=collide, apply_spring_force=apply_spring_force,
                advance=advance, compute_loss=compute_loss)


class WarpRigidBody:
    PARAMS = rb.RigidBody.PARAMS  # weights1, bias1, weights2, bias2

    def __init__(self, steps: int = rb.STEPS, seed: int = 0, graph: bool = False, device=None,
                 robot_id: int = 0):
        self.steps = steps
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        objects, springs, self.head_id = rb.robot(robot_id)
        self.n_objects, self.n_springs = len(objects), len(springs)
        self.k = build_kernels(self.n_objects, self.n_springs, self.head_id)
        n_input = N_SIN_WAVES + 6 * self.n_objects + 2
        d = self.device

        def const(value, dtype=float):
            return wp.array(np.asarray(value, np.int32 if dtype is int else np.float32),
                            dtype=dtype, device=d)

        def state(dtype, host=None):
            shape = (steps, self.n_objects)
            if host is None:
                return wp.zeros(shape, dtype=dtype, device=d, requires_grad=True)
            return wp.array(host.astype(np.float32), dtype=dtype, device=d, requires_grad=True)

        x0 = np.zeros((steps, self.n_objects, 2))
        x0[0] = [o[0] for o in objects]
        r0 = np.zeros((steps, self.n_objects))
        r0[0] = [o[2] for o in objects]
        self.x, self.v = state(wp.vec2, x0), state(wp.vec2)
        self.rotation, self.omega = state(float, r0), state(float)
        self.x_inc, self.v_inc = state(wp.vec2), state(wp.vec2)
        self.rotation_inc, self.omega_inc = state(float), state(float)
        self.hidden = wp.zeros((steps, N_HIDDEN), dtype=float, device=d, requires_grad=True)
        self.actuation = wp.zeros((steps, self.n_springs), dtype=float, device=d,
                                  requires_grad=True)
        self.loss = wp.zeros(1, dtype=float, device=d, requires_grad=True)
        # the example's weights (DiffTaichi's optimize(): Gaussian, RandomState(seed))
        rng = np.random.RandomState(seed)
        w1 = rng.randn(N_HIDDEN, n_input) * math.sqrt(2 / (N_HIDDEN + n_input)) * 0.5
        w2 = rng.randn(self.n_springs, N_HIDDEN) * math.sqrt(2 / (N_HIDDEN + self.n_springs))
        for name, value in dict(weights1=w1, bias1=np.zeros(N_HIDDEN), weights2=w2,
                                bias2=np.zeros(self.n_springs)).items():
            setattr(self, name, wp.array(value.astype(np.float32), dtype=float, device=d,
                                         requires_grad=True))
        halfsize = np.array([o[1] for o in objects])
        hx, hy = halfsize[:, 0], halfsize[:, 1]  # DiffTaichi's initialize_properties
        self.halfsize = const(halfsize, wp.vec2)
        self.inverse_mass = const(1.0 / (4 * hx * hy))
        self.inverse_inertia = const(1.0 / (4 / 3 * hx * hy * (hx * hx + hy * hy)))
        self.anchor_a = const([sp[0] for sp in springs], int)
        self.anchor_b = const([sp[1] for sp in springs], int)
        self.offset_a = const([sp[2] for sp in springs], wp.vec2)
        self.offset_b = const([sp[3] for sp in springs], wp.vec2)
        self.spring_length = const([sp[4] for sp in springs])
        self.spring_stiffness = const([sp[5] for sp in springs])
        self.spring_actuation = const([sp[6] for sp in springs])
        self.goal = const([rb.GOAL], wp.vec2)
        self.phase = const([2 * math.pi / N_SIN_WAVES * j for j in range(N_SIN_WAVES)])
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        """DiffTaichi's clear_states() and forward(): per step nn1(t - 1), nn2(t - 1),
        collide(t - 1), apply_spring_force(t - 1), advance(t); the loss at the last step."""
        for a in (self.x_inc, self.v_inc, self.rotation_inc, self.omega_inc, self.loss):
            a.zero_()
        k, n, m = self.k, self.n_objects, self.n_springs
        state = (self.x, self.v, self.rotation, self.omega)
        inc = (self.x_inc, self.v_inc, self.rotation_inc, self.omega_inc)
        for t in range(1, self.steps):
            self._launch(k["nn1"], N_HIDDEN, t - 1, *state, self.goal, self.phase,
                         self.weights1, self.bias1, self.hidden)
            self._launch(k["nn2"], m, t - 1, self.hidden, self.weights2, self.bias2,
                         self.actuation)
            self._launch(k["collide"], n, t - 1, *state, self.halfsize, self.inverse_mass,
                         self.inverse_inertia, *inc)
            self._launch(k["apply_spring_force"], m, t - 1, *state, self.actuation,
                         self.anchor_a, self.anchor_b, self.offset_a, self.offset_b,
                         self.spring_length, self.spring_stiffness, self.spring_actuation,
                         self.inverse_mass, self.inverse_inertia, *inc)
            self._launch(k["advance"], n, t, *state, *inc)
        self._launch(k["compute_loss"], 1, self.steps - 1, self.x, self.goal, self.loss)

    def _forward_backward(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)

    def iteration(self) -> float:
        """Forward on the tape and backward (replayed from a CUDA graph with graph=True), then
        DiffTaichi's update on the host: w -= min(1, 0.2 / (|grad| + 1e-4)) * grad. Returns the
        forward's loss."""
        run_taped(self, self._forward_backward)
        loss = float(self.loss.numpy()[0])
        grads = self.gradients()
        norm_sqr = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())
        scale = rb.LEARNING_RATE * min(1.0, rb.GRADIENT_CLIP / (norm_sqr ** 0.5 + 1e-4))
        for p in self.PARAMS:
            w = getattr(self, p)
            w.assign((w.numpy().astype(np.float64) - scale * grads[p]).astype(np.float32))
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}
