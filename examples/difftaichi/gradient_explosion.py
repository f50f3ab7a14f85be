"""DiffTaichi's gradient_explosion.py on vkad: without damping, gradients grow with the steps.

    python examples/difftaichi/gradient_explosion.py            # 1000 steps at most, f32
    python examples/difftaichi/gradient_explosion.py --large    # DiffTaichi's `... 1`: 10,000

The program, constants and scan are those of DiffTaichi's examples/gradient_explosion.py
(github.com/taichi-dev/difftaichi), the gradient-explosion figure of its paper, its kernels
`@vkad.kernel` functions written as DiffTaichi writes them (top-level statements: one serial
invocation, as in a Taichi kernel):

- a point on a line, x[t] and v[t] (scalars with a time axis), from rest; dt = 0.001;
  advance(t): v[t] = damping v[t - 1] + a, x[t] = x[t - 1] + dt v[t], with a = 1 and damping =
  exp(-dt alpha) in 0-d arrays (DiffTaichi's root-placed scalars); compute_loss(t): loss = x[t];
- DiffTaichi's gradient(alpha, num_steps): advance(1 .. num_steps - 1) and compute_loss(num_steps
  - 1) on a tape; for alpha = 0, 1, 3, 10 and num_steps = 0, 50, .. 950 (--large: .. 9950), a
  plot against num_steps. Without damping (alpha = 0) the value grows as dt num_steps^2 / 2; with
  it, linearly at most.

What vkad does instead of Taichi's behaviour, and what DiffTaichi leaves open:
- DiffTaichi's gradient() returns loss[None], the loss, and plots it as "Gradient": x is linear
  in a from rest, so with a = 1 the loss equals d loss / d a. Here evaluate() returns the loss
  and gradients() the tape's d loss / d a (and d loss / d damping); the scan plots the
  gradient, and the tests check that it equals the loss.
- DiffTaichi's num_steps = 0 reads x[-1], outside its field (Taichi does not check without its
  debug mode); here the loss is then read at x[0], 0, as at num_steps = 1.
- ti.Tape(loss) zeroes the gradients and seeds d loss = 1; here a vkad.Tape records the step loop
  and compute_loss, and backward() (seed 1) zeroes the gradients and runs the adjoints. DiffTaichi
  writes damping and a from Python scope before each tape; here they are uploaded.
- DiffTaichi allocates max_timesteps = 2^20 rows; here the arrays have the scan's longest
  num_steps rows (1000, or 10,000 with --large). DiffTaichi has no optimiser for this program:
  iteration(), what the training loop and bench/difftaichi.py's race call, is one evaluation at
  `steps` (the next alpha of the four), nothing updated. With matplotlib,
  gradient_explosion_scan.png (DiffTaichi's figure) goes into --out.

The step loop is said as one (Session.loop) and prepared at construction for `steps`. DiffTaichi's
kernels are top-level statements, a serial task each in vkad as in Taichi; the loop of them rolls
into one resident kernel each way (docs/graphs.md, "Resident step loops"). Each evaluation's
launches are captured once per num_steps as a graph and replayed for the other alphas, damping
uploaded before each replay (--no-graph launches the kernels one by one; the results are the
same). The GradientExplosion class is what tests/python/test_difftaichi_gradient_explosion.py and
bench/difftaichi.py import.
"""

import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared parts)

# DiffTaichi's constants (examples/gradient_explosion.py)
DT = 0.001
ALPHAS = (0, 1, 3, 10)
STEPS = 1000  # the scan's num_steps run over range(0, STEPS, 50); --large: 10,000
LARGE_STEPS = 10000
STRIDE = 50


def num_steps_scan(steps: int = STEPS) -> range:
    """DiffTaichi's num_steps: range(0, 1000, 50), or with its argument range(0, 10000, 50)."""
    return range(0, steps, STRIDE)


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType):
    """DiffTaichi's advance(t) and compute_loss(t) as @vkad.kernel functions."""
    path = vkad.array(ft, ndim=1, grad=True)   # x[t], v[t]
    value = vkad.array(ft, ndim=0, grad=True)  # a, damping, loss

    @vkad.kernel
    def advance(t: vkad.i32, x: path, v: path, a: value, damping: value):
        speed = damping[None] * v[t - 1] + a[None]
        v[t] = speed
        x[t] = x[t - 1] + DT * speed  # DiffTaichi reads v[t] back

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: path, loss: value):
        loss[None] = x[t]

    return {"advance": advance, "compute_loss": compute_loss}


