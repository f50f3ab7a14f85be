"""DiffTaichi's electric.py on vkad: a controller charges 8 electrodes to steer a particle.

    python examples/difftaichi/electric.py --iters 200        # 512 steps, f32

The physics, parameters and optimisation loop are those of DiffTaichi's examples/electric.py
(github.com/taichi-dev/difftaichi), its kernels `@vkad.kernel` functions written as DiffTaichi
writes them:

- one particle, x[t] and v[t] (2-vectors with a time axis), in the field of 8 electrodes at
  fixed positions (pad 0.1 from the unit square's corners and edges' midpoints) whose charges
  gravitation[t, i] in [-1, 1] a controller sets every step; dt = 0.03, damping 0.2, K = 1e-3;
- per step t = 1 .. steps - 1 (steps = 512): nn1(t), 8 inputs (the particle's position and
  velocity, the goal's position and velocity) -> 64 tanh hidden units; nn2(t) -> 8 tanh charges;
  advance(t), the force sum over the electrodes of K q r / max(|r|, 0.1)^3, v[t] = v[t-1]
  exp(-dt damping) + dt force, x[t] = x[t-1] + dt v[t]; compute_loss(t) adds dt |x[t] - goal[t]|^2
  into the rank-0 loss (an atomic add);
- DiffTaichi's initialize(), every iteration: a new goal path, straight segments of seg_size =
  256 steps between steps / seg_size + 1 random points in [0.2, 0.8]^2 (goal[t], and goal_v[t]
  the segment's direction), and x[0] = the first point, v[0] = 0;
- weight1 and weight2 uniform in +-0.15 (random.random(), drawn in DiffTaichi's order from
  random.Random(seed)), biases 0; plain gradient descent with learning rate 2e-2 on the four
  arrays (DiffTaichi's update, a kernel here).

What vkad does instead of Taichi's behaviour:
- DiffTaichi's nn1(t) reads x[t] and v[t], which advance(t) writes after it: in Taichi those
  are the previous simulation's values left in the reused fields (0 in the first), and the
  tape's adjoint of nn1 reads them again after the forward overwrote them, so the controller's
  input and its gradient come from different trajectories (and the input's gradient is added
  to x.grad[t] after advance's adjoint used it). Here nn1(t) reads x[t - 1] and v[t - 1], the
  state advance(t) starts from: the controller sees the particle it steers, and the gradient is
  the loss's exact gradient (the tests compare it with central differences).
- ti.ad.Tape(loss) zeroes the loss and every gradient, seeds d loss = 1 and runs the kernels'
  gradients in reverse; here the loss is zeroed with the forward, a vkad.Tape records the step
  loop, and backward() (seed 1) zeroes the gradients and runs the adjoints. x[0] = goal[0]
  (DiffTaichi's `x[0] = points[0]`) is a kernel off the tape (no parameter depends on it).
- The random goal path is drawn in Python and uploaded before each iteration's graph replay
  (DiffTaichi writes goal and goal_v element by element from Python scope). DiffTaichi also
  draws a list of 10 `tasks` at import that nothing reads; it is left out. DiffTaichi's update
  runs in Python scope in f64; here apply_grad runs on the device in the simulation's dtype.
- DiffTaichi allocates max_steps = 2048 rows and trains for 200,000 iterations, showing the
  particle in a GUI and printing the summed loss every 200; here the arrays have `steps` rows,
  --iters defaults to 200, and with matplotlib electric_loss.png and electric_final.png (the
  last path against its goal) go into --out. `--same-task` keeps the first goal path for every
  iteration (not in DiffTaichi: a loss curve that shows the training rather than the tasks).

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop).
The whole iteration (zeroing, initialize, forward, backward, the update) is captured once as a
graph and replayed (--no-graph launches the kernels one by one; the results are the same). The
Electric class is what tests/python/test_difftaichi_electric.py and bench/difftaichi_ports.py
import.
"""

import math
import os
import random
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)
from vkad import Vector

