"""DiffTaichi's mass_spring_simple.py on vkad: three springs' rest lengths learn a triangle's area.

    python examples/difftaichi/mass_spring_simple.py          # 1024 steps, 25 iterations, f32

The scene, constants, loss and optimiser are those of DiffTaichi's examples/mass_spring_simple.py
(github.com/taichi-dev/difftaichi), its kernels `@vkad.kernel` functions written as DiffTaichi
writes them:

- three unit masses at (0.3, 0.5), (0.3, 0.4), (0.4, 0.4), at rest, joined by springs 0-1, 1-2
  (rest length 0.1) and 2-0 (0.1 sqrt 2), stiffness 10; x[t, i], v[t, i] and force[t, i]
  (2-vectors with a time axis); dt = 0.001, steps = 1024, damping 20;
- per step t = 1 .. steps - 1: apply_spring_force(t), each spring's force
  (|d| + 1e-4 - rest) k d / (|d| + 1e-4), d = x_a - x_b at step t - 1, added into force[t, b]
  and subtracted from force[t, a] (atomic adds); time_integrate(t), v[t] = exp(-dt damping)
  v[t - 1] + dt force[t] / mass, x[t] = x[t - 1] + dt v[t], and where that x is right of 0.4
  while moving right, the friction projection (the velocity's x zeroed, its y moved towards 0 by
  at most 0.01 of the x it had) on v[t] alone;
- the loss at the last step, (|area| - 0.1)^2 with area half the cross product of the
  triangle's edges from mass 0; gradient descent on the three rest lengths, learning rate 5,
  25 iterations.

What vkad does instead of Taichi's behaviour:
- DiffTaichi's clear_states() zeroes force and the gradients before each tape (Taichi's old
  ti.Tape did not); here forward() zeroes force (inside the tape's recording, so a replayed
  iteration zeroes it too) and the tape's backward() zeroes the gradients it accumulates.
- ti.Tape(loss) seeds d loss = 1 and runs the kernels' gradients in reverse; here a vkad.Tape
  records the step loop and compute_loss, and backward() (seed 1) runs the adjoints.
  compute_loss stores the loss, as DiffTaichi's does (no zeroing needed).
- DiffTaichi updates spring_length from Python scope in f64 and stores f32; here apply_grad runs
  on the device in the simulation's dtype (an ulp's difference at most).
- DiffTaichi draws every 256th step with OpenCV and writes videos for its initial and final
  forward; here, with matplotlib, mass_spring_simple_loss.png (DiffTaichi's plot) and
  mass_spring_simple_final.png (the triangle's first and last steps, before and after training)
  go into --out. DiffTaichi's forward('initial') before training is loss() here.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop):
its two kernels have no loops, so it rolls into one resident kernel forward and one backward.
The whole iteration (zeroing force, forward, backward, the update) is captured once as a graph
and replayed (--no-graph launches the kernels one by one; the results are the same). The
MassSpringSimple class is what tests/python/test_difftaichi_mass_spring_simple.py and
bench/difftaichi.py import.
"""

import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared parts)

# DiffTaichi's constants (examples/mass_spring_simple.py)
STEPS = 1024
ITERS = 25
DT = 0.001
MASS = 1.0
SPRING_STIFFNESS = 10.0
DAMPING = 20.0
FRICTION = 0.01
TARGET_AREA = 0.1
LEARNING_RATE = 5.0
OBJECTS = ((0.3, 0.5), (0.3, 0.4), (0.4, 0.4))
SPRINGS = ((0, 1, 0.1), (1, 2, 0.1), (2, 0, 0.1 * 2 ** 0.5))  # anchor a, anchor b, rest length
N_OBJECTS, N_SPRINGS = len(OBJECTS), len(SPRINGS)


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType):
    """DiffTaichi's kernels as @vkad.kernel functions, launched with step t, and its update."""
    vec = vkad.vec(2, ft)
    state = vkad.array(vec, ndim=2, grad=True)  # x[t, i], v[t, i], force[t, i]
    anchor = vkad.array(vkad.i32, ndim=1, readonly=True)
    lengths = vkad.array(ft, ndim=1, grad=True)  # spring_length, the trained array

    @vkad.kernel
    def apply_spring_force(t: vkad.i32, x: state, spring_anchor_a: anchor,
                           spring_anchor_b: anchor, spring_length: lengths, force: state):
        for i in range(N_SPRINGS):  # one spring per invocation, its ends' forces atomic adds
            a, b = spring_anchor_a[i], spring_anchor_b[i]
            d = x[t - 1, a] - x[t - 1, b]
            stretched = d.norm() + 1e-4
            f = (stretched - spring_length[i]) * SPRING_STIFFNESS * d / stretched
            force[t, a] -= f
            force[t, b] += f

    @vkad.kernel
    def time_integrate(t: vkad.i32, x: state, v: state, force: state):
        for i in range(N_OBJECTS):
            vel = math.exp(-DT * DAMPING) * v[t - 1, i] + DT * force[t, i] / MASS
            pos = x[t - 1, i] + DT * vel
            if pos[0] > 0.4 and vel[0] > 0:
                # friction projection: the x velocity stops, the y one loses up to
                # friction * (the x velocity it had); the position keeps this step's motion
                if vel[1] > 0:
                    vel[1] -= vkad.min(vel[1], FRICTION * vel[0])
                if vel[1] < 0:
                    vel[1] += vkad.min(-vel[1], FRICTION * vel[0])
                vel[0] = 0.0
            v[t, i] = vel
            x[t, i] = pos

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: state, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            e1, e2 = x[t, 0] - x[t, 1], x[t, 0] - x[t, 2]
            area = abs(0.5 * (e1[0] * e2[1] - e1[1] * e2[0]))  # the triangle's, by the cross
            loss[None] = (area - TARGET_AREA) ** 2

    @vkad.kernel
    def apply_grad(spring_length: vkad.array(ft, ndim=1),
                   spring_length_grad: vkad.array(ft, ndim=1, readonly=True)):
        for i in range(N_SPRINGS):  # DiffTaichi's update (not differentiated)
            spring_length[i] = spring_length[i] - LEARNING_RATE * spring_length_grad[i]

    return {"apply_spring_force": apply_spring_force, "time_integrate": time_integrate,
            "compute_loss": compute_loss}, apply_grad