class GradientExplosion(Simulation):
    """The point, its two parameters and the differentiated simulation on one session.

    evaluate(alpha, num_steps) runs DiffTaichi's gradient(alpha, num_steps) (damping =
    exp(-dt alpha), a = 1, the taped forward and backward) and returns the loss; gradients()
    then gives d loss / d a and d loss / d damping. iteration() evaluates at num_steps = `steps`
    for the next of the four alphas. `steps` is the arrays' length, the longest num_steps.
    `seed` is accepted for the benchmarks' common interface and unused."""

    PARAMS = ("a", "damping")
    NAME = "gradient_explosion"

    def __init__(self, session: vkad.Session, steps: int = STEPS, dtype: vkad.DType = vkad.f32,
                 seed: int = 0, graph: bool = True, loop: bool = True,
                 alphas: Sequence[float] = ALPHAS):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        super().__init__(session, dtype, graph)
        self.steps, self.loop, self.alphas = steps, loop, tuple(alphas)
        self.length = steps  # the num_steps of the next forward
        self._graphs: Dict[int, vkad.Graph] = {}  # one captured evaluation per num_steps
        self._next = 0
        self.kernels = {name: session.differentiate(k)
                        for name, k in build_kernels(dtype).items()}
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.zeros(steps, dtype, "x"),  # x[0] = v[0] = 0: nothing writes them
            "v": s.zeros(steps, dtype, "v"),
            "a": s.zeros(1, dtype, "a"),
            "damping": s.zeros(1, dtype, "damping"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.tape = s.tape()
        self.set_alpha(self.alphas[0])
        # loop: the step loop (and its adjoint) made now, with the kernels. rolled: whether it
        # runs as one resident kernel -- not for advance's serial task (see the docstring).
        self.rolled = loop and self.s.prepare_loop(1, steps, self._step(True))

    def set_alpha(self, alpha: float) -> None:
        """DiffTaichi's damping[None] = exp(-dt alpha), a[None] = 1, uploaded."""
        self.alpha = alpha
        self.set_weights({"a": [1.0], "damping": [math.exp(-DT * alpha)]})

    def _step(self, recorded: bool):
        advance = self.launcher("advance", recorded)

        def step(t):
            advance(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """advance(t) for t = 1 .. length - 1, then compute_loss(length - 1) (x[0] for length
        0). Asynchronous."""
        n = self.length
        step = self._step(recorded)
        if self.loop and n > 1:
            self.s.loop(1, n, step)
        else:
            for t in range(1, n):
                step(t)
        self.launcher("compute_loss", recorded)(max(n - 1, 0))

    def evaluate(self, alpha: float, num_steps: Optional[int] = None) -> float:
        """DiffTaichi's gradient(alpha, num_steps) (num_steps None: `steps`): the taped forward
        and backward, each num_steps captured once as a graph and replayed. Returns the loss
        (which, a being 1, equals d loss / d a); gradients() the gradient."""
        n = self.steps if num_steps is None else num_steps
        if not 0 <= n <= self.steps:
            raise ValueError(f"num_steps={n}: the arrays hold {self.steps} steps")
        self.set_alpha(alpha)
        self.length = n
        self._graph = self._graphs.get(n)  # run_iteration replays it, or captures a new one
        loss = self.run_iteration(self.forward_backward)
        if self._graph is not None:
            self._graphs[n] = self._graph
        return loss

    def iteration(self) -> float:
        """evaluate(alpha, steps) for the next alpha of the four (cycling)."""
        alpha = self.alphas[self._next % len(self.alphas)]
        self._next += 1
        return self.evaluate(alpha)


# --- the program ---------------------------------------------------------------------------------

def scan(sim: GradientExplosion, steps: int) -> Dict[float, Tuple[List[int], List[float]]]:
    """DiffTaichi's figure's data: for each alpha, (num_steps, d loss / d a) over
    num_steps_scan(steps)."""
    curves = {}
    for alpha in sim.alphas:
        xs, ys = [], []
        for n in num_steps_scan(steps):
            sim.evaluate(alpha, n)
            xs.append(n)
            ys.append(float(sim.gradients()["a"][0]))
        curves[alpha] = (xs, ys)
    return curves


def plot(curves, large: bool, out: str) -> List[str]:
    """DiffTaichi's figure; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3))
    for alpha, (xs, ys) in curves.items():
        ax.plot(xs, ys, label=f"damping={alpha}")
    ax.set_title("Gradient Explosion without Damping")
    ax.set_ylabel("Gradient"), ax.set_xlabel("Time steps")
    ax.legend()
    if large:
        ax.set_ylim(0, 3000)
    fig.tight_layout()
    path = os.path.join(out, "gradient_explosion_scan.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=0, seed=False)
    ap.add_argument("--large", action="store_true",
                    help=f"DiffTaichi's larger scan, num_steps up to {LARGE_STEPS}")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    steps = LARGE_STEPS if a.large else a.steps
    with open_session(a) as s:
        sim = GradientExplosion(s, steps, vkad.f64 if a.f64 else vkad.f32,
                                graph=not a.no_graph, loop=not a.no_loop)
        print(f"{s.device_name}: num_steps 0 .. {num_steps_scan(steps)[-1]} by {STRIDE}, "
              f"alpha {', '.join(map(str, sim.alphas))}")
        curves = scan(sim, steps)
        for alpha, (xs, ys) in curves.items():
            print(f"alpha {alpha:>2}: d loss / d a at num_steps {xs[-1]}: {ys[-1]:.4f}")
        if a.iters:  # --iters N: the race's iterations (evaluations at --steps), timed
            train(sim, a.iters, "gradient_explosion", profile=a.profile, session=s)
        for path in plot(curves, a.large, a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
