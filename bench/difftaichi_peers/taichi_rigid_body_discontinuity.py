"""DiffTaichi's rigid_body_discountinuity.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: fields with a time axis x[t, i], v[t, i] (Vector),
rotation[t, i], omega[t, i], v_inc[t, i], omega_inc[t, i]; halfsize, inverse_mass and
inverse_inertia per object; friction and loss 0-d; every field with a gradient. The start written
into row 0 (and halfsize) from Python scope, clear_states() zeroing the increments, then inside
`ti.ad.Tape(loss=...)` initialize_properties, collide(t - 1) and advance(t) per step (collide's
impulses atomic adds into step t's increments) and compute_loss; the gradient read from the
fields' row 0 (DiffTaichi prints omega.grad[0, 0]). Differences from DiffTaichi's file, none
changing a result: compute_loss reads object 0 (DiffTaichi's head_id = 3 with one object, which
the Taichi it was written for read as object 0; examples/difftaichi/rigid_body_discontinuity.py
says why); the fields have `steps` rows instead of max_steps = 4096; advance reuses the velocity
it stores; nothing is drawn.

As in the vkad example, DiffTaichi has no optimiser here: iteration() is the next point of its
scan (friction 0 then 1, 40 angles), a taped forward and backward, returning the loss. The
caller runs ti.init (arch, default_fp = `real`) before constructing.
"""
import math
from typing import Dict

import numpy as np
import taichi as ti

from . import load_example

rb = load_example("rigid_body_discontinuity")
N = rb.N_OBJECTS
DAMP = math.exp(-rb.DT * rb.DAMPING)  # DiffTaichi's s, from Python's math (1: no damping)


@ti.data_oriented
class TaichiRigidBodyDiscontinuity:
    PARAMS = rb.RigidBodyDiscontinuity.PARAMS  # the example's names for row 0

    def __init__(self, steps: int = rb.STEPS, seed: int = 0, real=ti.f32):
        # seed: the benchmarks' common interface; the scene has nothing random
        self.steps = steps
        self.points, self._next = rb.scan_points(), 0
        shape = (steps, N)
        self.x = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.v = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.rotation = ti.field(real, shape=shape, needs_grad=True)
        self.omega = ti.field(real, shape=shape, needs_grad=True)
        self.v_inc = ti.Vector.field(2, real, shape=shape, needs_grad=True)
        self.omega_inc = ti.field(real, shape=shape, needs_grad=True)
        self.halfsize = ti.Vector.field(2, real, shape=N, needs_grad=True)
        self.inverse_mass = ti.field(real, shape=N, needs_grad=True)
        self.inverse_inertia = ti.field(real, shape=N, needs_grad=True)
        self.friction = ti.field(real, shape=(), needs_grad=True)
        self.loss = ti.field(real, shape=(), needs_grad=True)

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def initialize_properties(self):
        for i in range(N):
            hs = self.halfsize[i]
            self.inverse_mass[i] = 1.0 / (4 * hs[0] * hs[1])
            self.inverse_inertia[i] = 1.0 / (4 / 3 * hs[0] * hs[1] *
                                             (hs[0] * hs[0] + hs[1] * hs[1]))

    @ti.func
    def to_world(self, t, i, rela_x):
        rot = self.rotation[t, i]
        rot_matrix = ti.Matrix([[ti.cos(rot), -ti.sin(rot)], [ti.sin(rot), ti.cos(rot)]])
        rela_pos = rot_matrix @ rela_x
        rela_v = self.omega[t, i] * ti.Vector([-rela_pos[1], rela_pos[0]])
        return self.x[t, i] + rela_pos, self.v[t, i] + rela_v, rela_pos

    @ti.func
    def apply_impulse(self, t, i, impulse, location):
        ti.atomic_add(self.v_inc[t + 1, i], impulse * self.inverse_mass[i])
        ti.atomic_add(self.omega_inc[t + 1, i],
                      (location - self.x[t, i]).cross(impulse) * self.inverse_inertia[i])

    @ti.kernel
    def collide(self, t: ti.i32):
        for i in range(N):
            hs = self.halfsize[i]
            for k in ti.static(range(4)):
                f = self.friction[None]
                offset_scale = ti.Vector([k % 2 * 2 - 1, k // 2 % 2 * 2 - 1])
                corner_x, corner_v, rela_pos = self.to_world(t, i, offset_scale * hs)
                corner_v = corner_v + rb.DT * rb.GRAVITY * ti.Vector([0.0, 1.0])
                normal = ti.Vector([0.0, 1.0])
                tao = ti.Vector([1.0, 0.0])
                rn = rela_pos.cross(normal)
                rt = rela_pos.cross(tao)
                impulse_contribution = self.inverse_mass[i] + rn ** 2 * self.inverse_inertia[i]
                timpulse_contribution = self.inverse_mass[i] + rt ** 2 * self.inverse_inertia[i]
                rela_v_ground = normal.dot(corner_v)
                impulse = 0.0
                timpulse = 0.0
                if rela_v_ground < 0 and corner_x[1] < rb.GROUND_HEIGHT:
                    impulse = -(1 + rb.ELASTICITY) * rela_v_ground / impulse_contribution
                    if impulse > 0:
                        timpulse = -corner_v.dot(tao) / timpulse_contribution
                        timpulse = ti.min(f * impulse, ti.max(-f * impulse, timpulse))
                if corner_x[1] < rb.GROUND_HEIGHT:
                    impulse = impulse - rb.DT * rb.PENALTY * (
                        corner_x[1] - rb.GROUND_HEIGHT) / impulse_contribution
                self.apply_impulse(t, i, impulse * normal + timpulse * tao, corner_x)

    @ti.kernel
    def advance(self, t: ti.i32):
        for i in range(N):
            s = DAMP
            new_v = s * self.v[t - 1, i] + self.v_inc[t, i] + rb.DT * rb.GRAVITY * ti.Vector(
                [0.0, 1.0])
            new_omega = s * self.omega[t - 1, i] + self.omega_inc[t, i]
            self.v[t, i] = new_v
            self.x[t, i] = self.x[t - 1, i] + rb.DT * new_v
            self.omega[t, i] = new_omega
            self.rotation[t, i] = self.rotation[t - 1, i] + rb.DT * new_omega

    @ti.kernel
    def compute_loss(self, t: ti.i32):
        self.loss[None] = self.x[t, 0][0]

    @ti.kernel
    def clear_states(self):
        for t, i in self.v_inc:
            self.v_inc[t, i] = ti.Vector([0.0, 0.0])
            self.omega_inc[t, i] = 0.0

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        self.initialize_properties()
        for t in range(1, self.steps):
            self.collide(t - 1)
            self.advance(t)
        self.loss[None] = 0
        self.compute_loss(self.steps - 1)

    def iteration(self) -> float:
        """The scan's next point: the start written into row 0, the increments cleared, the
        taped forward and backward. Returns the loss."""
        friction, angle = self.points[self._next % len(self.points)]
        self._next += 1
        self.friction[None] = friction
        self.x[0, 0] = list(rb.INIT_X)
        self.v[0, 0] = list(rb.INIT_V)
        self.halfsize[0] = list(rb.HALFSIZE)
        self.rotation[0, 0] = angle
        self.omega[0, 0] = 0.0
        self.clear_states()
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        return float(self.loss[None])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"init_x": self.x.grad.to_numpy()[0, 0], "init_v": self.v.grad.to_numpy()[0, 0],
                "init_rotation": self.rotation.grad.to_numpy()[0, :1],
                "init_omega": self.omega.grad.to_numpy()[0, :1]}
