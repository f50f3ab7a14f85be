"""DiffTaichi's rigid_body_discountinuity.py on vkad: a box lands; its loss jumps with its angle.

    python examples/difftaichi/rigid_body_discontinuity.py     # the scan, friction 0 and 1, f32

The scene, constants and scan are those of DiffTaichi's examples/rigid_body_discountinuity.py
(github.com/taichi-dev/difftaichi; also examples/misc/; the file name's spelling is DiffTaichi's,
the port's is corrected), a figure of its paper: a square box thrown down and left lands on the
ground on a corner or, near angle 0, on two at once, and where it ends up -- the loss -- jumps
as the starting angle crosses 0, so its gradient there says nothing about the loss's change.

- one box (n_objects = 1) of half size (0.1, 0.1), unit density (inverse mass 1 / (4 w h),
  inverse inertia from the box's second moment: initialize_properties); x[t, i], v[t, i]
  (2-vectors), rotation[t, i], omega[t, i] with a time axis; dt = 2e-4, steps = 2048, gravity 0,
  damping 0, the ground at y = 0.1 with elasticity 0.3 and a penalty of 1e4;
- per step t = 1 .. steps - 1: collide(t - 1) -- each of the 4 corners below the ground and
  moving into it gets a normal impulse -(1 + e) v_n / K_n and, where that is positive, a friction
  impulse clamped to the friction cone (coefficient friction[None]), plus a penalty impulse
  proportional to its depth; the impulses go, as atomic adds, into v_inc[t] and omega_inc[t] --
  then advance(t) (velocities plus increments, positions and angle integrated);
- the loss: the box's x at the last step;
- DiffTaichi's main(): for friction 0 and then 1, for i = -20 .. 19, the start (0.7, 0.5) at
  (-1, -2), angle (i + 0.5) 1e-3 rad, one taped forward and backward; a plot of the loss against
  the angle in degrees for both, and the gradient d loss / d omega[0] printed.

What vkad does instead of Taichi's behaviour, and what DiffTaichi leaves open:
- DiffTaichi's compute_loss reads x[t, head_id] with head_id = 3 (a leftover of rigid_body.py)
  although there is one object. The Taichi the file was written for indexed a dense axis of size
  1 with 0 bits, so every index read object 0, and its plot (losses 0.2 .. 0.55) is object 0's x;
  the port reads object 0. (Today's Taichi does not check the index without debug mode and reads
  another row's memory.)
- DiffTaichi writes x[0, 0], v[0, 0], rotation[0, 0] and halfsize[0] from Python scope before
  each tape; here the start is rank-0 arrays (init_x, init_v, init_rotation, init_omega) and
  halfsize, uploaded before each evaluation, and initialize() (on the tape, with
  initialize_properties) copies the start into row 0, so d loss / d init_omega is DiffTaichi's
  omega.grad[0, 0]. clear_states() is a zeroing of v_inc and omega_inc inside the recording.
- advance reuses the velocity and angular velocity it stores (DiffTaichi reads v[t, i] back; a
  vkad task may not read what it stored, docs/kernels.md). DiffTaichi's `exp(-dt damping)` and
  gravity (both 0 here) are kept as written.
- DiffTaichi allocates max_steps = 4096 rows for a video at twice the steps; the GUI and the
  video are left out, and the arrays have `steps` rows.
- DiffTaichi has no optimiser (learning_rate = 1.0 is never used): its program is the scan. So
  iteration(), what the training loop and bench/difftaichi.py's race call, is one point of it
  -- the next (friction, angle), a taped forward and backward -- and returns the loss; nothing is
  updated. main() runs the scan and with matplotlib writes rigid_body_discontinuity_scan.png
  (DiffTaichi's figure) into --out.

The step loop is said as one (Session.loop) and prepared at construction (Session.prepare_loop):
collide and advance have no loops, so it rolls into one resident kernel forward and one backward.
A scan point's launches are captured once as a graph and replayed for every later point, the
start and friction uploaded before each replay (--no-graph launches the kernels one by one).
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

# DiffTaichi's constants (examples/rigid_body_discountinuity.py)
STEPS = 2048
DT = 2e-4
N_OBJECTS = 1
ELASTICITY = 0.3
GROUND_HEIGHT = 0.1
GRAVITY = 0.0  # DiffTaichi: 0 (its -9.8 commented out)
PENALTY = 1e4
DAMPING = 0.0
HALFSIZE = (0.1, 0.1)
INIT_X = (0.7, 0.5)
INIT_V = (-1.0, -2.0)
FRICTIONS = (0.0, 1.0)


def angles() -> np.ndarray:
    """DiffTaichi's starting angles: (i + 0.5) * 0.001 rad for i = -20 .. 19."""
    return (np.arange(-20, 20) + 0.5) * 0.001


