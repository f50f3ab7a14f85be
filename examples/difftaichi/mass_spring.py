"""DiffTaichi's mass_spring.py on vkad: a mass-spring robot with a neural controller learns to walk.

    python examples/difftaichi/mass_spring.py --iters 30        # robot 0, 682 steps, f32

The physics, parameters and optimisation loop are those of DiffTaichi's examples/mass_spring.py
(github.com/taichi-dev/difftaichi), and its kernels are written as DiffTaichi writes them, as
Python functions (`@vkad.kernel`: the outermost `for` the parallel loop, `vkad.static` loops
unrolled, `+=` on an array element an atomic add, a runtime `if` for the ground contact):

- state in arrays with a time axis, x[t, i] and v[t, i] (2-vectors), read at step t - 1 and
  written at step t of the same array (reverse mode proves the rows disjoint);
- per step: the centre of mass, the controller's two layers (nn1: sine waves, offsets from the
  centre, velocities and the goal -> 32 tanh hidden units; nn2: -> one tanh actuation per
  spring), spring impulses scattered with atomic adds into v_inc[t + 1], and the time
  integration with ground contact (time of impact by default, as DiffTaichi's `train`; the
  friction projection with --no-toi);
- the loss, -x[last step, head].x, accumulated with an atomic add into a rank-0 array;
- a vkad.Tape records the forward launches, backward() runs their adjoints; the gradient is
  clipped to norm 0.2 and the weights descend (DiffTaichi's update). The whole iteration's
  launches (zeroing, forward, backward) are captured once as a graph and replayed
  (--no-graph launches them one by one; the results are the same).

Prints progress (tqdm where installed), and with matplotlib writes mass_spring_loss.png and
mass_spring_final.png (the robot at its last step, with earlier poses faint) into --out.
The MassSpring class is what tests/python/test_difftaichi.py imports.
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

# DiffTaichi's constants (examples/mass_spring.py)
DT = 0.004
STEPS = 2048 // 3
GROUND_HEIGHT = 0.1
GRAVITY = -4.8
SPRING_OMEGA = 10.0
DAMPING = 15.0
N_SIN_WAVES = 10
N_HIDDEN = 32
GRADIENT_CLIP = 0.2  # the update's step length: the gradient is scaled to this norm
HEAD_ID = 0
GOAL = (0.9, 0.2)

Spring = Tuple[int, int, float, float, float]  # a, b, rest length, stiffness, actuation


# --- robots (DiffTaichi's mass_spring_robot_config.py) -----------------------------------------

class _Robot:
    def __init__(self):
        self.objects: List[Tuple[float, float]] = []
        self.springs: List[Spring] = []
        self._grid: Dict[Tuple[float, float], int] = {}
        self._pairs = set()

    def mass(self, x: float, y: float) -> int:
        self.objects.append((x, y))
        return len(self.objects) - 1

    def spring(self, a: int, b: int, stiffness: float, actuation: float) -> None:
        (ax, ay), (bx, by) = self.objects[a], self.objects[b]
        self.springs.append((a, b, math.hypot(ax - bx, ay - by), stiffness, actuation))

    # mesh robots: masses on a 0.05 grid, springs between every pair of a cell's corners
    def _point(self, i: float, j: float) -> int:
        if (i, j) not in self._grid:
            self._grid[(i, j)] = self.mass(i * 0.05 + 0.1, j * 0.05 + 0.1)
        return self._grid[(i, j)]

    def _mesh_spring(self, a: int, b: int, actuation: float) -> None:
        if (a, b) in self._pairs or (b, a) in self._pairs:
            return
        self._pairs.add((a, b))
        self.spring(a, b, 3e4, actuation)

    def square(self, i: int, j: int, actuation: float = 0.0) -> None:
        a, b = self._point(i, j), self._point(i, j + 1)
        c, d = self._point(i + 1, j), self._point(i + 1, j + 1)
        self._mesh_spring(a, b, actuation)  # the vertical sides are the muscles
        self._mesh_spring(c, d, actuation)
        for p in (a, b, c, d):
            for q in (a, b, c, d):
                if p != q:
                    self._mesh_spring(p, q, 0.0)

    def triangle(self, i: int, j: int) -> None:  # passive, as in DiffTaichi
        corners = (self._point(i + 0.5, j + 0.5), self._point(i, j + 1), self._point(i + 1, j + 1))
        for p in corners:
            for q in corners:
                if p != q:
                    self._mesh_spring(p, q, 0.0)


def robot(robot_id: int) -> Tuple[np.ndarray, List[Spring]]:
    """Masses (N, 2) and springs of DiffTaichi's robots A-D (ids 0-3)."""
    r = _Robot()
    if robot_id == 0:
        for x, y in ((0.2, 0.1), (0.3, 0.13), (0.4, 0.1), (0.2, 0.2), (0.3, 0.2), (0.4, 0.2)):
            r.mass(x, y)
        for a, b in ((0, 1), (1, 2), (3, 4), (4, 5), (0, 3), (2, 5), (0, 4), (1, 4), (2, 4),
                     (3, 1), (5, 1)):
            r.spring(a, b, 14000.0, 0.1)
    elif robot_id == 1:
        r.triangle(2, 0)
        r.triangle(0, 0)
        for i, j, act in ((0, 1, 0.15), (0, 2, 0), (1, 2, 0), (2, 1, 0.15), (2, 2, 0)):
            r.square(i, j, act)
    elif robot_id in (2, 3):
        cells = [(2, 0, 0.15), (0, 0, 0.15), (0, 1, 0.15), (0, 2, 0), (1, 2, 0), (2, 1, 0.15),
                 (2, 2, 0), (2, 3, 0), (2, 4, 0)]
        if robot_id == 3:
            cells += [(3, 1, 0), (4, 0, 0.15), (4, 1, 0.15)]
        for i, j, act in cells:
            r.square(i, j, act)
    else:
        raise ValueError(f"robot {robot_id}: DiffTaichi has robots 0-3")
    return np.array(r.objects, np.float64), r.springs


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_objects: int, n_springs: int, toi: bool):
    """DiffTaichi's forward kernels as @vkad.kernel functions, launched with step t. `for i in
    range(n)` is the parallel loop; loops over objects, sine waves and hidden units are unrolled
    (vkad.static, DiffTaichi's ti.static): each is a handful of masses or units."""
    n_input = N_SIN_WAVES + 4 * n_objects + 2
    vec = vkad.vec(2, ft)
    state = vkad.array(vec, ndim=2, grad=True)         # x[t, i], v[t, i], v_inc[t, i]
    centers = vkad.array(vec, ndim=1, grad=True)       # center[t]
    field = vkad.array(ft, ndim=2, grad=True)          # hidden[t, i], act[t, i], weights
    row = vkad.array(ft, ndim=1, grad=True)            # biases
    const = vkad.array(ft, ndim=1, readonly=True)      # spring parameters
    index = vkad.array(vkad.i32, ndim=1, readonly=True)

    @vkad.kernel
    def compute_center(t: vkad.i32, x: state, center: centers):
        for _ in range(1):
            c = x[t, 0]
            for i in vkad.static(range(1, n_objects)):
                c += x[t, i]
            center[t] = c * (1.0 / n_objects)

    @vkad.kernel
    def nn1(t: vkad.i32, x: state, v: state, center: centers,
            goal: vkad.array(vec, ndim=0, readonly=True), weights1: field, bias1: row,
            hidden: field):
        for i in range(N_HIDDEN):
            phase = vkad.cast(t, ft) * (SPRING_OMEGA * DT)
            actuation = weights1[i, 0] * vkad.sin(phase)
            for j in vkad.static(range(1, N_SIN_WAVES)):
                actuation += weights1[i, j] * vkad.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
            c = center[t]
            for j in vkad.static(range(n_objects)):
                offset, vel = x[t, j] - c, v[t, j]
                k = N_SIN_WAVES + 4 * j  # offsets and velocities get smaller weights: many inputs
                actuation += weights1[i, k] * offset[0] * 0.05
                actuation += weights1[i, k + 1] * offset[1] * 0.05
                actuation += weights1[i, k + 2] * vel[0] * 0.05
                actuation += weights1[i, k + 3] * vel[1] * 0.05
            to_goal = goal[None] - c
            k = N_SIN_WAVES + 4 * n_objects
            actuation += weights1[i, k] * to_goal[0]
            actuation += weights1[i, k + 1] * to_goal[1]
            hidden[t, i] = vkad.tanh(actuation + bias1[i])

    @vkad.kernel
    def nn2(t: vkad.i32, hidden: field, weights2: field, bias2: row, act: field):
        for i in range(n_springs):
            actuation = weights2[i, 0] * hidden[t, 0]
            for j in vkad.static(range(1, N_HIDDEN)):
                actuation += weights2[i, j] * hidden[t, j]
            act[t, i] = vkad.tanh(actuation + bias2[i])

    @vkad.kernel
    def apply_spring_force(t: vkad.i32, x: state, act: field, anchor_a: index, anchor_b: index,
                           spring_length: const, spring_stiffness: const,
                           spring_actuation: const, v_inc: state):
        for i in range(n_springs):
            a, b = anchor_a[i], anchor_b[i]
            dist = x[t, a] - x[t, b]
            length = dist.norm() + 1e-4
            target = spring_length[i] * (1.0 + spring_actuation[i] * act[t, i])
            impulse = DT * (length - target) * spring_stiffness[i] / length * dist
            v_inc[t + 1, a] -= impulse  # atomic adds, as DiffTaichi's
            v_inc[t + 1, b] += impulse

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
    def compute_loss(t: vkad.i32, x: state, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] += -x[t, HEAD_ID][0]  # DiffTaichi: loss[None] = -x[t, head_id][0]

    return {"compute_center": compute_center, "nn1": nn1, "nn2": nn2,
            "apply_spring_force": apply_spring_force, "advance": advance,
            "compute_loss": compute_loss}, n_input