class MassSpringSimple(Simulation):
    """The three masses, the springs and the differentiated simulation on one session.

    iteration() runs forward, backward and DiffTaichi's update and returns the loss (before the
    update); loss() the current rest lengths' loss; weights() / set_weights() the rest lengths
    (spring_length) as numpy. `seed` is accepted for the benchmarks' common interface and
    unused: DiffTaichi's scene has nothing random."""

    PARAMS = ("spring_length",)
    NAME = "mass_spring_simple"

    def __init__(self, session: vkad.Session, steps: int = STEPS, dtype: vkad.DType = vkad.f32,
                 seed: int = 0, graph: bool = True, loop: bool = True):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        super().__init__(session, dtype, graph)
        self.steps, self.loop = steps, loop  # loop: the step loop through Session.loop
        kernels, apply_grad = build_kernels(dtype)
        self.kernels = {name: session.differentiate(k) for name, k in kernels.items()}
        npt = vkad.numpy_dtype(dtype)
        s = session
        x0 = np.zeros((steps, N_OBJECTS, 2))
        x0[0] = OBJECTS
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.ndarray(x0, npt, "x"),
            "v": s.zeros((steps, N_OBJECTS, 2), dtype, "v"),  # v[0] = 0: nothing writes it
            "force": s.zeros((steps, N_OBJECTS, 2), dtype, "force"),
            "spring_anchor_a": s.ndarray(np.array([a for a, _, _ in SPRINGS], np.int32),
                                         name="spring_anchor_a"),
            "spring_anchor_b": s.ndarray(np.array([b for _, b, _ in SPRINGS], np.int32),
                                         name="spring_anchor_b"),
            "spring_length": s.ndarray(np.array([r for _, _, r in SPRINGS]), npt,
                                       "spring_length"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()
        self.tape = s.tape()
        self._apply_grad = self.bind_update(s.compile(apply_grad))
        if loop:  # the step loop's resident kernel and its adjoint's made now, with the kernels
            self.s.prepare_loop(1, steps, self._step(True))

    def _step(self, recorded: bool):
        """DiffTaichi's loop body, step t (symbolic inside Session.loop, which traces it once)."""
        springs = self.launcher("apply_spring_force", recorded)
        integrate = self.launcher("time_integrate", recorded)

        def step(t):
            springs(t)
            integrate(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """DiffTaichi's forward(): force zeroed (its clear_states()), then apply_spring_force(t)
        and time_integrate(t) for t = 1 .. steps - 1, then the loss at the last step.
        Asynchronous."""
        self.s.zero(self.arrays["force"])
        step = self._step(recorded)
        if self.loop:
            self.s.loop(1, self.steps, step)
        else:
            for t in range(1, self.steps):
                step(t)
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's update (rate 5) on the device. Returns the
        loss the forward computed."""
        return self.run_iteration(self.forward_backward, self._apply_grad)

    def positions(self) -> np.ndarray:
        """x[t, i] of the last simulation."""
        return self.arrays["x"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(losses: Sequence[float], before: np.ndarray, after: np.ndarray, out: str) -> List[str]:
    """DiffTaichi's loss plot, and the triangle at its first and last steps before and after
    training; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(losses)
    ax.set_title("Spring Rest Length Optimization")
    ax.set_xlabel("Gradient descent iterations"), ax.set_ylabel("Loss")
    fig.tight_layout()
    written.append(os.path.join(out, "mass_spring_simple_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4, 4))
    ax.set_facecolor((216 / 255,) * 3)  # DiffTaichi's background
    for x, style, label in ((before, ":", "before"), (after, "-", "after")):
        for t, alpha in ((0, 0.4), (-1, 1.0)):
            tri = np.vstack([x[t], x[t][:1]])
            ax.plot(tri[:, 0], tri[:, 1], style, color="#33BF7A", alpha=alpha, lw=2,
                    label=f"{label}, step {t % len(x)}")
            ax.plot(x[t][:, 0], x[t][:, 1], "o", color="#3D4D40", alpha=alpha)
    ax.axvline(0.4, color="#888888", lw=0.8)  # the friction projection's wall
    ax.set_aspect("equal"), ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(os.path.join(out, "mass_spring_simple_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS, seed=False)
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = MassSpringSimple(s, a.steps, vkad.f64 if a.f64 else vkad.f32,
                               graph=not a.no_graph, loop=not a.no_loop)
        print(f"{s.device_name}: {a.steps} steps, {a.iters} iterations")
        first = sim.loss()  # DiffTaichi's forward('initial')
        before = sim.positions()
        losses = train(sim, a.iters, "mass_spring_simple", profile=a.profile, session=s)
        final = sim.loss()  # DiffTaichi's forward('final')
        lengths = sim.weights()["spring_length"]
        print(f"loss {first:.6g} -> {final:.6g}; rest lengths "
              + ", ".join(f"{r:.5f}" for r in lengths))
        for path in plot(losses + [final], before, sim.positions(), a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
