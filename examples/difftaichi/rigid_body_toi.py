"""DiffTaichi's rigid_body_toi.py on vkad: a bouncing ball's gradient with and without time of impact.

    python examples/difftaichi/rigid_body_toi.py            # the scan, naive and +TOI, f32
    python examples/difftaichi/rigid_body_toi.py --zoom     # DiffTaichi's `rigid_body_toi.py 1`

The scene, constants and scan are those of DiffTaichi's examples/rigid_body_toi.py
(github.com/taichi-dev/difftaichi), the "misc" gradient demo of its paper: a ball thrown down
onto the ground bounces elastically, and the loss -- the ball's height at the last step -- is
differentiated with respect to its starting height. Without time of impact the bounce happens at
a step boundary, so d loss / d y0 is +1 (every step is a translation) while the loss, over a
wider range, falls with y0 (slope -1); with time of impact the step that crosses the ground is
split at the impact and the gradient is the loss's true one, -1.

- one object (n_objects = 1), x[t, i] and v[t, i] (2-vectors with a time axis); dt = 0.002,
  steps = 204, ground at y = 0.1; the ball starts at x0 = (0.7, 0.5 + dy) with v0 = (-1, -2);
- per step t = 1 .. steps - 1, advance(t): naive (advance_no_toi) reflects v_y when the ball is
  below the ground and falling, then x[t] = x[t - 1] + dt v[t]; with time of impact
  (advance_toi), when the step would end below the ground while falling, v_y is reflected and
  the ball moves with the old velocity for toi = (ground - y) / v_y and the new one for the
  rest of the step;
- the loss: loss[None] = x[steps - 1, 0].y (DiffTaichi's compute_loss; its commented-out
  distance to goal = (0.9, 0.15) is left out with it);
- DiffTaichi's main(): for naive and then +TOI, for dy in 0, 0.02, ... 0.28 (with an argument,
  --zoom here: 0.26 .. 0.3 in steps of 1e-4), one taped forward and backward, recording the loss
  and x.grad[0, 0].y; a plot of both against the starting height.

What vkad does instead of Taichi's behaviour, and what DiffTaichi leaves open:
- DiffTaichi writes x[0, 0] and v[0, 0] from Python scope before each tape; here the start is
  two rank-0 arrays, init_x and init_v, uploaded before each evaluation, and initialize() (on the
  tape) copies them into row 0, so d loss / d init_x is DiffTaichi's x.grad[0, 0] (and
  d loss / d init_v its v.grad[0, 0]).
- ti.Tape(loss) zeroes the gradients and seeds d loss = 1; here a vkad.Tape records initialize,
  the step loop and compute_loss, and backward() (seed 1) zeroes the gradients and runs the
  adjoints. compute_loss stores the loss (DiffTaichi zeroes it first; a store needs no zeroing).
- DiffTaichi allocates max_steps = 4096 rows for a video at twice the steps; the GUI and the
  video are left out, and the arrays have `steps` rows.
- DiffTaichi has no optimiser (it declares learning_rate = 1.0 and never uses it): its program is
  the scan. So iteration(), what the training loop and bench/difftaichi.py's race call, is one
  point of that scan -- the next starting height, a taped forward and backward -- and returns
  the loss; nothing is updated. main() runs DiffTaichi's scan, naive and then +TOI, and with
  matplotlib writes rigid_body_toi_scan.png (the loss and, unzoomed, the gradient, as DiffTaichi
  plots them) into --out.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop);
advance has no loop, so it rolls into one resident kernel forward and one backward. The scan
point's launches (initialize, the rolled loop, compute_loss, their adjoints) are captured once as
a graph and replayed for every later point, the start uploaded before each replay (--no-graph
launches the kernels one by one; the results are the same). The RigidBodyTOI class is what
tests/python/test_difftaichi_rigid_body_toi.py and bench/difftaichi.py import.
"""

import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)

# DiffTaichi's constants (examples/rigid_body_toi.py)
STEPS = 204
DT = 0.002
N_OBJECTS = 1
GROUND_HEIGHT = 0.1
INIT_X = (0.7, 0.5)  # x0 = (0.7, 0.5 + dy)
INIT_V = (-1.0, -2.0)


