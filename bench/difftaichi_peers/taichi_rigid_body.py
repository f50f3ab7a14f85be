"""DiffTaichi's rigid_body.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's file, nearly as it is: Vector fields with a time axis x[t, i], v[t, i] and fields
rotation[t, i], omega[t, i], the increments collide and apply_spring_force add impulses into
with `+=` (x_inc, v_inc, rotation_inc, omega_inc[t + 1, i]), to_world and apply_impulse as
ti.func, the sums unrolled with ti.static, nn1(t - 1), nn2(t - 1), collide(t - 1),
apply_spring_force(t - 1) and advance_toi(t) per step, `ti.ad.Tape(loss=...)` around the forward
(it zeroes the gradients and seeds d loss = 1), the clipped update from Python scope (numpy here;
DiffTaichi loops over the elements). Differences from DiffTaichi's file, none changing a result:
the fields have `steps` rows instead of max_steps = 4096; the boxes' inverse mass and inertia
are computed once (DiffTaichi's initialize_properties kernel runs in every forward, writing the
same values); clear_states zeroes the increments over `steps` rows; nothing is drawn.

Robot 0, constants, the controller's initial weights (RandomState(seed)), the loss and the
update are examples/difftaichi/rigid_body.py's, itself DiffTaichi's. Checked against the vkad
example on Taichi's CPU backend (see bench/difftaichi_peers/__init__.py). The caller runs
ti.init (arch, default_fp = `real`) before constructing.
"""
import math
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

rb = load_example("rigid_body")
N_SIN_WAVES, N_HIDDEN = rb.N_SIN_WAVES, rb.N_HIDDEN


