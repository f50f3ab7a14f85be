"""DiffTaichi's mass_spring_velocity.py on vkad: a mass-spring robot learns to follow a target speed.

    python examples/difftaichi/mass_spring_velocity.py --iters 100   # robot 1, 1024 steps, f32

DiffTaichi's examples/mass_spring_velocity.py (github.com/taichi-dev/difftaichi) is its
mass_spring.py robot and controller given a task that changes: every iteration a new target
velocity, piecewise constant over segments of 300 steps (each segment's x velocity drawn
uniformly from (-1, 1), the y velocity 0), is an input of the controller, and the loss is the
squared error of the head mass's x velocity against it, accumulated over every step (dt (target
- v_head)^2). So the port is examples/difftaichi/mass_spring.py's MassSpring (its robots, its
compute_center, nn2 and apply_spring_force kernels, arrays, initialisation and step loop) with
this file's constants (1024 steps, dt 0.004, gravity -1.8, damping 15), its nn1 (the target
velocity in place of the goal), advance (time of impact by default, as DiffTaichi's `optimize(
toi=True)`; --no-toi the friction projection), per-step compute_loss, the robot placed 0.4 to the
right (DiffTaichi's setup_robot), and its update: the gradient scaled to norm 0.1 (gradient_clip),
1000 iterations.

What vkad does instead of Taichi's behaviour, and what DiffTaichi leaves open:
- DiffTaichi's nn1 reads v[t, i] with i the hidden unit (0 .. 31) inside its loop over objects
  j; mass_spring.py, the same controller, reads v[t, j]. Past the robot's masses that index reads
  outside the objects (memory the Taichi of the time padded to a power of two), so the port reads
  v[t, j], the object whose offset the same lines read.
- DiffTaichi's head_id = 10 needs a robot with 11 masses or more; its command line takes the
  robot id without a default. The port's default is robot 1 (14 masses), the smallest that has
  one; --robot 2 and 3 work too, robot 0 (6 masses) is refused.
- The target pool is drawn with Python's unseeded `random` every iteration; here with a numpy
  RandomState(seed), uploaded before each iteration (the graph replays with the new target).
- ti.Tape zeroes the loss and the gradients; DiffTaichi's clear_states() zeroes v_inc; here
  forward() zeroes v_inc and the loss inside the recording and backward() the gradients.
- DiffTaichi plots the losses smoothed by a Gaussian of sigma 10 (scipy); with matplotlib
  mass_spring_velocity_loss.png shows them raw and so smoothed (numpy), and
  mass_spring_velocity_final.png the head's x velocity against the target in the last iteration.

The step loop (6 launches per step) is said as one (Session.loop) and prepared at construction;
the iteration's launches (zeroing, forward, backward) are captured once as a graph and replayed
(--no-graph launches them one by one); the update runs on the host, as mass_spring.py's.
--f64 on lavapipe needs --no-loop: the rolled adjoint's f64 atomic adds are compare-and-swap
loops there, past its 65,535-iteration loop limit (refused, not miscomputed).
"""
import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mass_spring  # noqa: E402  (the robot, controller and simulation this one reuses)
from training import arguments, open_session, train  # noqa: E402
from vkad import Vector

# DiffTaichi's constants (examples/mass_spring_velocity.py); the others are mass_spring.py's
STEPS = 2048 // 2
DT = mass_spring.DT  # 0.004, as mass_spring.py
GRAVITY = -1.8
DAMPING = mass_spring.DAMPING  # 15
GROUND_HEIGHT = mass_spring.GROUND_HEIGHT
HEAD_ID = 10
GRADIENT_CLIP = 0.1  # the update's step length: the gradient scaled to this norm
SEGMENT = 300        # steps per target velocity
POOL = 100           # target velocities drawn per iteration (DiffTaichi's pool)
X_OFFSET = 0.4       # DiffTaichi's setup_robot: x[0, i] = objects[i] + (0.4, 0)
ROBOT = 1
ITERS = 1000