def offsets(zoom: bool = False) -> np.ndarray:
    """DiffTaichi's scan of dy: np.arange(0, 0.3, 0.02), or with zoom np.arange(0.26, 0.3,
    1e-4) (its float64 values, so the starts are DiffTaichi's to the last bit)."""
    return np.arange(0.26, 0.3, 0.0001) if zoom else np.arange(0, 0.3, 0.02)


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, toi: bool):
    """DiffTaichi's kernels as @vkad.kernel functions: initialize (the start into row 0),
    advance(t) (advance_toi or advance_no_toi), compute_loss(t)."""
    vec = vkad.vec(2, ft)
    state = vkad.array(vec, ndim=2, grad=True)  # x[t, i], v[t, i]
    start = vkad.array(vec, ndim=0, grad=True)  # init_x, init_v

    @vkad.kernel
    def initialize(init_x: start, init_v: start, x: state, v: state):
        for i in range(N_OBJECTS):  # DiffTaichi: x[0, 0] = [...], v[0, 0] = [...] from Python
            x[0, i] = init_x[None]
            v[0, i] = init_v[None]

    @vkad.kernel
    def advance_toi(t: vkad.i32, x: state, v: state):
        for i in range(N_OBJECTS):
            prev_x, prev_v = x[t - 1, i], v[t - 1, i]
            vel = prev_v
            toi = 0.0  # the time into the step at which the ball meets the ground
            if (prev_x + DT * prev_v)[1] < GROUND_HEIGHT and prev_v[1] < 0:
                vel[1] = -vel[1]  # an elastic bounce
                toi = -(prev_x[1] - GROUND_HEIGHT) / prev_v[1]
            v[t, i] = vel
            # the old velocity until the impact, the reflected one for the rest of the step
            x[t, i] = prev_x + toi * prev_v + (DT - toi) * vel

    @vkad.kernel
    def advance_no_toi(t: vkad.i32, x: state, v: state):
        for i in range(N_OBJECTS):
            vel = v[t - 1, i]
            if x[t - 1, i][1] < GROUND_HEIGHT and vel[1] < 0:
                vel[1] = -vel[1]  # bounce once already below the ground: no time of impact
            v[t, i] = vel
            x[t, i] = x[t - 1, i] + DT * vel

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: state, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] = x[t, 0][1]  # the ball's height at step t

    return {"initialize": initialize, "advance": advance_toi if toi else advance_no_toi,
            "compute_loss": compute_loss}