# DiffTaichi's constants (examples/electric.py)
STEPS = 512
SEG_SIZE = 256
DAMPING = 0.2
N_GRAVITATION = 8
N_HIDDEN = 64
DT = 0.03
LEARNING_RATE = 2e-2
K = 1e-3
PAD = 0.1
GRAVITATION_POSITION = ((PAD, PAD), (PAD, 1 - PAD), (1 - PAD, 1 - PAD), (1 - PAD, PAD),
                        (0.5, 1 - PAD), (0.5, PAD), (PAD, 0.5), (1 - PAD, 0.5))


def init_weights(rng: random.Random) -> Dict[str, np.ndarray]:
    """DiffTaichi's __main__: weight1[i, j] (8 x 64) then weight2 (64 x 8) uniform in +-0.15,
    biases 0."""
    w1 = [[(rng.random() - 0.5) * 0.3 for j in range(N_HIDDEN)] for i in range(8)]
    w2 = [[(rng.random() - 0.5) * 0.3 for j in range(N_GRAVITATION)] for i in range(N_HIDDEN)]
    return dict(weight1=np.array(w1), bias1=np.zeros(N_HIDDEN), weight2=np.array(w2),
                bias2=np.zeros(N_GRAVITATION))


def task(rng: random.Random, steps: int = STEPS,
         seg_size: int = SEG_SIZE) -> Tuple[np.ndarray, np.ndarray]:
    """DiffTaichi's initialize(): the goal path goal[t] and goal_v[t], (steps, 2) float64 each,
    through steps // seg_size + 1 random points (rows past the last whole segment stay 0, as
    DiffTaichi leaves them); x[0] is goal[0], the first point."""
    segments = steps // seg_size
    points = [[0.2 + rng.random() * 0.6, 0.2 + rng.random() * 0.6] for i in range(segments + 1)]
    goal, goal_v = np.zeros((steps, 2)), np.zeros((steps, 2))
    for i in range(segments):
        a, b = np.array(points[i]), np.array(points[i + 1])
        for j in range(steps // segments):
            k = steps // segments * i + j
            goal[k] = (1 - j / seg_size) * a + j / seg_size * b  # lerp
            goal_v[k] = b - a
    return goal, goal_v


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType):
    """DiffTaichi's kernels as @vkad.kernel functions, launched with step t; the loops over the
    inputs, hidden units and electrodes are unrolled (vkad.static, DiffTaichi's ti.static)."""
    vec = vkad.vec(2, ft)
    path = vkad.array(vec, ndim=1, grad=True)          # x[t], v[t]
    goals = vkad.array(vec, ndim=1, readonly=True)     # goal[t], goal_v[t]
    field = vkad.array(ft, ndim=2, grad=True)          # hidden[t, i], gravitation[t, i], weights
    row = vkad.array(ft, ndim=1, grad=True)            # biases

    @vkad.kernel
    def initialize(x: vkad.array(vec, ndim=1), goal: goals):
        for _ in range(1):
            x[0] = goal[0]  # DiffTaichi: x[0] = points[0]

    @vkad.kernel
    def nn1(t: vkad.i32, x: path, v: path, goal: goals, goal_v: goals, weight1: field,
            bias1: row, hidden: field):
        for i in range(N_HIDDEN):
            p, u, g, gv = x[t - 1], v[t - 1], goal[t], goal_v[t]  # DiffTaichi: x[t], v[t]
            act = 0.0
            act += (p[0] - 0.5) * weight1[0, i]
            act += (p[1] - 0.5) * weight1[1, i]
            act += u[0] * weight1[2, i]
            act += u[1] * weight1[3, i]
            act += (g[0] - 0.5) * weight1[4, i]
            act += (g[1] - 0.5) * weight1[5, i]
            act += (gv[0] - 0.5) * weight1[6, i]
            act += (gv[1] - 0.5) * weight1[7, i]
            act += bias1[i]
            hidden[t, i] = vkad.tanh(act)

    @vkad.kernel
    def nn2(t: vkad.i32, hidden: field, weight2: field, bias2: row, gravitation: field):
        for i in range(N_GRAVITATION):
            act = 0.0
            for j in vkad.static(range(N_HIDDEN)):
                act += hidden[t, j] * weight2[j, i]
            act += bias2[i]
            gravitation[t, i] = vkad.tanh(act)

    @vkad.kernel
    def advance(t: vkad.i32, x: path, v: path, gravitation: field):
        for _ in range(1):  # DiffTaichi: "parallelize this loop"
            gravitational_force = Vector([0.0, 0.0])
            for i in vkad.static(range(N_GRAVITATION)):  # "instead of this one"
                r = x[t - 1] - Vector(GRAVITATION_POSITION[i])
                len_r = vkad.max(r.norm(), 1e-1)
                gravitational_force += K * gravitation[t, i] / (len_r * len_r * len_r) * r
            new_v = v[t - 1] * math.exp(-DT * DAMPING) + DT * gravitational_force
            v[t] = new_v
            x[t] = x[t - 1] + DT * new_v

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: path, goal: goals, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] += DT * (x[t] - goal[t]).norm_sqr()  # DiffTaichi's ti.atomic_add

    weights = vkad.array(ft, ndim=2)
    weights_grad = vkad.array(ft, ndim=2, readonly=True)
    biases = vkad.array(ft, ndim=1)
    biases_grad = vkad.array(ft, ndim=1, readonly=True)

    @vkad.kernel
    def apply_grad(weight1: weights, weight1_grad: weights_grad, bias1: biases,
                   bias1_grad: biases_grad, weight2: weights, weight2_grad: weights_grad,
                   bias2: biases, bias2_grad: biases_grad):
        # DiffTaichi's update: each array -= learning_rate * its gradient (not differentiated)
        for i, j in vkad.ndrange(8, N_HIDDEN):
            weight1[i, j] = weight1[i, j] - weight1_grad[i, j] * LEARNING_RATE
        for j in range(N_HIDDEN):
            bias1[j] = bias1[j] - bias1_grad[j] * LEARNING_RATE
        for i, j in vkad.ndrange(N_HIDDEN, N_GRAVITATION):
            weight2[i, j] = weight2[i, j] - weight2_grad[i, j] * LEARNING_RATE
        for j in range(N_GRAVITATION):
            bias2[j] = bias2[j] - bias2_grad[j] * LEARNING_RATE

    return {"nn1": nn1, "nn2": nn2, "advance": advance,
            "compute_loss": compute_loss}, initialize, apply_grad


