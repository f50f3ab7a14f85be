"""DiffTaichi's billiards.py on vkad: the cue ball's start learns to send the target ball to a goal.

    python examples/difftaichi/billiards.py --iters 50        # 11 balls, 1024 steps, f32

The physics, parameters and optimisation loop are those of DiffTaichi's examples/billiards.py
(github.com/taichi-dev/difftaichi), written in its idiom with vkad's Python front door:

- 1 + 10 balls (a rack of billiard_layers = 4 layers), radius 0.03, elasticity 0.8,
  dt = 0.003, steps = 1024; ball k of layer i (j = 0 .. i) starts at
  (0.5 + 2 r i, 0.5 + 2 r j - 0.7 r i) at rest; the cue ball (ball 0) at init_x = (0.1, 0.5)
  with init_v = (0.3, 0);
- state with a time axis, x[t, i] and v[t, i] (2-vectors), and per step the collision kernel's
  outputs x_inc[t + 1, i] and impulse[t + 1, i]; for t = 1 .. steps - 1: collide(t - 1),
  advance(t);
- collide(t): for each ball i and every other ball j, the positions one step ahead,
  dist = (x_i + dt v_i) - (x_j + dt v_j); where |dist| < 2 r and the balls approach along
  dir = dist / |dist| (projected_v = dir . (v_i - v_j) < 0): the impulse
  -(1 + elasticity) / 2 projected_v dir, and the time of impact
  toi = (|dist| - 2 r) / min(-1e-3, projected_v), which moves the ball by
  min(toi - dt, 0) * impulse (x_inc);
- advance(t): v[t] = v[t-1] + impulse[t], x[t] = x[t-1] + dt v[t] + x_inc[t];
- the loss, the squared distance of the target ball (the last, n_balls - 1) from the goal
  (0.9, 0.75) at the last step; gradient descent with learning rate 0.01 on init_x and init_v
  (DiffTaichi's update, a kernel here), 200 iterations.

What vkad does instead of Taichi's behaviour:
- DiffTaichi's collide has two loops, `for j in range(i)` and `for j in range(i + 1, n)`, each
  adding the pair's contribution into x_inc[t + 1, i] and impulse[t + 1, i] with `+=` (an
  atomic add into fields clear() zeroed before the tape). Here the j loop is unrolled at build
  time (ti.static: 10 pairs per ball, with `kb.if_(i != j)` for the runtime test), the
  contributions are summed in a local in the same order (j ascending) and stored once: the same
  sums, bit for bit, and no clear() (every row a step reads is stored by the step before).
  Unrolled, the kernels have no loops, so the step loop rolls into one resident kernel on
  every device (lavapipe rolls no kernel with loops) and their adjoints need no stacks.
- DiffTaichi's newer file runs ti.init(flatten_if=True): its autodiff then made the branches
  selects (both sides evaluated). Here the branches stay branches (kb.if_), and the adjoint
  reverses the path the forward took; the gradients are the same (the untaken side of each
  branch is finite in DiffTaichi: min(-1e-3, projected_v) < 0, and j != i).
- DiffTaichi's advance reads back v[t, i] after storing it; here the stored value is reused.
- The rack's positions are written by forward() from Python into x[0, 1..] in DiffTaichi; here
  they are uploaded once at construction (no kernel writes row 0 but initialize, which writes
  ball 0 alone), and v[0, 1..] stays 0 as in DiffTaichi.
- DiffTaichi allocates max_steps = 2048 rows (for its `scan` and videos); the loss is at row
  steps - 1 either way. Here the arrays have `steps` rows and the GUI is left out; with
  matplotlib, billiards_loss.png and billiards_final.png (the balls' paths) go into --out.
  `--scan ZOOM` is DiffTaichi's `python billiards.py ZOOM`: the loss over 1000 angles of the
  cue's velocity (billiards_scan.png).
- ti.Tape(loss) zeroes the gradients, seeds d loss = 1 and runs the kernels' gradients in
  reverse; here the loss is zeroed with the forward, a vkad.Tape records initialize, the step
  loop and compute_loss, and backward() (seed 1) zeroes the gradients and runs the adjoints.
- DiffTaichi's update runs in Python scope in f64 and stores the result in the f32 field;
  here apply_grad runs on the device in the simulation's dtype (an ulp's difference at most).

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop):
its launches (11 balls, two kernels per step) roll into one resident kernel forward and one
backward. The whole iteration (zeroing, forward, backward, the update) is captured once as a
graph and replayed (--no-graph launches the kernels one by one; the results are the same). The
Billiards class is what tests/python/test_difftaichi_billiards.py and bench/difftaichi_ports.py
import. One iteration is 7 launches (initialize, the rolled loop, compute_loss, their three
adjoints, apply_grad) and the fills that zero the loss and the gradients and seed d loss.

On lavapipe, --f64 at the default 1024 steps needs --no-loop: lavapipe has no f64 atomic add,
so each of the adjoint's atomic adds is a compare-and-swap loop, and the rolled adjoint loop
(1023 steps x ~79 such loops per invocation) passes lavapipe's 65,535 loop passes per
invocation, which vkad refuses (docs/reference.md, "Loop limit on lavapipe"); a GPU has no limit.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)
from vkad import Vector

# DiffTaichi's constants (examples/billiards.py)
STEPS = 1024
BILLIARD_LAYERS = 4
GOAL = (0.9, 0.75)
RADIUS = 0.03
ELASTICITY = 0.8
DT = 0.003
LEARNING_RATE = 0.01
INIT_X = (0.1, 0.5)
INIT_V = (0.3, 0.0)


def n_balls(layers: int = BILLIARD_LAYERS) -> int:
    """The cue ball and a triangular rack of `layers` layers."""
    return 1 + (1 + layers) * layers // 2


def rack(layers: int = BILLIARD_LAYERS) -> np.ndarray:
    """The rack's balls 1 .. n - 1 (DiffTaichi's forward()): (n - 1, 2), float64."""
    return np.array([[i * 2 * RADIUS + 0.5, j * 2 * RADIUS + 0.5 - i * RADIUS * 0.7]
                     for i in range(layers) for j in range(i + 1)], np.float64).reshape(-1, 2)


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n: int, target_ball: int) -> Dict[str, vkad.KernelBuilder]:
    """DiffTaichi's kernels, one KernelBuilder each; collide, advance and compute_loss take the
    step t (an i32 parameter)."""
    kernels = {}

    def array(kb, name, rank, element=(2,), grad=True):
        return kb.ndarray(name, ft, rank, grad=grad, readonly=not grad, element=element)

    kb = vkad.KernelBuilder("initialize")
    init_x, init_v = array(kb, "init_x", 0), array(kb, "init_v", 0)
    x, v = array(kb, "x", 2), array(kb, "v", 2)
    with kb.parallel_for("cue", 0, 1):
        x[0, 0] = init_x[None]
        v[0, 0] = init_v[None]
    kernels["initialize"] = kb

    kb = vkad.KernelBuilder("collide")
    t = kb.scalar("t", vkad.i32)
    x, v = array(kb, "x", 2), array(kb, "v", 2)
    x_inc, impulse = array(kb, "x_inc", 2), array(kb, "impulse", 2)
    with kb.parallel_for("balls", 0, n) as i:
        imp = kb.local(Vector.zero(2, ft))  # the sums of the pairs' contributions
        inc = kb.local(Vector.zero(2, ft))
        xi, vi = x[t, i], v[t, i]
        for j in range(n):  # DiffTaichi's two j loops, in their order; unrolled (ti.static)
            with kb.if_(i != j):  # collide_pair(t, i, j)
                dist = (xi + DT * vi) - (x[t, j] + DT * v[t, j])
                dist_norm = dist.norm()
                rela_v = vi - v[t, j]
                with kb.if_(dist_norm < 2 * RADIUS):
                    direction = dist.normalized()
                    projected_v = direction.dot(rela_v)
                    with kb.if_(projected_v < 0.0):
                        pair_imp = -(1 + ELASTICITY) * 0.5 * projected_v * direction
                        toi = (dist_norm - 2 * RADIUS) / vkad.min(-1e-3, projected_v)
                        imp += pair_imp
                        inc += vkad.min(toi - DT, 0.0) * pair_imp
        x_inc[t + 1, i] = inc.value
        impulse[t + 1, i] = imp.value
    kernels["collide"] = kb

    kb = vkad.KernelBuilder("advance")
    t = kb.scalar("t", vkad.i32)
    x, v = array(kb, "x", 2), array(kb, "v", 2)
    x_inc, impulse = array(kb, "x_inc", 2), array(kb, "impulse", 2)
    with kb.parallel_for("balls", 0, n) as i:
        new_v = v[t - 1, i] + impulse[t, i]
        v[t, i] = new_v
        x[t, i] = x[t - 1, i] + DT * new_v + x_inc[t, i]
    kernels["advance"] = kb

    kb = vkad.KernelBuilder("compute_loss")
    t = kb.scalar("t", vkad.i32)
    x, loss = array(kb, "x", 2), array(kb, "loss", 0, element=())
    with kb.parallel_for("loss", 0, 1):
        p = x[t, target_ball]
        # DiffTaichi: loss[None] = (x - goal_x) ** 2 + (y - goal_y) ** 2
        loss.atomic_add(None, (p[0] - GOAL[0]) ** 2 + (p[1] - GOAL[1]) ** 2)
    kernels["compute_loss"] = kb
    return kernels


def build_apply_grad(ft: vkad.DType) -> vkad.KernelBuilder:
    """DiffTaichi's update: init_x -= learning_rate * init_x.grad, init_v likewise (not
    differentiated)."""
    kb = vkad.KernelBuilder("apply_grad")
    params = [(kb.ndarray(p, ft, 0, element=(2,)),
               kb.ndarray(p + "_grad", ft, 0, element=(2,), readonly=True))
              for p in ("init_x", "init_v")]
    with kb.parallel_for("update", 0, 1):
        for value, grad in params:
            value[None] = value[None] - LEARNING_RATE * grad[None]
    return kb


class Billiards(Simulation):
    """The table, the rack and the differentiated simulation on one session.

    forward() launches one simulation (on the tape when recording); iteration() runs one
    training iteration (forward, backward, DiffTaichi's update) and returns its loss (before
    the update); loss() the current loss; weights() / set_weights() the cue ball's init_x and
    init_v as numpy. `seed` is accepted for the benchmarks' common interface and unused:
    DiffTaichi starts from fixed values."""

    PARAMS = ("init_x", "init_v")
    NAME = "billiards"

    def __init__(self, session: vkad.Session, steps: int = STEPS, dtype: vkad.DType = vkad.f32,
                 seed: int = 0, graph: bool = True, loop: bool = True,
                 layers: int = BILLIARD_LAYERS, init_x: Sequence[float] = INIT_X,
                 init_v: Sequence[float] = INIT_V):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        if layers < 1:
            raise ValueError(f"layers={layers}: the rack needs at least 1 layer")
        super().__init__(session, dtype, graph)
        self.steps = steps
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        self.layers, self.n_balls = layers, n_balls(layers)
        self.target_ball = self.n_balls - 1
        kbs = build_kernels(dtype, self.n_balls, self.target_ball)
        self.kernels = {name: session.differentiate(kb) for name, kb in kbs.items()}
        self.apply_grad_kernel = session.compile(build_apply_grad(dtype))
        npt = vkad.numpy_dtype(dtype)
        shape = (steps, self.n_balls, 2)
        x0 = np.zeros(shape)
        x0[0, 1:] = rack(layers)
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.ndarray(x0, npt, "x"),
            "v": s.zeros(shape, dtype, "v"),
            "x_inc": s.zeros(shape, dtype, "x_inc"),
            "impulse": s.zeros(shape, dtype, "impulse"),
            "init_x": s.ndarray(np.array(init_x, np.float64), npt, "init_x"),
            "init_v": s.ndarray(np.array(init_v, np.float64), npt, "init_v"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        self._apply_grad = self.bind_update(self.apply_grad_kernel)
        # loop=True: the step loop said as one (Session.loop); its two 1-d launches of n_balls
        # invocations roll into one resident kernel, made here with its adjoint's (and the
        # tape's check of the loop), so the first iteration pays no compile for them.
        if loop:
            self.s.prepare_loop(1, steps, self._step(True))

    # launches
    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        collide, advance = self.launcher("collide", recorded), self.launcher("advance", recorded)

        def step(t):
            collide(t - 1)
            advance(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """One simulation: DiffTaichi's forward() (initialize, then collide(t - 1), advance(t)
        for t = 1 .. steps - 1, then the loss at the last step). Asynchronous."""
        self.s.zero(self.arrays["loss"])  # ti.Tape(loss) zeroes the loss
        self.launcher("initialize", recorded)()
        step = self._step(recorded)
        self.step_loop(1, self.steps, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update (rate 0.01) on the device. Returns the
        loss the forward computed."""
        return self.run_iteration(self.forward_backward, self._apply_grad)  # update off the tape

    def positions(self) -> np.ndarray:
        """x[t, i] of the last simulation."""
        return self.arrays["x"].numpy()