def target_velocities(rng: np.random.RandomState, steps: int) -> np.ndarray:
    """DiffTaichi's forward(): a pool of POOL speeds uniform in (-1, 1), target_v[t] =
    (pool[t // SEGMENT], 0); (steps, 2) float64."""
    pool = (rng.random_sample(POOL) - 0.5) * 2
    target = np.zeros((steps, 2))
    target[:, 0] = pool[np.arange(steps) // SEGMENT]
    return target


def build_kernels(ft: vkad.DType, n_objects: int, n_springs: int, toi: bool):
    """mass_spring.py's kernels (compute_center, nn2, apply_spring_force) with this program's
    nn1, advance and compute_loss; build_kernels's signature there (MassSpring's `build`)."""
    kernels, n_input = mass_spring.build_kernels(ft, n_objects, n_springs, toi)
    vec = vkad.vec(2, ft)
    state = vkad.array(vec, ndim=2, grad=True)        # x[t, i], v[t, i], v_inc[t, i]
    centers = vkad.array(vec, ndim=1, grad=True)      # center[t]
    targets = vkad.array(vec, ndim=1, readonly=True)  # target_v[t]
    field = vkad.array(ft, ndim=2, grad=True)
    row = vkad.array(ft, ndim=1, grad=True)
    n_sin, omega = mass_spring.N_SIN_WAVES, mass_spring.SPRING_OMEGA

    @vkad.kernel
    def nn1(t: vkad.i32, x: state, v: state, center: centers, target_v: targets,
            weights1: field, bias1: row, hidden: field):
        for i in range(mass_spring.N_HIDDEN):
            phase = vkad.cast(t, ft) * (omega * DT)
            actuation = weights1[i, 0] * vkad.sin(phase)
            for j in vkad.static(range(1, n_sin)):
                actuation += weights1[i, j] * vkad.sin(phase + 2 * math.pi / n_sin * j)
            c = center[t]
            for j in vkad.static(range(n_objects)):
                offset, vel = x[t, j] - c, v[t, j]  # DiffTaichi: v[t, i] (the docstring)
                k = n_sin + 4 * j
                actuation += weights1[i, k] * offset[0] * 0.05
                actuation += weights1[i, k + 1] * offset[1] * 0.05
                actuation += weights1[i, k + 2] * vel[0] * 0.05
                actuation += weights1[i, k + 3] * vel[1] * 0.05
            k = n_sin + 4 * n_objects
            actuation += weights1[i, k] * target_v[t][0]
            actuation += weights1[i, k + 1] * target_v[t][1]
            hidden[t, i] = vkad.tanh(actuation + bias1[i])

    @vkad.kernel(name="advance_toi" if toi else "advance_no_toi")
    def advance(t: vkad.i32, x: state, v: state, v_inc: state):
        for i in range(n_objects):
            old_v = math.exp(-DT * DAMPING) * v[t - 1, i] + Vector([0.0, DT * GRAVITY]) \
                + v_inc[t, i]
            old_x = x[t - 1, i]
            new_v = old_v
            if vkad.static(toi):
                # moving down through the ground within this step: stop at the time of impact
                toi_t = 0.0
                if old_x[1] + DT * old_v[1] < GROUND_HEIGHT and old_v[1] < -1e-4:
                    toi_t = -(old_x[1] - GROUND_HEIGHT) / old_v[1]
                    new_v = Vector([0.0, 0.0])
                new_x = old_x + toi_t * old_v + (DT - toi_t) * new_v
            else:
                # below the ground and moving down: friction projection, the velocity stops
                if old_x[1] - GROUND_HEIGHT < 0 and old_v[1] < 0:
                    new_v = Vector([0.0, 0.0])
                new_x = old_x + DT * new_v
            v[t, i] = new_v
            x[t, i] = new_x

    @vkad.kernel
    def compute_loss(t: vkad.i32, v: state, target_v: targets,
                     loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] += DT * (target_v[t][0] - v[t, HEAD_ID][0]) ** 2

    kernels.update(nn1=nn1, advance=advance, compute_loss=compute_loss)
    return kernels, n_input


class MassSpringVelocity(mass_spring.MassSpring):
    """MassSpring with a target velocity: iteration() draws a new target (target_velocities;
    with same_task, keeps the first),
    runs forward, backward and DiffTaichi's update (the gradient scaled to norm 0.1) and returns
    the loss; set_target() fixes one for loss() and forward_backward()."""

    NAME = "mass_spring_velocity"

    def __init__(self, session: vkad.Session, robot_id: int = ROBOT, steps: int = STEPS,
                 dtype: vkad.DType = vkad.f32, toi: bool = True, seed: int = 0,
                 graph: bool = True, loop: bool = True, same_task: bool = False):
        # same_task: every iteration keeps the first target (a fixed task, for tests and
        # --same-task); DiffTaichi draws a new one every iteration
        objects, _ = mass_spring.robot(robot_id)
        if len(objects) <= HEAD_ID:
            raise ValueError(f"robot {robot_id} has {len(objects)} masses: DiffTaichi's head_id "
                             f"= {HEAD_ID} needs {HEAD_ID + 1} or more (robots 1-3)")
        # loop=False here: the step loop is prepared below, once the target array exists
        super().__init__(session, robot_id, steps, dtype, toi, seed, graph, loop=False,
                         build=build_kernels)
        npt = vkad.numpy_dtype(dtype)
        x0 = np.zeros((steps, len(objects), 2))
        x0[0] = objects + np.array([X_OFFSET, 0.0])
        self.arrays["x"].upload(x0.astype(npt))
        self.arrays["target_v"] = session.zeros((steps, 2), dtype, "target_v")
        # the target pools (a generator of their own: the weights' draws stay mass_spring.py's);
        # until the first iteration draws it, the first target is uploaded already
        self.tasks = np.random.RandomState(seed + 1)
        self.set_target(target_velocities(np.random.RandomState(seed + 1), steps))
        self.loop, self.same_task = loop, same_task
        if loop:
            self.s.prepare_loop(1, steps, self._step(True))

    def set_target(self, target: np.ndarray) -> None:
        """target_v[t] ((steps, 2)) for the next forward."""
        self.target = np.asarray(target, np.float64)
        self.arrays["target_v"].upload(self.target.astype(vkad.numpy_dtype(self.dtype)))

    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t: mass_spring.py's and the loss at step t."""
        body = super()._step(recorded)
        loss = self.launcher("compute_loss", recorded)

        def step(t):
            body(t)
            loss(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation from x[0], v[0] = 0 with the uploaded target: DiffTaichi's forward()
        (steps - 1 steps, each adding its loss). Asynchronous."""
        self.s.zero_many([self.arrays["v_inc"], self.arrays["loss"]])
        self.step_loop(1, self.steps, self._step(recorded))

    def iteration(self) -> float:
        """A new target, forward and backward, then DiffTaichi's update: the gradient scaled to
        norm GRADIENT_CLIP. Returns the loss the forward computed."""
        if not self.same_task:
            self.set_target(target_velocities(self.tasks, self.steps))
        loss = self.run_iteration(self.forward_backward)
        grads = self.gradients()
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = GRADIENT_CLIP / (norm + 1e-6)
        w = self.weights()
        self.set_weights({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss

    def head_velocity(self) -> np.ndarray:
        """The head mass's x velocity at every step of the last simulation."""
        return self.arrays["v"].numpy()[:, HEAD_ID, 0]


def smoothed(values: Sequence[float], sigma: float = 10.0) -> np.ndarray:
    """A Gaussian filter of `sigma` samples, reflecting at the ends (scipy's gaussian_filter
    default, which DiffTaichi's plot uses)."""
    v = np.asarray(values, np.float64)
    radius = int(4 * sigma + 0.5)
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    return np.convolve(np.pad(v, radius, mode="symmetric"), k / k.sum(), mode="valid")


def plot(sim: MassSpringVelocity, losses: Sequence[float], out: str) -> List[str]:
    """The losses (raw and smoothed, as DiffTaichi plots them) and the last simulation's head
    velocity against its target; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(losses, color="#bbb", label="loss")
    ax.plot(smoothed(losses), label="smoothed (sigma 10)")
    ax.set_xlabel("iteration"), ax.set_ylabel("loss"), ax.legend()
    ax.set_title("mass_spring_velocity on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "mass_spring_velocity_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    t = np.arange(sim.steps) * DT
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(t, sim.target[:, 0], label="target x velocity")
    ax.plot(t, sim.head_velocity(), label=f"mass {HEAD_ID}'s x velocity")
    ax.set_xlabel("time"), ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(os.path.join(out, "mass_spring_velocity_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS)
    ap.add_argument("--robot", type=int, default=ROBOT, choices=(1, 2, 3),
                    help=f"DiffTaichi's robot id (default {ROBOT}; robot 0 has no mass "
                         f"{HEAD_ID})")
    ap.add_argument("--no-toi", action="store_true",
                    help="the friction projection instead of time of impact at the ground")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    ap.add_argument("--same-task", action="store_true",
                    help="keep the first target velocity for every iteration (DiffTaichi draws "
                         "a new one each)")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = MassSpringVelocity(s, a.robot, a.steps, vkad.f64 if a.f64 else vkad.f32,
                                 toi=not a.no_toi, seed=a.seed, graph=not a.no_graph,
                                 loop=not a.no_loop, same_task=a.same_task)
        print(f"{s.device_name}: robot {a.robot} ({len(sim.objects)} masses, "
              f"{len(sim.springs)} springs), {a.steps} steps, {a.iters} iterations")
        losses = train(sim, a.iters, "mass_spring_velocity", profile=a.profile, session=s)
        if losses:
            first, last = smoothed(losses)[[0, -1]]
            print(f"loss {losses[0]:.5f} -> {losses[-1]:.5f} (smoothed {first:.5f} -> "
                  f"{last:.5f})")
        for path in plot(sim, losses, a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