@ti.data_oriented
class TaichiRigidBody:
    PARAMS = rb.RigidBody.PARAMS  # weights1, bias1, weights2, bias2

    def __init__(self, steps: int = rb.STEPS, seed: int = 0, real=ti.f32, robot_id: int = 0):
        self.steps = steps
        objects, springs, self.head_id = rb.robot(robot_id)
        self.n_objects, self.n_springs = len(objects), len(springs)
        self.n_input = N_SIN_WAVES + 6 * self.n_objects + 2
        self.dt, self.gravity, self.damping = rb.DT, rb.GRAVITY, rb.DAMPING
        self.friction, self.elasticity, self.ground_height = rb.FRICTION, rb.ELASTICITY, \
            rb.GROUND_HEIGHT
        self.spring_omega = rb.SPRING_OMEGA
        self.decay = math.exp(-rb.DT * rb.DAMPING)
        self._np_real = np.float64 if real == ti.f64 else np.float32
        vec = lambda shape, grad=True: ti.Vector.field(2, real, shape=shape, needs_grad=grad)
        scalar = lambda shape, grad=True: ti.field(real, shape=shape, needs_grad=grad)
        shape = (steps, self.n_objects)
        self.x, self.v, self.x_inc, self.v_inc = vec(shape), vec(shape), vec(shape), vec(shape)
        self.rotation, self.omega = scalar(shape), scalar(shape)
        self.rotation_inc, self.omega_inc = scalar(shape), scalar(shape)
        self.halfsize = vec(self.n_objects, False)
        self.inverse_mass = scalar(self.n_objects, False)
        self.inverse_inertia = scalar(self.n_objects, False)
        self.spring_anchor_a = ti.field(ti.i32, shape=self.n_springs)
        self.spring_anchor_b = ti.field(ti.i32, shape=self.n_springs)
        self.spring_offset_a = vec(self.n_springs, False)
        self.spring_offset_b = vec(self.n_springs, False)
        self.spring_length = scalar(self.n_springs, False)
        self.spring_stiffness = scalar(self.n_springs, False)
        self.spring_actuation = scalar(self.n_springs, False)
        self.weights1 = scalar((N_HIDDEN, self.n_input))
        self.bias1 = scalar(N_HIDDEN)
        self.weights2 = scalar((self.n_springs, N_HIDDEN))
        self.bias2 = scalar(self.n_springs)
        self.hidden = scalar((steps, N_HIDDEN))
        self.actuation = scalar((steps, self.n_springs))
        self.goal = vec((), False)
        self.loss = ti.field(real, shape=(), needs_grad=True)

        x0 = np.zeros((steps, self.n_objects, 2), self._np_real)
        x0[0] = [o[0] for o in objects]
        self.x.from_numpy(x0)
        r0 = np.zeros(shape, self._np_real)
        r0[0] = [o[2] for o in objects]
        self.rotation.from_numpy(r0)
        halfsize = np.array([o[1] for o in objects])
        hx, hy = halfsize[:, 0], halfsize[:, 1]
        f = lambda a: np.asarray(a, self._np_real)
        self.halfsize.from_numpy(f(halfsize))
        self.inverse_mass.from_numpy(f(1.0 / (4 * hx * hy)))
        self.inverse_inertia.from_numpy(f(1.0 / (4 / 3 * hx * hy * (hx * hx + hy * hy))))
        self.spring_anchor_a.from_numpy(np.array([sp[0] for sp in springs], np.int32))
        self.spring_anchor_b.from_numpy(np.array([sp[1] for sp in springs], np.int32))
        self.spring_offset_a.from_numpy(f([sp[2] for sp in springs]))
        self.spring_offset_b.from_numpy(f([sp[3] for sp in springs]))
        self.spring_length.from_numpy(f([sp[4] for sp in springs]))
        self.spring_stiffness.from_numpy(f([sp[5] for sp in springs]))
        self.spring_actuation.from_numpy(f([sp[6] for sp in springs]))
        self.goal.from_numpy(f(rb.GOAL))
        # DiffTaichi's optimize(): Gaussian weights (np.random.randn, here seeded), zero biases
        rng = np.random.RandomState(seed)
        n_input = self.n_input
        self.weights1.from_numpy(f(rng.randn(N_HIDDEN, n_input)
                                   * math.sqrt(2 / (N_HIDDEN + n_input)) * 0.5))
        self.weights2.from_numpy(f(rng.randn(self.n_springs, N_HIDDEN)
                                   * math.sqrt(2 / (N_HIDDEN + self.n_springs)) * 1))

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def nn1(self, t: ti.i32):
        for i in range(N_HIDDEN):
            actuation = 0.0
            for j in ti.static(range(N_SIN_WAVES)):
                actuation += self.weights1[i, j] * ti.sin(
                    self.spring_omega * t * self.dt + 2 * math.pi / N_SIN_WAVES * j)
            for j in ti.static(range(self.n_objects)):
                offset = self.x[t, j] - self.x[t, self.head_id]
                # use a smaller weight since there are too many of them
                actuation += self.weights1[i, j * 6 + N_SIN_WAVES] * offset[0] * 0.05
                actuation += self.weights1[i, j * 6 + N_SIN_WAVES + 1] * offset[1] * 0.05
                actuation += self.weights1[i, j * 6 + N_SIN_WAVES + 2] * self.v[t, j][0] * 0.05
                actuation += self.weights1[i, j * 6 + N_SIN_WAVES + 3] * self.v[t, j][1] * 0.05
                actuation += self.weights1[i, j * 6 + N_SIN_WAVES + 4] * self.rotation[t, j] \
                    * 0.05
                actuation += self.weights1[i, j * 6 + N_SIN_WAVES + 5] * self.omega[t, j] \
                    * 0.05
            actuation += self.weights1[i, self.n_objects * 6 + N_SIN_WAVES] * self.goal[None][0]
            actuation += self.weights1[i, self.n_objects * 6 + N_SIN_WAVES + 1] \
                * self.goal[None][1]
            actuation += self.bias1[i]
            actuation = ti.tanh(actuation)
            self.hidden[t, i] = actuation

    @ti.kernel
    def nn2(self, t: ti.i32):
        for i in range(self.n_springs):
            actuation = 0.0
            for j in ti.static(range(N_HIDDEN)):
                actuation += self.weights2[i, j] * self.hidden[t, j]
            actuation += self.bias2[i]
            actuation = ti.tanh(actuation)
            self.actuation[t, i] = actuation

    @ti.func
    def to_world(self, t, i, rela_x):
        rot = self.rotation[t, i]
        rot_matrix = ti.Matrix([[ti.cos(rot), -ti.sin(rot)], [ti.sin(rot), ti.cos(rot)]])
        rela_pos = rot_matrix @ rela_x
        rela_v = self.omega[t, i] * ti.Vector([-rela_pos[1], rela_pos[0]])
        world_x = self.x[t, i] + rela_pos
        world_v = self.v[t, i] + rela_v
        return world_x, world_v, rela_pos

    @ti.func
    def apply_impulse(self, t, i, impulse, location, toi_input):
        delta_v = impulse * self.inverse_mass[i]
        delta_omega = (location - self.x[t, i]).cross(impulse) * self.inverse_inertia[i]
        toi = ti.min(ti.max(0.0, toi_input), self.dt)
        self.x_inc[t + 1, i] += toi * -delta_v
        self.rotation_inc[t + 1, i] += toi * -delta_omega
        self.v_inc[t + 1, i] += delta_v
        self.omega_inc[t + 1, i] += delta_omega

    @ti.kernel
    def collide(self, t: ti.i32):
        for i in range(self.n_objects):
            hs = self.halfsize[i]
            for k in ti.static(range(4)):
                # the corner for collision detection
                offset_scale = ti.Vector([k % 2 * 2 - 1, k // 2 % 2 * 2 - 1])
                corner_x, corner_v, rela_pos = self.to_world(t, i, offset_scale * hs)
                corner_v = corner_v + self.dt * self.gravity * ti.Vector([0.0, 1.0])
                # apply impulse so that there's no sinking
                normal = ti.Vector([0.0, 1.0])
                tao = ti.Vector([1.0, 0.0])
                rn = rela_pos.cross(normal)
                rt = rela_pos.cross(tao)
                impulse_contribution = self.inverse_mass[i] + (rn) ** 2 * \
                    self.inverse_inertia[i]
                timpulse_contribution = self.inverse_mass[i] + (rt) ** 2 * \
                    self.inverse_inertia[i]
                rela_v_ground = normal.dot(corner_v)
                impulse = 0.0
                timpulse = 0.0
                new_corner_x = corner_x + self.dt * corner_v
                toi = 0.0
                if rela_v_ground < 0 and new_corner_x[1] < self.ground_height:
                    impulse = -(1 + self.elasticity) * rela_v_ground / impulse_contribution
                    if impulse > 0:
                        # friction
                        timpulse = -corner_v.dot(tao) / timpulse_contribution
                        timpulse = ti.min(self.friction * impulse,
                                          ti.max(-self.friction * impulse, timpulse))
                        if corner_x[1] > self.ground_height:
                            toi = -(corner_x[1] - self.ground_height) / ti.min(corner_v[1], -1e-3)
                self.apply_impulse(t, i, impulse * normal + timpulse * tao, new_corner_x, toi)
                penalty = 0.0  # DiffTaichi's local, which shadows its global penalty
                if new_corner_x[1] < self.ground_height:
                    # apply penalty
                    penalty = -self.dt * penalty * (
                        new_corner_x[1] - self.ground_height) / impulse_contribution
                self.apply_impulse(t, i, penalty * normal, new_corner_x, 0)

    @ti.kernel
    def apply_spring_force(self, t: ti.i32):
        for i in range(self.n_springs):
            a = self.spring_anchor_a[i]
            b = self.spring_anchor_b[i]
            pos_a, vel_a, rela_a = self.to_world(t, a, self.spring_offset_a[i])
            pos_b, vel_b, rela_b = self.to_world(t, b, self.spring_offset_b[i])
            dist = pos_a - pos_b
            length = dist.norm() + 1e-4
            act = self.actuation[t, i]
            is_joint = self.spring_length[i] == -1
            target_length = self.spring_length[i] * (1.0 + self.spring_actuation[i] * act)
            if is_joint:
                target_length = 0.0
            impulse = self.dt * (length - target_length) * self.spring_stiffness[i] / length \
                * dist
            if is_joint:
                rela_vel = vel_a - vel_b
                rela_vel_norm = rela_vel.norm() + 1e-1
                impulse_dir = rela_vel / rela_vel_norm
                impulse_contribution = self.inverse_mass[a] + \
                    impulse_dir.cross(rela_a) ** 2 * self.inverse_inertia[a] + \
                    self.inverse_mass[b] + \
                    impulse_dir.cross(rela_b) ** 2 * self.inverse_inertia[b]
                # project relative velocity
                impulse += rela_vel_norm / impulse_contribution * impulse_dir
            self.apply_impulse(t, a, -impulse, pos_a, 0.0)
            self.apply_impulse(t, b, impulse, pos_b, 0.0)

    @ti.kernel
    def advance_toi(self, t: ti.i32):
        for i in range(self.n_objects):
            s = self.decay  # DiffTaichi: math.exp(-dt * damping), which Taichi warns about
            self.v[t, i] = s * self.v[t - 1, i] + self.v_inc[t, i] + self.dt * self.gravity * \
                ti.Vector([0.0, 1.0])
            self.x[t, i] = self.x[t - 1, i] + self.dt * self.v[t, i] + self.x_inc[t, i]
            self.omega[t, i] = s * self.omega[t - 1, i] + self.omega_inc[t, i]
            self.rotation[t, i] = self.rotation[t - 1, i] + self.dt * self.omega[t, i] + \
                self.rotation_inc[t, i]

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        self.loss[None] = (self.x[t, self.head_id] - self.goal[None]).norm()

    @ti.kernel
    def clear_states(self):
        for t, i in ti.ndrange(self.steps, self.n_objects):
            self.x_inc[t, i] = ti.Vector([0.0, 0.0])
            self.v_inc[t, i] = ti.Vector([0.0, 0.0])
            self.rotation_inc[t, i] = 0.0
            self.omega_inc[t, i] = 0.0

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        for t in range(1, self.steps):
            self.nn1(t - 1)
            self.nn2(t - 1)
            self.collide(t - 1)
            self.apply_spring_force(t - 1)
            self.advance_toi(t)
        self.loss[None] = 0
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """clear_states(), the forward on a tape (which zeroes every gradient first), then
        DiffTaichi's clipped update. Returns the loss the forward computed."""
        self.clear_states()
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        grads = self.gradients()
        norm_sqr = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())
        scale = rb.LEARNING_RATE * min(1.0, rb.GRADIENT_CLIP / (norm_sqr ** 0.5 + 1e-4))
        for p in self.PARAMS:
            w = getattr(self, p)
            w.from_numpy((w.to_numpy().astype(np.float64) - scale * grads[p])
                         .astype(self._np_real))
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy() for p in self.PARAMS}
