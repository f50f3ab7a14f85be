"""DiffTaichi's rigid_body.py on vkad: a robot of rigid boxes, springs and joints learns to walk.

    python examples/difftaichi/rigid_body.py --iters 20        # robot 0, 2048 steps, f32

The physics, parameters and optimisation loop are those of DiffTaichi's examples/rigid_body.py
and its robots, examples/robot_config.py (github.com/taichi-dev/difftaichi), the kernels
`@vkad.kernel` functions written as DiffTaichi writes them (to_world and apply_impulse are
`@vkad.func`s, `+=` on an array element an atomic add, runtime `if`s for the contacts and
joints):

- boxes with a time axis: x[t, i], v[t, i] (2-vectors), rotation[t, i], omega[t, i], and the
  per-step increments x_inc, v_inc, rotation_inc, omega_inc[t + 1, i] that collide and
  apply_spring_force add impulses into; dt = 0.001, gravity -9.8, damping 10, steps = 2048;
- per step: nn1 (10 sine waves of frequency 30, each box's offset from the head, velocity,
  rotation and angular velocity, the goal -> 32 tanh units), nn2 (-> one tanh actuation per
  spring), collide (each box's 4 corners against the ground at 0.1: an inelastic impulse with
  Coulomb friction (1.0) and time of impact, and a penalty 1e4), apply_spring_force (springs
  pull towards length * (1 + actuation * act); a spring of length -1 is a joint, pulled to 0
  with its relative velocity projected out), advance (time of impact, DiffTaichi's `train`);
- the loss |x[last step, head] - (0.9, 0.15)|; weights Gaussian (np.random.randn scaled as
  DiffTaichi's, from RandomState(seed)), biases 0; the update scales the gradient to norm 0.2
  at most (learning rate 1), 20 iterations.

What vkad does instead of Taichi's behaviour:
- DiffTaichi zeroes the increments with a clear_states kernel over max_steps = 4096 rows and
  calls initialize_properties (the boxes' inverse mass and inertia) in every forward; here the
  arrays have `steps` rows, zeroed with the forward (Session.zero_many), and the inverse masses
  are computed once, in f64 on the host, and uploaded in the simulation's dtype.
- ti.ad.Tape(loss) zeroes the gradients, seeds d loss = 1 and runs the kernels' gradients in
  reverse; here a vkad.Tape records the step loop and compute_loss, backward() (seed 1) zeroes
  the gradients and runs the adjoints. The whole iteration's launches (zeroing, forward,
  backward) are captured once as a graph and replayed (--no-graph launches them one by one);
  the update runs on the host, as DiffTaichi's does.
- DiffTaichi's GUI (and its forward of 2 x steps for the final video, and the `plot` command
  pickling 5 runs' losses) are left out; with matplotlib rigid_body_loss.png and
  rigid_body_final.png (the robot's last pose, earlier poses faint) go into --out. `--no-toi`
  is DiffTaichi's use_toi = False (advance_no_toi).
"""

import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)
from vkad import Vector

# DiffTaichi's constants (examples/rigid_body.py)
STEPS = 2048
DT = 0.001
LEARNING_RATE = 1.0
GRADIENT_CLIP = 0.2  # the update's: the gradient scaled to this norm at most
ELASTICITY = 0.0
GROUND_HEIGHT = 0.1
GRAVITY = -9.8
FRICTION = 1.0
PENALTY = 1e4
DAMPING = 10.0
SPRING_OMEGA = 30
DEFAULT_ACTUATION = 0.05
N_SIN_WAVES = 10
N_HIDDEN = 32
GOAL = (0.9, 0.15)

# a box: (x, halfsize, rotation); a spring: (a, b, offset_a, offset_b, length, stiffness,
# actuation); length -1 is a joint
Box = Tuple[Tuple[float, float], Tuple[float, float], float]
Spring = Tuple[int, int, Tuple[float, float], Tuple[float, float], float, float, float]


# --- robots (DiffTaichi's robot_config.py) -------------------------------------------------------