def scan_points() -> List[Tuple[float, float]]:
    """DiffTaichi's scan, in its order: (friction, angle) for friction 0, then 1."""
    return [(f, float(r)) for f in FRICTIONS for r in angles()]


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType):
    """DiffTaichi's kernels as @vkad.kernel functions: initialize (its initialize_properties, and
    the start into row 0), collide(t), advance(t), compute_loss(t)."""
    vec = vkad.vec(2, ft)
    vectors = vkad.array(vec, ndim=2, grad=True)   # x[t, i], v[t, i], v_inc[t, i]
    scalars = vkad.array(ft, ndim=2, grad=True)    # rotation[t, i], omega[t, i], omega_inc[t, i]
    body = vkad.array(ft, ndim=1, grad=True)       # inverse_mass[i], inverse_inertia[i]
    point = vkad.array(vec, ndim=0, grad=True)     # init_x, init_v
    number = vkad.array(ft, ndim=0, grad=True)     # init_rotation, init_omega

    @vkad.func
    def cross(a, b):
        return a[0] * b[1] - a[1] * b[0]

    @vkad.kernel
    def initialize(halfsize: vkad.array(vec, ndim=1, grad=True), inverse_mass: body,
                   inverse_inertia: body, init_x: point, init_v: point, init_rotation: number,
                   init_omega: number, x: vectors, v: vectors, rotation: scalars,
                   omega: scalars):
        for i in range(N_OBJECTS):
            hs = halfsize[i]
            inverse_mass[i] = 1.0 / (4 * hs[0] * hs[1])
            inverse_inertia[i] = 1.0 / (4 / 3 * hs[0] * hs[1] * (hs[0] * hs[0] + hs[1] * hs[1]))
            # DiffTaichi writes these from Python scope before its tape
            x[0, i] = init_x[None]
            v[0, i] = init_v[None]
            rotation[0, i] = init_rotation[None]
            omega[0, i] = init_omega[None]

    @vkad.kernel
    def collide(t: vkad.i32, halfsize: vkad.array(vec, ndim=1, grad=True), inverse_mass: body,
                inverse_inertia: body, friction: vkad.array(ft, ndim=0, readonly=True),
                x: vectors, v: vectors, rotation: scalars, omega: scalars, v_inc: vectors,
                omega_inc: scalars):
        for i in range(N_OBJECTS):
            hs = halfsize[i]
            rot = rotation[t, i]
            c, s = vkad.cos(rot), vkad.sin(rot)
            for k in vkad.static(range(4)):
                f = friction[None]
                # the corner, and its position and velocity in the world (DiffTaichi's to_world)
                local = Vector([(k % 2 * 2 - 1) * hs[0], (k // 2 % 2 * 2 - 1) * hs[1]])
                rela_pos = Vector([c * local[0] - s * local[1], s * local[0] + c * local[1]])
                corner_x = x[t, i] + rela_pos
                corner_v = v[t, i] + omega[t, i] * Vector([-rela_pos[1], rela_pos[0]])
                corner_v = corner_v + DT * GRAVITY * Vector([0.0, 1.0])
                normal = Vector([0.0, 1.0])
                tao = Vector([1.0, 0.0])
                rn = cross(rela_pos, normal)
                rt = cross(rela_pos, tao)
                impulse_contribution = inverse_mass[i] + rn ** 2 * inverse_inertia[i]
                timpulse_contribution = inverse_mass[i] + rt ** 2 * inverse_inertia[i]
                rela_v_ground = normal.dot(corner_v)
                impulse = 0.0
                timpulse = 0.0
                if rela_v_ground < 0 and corner_x[1] < GROUND_HEIGHT:
                    impulse = -(1 + ELASTICITY) * rela_v_ground / impulse_contribution
                    if impulse > 0:  # friction, within the cone
                        timpulse = -corner_v.dot(tao) / timpulse_contribution
                        timpulse = min(f * impulse, max(-f * impulse, timpulse))
                if corner_x[1] < GROUND_HEIGHT:  # the penalty: no sinking
                    impulse = impulse - DT * PENALTY * (
                        corner_x[1] - GROUND_HEIGHT) / impulse_contribution
                # DiffTaichi's apply_impulse, into step t + 1's increments
                j = impulse * normal + timpulse * tao
                v_inc[t + 1, i] += j * inverse_mass[i]
                omega_inc[t + 1, i] += cross(corner_x - x[t, i], j) * inverse_inertia[i]

    @vkad.kernel
    def advance(t: vkad.i32, x: vectors, v: vectors, rotation: scalars, omega: scalars,
                v_inc: vectors, omega_inc: scalars):
        for i in range(N_OBJECTS):
            s = math.exp(-DT * DAMPING)
            new_v = s * v[t - 1, i] + v_inc[t, i] + DT * GRAVITY * Vector([0.0, 1.0])
            new_omega = s * omega[t - 1, i] + omega_inc[t, i]
            v[t, i] = new_v
            x[t, i] = x[t - 1, i] + DT * new_v
            omega[t, i] = new_omega
            rotation[t, i] = rotation[t - 1, i] + DT * new_omega

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: vectors, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] = x[t, 0][0]  # DiffTaichi's x[t, head_id][0]: object 0 (the docstring)

    return {"initialize": initialize, "collide": collide, "advance": advance,
            "compute_loss": compute_loss}


class RigidBodyDiscontinuity(Simulation):
    """The box, the ground and the differentiated simulation on one session.

    evaluate(angle, friction) runs one point of DiffTaichi's scan (forward and backward on the
    tape) and returns the loss; gradients() then gives d loss / d the start (init_omega's is
    DiffTaichi's omega.grad[0, 0]). iteration() evaluates the scan's next point (cycling through
    scan_points()). `seed` is accepted for the benchmarks' common interface and unused."""

    PARAMS = ("init_x", "init_v", "init_rotation", "init_omega")
    NAME = "rigid_body_discontinuity"

    def __init__(self, session: vkad.Session, steps: int = STEPS, dtype: vkad.DType = vkad.f32,
                 seed: int = 0, graph: bool = True, loop: bool = True):
        if steps < 2:
            raise ValueError(f"steps={steps}: the simulation needs at least 2 steps")
        super().__init__(session, dtype, graph)
        self.steps = steps
        self.loop = loop  # the step loop through Session.loop; False: a Python loop of launches
        self.points, self._next = scan_points(), 0
        self.kernels = {name: session.differentiate(k) for name, k in build_kernels(dtype).items()}
        s, npt = session, vkad.numpy_dtype(dtype)
        vectors, scalars = (steps, N_OBJECTS, 2), (steps, N_OBJECTS)
        self.arrays: Dict[str, vkad.NdArray] = {
            "x": s.zeros(vectors, dtype, "x"),
            "v": s.zeros(vectors, dtype, "v"),
            "rotation": s.zeros(scalars, dtype, "rotation"),
            "omega": s.zeros(scalars, dtype, "omega"),
            "v_inc": s.zeros(vectors, dtype, "v_inc"),
            "omega_inc": s.zeros(scalars, dtype, "omega_inc"),
            "halfsize": s.ndarray(np.array([HALFSIZE]), npt, "halfsize"),
            "inverse_mass": s.zeros(N_OBJECTS, dtype, "inverse_mass"),
            "inverse_inertia": s.zeros(N_OBJECTS, dtype, "inverse_inertia"),
            "friction": s.zeros(1, dtype, "friction"),
            "init_x": s.zeros(2, dtype, "init_x"),
            "init_v": s.zeros(2, dtype, "init_v"),
            "init_rotation": s.zeros(1, dtype, "init_rotation"),
            "init_omega": s.zeros(1, dtype, "init_omega"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        self.lazy_grad()  # DiffTaichi's ti.root.lazy_grad(): with the arrays, not in a backward
        self.set_start(*self.points[0])
        self.tape = s.tape()
        if loop:  # the step loop's resident kernel and its adjoint's made now, with the kernels
            self.s.prepare_loop(1, steps, self._step(True))

    def set_start(self, friction: float, angle: float, init_x: Sequence[float] = INIT_X,
                  init_v: Sequence[float] = INIT_V, omega: float = 0.0) -> None:
        """The box's start and the ground's friction, uploaded for the next forward."""
        self.start = {"init_x": np.array(init_x, np.float64),
                      "init_v": np.array(init_v, np.float64),
                      "init_rotation": np.array([angle]), "init_omega": np.array([omega])}
        self.set_weights(dict(self.start, friction=np.array([friction])))

    def _step(self, recorded: bool):
        collide, advance = (self.launcher(k, recorded) for k in ("collide", "advance"))

        def step(t):
            collide(t - 1)
            advance(t)
        return step

    def forward(self, recorded: bool = True) -> None:
        """DiffTaichi's clear_states() and forward(): the increments zeroed, initialize, then
        collide(t - 1), advance(t) for t = 1 .. steps - 1 and the loss at step steps - 1.
        Asynchronous."""
        a = self.arrays
        self.s.zero_many([a["v_inc"], a["omega_inc"]])
        self.launcher("initialize", recorded)()
        self.step_loop(1, self.steps, self._step(recorded))
        self.launcher("compute_loss", recorded)(self.steps - 1)

    def evaluate(self, angle: float, friction: float) -> float:
        """One point of DiffTaichi's scan: the start at `angle` with `friction`, forward and
        backward -- captured as a graph the first time and replayed after (unless graph=False).
        Returns the loss; gradients() the gradient."""
        self.set_start(friction, angle)
        return self.run_iteration(self.forward_backward)

    def iteration(self) -> float:
        """The scan's next point (scan_points(), cycling): evaluate(angle, friction)."""
        friction, angle = self.points[self._next % len(self.points)]
        self._next += 1
        return self.evaluate(angle, friction)

    def state(self) -> Dict[str, np.ndarray]:
        """x, v, rotation and omega of object 0 at every step of the last simulation."""
        return {k: self.arrays[k].numpy()[:, 0] for k in ("x", "v", "rotation", "omega")}


# --- the program ---------------------------------------------------------------------------------

def scan(sim: RigidBodyDiscontinuity, friction: float) -> Tuple[List[float], List[float]]:
    """DiffTaichi's main() loop for one friction: (losses, d loss / d omega[0]) over angles()."""
    losses, grads = [], []
    for angle in angles():
        losses.append(sim.evaluate(float(angle), friction))
        grads.append(float(sim.gradients()["init_omega"][0]))
    return losses, grads


def plot(curves, out: str) -> List[str]:
    """DiffTaichi's figure: the loss against the starting angle in degrees, per friction; []
    without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3))
    degrees = np.degrees(angles())
    for friction, losses in curves:
        ax.plot(degrees, losses, "x", label=f"coeff of friction={friction:g}")
    ax.legend()
    ax.set_ylim(0.2, 0.55)
    ax.set_title("Rigid Body Simulation Discontinuity")
    ax.set_ylabel("Loss (m)"), ax.set_xlabel("Initial Rotation Angle (degrees)")
    fig.tight_layout()
    path = os.path.join(out, "rigid_body_discontinuity_scan.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=0, seed=False)
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        dtype = vkad.f64 if a.f64 else vkad.f32
        print(f"{s.device_name}: {a.steps} steps, {len(angles())} starting angles, frictions "
              f"{', '.join(f'{f:g}' for f in FRICTIONS)}")
        sim = RigidBodyDiscontinuity(s, a.steps, dtype, graph=not a.no_graph,
                                     loop=not a.no_loop)
        curves = []
        for friction in FRICTIONS:  # DiffTaichi's order
            losses, grads = scan(sim, friction)
            curves.append((friction, losses))
            half = len(losses) // 2  # angles below 0, then above
            print(f"friction {friction:g}: loss {losses[0]:.5f} .. {losses[half - 1]:.5f} | "
                  f"{losses[half]:.5f} .. {losses[-1]:.5f} (the jump at 0: "
                  f"{losses[half] - losses[half - 1]:+.5f}); d loss / d omega0 from "
                  f"{min(grads):+.4f} to {max(grads):+.4f}")
        if a.iters:  # --iters N: the race's iterations (more points of the scan), timed
            train(sim, a.iters, "rigid_body_discontinuity", profile=a.profile, session=s)
        for path in plot(curves, a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