class MassSpring(Simulation):
    """A robot, its controller and the differentiated simulation on one session.

    forward() launches one simulation (on the tape when recording); iteration() runs one
    training iteration and returns its loss (before the update); loss() the current loss;
    weights() / set_weights() the controller as numpy arrays."""

    PARAMS = ("weights1", "bias1", "weights2", "bias2")
    NAME = "mass_spring"

    def __init__(self, session: vkad.Session, robot_id: int = 0, steps: int = STEPS,
                 dtype: vkad.DType = vkad.f32, toi: bool = True, seed: int = 0,
                 graph: bool = True, loop: bool = True, build=None):
        # build: another maker of the kernels, build_kernels's signature (the tests pass the
        # KernelBuilder spelling, tests/python/difftaichi_builder_kernels.py)
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        super().__init__(session, dtype, graph)
        self.steps = steps
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        objects, springs = robot(robot_id)
        self.objects, self.springs = objects, springs
        n_obj, n_spr = len(objects), len(springs)
        kbs, self.n_input = (build or build_kernels)(dtype, n_obj, n_spr, toi)
        self.kernels = {name: session.differentiate(kb) for name, kb in kbs.items()}
        npt = vkad.numpy_dtype(dtype)

        # DiffTaichi's initialisation: np.random.seed(0), Gaussian weights, zero biases.
        rng = np.random.RandomState(seed)
        w1 = rng.randn(N_HIDDEN, self.n_input) * math.sqrt(2 / (N_HIDDEN + self.n_input)) * 2
        w2 = rng.randn(n_spr, N_HIDDEN) * math.sqrt(2 / (N_HIDDEN + n_spr)) * 3
        host = dict(weights1=w1, bias1=np.zeros(N_HIDDEN), weights2=w2, bias2=np.zeros(n_spr))
        x0 = np.zeros((steps, n_obj, 2))
        x0[0] = objects
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.ndarray(x0, npt, "x"),
            "v": s.zeros((steps, n_obj, 2), dtype, "v"),
            "v_inc": s.zeros((steps, n_obj, 2), dtype, "v_inc"),
            "center": s.zeros((steps, 2), dtype, "center"),
            "hidden": s.zeros((steps, N_HIDDEN), dtype, "hidden"),
            "act": s.zeros((steps, n_spr), dtype, "act"),
            "goal": s.ndarray(np.array(GOAL), npt, "goal"),
            "loss": s.zeros(1, dtype, "loss"),
            "anchor_a": s.ndarray(np.array([sp[0] for sp in springs], np.int32), name="anchor_a"),
            "anchor_b": s.ndarray(np.array([sp[1] for sp in springs], np.int32), name="anchor_b"),
            "spring_length": s.ndarray([sp[2] for sp in springs], npt, "spring_length"),
            "spring_stiffness": s.ndarray([sp[3] for sp in springs], npt, "spring_stiffness"),
            "spring_actuation": s.ndarray([sp[4] for sp in springs], npt, "spring_actuation"),
        }
        for name, value in host.items():
            self.arrays[name] = s.ndarray(value, npt, name)
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        if loop:
            # the step loop's resident kernel and its adjoint's made now, with the kernels: the
            # first iteration pays its launches, not their compiles (H100: 16 -> ~11 ms)
            self.s.prepare_loop(1, steps, self._step(True))

    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        center, nn1, nn2, springs, advance = (
            self.launcher(name, recorded)
            for name in ("compute_center", "nn1", "nn2", "apply_spring_force", "advance"))

        def step(t):
            center(t - 1)
            nn1(t - 1)
            nn2(t - 1)
            springs(t - 1)
            advance(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation from x[0], v[0] = 0: DiffTaichi's forward() (steps - 1 steps, then the
        loss at the last step). Asynchronous."""
        self.s.zero_many([self.arrays["v_inc"], self.arrays["loss"]])
        step = self._step(recorded)
        # One step loop rather than ~3,400 launches from Python: the session runs it as one
        # resident kernel (its ranges are small), and the tape's backward its adjoint likewise.
        self.step_loop(1, self.steps, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update: the gradient scaled to norm
        GRADIENT_CLIP. Returns the loss the forward computed."""
        # The capture's rework (the step loop as one resident kernel, ~18 ms) is installed by
        # the second or third iteration (H100: 38 ms, then 10, then 6 ms).
        loss = self.run_iteration(self.forward_backward)
        grads = self.gradients()
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
        scale = GRADIENT_CLIP / (norm + 1e-6)
        w = self.weights()
        self.set_weights({p: w[p] - scale * grads[p] for p in self.PARAMS})
        return loss

    def positions(self) -> np.ndarray:
        return self.arrays["x"].numpy()

    def actuations(self) -> np.ndarray:
        return self.arrays["act"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(sim: MassSpring, losses: Sequence[float], out: str) -> List[str]:
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
    ax.set_xlabel("iteration"), ax.set_ylabel("loss (-x of the head)")
    ax.set_title("mass_spring on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "mass_spring_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    x, act = sim.positions(), sim.actuations()
    last = sim.steps - 1
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.axhline(GROUND_HEIGHT, color="k", lw=2)
    for t in range(0, last, max(1, last // 6)):  # earlier poses
        for a, b, *_ in sim.springs:
            ax.plot(x[t, [a, b], 0], x[t, [a, b], 1], color="#ccc", lw=0.8)
    for k, (a, b, _, _, actuation) in enumerate(sim.springs):
        u = float(act[last - 1, k]) * 0.5 if actuation else 0.0
        color = (min(1, max(0, 0.5 + u)), min(1, max(0, 0.5 - abs(u))),
                 min(1, max(0, 0.5 - u))) if actuation else (0.13, 0.13, 0.13)
        ax.plot(x[last, [a, b], 0], x[last, [a, b], 1], color=color, lw=3 if actuation else 1.5)
    colors = ["#c33" if i == HEAD_ID else "#699" for i in range(len(sim.objects))]
    ax.scatter(x[last, :, 0], x[last, :, 1], c=colors, s=25, zorder=3)
    ax.set_aspect("equal")
    ax.set_title(f"step {last} after training (head in red)")
    fig.tight_layout()
    written.append(os.path.join(out, "mass_spring_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS)
    ap.add_argument("--robot", type=int, default=0, help="DiffTaichi's robot 0-3 (default 0)")
    ap.add_argument("--no-toi", action="store_true",
                    help="friction projection at the ground instead of time of impact")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = MassSpring(s, a.robot, a.steps, vkad.f64 if a.f64 else vkad.f32,
                         toi=not a.no_toi, seed=a.seed, graph=not a.no_graph)
        print(f"{s.device_name}: robot {a.robot} ({len(sim.objects)} masses, "
              f"{len(sim.springs)} springs), {a.steps} steps, {a.iters} iterations")
        losses = train(sim, a.iters, "mass_spring", bar_digits=4, line_digits=5,
                       profile=a.profile, session=s)
        final = sim.loss()
        moved = -final - sim.objects[HEAD_ID][0]  # the loss is -x of the head
        print(f"loss {losses[0]:.5f} -> {final:.5f} (the head moved {moved:+.4f})")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