def robot(robot_id: int) -> Tuple[List[Box], List[Spring], int]:
    """The boxes, springs and head of DiffTaichi's robots (0: robotA, 1: robotB, 2: robotLeg)."""
    objects: List[Box] = []
    springs: List[Spring] = []

    def add_object(x, halfsize, rotation=0.0):
        objects.append((tuple(x), tuple(halfsize), rotation))
        return len(objects) - 1

    def add_spring(a, b, offset_a, offset_b, length, stiffness, actuation=0.0):
        # actuation 0.0 is DiffTaichi's default_actuation
        springs.append((a, b, tuple(offset_a), tuple(offset_b), length, stiffness,
                        actuation or DEFAULT_ACTUATION))

    if robot_id == 0:  # robotA
        add_object([0.3, 0.25], [0.15, 0.03])
        for x in (0.2, 0.3, 0.4):
            add_object([x, 0.15], [0.03, 0.02])
        add_object([0.4, 0.3], [0.005, 0.03])
        for b, ox in ((1, -0.03), (1, -0.1), (2, -0.03), (2, 0.03), (3, 0.03), (3, 0.1)):
            add_spring(0, b, [ox, 0.0], [0.0, 0.0], 0.12, 15)
        add_spring(0, 4, [0.1, 0], [0, -0.05], -1, 15)
        return objects, springs, 0
    if robot_id == 1:  # robotB
        body = add_object([0.15, 0.25], [0.1, 0.03])
        back = add_object([0.08, 0.22], [0.03, 0.10])
        front = add_object([0.22, 0.22], [0.03, 0.10])
        add_spring(body, back, [0.08, 0.02], [0.0, -0.08], 0.22, 50, actuation=0.03)
        add_spring(body, front, [-0.08, 0.02], [0.0, -0.08], 0.22, 50, actuation=0.03)
        add_spring(body, back, [-0.08, 0.0], [0.0, 0.03], -1, 50)
        add_spring(body, front, [0.08, 0.0], [0.0, 0.03], -1, 50)
        return objects, springs, body
    if robot_id != 2:
        raise ValueError(f"robot {robot_id}: DiffTaichi has robots 0-2")
    # robotLeg: a hip and two legs of thigh, calf and foot
    thigh, calf, foot, hip = 0.11, 0.11, 0.08, 0.08
    hip_pos = [0.3, 0.5 + 0.15]

    def rot_along(half_length, deg, center):
        ang = math.radians(deg)
        return [half_length * math.sin(ang) + center[0], -half_length * math.cos(ang) + center[1]]

    add_object(hip_pos, [0.06, hip])
    hip_end = [hip_pos[0], hip_pos[1] - (hip - 0.01)]
    for _side in range(2):  # left (objects 1-3), then right (4-6): the same angles
        thigh_end = rot_along(thigh * 2.0, 10, hip_end)
        add_object(rot_along(thigh, 10, hip_end), [0.02, thigh], math.radians(10))
        add_object(rot_along(calf, -10, thigh_end), [0.02, calf], math.radians(-10))
        calf_end = rot_along(2.0 * calf, -10, thigh_end)
        add_object([calf_end[0] + foot, calf_end[1]], [foot, 0.02])
    for t in (1, 4):  # thigh, calf, foot of the side
        add_spring(0, t, [0, (hip - 0.01) * 0.4], [0, -thigh], 0.9 * (2.0 * thigh + 0.22), 5)
        add_spring(t, t + 1, [0, thigh], [0, -thigh], 0.9 * 4.0 * thigh, 20, 0.08)
        add_spring(t + 1, t + 2, [0, 0], [foot, 0],
                   0.7 * math.sqrt(pow(thigh, 2) + pow(2.0 * foot, 2)), 40)
        add_spring(0, t, [0, -(hip - 0.01)], [0.0, thigh], -1, 200)
        add_spring(t, t + 1, [0, -thigh], [0.0, thigh], -1, 200)
        add_spring(t + 1, t + 2, [0, -thigh], [-foot, 0], -1, 200)
    return objects, springs, 3


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_objects: int, n_springs: int, head_id: int, toi: bool):
    """DiffTaichi's kernels as @vkad.kernel functions, launched with step t; the loops over
    boxes, corners, sine waves and hidden units are unrolled (vkad.static, its ti.static)."""
    n_input = N_SIN_WAVES + 6 * n_objects + 2
    vec = vkad.vec(2, ft)
    state = vkad.array(vec, ndim=2, grad=True)      # x[t, i], v[t, i], x_inc, v_inc
    angle = vkad.array(ft, ndim=2, grad=True)       # rotation[t, i], omega[t, i], *_inc
    field = vkad.array(ft, ndim=2, grad=True)       # hidden[t, i], actuation[t, i], weights
    row = vkad.array(ft, ndim=1, grad=True)         # biases
    const = vkad.array(ft, ndim=1, readonly=True)   # per box / spring constants
    consts = vkad.array(vec, ndim=1, readonly=True)
    index = vkad.array(vkad.i32, ndim=1, readonly=True)

    @vkad.kernel
    def nn1(t: vkad.i32, x: state, v: state, rotation: angle, omega: angle,
            goal: vkad.array(vec, ndim=0, readonly=True), weights1: field, bias1: row,
            hidden: field):
        for i in range(N_HIDDEN):
            actuation = 0.0
            for j in vkad.static(range(N_SIN_WAVES)):
                actuation += weights1[i, j] * vkad.sin(vkad.cast(SPRING_OMEGA * t, ft) * DT
                                                       + 2 * math.pi / N_SIN_WAVES * j)
            for j in vkad.static(range(n_objects)):
                offset, vel = x[t, j] - x[t, head_id], v[t, j]
                k = j * 6 + N_SIN_WAVES  # a smaller weight: there are many of them
                actuation += weights1[i, k] * offset[0] * 0.05
                actuation += weights1[i, k + 1] * offset[1] * 0.05
                actuation += weights1[i, k + 2] * vel[0] * 0.05
                actuation += weights1[i, k + 3] * vel[1] * 0.05
                actuation += weights1[i, k + 4] * rotation[t, j] * 0.05
                actuation += weights1[i, k + 5] * omega[t, j] * 0.05
            g = goal[None]
            actuation += weights1[i, n_objects * 6 + N_SIN_WAVES] * g[0]
            actuation += weights1[i, n_objects * 6 + N_SIN_WAVES + 1] * g[1]
            actuation += bias1[i]
            hidden[t, i] = vkad.tanh(actuation)

    @vkad.kernel
    def nn2(t: vkad.i32, hidden: field, weights2: field, bias2: row, actuation: field):
        for i in range(n_springs):
            act = 0.0
            for j in vkad.static(range(N_HIDDEN)):
                act += weights2[i, j] * hidden[t, j]
            act += bias2[i]
            actuation[t, i] = vkad.tanh(act)

    @vkad.func
    def to_world(x, v, rotation, omega, t, i, rela_x):
        rot = rotation[t, i]
        rot_matrix = vkad.Matrix([[vkad.cos(rot), -vkad.sin(rot)],
                                  [vkad.sin(rot), vkad.cos(rot)]])  # rotation_matrix(rot)
        rela_pos = rot_matrix @ rela_x
        rela_v = omega[t, i] * Vector([-rela_pos[1], rela_pos[0]])
        return x[t, i] + rela_pos, v[t, i] + rela_v, rela_pos

    @vkad.func
    def apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc, omega_inc,
                      t, i, impulse, location, toi_input):
        delta_v = impulse * inverse_mass[i]
        delta_omega = (location - x[t, i]).cross(impulse) * inverse_inertia[i]
        toi = vkad.min(vkad.max(0.0, toi_input), DT)
        x_inc[t + 1, i] += toi * (-delta_v)
        rotation_inc[t + 1, i] += toi * (-delta_omega)
        v_inc[t + 1, i] += delta_v
        omega_inc[t + 1, i] += delta_omega

    @vkad.kernel
    def collide(t: vkad.i32, x: state, v: state, rotation: angle, omega: angle, halfsize: consts,
                inverse_mass: const, inverse_inertia: const, x_inc: state, v_inc: state,
                rotation_inc: angle, omega_inc: angle):
        for i in range(n_objects):
            hs = halfsize[i]
            for k in vkad.static(range(4)):
                # the corner for collision detection
                offset_scale = Vector([k % 2 * 2 - 1.0, k // 2 % 2 * 2 - 1.0])
                corner_x, corner_v, rela_pos = to_world(x, v, rotation, omega, t, i,
                                                        offset_scale * hs)
                corner_v = corner_v + DT * GRAVITY * Vector([0.0, 1.0])
                # apply an impulse so that there is no sinking
                normal, tao = Vector([0.0, 1.0]), Vector([1.0, 0.0])
                rn, rt = rela_pos.cross(normal), rela_pos.cross(tao)
                impulse_contribution = inverse_mass[i] + rn ** 2 * inverse_inertia[i]
                timpulse_contribution = inverse_mass[i] + rt ** 2 * inverse_inertia[i]
                rela_v_ground = normal.dot(corner_v)
                impulse, timpulse, toi = 0.0, 0.0, 0.0
                new_corner_x = corner_x + DT * corner_v
                if rela_v_ground < 0 and new_corner_x[1] < GROUND_HEIGHT:
                    impulse = -(1 + ELASTICITY) * rela_v_ground / impulse_contribution
                    if impulse > 0:  # friction
                        timpulse = vkad.min(FRICTION * impulse, vkad.max(
                            -FRICTION * impulse, -corner_v.dot(tao) / timpulse_contribution))
                        if corner_x[1] > GROUND_HEIGHT:
                            toi = -(corner_x[1] - GROUND_HEIGHT) / vkad.min(corner_v[1], -1e-3)
                apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc,
                              omega_inc, t, i, impulse * normal + timpulse * tao, new_corner_x,
                              toi)
                # DiffTaichi's local `penalty` shadows its global penalty = 1e4 (PENALTY): the
                # product reads the local's 0.0, so this impulse is 0 there, and here
                penalty = 0.0
                if new_corner_x[1] < GROUND_HEIGHT:  # apply a penalty
                    penalty = -DT * penalty * (new_corner_x[1] - GROUND_HEIGHT) \
                        / impulse_contribution
                apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc,
                              omega_inc, t, i, penalty * normal, new_corner_x, 0.0)

    @vkad.kernel
    def apply_spring_force(t: vkad.i32, x: state, v: state, rotation: angle, omega: angle,
                           actuation: field, anchor_a: index, anchor_b: index, offset_a: consts,
                           offset_b: consts, spring_length: const, spring_stiffness: const,
                           spring_actuation: const, inverse_mass: const, inverse_inertia: const,
                           x_inc: state, v_inc: state, rotation_inc: angle, omega_inc: angle):
        for i in range(n_springs):
            a, b = anchor_a[i], anchor_b[i]
            pos_a, vel_a, rela_a = to_world(x, v, rotation, omega, t, a, offset_a[i])
            pos_b, vel_b, rela_b = to_world(x, v, rotation, omega, t, b, offset_b[i])
            dist = pos_a - pos_b
            length = dist.norm() + 1e-4
            is_joint = spring_length[i] == -1
            target_length = spring_length[i] * (1.0 + spring_actuation[i] * actuation[t, i])
            if is_joint:
                target_length = 0.0
            impulse = DT * (length - target_length) * spring_stiffness[i] / length * dist
            if is_joint:  # project the relative velocity out
                rela_vel = vel_a - vel_b
                rela_vel_norm = rela_vel.norm() + 1e-1
                impulse_dir = rela_vel / rela_vel_norm
                impulse_contribution = inverse_mass[a] \
                    + impulse_dir.cross(rela_a) ** 2 * inverse_inertia[a] + inverse_mass[b] \
                    + impulse_dir.cross(rela_b) ** 2 * inverse_inertia[b]
                impulse += rela_vel_norm / impulse_contribution * impulse_dir
            apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc,
                          omega_inc, t, a, -impulse, pos_a, 0.0)
            apply_impulse(x, inverse_mass, inverse_inertia, x_inc, v_inc, rotation_inc,
                          omega_inc, t, b, impulse, pos_b, 0.0)

    @vkad.kernel(name="advance_toi" if toi else "advance_no_toi")
    def advance(t: vkad.i32, x: state, v: state, rotation: angle, omega: angle, x_inc: state,
                v_inc: state, rotation_inc: angle, omega_inc: angle):
        for i in range(n_objects):
            s = math.exp(-DT * DAMPING)
            new_v = s * v[t - 1, i] + v_inc[t, i] + DT * GRAVITY * Vector([0.0, 1.0])
            new_omega = s * omega[t - 1, i] + omega_inc[t, i]
            v[t, i] = new_v
            omega[t, i] = new_omega
            if vkad.static(toi):
                x[t, i] = x[t - 1, i] + DT * new_v + x_inc[t, i]
                rotation[t, i] = rotation[t - 1, i] + DT * new_omega + rotation_inc[t, i]
            else:
                x[t, i] = x[t - 1, i] + DT * new_v
                rotation[t, i] = rotation[t - 1, i] + DT * new_omega

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: state, goal: vkad.array(vec, ndim=0, readonly=True),
                     loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] += (x[t, head_id] - goal[None]).norm()  # DiffTaichi: loss[None] = ...

    return {"nn1": nn1, "nn2": nn2, "collide": collide, "apply_spring_force": apply_spring_force,
            "advance": advance, "compute_loss": compute_loss}, n_input