class Electric(Simulation):
    """The particle, the electrodes, the controller and the differentiated simulation on one
    session.

    iteration() draws a goal path (DiffTaichi's initialize; the same one with same_task), runs
    forward, backward and DiffTaichi's update, and returns the loss (before the update); loss()
    the current weights' loss on the current path; weights() / set_weights() the controller as
    numpy; set_task(goal, goal_v) another path."""

    PARAMS = ("weight1", "bias1", "weight2", "bias2")
    NAME = "electric"

    def __init__(self, session: vkad.Session, steps: int = STEPS, dtype: vkad.DType = vkad.f32,
                 seed: int = 0, graph: bool = True, loop: bool = True,
                 seg_size: int = SEG_SIZE, same_task: bool = False):
        if steps < 2 or seg_size < 1:
            raise ValueError(f"steps={steps}, seg_size={seg_size}: the simulation needs at "
                             "least 2 steps and the goal path segments of at least 1")
        seg_size = min(seg_size, steps)  # a run shorter than a segment: one segment
        super().__init__(session, dtype, graph)
        self.steps = steps
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        self.seg_size, self.same_task, self._iterations = seg_size, same_task, 0
        kernels, initialize, apply_grad = build_kernels(dtype)
        self.kernels = {name: session.differentiate(k) for name, k in kernels.items()}
        self.rng = random.Random(seed)  # DiffTaichi: the unseeded `random` module
        npt = vkad.numpy_dtype(dtype)
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.zeros((steps, 2), dtype, "x"),
            "v": s.zeros((steps, 2), dtype, "v"),  # v[0] stays 0: nothing writes it
            "hidden": s.zeros((steps, N_HIDDEN), dtype, "hidden"),
            "gravitation": s.zeros((steps, N_GRAVITATION), dtype, "gravitation"),
            "goal": s.zeros((steps, 2), dtype, "goal"),
            "goal_v": s.zeros((steps, 2), dtype, "goal_v"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        for name, value in init_weights(self.rng).items():
            self.arrays[name] = s.ndarray(value, npt, name)
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.set_task(*task(self.rng, steps, seg_size))
        self.tape = s.tape()
        self._initialize = s.bind(s.compile(initialize), x=self.arrays["x"],
                                  goal=self.arrays["goal"])
        self._apply_grad = self.bind_update(s.compile(apply_grad))
        if loop:  # the step loop's resident kernel and its adjoint's made now, with the kernels
            self.s.prepare_loop(1, steps, self._step(True))

    def set_task(self, goal: np.ndarray, goal_v: np.ndarray) -> None:
        """The goal path, uploaded (x[0] = goal[0] at the next forward)."""
        self.task = (np.asarray(goal, np.float64), np.asarray(goal_v, np.float64))
        for name, value in zip(("goal", "goal_v"), self.task):
            self.arrays[name].upload(np.asarray(value, vkad.numpy_dtype(self.dtype)))

    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        nn1, nn2, advance, compute_loss = (
            self.launcher(name, recorded) for name in ("nn1", "nn2", "advance", "compute_loss"))

        def step(t):
            nn1(t)
            nn2(t)
            advance(t)
            compute_loss(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation: DiffTaichi's forward() (steps - 1 steps, each adding to the loss) from
        x[0] = goal[0]. Asynchronous."""
        self.s.zero(self.arrays["loss"])  # ti.ad.Tape(loss) zeroes the loss
        self._initialize()
        step = self._step(recorded)
        self.step_loop(1, self.steps, step)

    def iteration(self) -> float:
        """DiffTaichi's initialize() (a new goal path, unless same_task), forward and backward,
        then its update (rate 2e-2) on the device. Returns the loss the forward computed."""
        if self._iterations and not self.same_task:  # the first uses the constructor's path
            self.set_task(*task(self.rng, self.steps, self.seg_size))
        self._iterations += 1
        return self.run_iteration(self.forward_backward, self._apply_grad)  # update off the tape

    def positions(self) -> np.ndarray:
        """x[t] of the last simulation."""
        return self.arrays["x"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(sim: Electric, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve and the last path against its goal; [] without matplotlib."""
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
    ax.set_xlabel("iteration"), ax.set_ylabel("loss (dt * sum |x - goal|^2)")
    ax.set_title("electric on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "electric_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    x, goal = sim.positions(), sim.task[0]
    charge = sim.arrays["gravitation"].numpy()[-1]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.set_facecolor("#3C733F")  # DiffTaichi's background
    for (px, py), q in zip(GRAVITATION_POSITION, charge):  # DiffTaichi: radius (q + 1) * 30
        ax.add_patch(plt.Circle((px, py), 0.01 + 0.02 * (q + 1), color="#ccaa44"))
    ax.plot(goal[:, 0], goal[:, 1], color="#3344cc", lw=1.5, label="goal")
    ax.plot(x[:, 0], x[:, 1], color="#F20530", lw=1.5, label="particle")
    ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal"), ax.legend(loc="upper right")
    ax.set_title(f"the last iteration's path ({sim.steps} steps)")
    fig.tight_layout()
    written.append(os.path.join(out, "electric_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=200)
    ap.add_argument("--seg-size", type=int, default=SEG_SIZE,
                    help=f"steps per segment of the goal path (default {SEG_SIZE})")
    ap.add_argument("--same-task", action="store_true",
                    help="train on one goal path instead of a new one per iteration")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = Electric(s, a.steps, vkad.f64 if a.f64 else vkad.f32, seed=a.seed,
                       graph=not a.no_graph, loop=not a.no_loop, seg_size=a.seg_size,
                       same_task=a.same_task)
        print(f"{s.device_name}: {a.steps} steps, {a.iters} iterations"
              + (", one goal path" if a.same_task else ""))
        losses = train(sim, a.iters, "electric", profile=a.profile, session=s)
        final = sim.loss()
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f} (the last path, with "
              "the last update)")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