class RigidBodyTOI(Simulation):
    """The ball, the ground and the differentiated simulation on one session.

    evaluate(dy) runs one point of DiffTaichi's scan (start (0.7, 0.5 + dy), velocity (-1, -2),
    forward and backward on the tape) and returns the loss; gradients() then gives d loss /
    d init_x and d init_v (DiffTaichi's x.grad[0, 0] is init_x's). iteration() evaluates the
    scan's next point (cycling through offsets(zoom)). weights() / set_weights(): the start,
    init_x and init_v (the next evaluate() sets its own). `seed` is accepted for the benchmarks'
    common interface and unused: DiffTaichi's scene has nothing random."""

    PARAMS = ("init_x", "init_v")
    NAME = "rigid_body_toi"

    def __init__(self, session: vkad.Session, steps: int = STEPS, dtype: vkad.DType = vkad.f32,
                 toi: bool = True, seed: int = 0, graph: bool = True, loop: bool = True,
                 zoom: bool = False):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        super().__init__(session, dtype, graph)
        self.steps, self.toi = steps, toi
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        self.offsets, self._next = offsets(zoom), 0
        self.kernels = {name: session.differentiate(k)
                        for name, k in build_kernels(dtype, toi).items()}
        s = session
        shape = (steps, N_OBJECTS, 2)
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.zeros(shape, dtype, "x"),
            "v": s.zeros(shape, dtype, "v"),
            "init_x": s.zeros(2, dtype, "init_x"),
            "init_v": s.zeros(2, dtype, "init_v"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.set_start(0.0)
        self.tape = s.tape()
        if loop:  # the step loop's resident kernel and its adjoint's made now, with the kernels
            self.s.prepare_loop(1, steps, self._step(True))

    def set_start(self, dy: float, init_v: Sequence[float] = INIT_V) -> None:
        """The ball's start, (0.7, 0.5 + dy) moving at init_v, uploaded for the next forward."""
        npt = vkad.numpy_dtype(self.dtype)
        self.start = (np.array([INIT_X[0], INIT_X[1] + dy]), np.array(init_v, np.float64))
        self.arrays["init_x"].upload(self.start[0].astype(npt))
        self.arrays["init_v"].upload(self.start[1].astype(npt))

    def _step(self, recorded: bool):
        advance = self.launcher("advance", recorded)

        def step(t):
            advance(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """DiffTaichi's forward(): advance(t) for t = 1 .. steps - 1 from the uploaded start,
        then the loss at step steps - 1. Asynchronous."""
        self.launcher("initialize", recorded)()
        step = self._step(recorded)
        self.step_loop(1, self.steps, step)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def evaluate(self, dy: float) -> float:
        """One point of DiffTaichi's scan: the start (0.7, 0.5 + dy), forward and backward --
        captured as a graph the first time and replayed after (unless graph=False). Returns the
        loss; gradients() the gradient."""
        self.set_start(dy)
        return self.run_iteration(self.forward_backward)

    def iteration(self) -> float:
        """The scan's next point (offsets(zoom), from dy = 0, cycling): evaluate(dy)."""
        dy = float(self.offsets[self._next % len(self.offsets)])
        self._next += 1
        return self.evaluate(dy)

    def positions(self) -> np.ndarray:
        """x[t, i] of the last simulation."""
        return self.arrays["x"].numpy()


# --- the program ---------------------------------------------------------------------------------

def scan(sim: RigidBodyTOI) -> Tuple[np.ndarray, List[float], List[float]]:
    """DiffTaichi's main() loop for one mode: (starting heights 0.5 + dy, losses, d loss / d y0)
    over sim.offsets."""
    losses, grads = [], []
    for dy in sim.offsets:
        losses.append(sim.evaluate(float(dy)))
        grads.append(float(sim.gradients()["init_x"][1]))
    return INIT_X[1] + sim.offsets, losses, grads


def plot(curves, zoom: bool, out: str) -> List[str]:
    """DiffTaichi's figure: the loss (and, unzoomed, the gradient) against the starting height
    for each mode; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(4, 3))
    for toi, (y0, losses, grads) in curves:
        suffix = " (+TOI)" if toi else " (Naive)"
        ax.plot(y0, losses, "-" if zoom else ":" if toi else ".", label="Loss" + suffix)
        if not zoom:
            ax.plot(y0, grads, label="Gradient" + suffix)
    ax.set_title("The Effect of Time of Impact on Gradients")
    ax.set_xlabel("Initial y")
    ax.legend(loc="lower left" if not zoom else "best", fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, "rigid_body_toi_scan.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=0, seed=False)
    ap.add_argument("--zoom", action="store_true",
                    help="DiffTaichi's zoomed scan (dy 0.26 .. 0.3 in steps of 1e-4)")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        dtype = vkad.f64 if a.f64 else vkad.f32
        print(f"{s.device_name}: {a.steps} steps, {len(offsets(a.zoom))} starting heights")
        curves = []
        for toi in (False, True):  # DiffTaichi's order
            sim = RigidBodyTOI(s, a.steps, dtype, toi=toi, graph=not a.no_graph,
                               loop=not a.no_loop, zoom=a.zoom)
            y0, losses, grads = scan(sim)
            curves.append((toi, (y0, losses, grads)))
            name = "+TOI " if toi else "naive"
            print(f"{name}: loss {losses[0]:.6f} .. {losses[-1]:.6f} over y0 {y0[0]:.4f} .. "
                  f"{y0[-1]:.4f}; d loss / d y0 from {min(grads):+.4f} to {max(grads):+.4f} "
                  f"(the loss's slope over the scan {np.polyfit(y0, losses, 1)[0]:+.4f})")
            if a.iters:  # --iters N: the race's iterations (more points of the scan), timed
                train(sim, a.iters, f"rigid_body_toi ({name.strip()})", profile=a.profile,
                      session=s)
        for path in plot(curves, a.zoom, a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