class RigidBody(Simulation):
    """A robot, its controller and the differentiated simulation on one session.

    forward() launches one simulation (on the tape when recording); iteration() runs one
    training iteration and returns its loss (before the update); loss() the current loss;
    weights() / set_weights() the controller as numpy arrays."""

    PARAMS = ("weights1", "bias1", "weights2", "bias2")
    NAME = "rigid_body"
    STATE = ("x", "v", "rotation", "omega", "x_inc", "v_inc", "rotation_inc", "omega_inc")

    def __init__(self, session: vkad.Session, robot_id: int = 0, steps: int = STEPS,
                 dtype: vkad.DType = vkad.f32, toi: bool = True, seed: int = 0,
                 graph: bool = True, loop: bool = True):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        super().__init__(session, dtype, graph)
        self.steps = steps
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        self.objects, self.springs, self.head_id = robot(robot_id)
        n_obj, n_spr = len(self.objects), len(self.springs)
        kernels, self.n_input = build_kernels(dtype, n_obj, n_spr, self.head_id, toi)
        self.kernels = {name: session.differentiate(k) for name, k in kernels.items()}
        npt = vkad.numpy_dtype(dtype)

        # DiffTaichi's optimize(): Gaussian weights (np.random.randn, here seeded), zero biases
        rng = np.random.RandomState(seed)
        w1 = rng.randn(N_HIDDEN, self.n_input) * math.sqrt(2 / (N_HIDDEN + self.n_input)) * 0.5
        w2 = rng.randn(n_spr, N_HIDDEN) * math.sqrt(2 / (N_HIDDEN + n_spr)) * 1
        host = dict(weights1=w1, bias1=np.zeros(N_HIDDEN), weights2=w2, bias2=np.zeros(n_spr))
        halfsize = np.array([o[1] for o in self.objects])
        hx, hy = halfsize[:, 0], halfsize[:, 1]  # DiffTaichi's initialize_properties
        host.update(halfsize=halfsize, inverse_mass=1.0 / (4 * hx * hy),
                    inverse_inertia=1.0 / (4 / 3 * hx * hy * (hx * hx + hy * hy)),
                    offset_a=np.array([sp[2] for sp in self.springs]),
                    offset_b=np.array([sp[3] for sp in self.springs]),
                    spring_length=[sp[4] for sp in self.springs],
                    spring_stiffness=[sp[5] for sp in self.springs],
                    spring_actuation=[sp[6] for sp in self.springs], goal=np.array(GOAL))
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            name: s.zeros((steps, n_obj) + ((2,) if name in ("x", "v", "x_inc", "v_inc") else ()),
                          dtype, name)
            for name in self.STATE}
        self.arrays.update(
            hidden=s.zeros((steps, N_HIDDEN), dtype, "hidden"),
            actuation=s.zeros((steps, n_spr), dtype, "actuation"),
            loss=s.zeros(1, dtype, "loss"),
            anchor_a=s.ndarray(np.array([sp[0] for sp in self.springs], np.int32),
                               name="anchor_a"),
            anchor_b=s.ndarray(np.array([sp[1] for sp in self.springs], np.int32),
                               name="anchor_b"))
        for name, value in host.items():
            self.arrays[name] = s.ndarray(np.asarray(value, np.float64), npt, name)
        x0 = np.zeros((steps, n_obj, 2))
        x0[0] = [o[0] for o in self.objects]
        self.arrays["x"].upload(x0.astype(npt))
        r0 = np.zeros((steps, n_obj))
        r0[0] = [o[2] for o in self.objects]
        self.arrays["rotation"].upload(r0.astype(npt))
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        if loop:  # the step loop's resident kernel and its adjoint's made now, with the kernels
            self.s.prepare_loop(1, steps, self._step(True))

    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        nn1, nn2, collide, springs, advance = (
            self.launcher(name, recorded)
            for name in ("nn1", "nn2", "collide", "apply_spring_force", "advance"))

        def step(t):
            nn1(t - 1)
            nn2(t - 1)
            collide(t - 1)
            springs(t - 1)
            advance(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation from the robot's rest pose: DiffTaichi's clear_states() and forward()
        (steps - 1 steps, then the loss at the last step). Asynchronous."""
        self.s.zero_many([self.arrays[n] for n in self.STATE[4:]] + [self.arrays["loss"]])
        step = self._step(recorded)
        self.step_loop(1, self.steps, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update: w -= lr * min(1, 0.2 / (|grad| +
        1e-4)) * grad. Returns the loss the forward computed."""
        loss = self.run_iteration(self.forward_backward)
        grads = self.gradients()
        norm_sqr = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())
        scale = LEARNING_RATE * min(1.0, GRADIENT_CLIP / (norm_sqr ** 0.5 + 1e-4))
        w = self.weights()
        self.set_weights({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss

    def corners(self, t: int) -> np.ndarray:
        """The boxes' corners at step t of the last simulation, (boxes, 4, 2)."""
        x, rot = self.arrays["x"].numpy()[t], self.arrays["rotation"].numpy()[t]
        out = []
        for i, (_, hs, _) in enumerate(self.objects):
            c, s = math.cos(rot[i]), math.sin(rot[i])
            out.append([x[i] + np.array([[c, -s], [s, c]]) @ (np.array(k) * hs)
                        for k in ((-1, -1), (1, -1), (1, 1), (-1, 1))])
        return np.array(out)


# --- the program ---------------------------------------------------------------------------------

def plot(sim: RigidBody, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve and the robot's last pose (earlier poses faint); [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(losses)
    ax.set_xlabel("iteration"), ax.set_ylabel("loss (distance of the head to the goal)")
    ax.set_title("rigid_body on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "rigid_body_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    last = sim.steps - 1
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.axhline(GROUND_HEIGHT, color="k", lw=2)
    for t in list(range(0, last, max(1, last // 6))) + [last]:
        for box in sim.corners(t):
            ax.fill(box[:, 0], box[:, 1], fill=t == last, color="#699" if t == last else "#ccc")
    ax.plot(*GOAL, "r*")
    ax.set_aspect("equal")
    ax.set_title(f"step {last} (goal: red star)")
    fig.tight_layout()
    written.append(os.path.join(out, "rigid_body_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=20)
    ap.add_argument("--robot", type=int, default=0, help="DiffTaichi's robot 0-2 (default 0)")
    ap.add_argument("--no-toi", action="store_true",
                    help="DiffTaichi's use_toi = False: advance without the time of impact")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = RigidBody(s, a.robot, a.steps, vkad.f64 if a.f64 else vkad.f32, toi=not a.no_toi,
                        seed=a.seed, graph=not a.no_graph, loop=not a.no_loop)
        print(f"{s.device_name}: robot {a.robot} ({len(sim.objects)} boxes, "
              f"{len(sim.springs)} springs), {a.steps} steps, {a.iters} iterations")
        losses = train(sim, a.iters, "rigid_body", profile=a.profile, session=s)
        final = sim.loss()
        print(f"loss {losses[0] if losses else final:.5f} -> {final:.5f}")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