# --- the program ---------------------------------------------------------------------------------

def scan(sim: Billiards, zoom: float, n: int = 1000) -> Tuple[List[float], List[float]]:
    """DiffTaichi's scan(zoom): the loss for n angles of the cue's velocity (speed 0.3) within
    +-zoom * 90 degrees, from init_x = (0.1, 0.5). Returns (degrees, losses)."""
    angles, losses = [], []
    for k in range(n):
        alpha = ((k + 0.5) / n - 0.5) * math.pi * zoom
        sim.set_weights({"init_x": INIT_X, "init_v": (0.3 * math.cos(alpha),
                                                      0.3 * math.sin(alpha))})
        losses.append(sim.loss())
        angles.append(math.degrees(alpha))
    return angles, losses


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(sim: Billiards, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve and the balls' paths in the last simulation; [] without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(losses)
    ax.set_xlabel("iteration"), ax.set_ylabel("loss (squared distance to the goal)")
    ax.set_title("billiards on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "billiards_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    x = sim.positions()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.set_facecolor("#3C733F")  # DiffTaichi's table
    for i in range(sim.n_balls):
        color = "#CCCCCC" if i == 0 else "#3344CC" if i == sim.target_ball else "#F20530"
        ax.plot(x[:, i, 0], x[:, i, 1], color=color, lw=0.8, alpha=0.6)
        ax.add_patch(plt.Circle(tuple(x[-1, i]), RADIUS, color=color))
    ax.add_patch(plt.Circle(GOAL, RADIUS / 2, color="black"))
    ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal")
    ax.set_title(f"step {sim.steps - 1} (cue grey, target blue, goal black)")
    fig.tight_layout()
    written.append(os.path.join(out, "billiards_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=200, seed=False)
    ap.add_argument("--layers", type=int, default=BILLIARD_LAYERS,
                    help=f"layers of the rack (default {BILLIARD_LAYERS}: 10 balls)")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    ap.add_argument("--scan", type=float, default=None, metavar="ZOOM",
                    help="DiffTaichi's scan: the loss over 1000 cue angles in +-ZOOM*90 degrees")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = Billiards(s, a.steps, vkad.f64 if a.f64 else vkad.f32, graph=not a.no_graph,
                        loop=not a.no_loop, layers=a.layers)
        print(f"{s.device_name}: {sim.n_balls} balls, {a.steps} steps, "
              + (f"scan zoom {a.scan}" if a.scan is not None else f"{a.iters} iterations"))
        if a.scan is not None:
            angles, losses = scan(sim, a.scan)
            best = int(np.argmin(losses))
            print(f"lowest loss {losses[best]:.6f} at {angles[best]:+.3f} degrees")
            plt = _pyplot()
            if plt is not None:
                os.makedirs(a.out, exist_ok=True)
                fig, ax = plt.subplots(figsize=(5, 3))
                ax.plot(angles, losses)
                ax.set_title("Billiard Scene Objective")
                ax.set_ylabel("Objective"), ax.set_xlabel("Angle of velocity")
                fig.tight_layout()
                path = os.path.join(a.out, "billiards_scan.png")
                fig.savefig(path, dpi=120)
                plt.close(fig)
                print(f"wrote {path}")
            return 0
        losses = train(sim, a.iters, "billiards", profile=a.profile,
                       session=s)
        final = sim.loss()
        w = sim.weights()
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f} (init_x "
              f"{w['init_x'][0]:.4f}, {w['init_x'][1]:.4f}; init_v {w['init_v'][0]:.4f}, "
              f"{w['init_v'][1]:.4f})")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
