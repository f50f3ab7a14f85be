#!/usr/bin/env python3
"""Four simulation patterns, each a differentiated iteration, raced: vkad against Warp (issue 53).

Each pattern is one small training-style iteration -- a forward over T steps with a time axis,
a scalar loss, a backward through the framework's tape, the gradient of the loss with respect to
an input field -- written the way a user of each framework writes it, not tuned for the race:

  stencil     a damped 2-D wave on n x n (default 256^2), u[t, i, j] from u[t - 1] (5-point
              laplacian, zero outside the grid) and u[t - 2], T = 128 steps; loss sum (u[T - 1]
              - target)^2; gradient w.r.t. u[0] (u[1] starts equal to it, at rest, and is held)
  jacobi      per step on 128^2 (periodic): the divergence of the velocity v[t], 10 Jacobi
              iterations of the pressure (rows p[10 t + k], each step starting from the last
              step's pressure), the projection v[t + 1] = v[t] - grad p; T = 16 steps; loss sum
              |v[T] - target|^2; gradient w.r.t. v[0]
  advection   semi-Lagrangian advection of a scalar c[t] on 128^2 (periodic) by a fixed swirl,
              bilinear gathers at c[t - 1]; T = 64 steps; loss sum (c[T - 1] - target)^2;
              gradient w.r.t. c[0] (its adjoint scatters: atomic adds at the gathered cells)
  collisions  16 balls in the unit box (soft walls), T = 512 steps, each step forces(t - 1): one
              thread per ball looping over the others (a soft penalty where two overlap), then
              integrate(t) (explicit Euler); loss sum |x[T - 1] - target|^2; gradient w.r.t.
              the initial velocities v[0]

Backends (--backend, comma-separated; those that cannot run here are skipped with a line):
  vkad-graph  @vkad.kernel functions, the step loop said once (Session.loop), a vkad.Tape, the
              iteration (forward on the tape, backward) captured once as a graph and replayed
  vkad        the same without the graph: each iteration launched from Python (the step
              loop still one Session.loop call)
  warp-graph  @wp.kernel functions launched per step, wp.Tape, the iteration captured with
              wp.ScopedCapture and replayed with wp.capture_launch (CUDA only)
  warp        the same without the graph (cuda:0 when present, else the CPU)

    python3 bench/patterns.py [--pattern stencil,jacobi,advection,collisions]
                              [--backend vkad-graph,vkad,warp-graph,warp] [--reps 20]
                              [--grid N] [--steps T] [--balls B] [--json FILE]
    python3 bench/patterns.py --check      # gradients against central differences, small sizes

Printed per pattern and backend: ms per iteration (median of --reps, each iteration synchronised,
after two warm-up iterations and, for the graph, the rework installed), the loss, the gradient's
L2 norm and sum (a checksum), and for vkad the compute dispatches one replayed iteration records
(Session.stats()["dispatches"]), the floor those dispatches cost on this device (dispatches x the
per-dispatch cost measured in the same run: a chain of --chain dependent launches of a kernel
that reads a neighbour of what the launch before wrote, captured and replayed, which no graph
pass can fuse, roll, block or reorder), the iteration against that floor, and vkad's time against
Warp's CUDA graph. Every backend's loss and gradient are checked against the first backend's
(--backend's order): a difference past the f32 tolerances below exits with status 3
(CHECK FAILED on stderr), as a benchmark whose result is wrong has no speed.

--check runs each pattern at a small size on vkad in f64 (f32 where the device has no f64):
the loss against a float64 numpy transcription of the pattern (reference_loss), and the
gradient at a few entries against central finite differences of vkad's own loss.
tests/python/test_patterns_bench.py imports this file.

The data are seeded (--seed): smooth random fields (sums of Gaussian bumps or of a few Fourier
modes), a swirl for the advecting velocity, a jittered lattice of balls with random velocities;
every backend gets the same float64 arrays, rounded to its dtype.
"""

import argparse
import json
import math
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

PATTERNS = ("stencil", "jacobi", "advection", "collisions")
BACKENDS = ("vkad-graph", "vkad", "warp-graph", "warp")
SIZES = {"stencil": {"n": 256, "steps": 128}, "jacobi": {"n": 128, "steps": 16},
         "advection": {"n": 128, "steps": 64}, "collisions": {"balls": 16, "steps": 512}}
# --check's and the tests' sizes: a few seconds each on lavapipe, the balls colliding.
CHECK_SIZES = {"stencil": {"n": 16, "steps": 12}, "jacobi": {"n": 12, "steps": 3},
               "advection": {"n": 16, "steps": 8}, "collisions": {"balls": 9, "steps": 48}}

# stencil: u[t] = (2 - DAMP) u[t-1] - (1 - DAMP) u[t-2] + C2 lap(u[t-1]); C2 = (c dt / dx)^2 is
# under the 2-D leapfrog's stability limit of 0.5.
C2, DAMP = 0.2, 0.002
JACOBI_ITERS = 10
SWIRL = 1.5  # advection: the velocity's largest component, cells per step
# collisions: radius, penalty stiffness (per unit mass), time step
RADIUS, STIFFNESS, DT = 0.06, 2000.0, 2e-3

# The race's cross-checks (f32 implementations against each other). The loss is a sum of n^2
# (or n_balls) f32 terms added atomically in an order each device picks, after T steps whose
# f32 roundings differ with each compiler's contractions (fma); the gradients likewise. The
# largest differences seen between vkad on lavapipe and Warp on the CPU at the default sizes:
# 1.0e-7 (loss, relative) and 3.4e-6 (gradient, relative L2: the stencil's). The tolerances
# leave room for a GPU's compilers and atomic orders (collisions' 512 steps amplify roundings)
# and are still far below what a wrong or missing term moves.
LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-3


# --- data, and the patterns in float64 numpy ------------------------------------------------------

def bumps(n: int, rng: np.random.Generator, count: int = 4) -> np.ndarray:
    """A smooth random field on n x n: `count` Gaussian bumps of random sign, width n / 12."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    out = np.zeros((n, n))
    for _ in range(count):
        ci, cj = rng.uniform(0.25, 0.75, 2) * n
        out += rng.uniform(-1, 1) * np.exp(-((i - ci) ** 2 + (j - cj) ** 2) / (2 * (n / 12) ** 2))
    return out


def fourier(n: int, rng: np.random.Generator, modes: int = 3) -> np.ndarray:
    """A smooth periodic random 2-vector field on n x n, (n, n, 2): a few low Fourier modes."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    out = np.zeros((n, n, 2))
    for c in range(2):
        for _ in range(modes):
            ki, kj = rng.integers(-3, 4, 2)
            out[..., c] += rng.uniform(-1, 1) * np.sin(2 * np.pi * (ki * i + kj * j) / n
                                                        + rng.uniform(0, 2 * np.pi))
    return out


def lattice(balls: int, rng: np.random.Generator) -> np.ndarray:
    """Initial positions (balls, 2): a square lattice 2.3 radii apart, centred in the unit box,
    jittered by 0.1 radius, so neighbours collide within the first few dozen steps."""
    side = math.ceil(math.sqrt(balls))
    k = np.arange(balls)
    p = np.stack([k // side, k % side], 1) * 2.3 * RADIUS
    p += 0.5 - p.mean(0)
    return p + 0.1 * RADIUS * rng.standard_normal((balls, 2))


def make_data(pattern: str, size: Dict[str, int], seed: int = 0) -> Dict[str, np.ndarray]:
    """The pattern's inputs in float64: 'x0' the differentiated input (u[0], v[0], c[0] or the
    initial velocities) and what else it reads."""
    rng = np.random.default_rng(seed)
    if pattern == "stencil":
        n = size["n"]
        return {"x0": bumps(n, rng), "target": bumps(n, rng)}
    if pattern == "jacobi":
        n = size["n"]
        return {"x0": fourier(n, rng), "target": fourier(n, rng)}
    if pattern == "advection":
        n = size["n"]
        i = np.arange(n)[:, None] * np.ones((1, n))
        j = np.ones((n, 1)) * np.arange(n)[None, :]
        vel = np.stack([SWIRL * np.sin(2 * np.pi * j / n), SWIRL * np.cos(2 * np.pi * i / n)], -1)
        return {"x0": bumps(n, rng, 6), "target": bumps(n, rng, 6), "vel": vel}
    if pattern == "collisions":
        b = size["balls"]
        return {"x0": 0.5 * rng.standard_normal((b, 2)), "pos0": lattice(b, rng),
                "target": rng.uniform(0.2, 0.8, (b, 2))}
    raise ValueError(f"pattern '{pattern}': one of {', '.join(PATTERNS)}")


def _wall(p: np.ndarray) -> np.ndarray:
    return STIFFNESS * (np.maximum(RADIUS - p, 0) - np.maximum(p - (1 - RADIUS), 0))


def reference_loss(pattern: str, size: Dict[str, int], data: Dict[str, np.ndarray],
                   x0: Optional[np.ndarray] = None) -> float:
    """The pattern's loss in float64 numpy, from data['x0'] or `x0`: what each backend's kernels
    compute, step for step (the tests' and --check's transcription)."""
    x0 = data["x0"] if x0 is None else x0
    T = size["steps"]
    if pattern == "stencil":
        prev, u = x0, data["x0"]  # u[1] = data's u[0], held
        for _ in range(2, T):
            pad = np.pad(u, 1)
            lap = pad[:-2, 1:-1] + pad[2:, 1:-1] + pad[1:-1, :-2] + pad[1:-1, 2:] - 4 * u
            prev, u = u, (2 - DAMP) * u - (1 - DAMP) * prev + C2 * lap
        return float(((u - data["target"]) ** 2).sum())
    if pattern == "jacobi":
        v, p = x0, np.zeros(x0.shape[:2])
        for _ in range(T):
            div = 0.5 * (np.roll(v[..., 0], -1, 0) - np.roll(v[..., 0], 1, 0)
                         + np.roll(v[..., 1], -1, 1) - np.roll(v[..., 1], 1, 1))
            for _ in range(JACOBI_ITERS):
                p = 0.25 * (np.roll(p, 1, 0) + np.roll(p, -1, 0) + np.roll(p, 1, 1)
                            + np.roll(p, -1, 1) - div)
            grad = np.stack([np.roll(p, -1, 0) - np.roll(p, 1, 0),
                             np.roll(p, -1, 1) - np.roll(p, 1, 1)], -1)
            v = v - 0.5 * grad
        return float(((v - data["target"]) ** 2).sum())
    if pattern == "advection":
        n = x0.shape[0]
        vel = data["vel"]
        y = np.arange(n)[:, None] - vel[..., 0]
        x = np.arange(n)[None, :] - vel[..., 1]
        fy, fx = y - np.floor(y), x - np.floor(x)
        i0, j0 = np.floor(y).astype(int) % n, np.floor(x).astype(int) % n
        i1, j1 = (i0 + 1) % n, (j0 + 1) % n
        c = x0
        for _ in range(1, T):
            c = (1 - fy) * ((1 - fx) * c[i0, j0] + fx * c[i0, j1]) \
                + fy * ((1 - fx) * c[i1, j0] + fx * c[i1, j1])
        return float(((c - data["target"]) ** 2).sum())
    if pattern == "collisions":
        x, v = data["pos0"], x0
        for _ in range(1, T):
            d = x[:, None, :] - x[None, :, :]
            dist = np.sqrt((d ** 2).sum(-1))
            near = (dist < 2 * RADIUS) & ~np.eye(len(x), dtype=bool)
            dist = np.where(near, dist, 1.0)
            push = np.where(near, STIFFNESS * (2 * RADIUS - dist) / dist, 0.0)
            f = (push[..., None] * d).sum(1)
            v = v + DT * (f + _wall(x))
            x = x + DT * v
        return float(((x - data["target"]) ** 2).sum())
    raise ValueError(f"pattern '{pattern}'")


# --- vkad ---------------------------------------------------------------------------------------

def vkad_kernels(pattern: str, ft, size: Dict[str, int]) -> Dict[str, Callable]:
    """The pattern's kernels as @vkad.kernel functions in dtype `ft`; the step kernels take the
    step t (an i32 parameter)."""
    import vkad
    from vkad import Vector
    field2 = vkad.array(ft, ndim=2, readonly=True)
    field3 = vkad.array(ft, ndim=3, grad=True)
    vec = vkad.vec(2, ft)
    vfield3 = vkad.array(vec, ndim=3, grad=True)
    loss_t = vkad.array(ft, ndim=0, grad=True)
    n = size.get("n", 0)

    @vkad.func
    def dec(i):  # periodic neighbours
        return i - 1 if i >= 1 else n - 1

    @vkad.func
    def inc(i):
        return i + 1 if i < n - 1 else 0

    def field_loss():
        """sum (c[t] - target)^2 of a scalar field (stencil's and advection's loss)."""
        @vkad.kernel
        def field_loss(t: vkad.i32, c: field3, target: field2, loss: loss_t):
            for i, j in vkad.ndrange(n, n):
                d = c[t, i, j] - target[i, j]
                loss[None] += d * d
        return field_loss

    if pattern == "stencil":
        @vkad.func
        def at(u, t, i, j):
            """u[t, i, j], 0 outside the grid (the index clamped into it, the value selected)."""
            inside = i >= 0 and i < n and j >= 0 and j < n
            return u[t, vkad.min(vkad.max(i, 0), n - 1),
                     vkad.min(vkad.max(j, 0), n - 1)] if inside else 0.0

        @vkad.kernel
        def wave(t: vkad.i32, u: field3):
            for i, j in vkad.ndrange(n, n):
                lap = at(u, t - 1, i - 1, j) + at(u, t - 1, i + 1, j) + at(u, t - 1, i, j - 1) \
                    + at(u, t - 1, i, j + 1) - 4.0 * u[t - 1, i, j]
                u[t, i, j] = (2.0 - DAMP) * u[t - 1, i, j] - (1.0 - DAMP) * u[t - 2, i, j] \
                    + C2 * lap

        return {"step": wave, "loss": field_loss()}

    if pattern == "jacobi":
        J = JACOBI_ITERS

        @vkad.kernel
        def divergence(t: vkad.i32, v: vfield3, div: field3):
            for i, j in vkad.ndrange(n, n):
                div[t, i, j] = 0.5 * (v[t, inc(i), j, 0] - v[t, dec(i), j, 0]
                                      + v[t, i, inc(j), 1] - v[t, i, dec(j), 1])

        @vkad.kernel
        def jacobi(t: vkad.i32, k: vkad.i32, div: field3, p: field3):
            for i, j in vkad.ndrange(n, n):
                a = k + t * J
                p[a + 1, i, j] = 0.25 * (p[a, dec(i), j] + p[a, inc(i), j] + p[a, i, dec(j)]
                                         + p[a, i, inc(j)] - div[t, i, j])

        @vkad.kernel
        def project(t: vkad.i32, p: field3, v: vfield3):
            for i, j in vkad.ndrange(n, n):
                a = (t + 1) * J
                grad = Vector([p[a, inc(i), j] - p[a, dec(i), j],
                               p[a, i, inc(j)] - p[a, i, dec(j)]])
                v[t + 1, i, j] = v[t, i, j] - 0.5 * grad

        @vkad.kernel
        def jacobi_loss(t: vkad.i32, v: vfield3,
                        target: vkad.array(vec, ndim=2, readonly=True), loss: loss_t):
            for i, j in vkad.ndrange(n, n):
                d = v[t, i, j] - target[i, j]
                loss[None] += d.dot(d)
        return {"divergence": divergence, "jacobi": jacobi, "project": project,
                "loss": jacobi_loss}

    if pattern == "advection":
        @vkad.kernel
        def advect(t: vkad.i32, vel: vkad.array(vec, ndim=2, readonly=True), c: field3):
            for i, j in vkad.ndrange(n, n):
                # the departure point, fetched bilinearly from the last step (wrapped)
                y = vkad.cast(i, ft) - vel[i, j][0]
                x = vkad.cast(j, ft) - vel[i, j][1]
                y0, x0 = vkad.floor(y), vkad.floor(x)
                fy, fx = y - y0, x - x0
                i0, j0 = int(y0) % n, int(x0) % n
                i1, j1 = inc(i0), inc(j0)
                c[t, i, j] = (1.0 - fy) * ((1.0 - fx) * c[t - 1, i0, j0] + fx * c[t - 1, i0, j1]) \
                    + fy * ((1.0 - fx) * c[t - 1, i1, j0] + fx * c[t - 1, i1, j1])

        return {"step": advect, "loss": field_loss()}

    if pattern == "collisions":
        state = vkad.array(vec, ndim=2, grad=True)  # x[t, i], v[t, i], f[t, i]

        @vkad.kernel
        def forces(t: vkad.i32, x: state, f: state):
            for i in range(x.shape[1]):
                acc = Vector([0.0, 0.0])
                for j in range(x.shape[1]):
                    if j != i:
                        d = x[t, i] - x[t, j]
                        dist = d.norm()
                        if dist < 2.0 * RADIUS:
                            acc += STIFFNESS * (2.0 * RADIUS - dist) / dist * d
                f[t, i] = acc

        @vkad.func
        def wall(p):
            return STIFFNESS * (vkad.max(RADIUS - p, 0.0) - vkad.max(p - (1.0 - RADIUS), 0.0))

        @vkad.kernel
        def integrate(t: vkad.i32, x: state, v: state, f: state):
            for i in range(x.shape[1]):
                p = x[t - 1, i]
                nv = v[t - 1, i] + DT * (f[t - 1, i] + Vector([wall(p[0]), wall(p[1])]))
                v[t, i] = nv
                x[t, i] = p + DT * nv

        @vkad.kernel
        def collisions_loss(t: vkad.i32, x: state, target: vkad.array(vec, ndim=1, readonly=True),
                            loss: loss_t):
            for i in range(x.shape[1]):
                d = x[t, i] - target[i]
                loss[None] += d.dot(d)
        return {"forces": forces, "integrate": integrate, "loss": collisions_loss}
    raise ValueError(f"pattern '{pattern}'")


class VkadPattern:
    """One pattern on a vkad session: its arrays (a time axis on every state), a tape, and
    iteration() -- the forward on the tape and its backward -- captured once as a graph and
    replayed (graph=True) or launched one by one. The input is row 0 of `self.input`; loss(),
    gradient() and loss_at(x0) read the results back."""

    def __init__(self, pattern: str, session, size: Dict[str, int],
                 data: Dict[str, np.ndarray], dtype=None, graph: bool = True):
        import vkad
        self.pattern, self.s, self.size, self.graph = pattern, session, dict(size), graph
        self.dtype = dtype or vkad.f32
        self.kernels = vkad_kernels(pattern, self.dtype, size)
        for k in self.kernels.values():  # before any step loop: a loop body may not compile
            k.differentiate(session)
        npt = vkad.numpy_dtype(self.dtype)
        s, T = session, size["steps"]

        def state(shape, row0=None, rows=T):
            host = np.zeros((rows,) + shape)
            if row0 is not None:
                host[0] = row0
            return s.ndarray(host, npt, grad=True)

        a: Dict[str, object] = {"loss": s.zeros(1, self.dtype, grad=True)}
        if pattern == "stencil":
            n = size["n"]
            host = np.zeros((T, n, n))
            host[0] = host[1] = data["x0"]  # at rest: u[1] = u[0]; the gradient is u[0]'s
            a["u"] = s.ndarray(host, npt, grad=True)
            a["target"] = s.ndarray(data["target"], npt)
            self.input = a["u"]
        elif pattern == "jacobi":
            n = size["n"]
            a["v"] = state((n, n, 2), data["x0"], T + 1)
            a["div"] = state((n, n))
            a["p"] = state((n, n), rows=JACOBI_ITERS * T + 1)  # row 0: the first guess, 0
            a["target"] = s.ndarray(data["target"], npt)
            self.input = a["v"]
        elif pattern == "advection":
            n = size["n"]
            a["c"] = state((n, n), data["x0"])
            a["vel"] = s.ndarray(data["vel"], npt)
            a["target"] = s.ndarray(data["target"], npt)
            self.input = a["c"]
        else:
            b = size["balls"]
            a["x"] = state((b, 2), data["pos0"])
            a["v"] = state((b, 2), data["x0"])
            a["f"] = state((b, 2))
            a["target"] = s.ndarray(data["target"], npt)
            self.input = a["v"]
        self.arrays = a
        self.tape = s.tape()
        self._graph = None

    def forward(self) -> None:
        """One simulation and its loss (recorded when called inside the tape). Asynchronous."""
        s, a, k, T = self.s, self.arrays, self.kernels, self.size["steps"]
        s.zero(a["loss"])
        if self.pattern == "stencil":
            s.loop(2, T, lambda t: k["step"](t, a["u"], session=s))
            k["loss"](T - 1, a["u"], a["target"], a["loss"], session=s)
        elif self.pattern == "jacobi":
            def step(t):
                k["divergence"](t, a["v"], a["div"], session=s)
                for it in range(JACOBI_ITERS):
                    k["jacobi"](t, it, a["div"], a["p"], session=s)
                k["project"](t, a["p"], a["v"], session=s)
            s.loop(0, T, step)
            k["loss"](T, a["v"], a["target"], a["loss"], session=s)
        elif self.pattern == "advection":
            s.loop(1, T, lambda t: k["step"](t, a["vel"], a["c"], session=s))
            k["loss"](T - 1, a["c"], a["target"], a["loss"], session=s)
        else:
            def step(t):
                k["forces"](t - 1, a["x"], a["f"], session=s)
                k["integrate"](t, a["x"], a["v"], a["f"], session=s)
            s.loop(1, T, step)
            k["loss"](T - 1, a["x"], a["target"], a["loss"], session=s)

    def forward_backward(self) -> None:
        with self.tape:
            self.forward()
        self.tape.backward(seed={self.arrays["loss"]: 1.0})

    def iteration(self) -> None:
        """Forward on the tape and backward; the first call with graph=True captures them
        (running them while it captures, the rework in the background), later calls replay."""
        if not self.graph:
            self.forward_backward()
        elif self._graph is None:
            with self.s.capture(self.pattern, background=True, run=True) as g:
                self.forward_backward()
            self._graph = g
        else:
            self.s.replay(self._graph)

    def settle(self) -> None:
        """Waits for the graph's rework and installs it, so a timed replay is the steady one."""
        if self._graph is not None:
            self.s.finish_rework(self._graph)

    def sync(self) -> None:
        self.s.synchronize()

    def loss(self) -> float:
        return float(self.arrays["loss"].numpy()[0])

    def gradient(self) -> np.ndarray:
        """d loss / d input, float64 (after an iteration)."""
        return self.tape.grad(self.input).numpy()[0].astype(np.float64)

    def loss_at(self, x0: np.ndarray) -> float:
        """The loss of a forward from input x0 (not recorded); the input is left at x0."""
        host = self.input.numpy()
        host[0] = x0
        self.input.upload(host)
        self.forward()
        return self.loss()

    def input_value(self) -> np.ndarray:
        return self.input.numpy()[0].astype(np.float64)


# --- Warp ---------------------------------------------------------------------------------------

def warp_kernels(pattern: str, size: Dict[str, int]):
    """The pattern's kernels as @wp.kernel functions (float32), the arithmetic in the order of
    vkad_kernels'."""
    import warp as wp
    n = size.get("n", 0)

    @wp.func
    def dec(i: int, n: int):
        j = i - 1
        if i < 1:
            j = n - 1
        return j

    @wp.func
    def inc(i: int, n: int):
        j = i + 1
        if i >= n - 1:
            j = 0
        return j

    def field_loss():
        """sum (c[t] - target)^2 of a scalar field (stencil's and advection's loss)."""
        @wp.kernel
        def field_loss(t: int, c: wp.array3d(dtype=float), target: wp.array2d(dtype=float),
                       loss: wp.array(dtype=float)):
            i, j = wp.tid()
            d = c[t, i, j] - target[i, j]
            wp.atomic_add(loss, 0, d * d)
        return field_loss

    if pattern == "stencil":
        @wp.func
        def at(u: wp.array3d(dtype=float), t: int, i: int, j: int, n: int):
            value = float(0.0)
            if i >= 0 and i < n and j >= 0 and j < n:
                value = u[t, i, j]
            return value

        @wp.kernel
        def wave(t: int, u: wp.array3d(dtype=float)):
            i, j = wp.tid()
            m = wp.static(n)
            lap = at(u, t - 1, i - 1, j, m) + at(u, t - 1, i + 1, j, m) \
                + at(u, t - 1, i, j - 1, m) + at(u, t - 1, i, j + 1, m) - 4.0 * u[t - 1, i, j]
            u[t, i, j] = wp.static(2.0 - DAMP) * u[t - 1, i, j] \
                - wp.static(1.0 - DAMP) * u[t - 2, i, j] + wp.static(C2) * lap

        return {"step": wave, "loss": field_loss()}

    if pattern == "jacobi":
        @wp.kernel
        def divergence(t: int, v: wp.array3d(dtype=wp.vec2), div: wp.array3d(dtype=float)):
            i, j = wp.tid()
            m = wp.static(n)
            div[t, i, j] = 0.5 * (v[t, inc(i, m), j][0] - v[t, dec(i, m), j][0]
                                  + v[t, i, inc(j, m)][1] - v[t, i, dec(j, m)][1])

        @wp.kernel
        def jacobi(t: int, k: int, div: wp.array3d(dtype=float), p: wp.array3d(dtype=float)):
            i, j = wp.tid()
            m = wp.static(n)
            a = k + t * wp.static(JACOBI_ITERS)
            p[a + 1, i, j] = 0.25 * (p[a, dec(i, m), j] + p[a, inc(i, m), j]
                                     + p[a, i, dec(j, m)] + p[a, i, inc(j, m)] - div[t, i, j])

        @wp.kernel
        def project(t: int, p: wp.array3d(dtype=float), v: wp.array3d(dtype=wp.vec2)):
            i, j = wp.tid()
            m = wp.static(n)
            a = (t + 1) * wp.static(JACOBI_ITERS)
            grad = wp.vec2(p[a, inc(i, m), j] - p[a, dec(i, m), j],
                           p[a, i, inc(j, m)] - p[a, i, dec(j, m)])
            v[t + 1, i, j] = v[t, i, j] - 0.5 * grad

        @wp.kernel
        def jacobi_loss(t: int, v: wp.array3d(dtype=wp.vec2), target: wp.array2d(dtype=wp.vec2),
                        loss: wp.array(dtype=float)):
            i, j = wp.tid()
            d = v[t, i, j] - target[i, j]
            wp.atomic_add(loss, 0, wp.dot(d, d))
        return {"divergence": divergence, "jacobi": jacobi, "project": project,
                "loss": jacobi_loss}

    if pattern == "advection":
        @wp.func
        def imod(i: int, n: int):  # Warp's % truncates toward 0 (C's); vkad's floors
            r = i % n
            if r < 0:
                r = r + n
            return r

        @wp.kernel
        def advect(t: int, vel: wp.array2d(dtype=wp.vec2), c: wp.array3d(dtype=float)):
            i, j = wp.tid()
            m = wp.static(n)
            y = float(i) - vel[i, j][0]
            x = float(j) - vel[i, j][1]
            y0 = wp.floor(y)
            x0 = wp.floor(x)
            fy = y - y0
            fx = x - x0
            i0 = imod(int(y0), m)
            j0 = imod(int(x0), m)
            i1 = inc(i0, m)
            j1 = inc(j0, m)
            c[t, i, j] = (1.0 - fy) * ((1.0 - fx) * c[t - 1, i0, j0] + fx * c[t - 1, i0, j1]) \
                + fy * ((1.0 - fx) * c[t - 1, i1, j0] + fx * c[t - 1, i1, j1])

        return {"step": advect, "loss": field_loss()}

    if pattern == "collisions":
        @wp.kernel
        def forces(t: int, x: wp.array2d(dtype=wp.vec2), f: wp.array2d(dtype=wp.vec2)):
            i = wp.tid()
            acc = wp.vec2(0.0, 0.0)
            for j in range(x.shape[1]):
                if j != i:
                    d = x[t, i] - x[t, j]
                    dist = wp.length(d)
                    if dist < wp.static(2.0 * RADIUS):
                        acc += wp.static(STIFFNESS) * (wp.static(2.0 * RADIUS) - dist) / dist * d
            f[t, i] = acc

        @wp.func
        def wall(p: float):
            return wp.static(STIFFNESS) * (wp.max(wp.static(RADIUS) - p, 0.0)
                                           - wp.max(p - wp.static(1.0 - RADIUS), 0.0))

        @wp.kernel
        def integrate(t: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
                      f: wp.array2d(dtype=wp.vec2)):
            i = wp.tid()
            p = x[t - 1, i]
            nv = v[t - 1, i] + wp.static(DT) * (f[t - 1, i] + wp.vec2(wall(p[0]), wall(p[1])))
            v[t, i] = nv
            x[t, i] = p + wp.static(DT) * nv

        @wp.kernel
        def collisions_loss(t: int, x: wp.array2d(dtype=wp.vec2), target: wp.array(dtype=wp.vec2),
                            loss: wp.array(dtype=float)):
            i = wp.tid()
            d = x[t, i] - target[i]
            wp.atomic_add(loss, 0, wp.dot(d, d))
        return {"forces": forces, "integrate": integrate, "loss": collisions_loss}
    raise ValueError(f"pattern '{pattern}'")


class WarpPattern:
    """One pattern in Warp: the same arrays (wp.vec2 for 2-vectors), the forward launched step
    by step on a wp.Tape, tape.backward(loss); graph=True captures the taped forward and the
    backward with wp.ScopedCapture and replays them with wp.capture_launch (the gradients zeroed
    by tape.zero() before each replay, as Warp's examples do)."""

    def __init__(self, pattern: str, size: Dict[str, int], data: Dict[str, np.ndarray],
                 device=None, graph: bool = False):
        import warp as wp
        self.wp, self.pattern, self.size = wp, pattern, dict(size)
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.kernels = warp_kernels(pattern, size)
        T, d = size["steps"], self.device

        def array(host, vec=False, grad=True):
            return wp.array(np.asarray(host, np.float32), dtype=wp.vec2 if vec else float,
                            device=d, requires_grad=grad)

        def state(shape, row0=None, rows=T):
            host = np.zeros((rows,) + shape)
            if row0 is not None:
                host[0] = row0
            return array(host, vec=shape[-1:] == (2,))

        a = {"loss": wp.zeros(1, dtype=float, device=d, requires_grad=True)}
        if pattern == "stencil":
            n = size["n"]
            host = np.zeros((T, n, n))
            host[0] = host[1] = data["x0"]
            a["u"], a["target"] = array(host), array(data["target"], grad=False)
            self.input = a["u"]
        elif pattern == "jacobi":
            n = size["n"]
            a["v"] = state((n, n, 2), data["x0"], T + 1)
            a["div"] = state((n, n))
            a["p"] = state((n, n), rows=JACOBI_ITERS * T + 1)
            a["target"] = array(data["target"], vec=True, grad=False)
            self.input = a["v"]
        elif pattern == "advection":
            n = size["n"]
            a["c"] = state((n, n), data["x0"])
            a["vel"] = array(data["vel"], vec=True, grad=False)
            a["target"] = array(data["target"], grad=False)
            self.input = a["c"]
        else:
            b = size["balls"]
            a["x"] = state((b, 2), data["pos0"])
            a["v"] = state((b, 2), data["x0"])
            a["f"] = state((b, 2))
            a["target"] = array(data["target"], vec=True, grad=False)
            self.input = a["v"]
        self.arrays = a
        self.tape = wp.Tape()
        self._graph = None

    def forward(self) -> None:
        wp, a, k, T, d = self.wp, self.arrays, self.kernels, self.size["steps"], self.device
        a["loss"].zero_()
        if self.pattern == "stencil":
            g = (self.size["n"],) * 2
            for t in range(2, T):
                wp.launch(k["step"], dim=g, inputs=[t, a["u"]], device=d)
            wp.launch(k["loss"], dim=g, inputs=[T - 1, a["u"], a["target"], a["loss"]], device=d)
        elif self.pattern == "jacobi":
            g = (self.size["n"],) * 2
            for t in range(T):
                wp.launch(k["divergence"], dim=g, inputs=[t, a["v"], a["div"]], device=d)
                for it in range(JACOBI_ITERS):
                    wp.launch(k["jacobi"], dim=g, inputs=[t, it, a["div"], a["p"]], device=d)
                wp.launch(k["project"], dim=g, inputs=[t, a["p"], a["v"]], device=d)
            wp.launch(k["loss"], dim=g, inputs=[T, a["v"], a["target"], a["loss"]], device=d)
        elif self.pattern == "advection":
            g = (self.size["n"],) * 2
            for t in range(1, T):
                wp.launch(k["step"], dim=g, inputs=[t, a["vel"], a["c"]], device=d)
            wp.launch(k["loss"], dim=g, inputs=[T - 1, a["c"], a["target"], a["loss"]], device=d)
        else:
            b = self.size["balls"]
            for t in range(1, T):
                wp.launch(k["forces"], dim=b, inputs=[t - 1, a["x"], a["f"]], device=d)
                wp.launch(k["integrate"], dim=b, inputs=[t, a["x"], a["v"], a["f"]], device=d)
            wp.launch(k["loss"], dim=b, inputs=[T - 1, a["x"], a["target"], a["loss"]], device=d)

    def _record(self) -> None:
        with self.tape:
            self.forward()
        self.tape.backward(self.arrays["loss"])

    def iteration(self) -> None:
        """Forward on the tape and backward; with graph=True the first call runs them once
        eagerly (Warp loads its module outside a capture), then captures them; every call
        replays the graph."""
        wp = self.wp
        if not self.graph:
            self.tape.reset()  # forgets the launches and zeroes the gradients
            self._record()
            return
        if self._graph is None:
            self._record()
            wp.synchronize_device(self.device)
            self.tape.reset()
            with wp.ScopedCapture(device=self.device) as capture:
                self._record()
            self._graph = capture.graph
        self.tape.zero()  # backward accumulates into .grad
        wp.capture_launch(self._graph)

    def settle(self) -> None:
        pass

    def sync(self) -> None:
        self.wp.synchronize_device(self.device)

    def loss(self) -> float:
        return float(self.arrays["loss"].numpy()[0])

    def gradient(self) -> np.ndarray:
        """d loss / d input, float64 ((n, n) or (n, n, 2) / (balls, 2))."""
        return np.asarray(self.input.grad.numpy()[0], np.float64)


# --- the per-dispatch floor ---------------------------------------------------------------------

# b[i] = a[min(i + 1, 4095)] + 1 over 4,096 elements (bench/iteration_breakdown.py's): each launch
# reads a neighbour of what the one before wrote, ping-pong between two arrays (no array read and
# written at a stepping row: nothing to block), and its range is wider than one workgroup, so no
# graph pass fuses, rolls, blocks or reorders the chain: every launch is a dispatch behind a
# barrier (dispatch_floor checks it). The kernel text is iteration_breakdown.py's, which imports
# vkad and the DiffTaichi ports at load.
BUMP = """
kernel bump(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [0, 4096) {
    %one = const 1 : i32
    %next = add %i, %one : i32
    %last = const 4095 : i32
    %j = min %next, %last : i32
    %v = load a[%j] : f32
    %onef = const 1 : f32
    %w = add %v, %onef : f32
    store b[%i], %w
  }
}"""


def dispatch_floor(session, chain: int = 1000, reps: int = 10) -> Tuple[float, int]:
    """Microseconds per dependent dispatch on `session`'s device: a captured chain of `chain`
    bump launches (made even), replayed, median of `reps` replays each synchronised. Returns (us
    per dispatch, dispatches one replay records). Checks the chain's result (x[0] counts the
    launches that ran) and that a replay is one dispatch per launch."""
    import vkad
    chain += chain % 2  # even: each replay ends in x
    s = session
    bump = s.compile(BUMP)
    x, y = s.zeros(4096, vkad.f32), s.zeros(4096, vkad.f32)
    with s.capture("dispatch floor") as g:
        for k in range(chain):
            s.launch(bump, *((x, y) if k % 2 == 0 else (y, x)))
    before = s.stats()["dispatches"]
    s.replay(g)
    s.synchronize()
    dispatches = s.stats()["dispatches"] - before
    ms = timed(lambda: s.replay(g), s.synchronize, reps, warmup=1)
    runs = reps + 2  # the counted replay, the warm-up and the timed ones
    got = float(x.numpy()[0])
    if got != runs * chain or dispatches != chain:
        fail(f"dispatch floor: x[0] = {got} (expected {runs * chain}), {dispatches} dispatches "
             f"per replay (expected {chain}): the chain is not what it should measure")
    return 1e3 * ms / chain, dispatches


# --- timing and checks --------------------------------------------------------------------------

def timed(iteration: Callable[[], None], sync: Callable[[], None], reps: int,
          warmup: int = 2) -> float:
    """Median ms of `iteration` then `sync`, over `reps` after `warmup` untimed ones."""
    for _ in range(warmup):
        iteration()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        iteration()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def fail(msg: str) -> None:
    print(f"CHECK FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(3)


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| (0 when both are 0, inf when only b is)."""
    num, den = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
    return num / den if den else (0.0 if num == 0 else math.inf)


def gradient_entries(g: np.ndarray, count: int = 3, seed: int = 0) -> List[Tuple[int, ...]]:
    """The gradient's largest entry and count - 1 others drawn at random (seeded)."""
    rng = np.random.default_rng(seed)
    out = [tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(g))), g.shape))]
    while len(out) < min(count, g.size):
        e = tuple(int(rng.integers(0, d)) for d in g.shape)
        if e not in out:
            out.append(e)
    return out


def central_differences(sim: VkadPattern, entries: Sequence[Tuple[int, ...]],
                        eps: float) -> List[float]:
    """(L(x + eps e) - L(x - eps e)) / 2 eps of sim's own loss at each entry e; the input is
    restored after."""
    x0 = sim.input_value()
    out = []
    for e in entries:
        x = x0.copy()
        x[e] += eps
        plus = sim.loss_at(x)
        x[e] -= 2 * eps
        minus = sim.loss_at(x)
        out.append((plus - minus) / (2 * eps))
    sim.loss_at(x0)
    return out


def has_f64(session) -> bool:
    import vkad
    try:
        session.compile("kernel probe(x: ndarray<f64, 1>) {\n  task t parallel %0 in "
                        "[0, shape(x, 0)) {\n    %1 = load x[%0] : f64\n    store x[%0], %1\n"
                        "  }\n}\n")
        return True
    except vkad.UnsupportedError:
        return False


def check_pattern(pattern: str, session, size: Optional[Dict[str, int]] = None,
                  seed: int = 0, dtype=None) -> Dict[str, object]:
    """--check for one pattern, vkad launching one by one at `size` (default CHECK_SIZES) in
    `dtype` (default f64, f32 where the device has no f64): the loss against reference_loss,
    and the tape's gradient against central differences of vkad's own loss at three entries.
    Returns the figures, the tolerances and 'ok'."""
    import vkad
    size = dict(size or CHECK_SIZES[pattern])
    data = make_data(pattern, size, seed)
    if dtype is None:
        dtype = vkad.f64 if has_f64(session) else vkad.f32
    f64 = dtype == vkad.f64
    sim = VkadPattern(pattern, session, size, data, dtype=dtype, graph=False)
    sim.forward_backward()
    loss, g = sim.loss(), sim.gradient()
    want = reference_loss(pattern, size, data)
    entries = gradient_entries(g, 3, seed)
    # The grid patterns are linear in their input and their loss quadratic, so a central
    # difference is exact but for the loss's rounding, 2 |L| u / eps (u = 1.1e-16 in f64, 6e-8
    # in f32): eps is large. collisions is nonlinear (a contact's penalty switches on and off):
    # eps small enough that the O(eps^2) truncation is negligible and no contact starts or ends
    # within it.
    if pattern == "collisions":
        eps = 1e-6 if f64 else 1e-3
    else:
        eps = 1e-3 if f64 else 1e-1
    fd = central_differences(sim, entries, eps)
    scale = float(np.abs(g).max())
    # Loss: in f64 the same operations as numpy but for fma contraction and the atomic sum's
    # order (~1e-15 relative, amplified over the steps); in f32 each step rounds at 6e-8.
    loss_rtol = 1e-10 if f64 else 1e-4
    # Gradient: in f64 the rounding above (and collisions' truncation) comes to < 2e-9 of the
    # largest entry at these sizes (seen: 5e-13 to 1.7e-9); 1e-6 of it fails any wrong adjoint
    # term. In f32 the rounding is ~|L| 6e-8 / eps, a few 1e-4 of the largest entry.
    grad_tol = (1e-6 if f64 else 1e-2) * scale
    worst = max(abs(float(g[e]) - d) for e, d in zip(entries, fd))
    ok = abs(loss - want) <= loss_rtol * abs(want) and worst <= grad_tol
    return {"pattern": pattern, "dtype": dtype.name, "size": size, "loss": loss,
            "reference_loss": want, "loss_rtol": loss_rtol,
            "entries": [(list(e), float(g[e]), d) for e, d in zip(entries, fd)],
            "eps": eps, "grad_max": scale, "worst": worst, "grad_tol": grad_tol, "ok": ok}


# --- the race -----------------------------------------------------------------------------------

class Skipped(Exception):
    """The backend cannot run here (not installed, no CUDA for a CUDA graph)."""


def describe(pattern: str, size: Dict[str, int]) -> str:
    T = size["steps"]
    return {"stencil": f"2-D wave on {size.get('n')}^2, {T} steps, gradient w.r.t. u[0]",
            "jacobi": f"divergence, {JACOBI_ITERS} Jacobi sweeps and projection per step on "
                      f"{size.get('n')}^2, {T} steps, gradient w.r.t. v[0]",
            "advection": f"bilinear semi-Lagrangian advection on {size.get('n')}^2, {T} steps, "
                         "gradient w.r.t. c[0]",
            "collisions": f"{size.get('balls')} balls, pairwise soft collisions, {T} steps, "
                          "gradient w.r.t. v[0]"}[pattern]


def run_vkad(pattern: str, size, data, reps: int, graph: bool) -> Dict[str, object]:
    try:
        import vkad
    except ImportError as e:
        raise Skipped(f"vkad not importable ({e})")
    with vkad.Session() as s:
        sim = VkadPattern(pattern, s, size, data, graph=graph)
        sim.iteration()  # captures the graph (and runs it)
        sim.sync()
        sim.settle()  # the rework installed: what the timed replays run
        ms = timed(sim.iteration, sim.sync, reps)
        before = s.stats()["dispatches"]
        sim.iteration()
        sim.sync()
        dispatches = s.stats()["dispatches"] - before
        how = "graph replayed" if graph else "launches one by one"
        return {"name": f"vkad {vkad.__version__} {how}", "device": s.device_name, "ms": ms,
                "loss": sim.loss(), "grad": sim.gradient(), "dispatches": dispatches}


def run_warp(pattern: str, size, data, reps: int, graph: bool) -> Dict[str, object]:
    try:
        import warp as wp
    except ImportError as e:
        raise Skipped(f"warp not importable ({e})")
    wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no banner or module-load lines
    wp.init()
    if graph and not wp.is_cuda_available():
        raise Skipped("no CUDA device for a CUDA graph")
    device = "cuda:0" if wp.is_cuda_available() else "cpu"
    sim = WarpPattern(pattern, size, data, device=device, graph=graph)
    sim.iteration()  # compiles (and for the graph, captures)
    sim.sync()
    ms = timed(sim.iteration, sim.sync, reps)
    name = f"warp {wp.config.version} tape" + (" in a CUDA graph" if graph else "")
    return {"name": name, "device": wp.get_device(device).name, "ms": ms, "loss": sim.loss(),
            "grad": sim.gradient(), "dispatches": None}


RUNNERS = {"vkad-graph": lambda *a: run_vkad(*a, graph=True),
           "vkad": lambda *a: run_vkad(*a, graph=False),
           "warp-graph": lambda *a: run_warp(*a, graph=True),
           "warp": lambda *a: run_warp(*a, graph=False)}


def fmt(x, spec: str) -> str:
    """x formatted, or '-' in the same width when it is None."""
    return format("-", ">" + spec.split(".")[0].rstrip("d")) if x is None else format(x, spec)


def race(a) -> int:
    backends = [b.strip() for b in a.backend.split(",") if b.strip()]
    patterns = [p.strip() for p in a.pattern.split(",") if p.strip()]
    for name, got, known in (("--backend", backends, BACKENDS), ("--pattern", patterns, PATTERNS)):
        if set(got) - set(known):
            raise SystemExit(f"{name}: unknown {sorted(set(got) - set(known))}; choose from "
                             f"{', '.join(known)}")
    per_dispatch_us, floor_device = None, None
    if any(b.startswith("vkad") for b in backends):
        try:
            import vkad
            with vkad.Session() as s:
                per_dispatch_us, _ = dispatch_floor(s, a.chain, a.reps)
                floor_device = s.device_name
            print(f"per-dispatch floor on {floor_device}: {per_dispatch_us:.2f} us (a captured "
                  f"chain of {a.chain} dependent launches, replayed; median of {a.reps})")
        except ImportError as e:
            print(f"per-dispatch floor: skipped (vkad not importable: {e})")
    rows, failures = [], []
    for pattern in patterns:
        size = dict(SIZES[pattern])
        for key, flag in (("n", a.grid), ("balls", a.balls), ("steps", a.steps)):
            if key in size and flag:
                size[key] = flag
        data = make_data(pattern, size, a.seed)
        print(f"\n{pattern}: {describe(pattern, size)}")
        head = (f"  {'backend':11} {'ms/iter':>9} {'loss':>14} {'|grad|':>11} {'sum grad':>11} "
                f"{'disp/iter':>9} {'floor ms':>9} {'x floor':>7} {'/warp-graph':>12}")
        print(head)
        done = {}
        for b in backends:
            try:
                r = RUNNERS[b](pattern, size, data, a.reps)
            except Skipped as e:
                print(f"  {b:11} skipped ({e})", flush=True)
                continue
            g = r.pop("grad")
            r.update(pattern=pattern, backend=b, size=size, grad_l2=float(np.linalg.norm(g)),
                     grad_sum=float(g.sum()), floor_ms=None, per_dispatch_us=None)
            if r["dispatches"] is not None and per_dispatch_us is not None:
                r["per_dispatch_us"] = per_dispatch_us
                r["floor_ms"] = r["dispatches"] * per_dispatch_us * 1e-3
            done[b] = (r, g)
        ref_ms = done["warp-graph"][0]["ms"] if "warp-graph" in done else None
        ref = next(iter(done.values()), None)
        for b, (r, g) in done.items():
            r["vs_warp_graph"] = r["ms"] / ref_ms if ref_ms and b.startswith("vkad") else None
            r["x_floor"] = r["ms"] / r["floor_ms"] if r["floor_ms"] else None
            print(f"  {b:11} {r['ms']:9.3f} {r['loss']:14.7e} {r['grad_l2']:11.5e} "
                  f"{r['grad_sum']:11.4e} {fmt(r['dispatches'], '9d')} "
                  f"{fmt(r['floor_ms'], '9.3f')} {fmt(r['x_floor'], '7.2f')} "
                  f"{fmt(r['vs_warp_graph'], '12.3f')}")
            # Each backend against the first: the loss to LOSS_RTOL, the gradient to GRAD_RTOL
            # (relative L2).
            if ref is not None and r is not ref[0]:
                dl = abs(r["loss"] - ref[0]["loss"]) / max(abs(ref[0]["loss"]), 1e-30)
                dg = relative_difference(g, ref[1])
                r["loss_vs_first"], r["grad_vs_first"] = dl, dg
                if not (dl <= LOSS_RTOL and dg <= GRAD_RTOL):
                    failures.append(f"{pattern}: {b} against {ref[0]['backend']}: loss relative "
                                    f"difference {dl:.2e} (tolerance {LOSS_RTOL:g}), gradient "
                                    f"{dg:.2e} (tolerance {GRAD_RTOL:g})")
            rows.append(r)
        compared = [(b, r) for b, (r, _) in done.items() if "grad_vs_first" in r]
        if compared:
            print("  against " + ref[0]["backend"] + ": " + ", ".join(
                f"{b} loss {r['loss_vs_first']:.1e}, gradient {r['grad_vs_first']:.1e}"
                for b, r in compared) + f" (tolerances {LOSS_RTOL:g}, {GRAD_RTOL:g})")
        if done:
            print("  devices: " + ", ".join(f"{b} {r['device']}" for b, (r, _) in done.items()),
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"per_dispatch_us": per_dispatch_us, "floor_device": floor_device,
                       "chain": a.chain, "reps": a.reps, "seed": a.seed, "rows": rows}, f,
                      indent=1)
        print(f"\nwrote {a.json}")
    for msg in failures:
        print(f"CHECK FAILED: {msg}", file=sys.stderr)
    return 3 if failures else 0


def check(a) -> int:
    import vkad
    patterns = [p.strip() for p in a.pattern.split(",") if p.strip()]
    bad = 0
    with vkad.Session() as s:
        for pattern in patterns:
            r = check_pattern(pattern, s, seed=a.seed)
            print(f"{pattern} ({r['dtype']}, {r['size']}): loss {r['loss']:.12g}, numpy "
                  f"{r['reference_loss']:.12g}")
            for e, g, d in r["entries"]:
                print(f"  d loss / d x0{tuple(e)}: tape {g:+.10e}, central difference "
                      f"{d:+.10e} (eps {r['eps']:g})")
            print(f"  worst {r['worst']:.2e} (tolerance {r['grad_tol']:.2e}): "
                  + ("ok" if r["ok"] else "FAILED"), flush=True)
            bad += not r["ok"]
    if bad:
        print(f"CHECK FAILED: {bad} pattern(s)", file=sys.stderr)
    return 3 if bad else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pattern", default=",".join(PATTERNS), help="comma-separated patterns")
    ap.add_argument("--backend", default=",".join(BACKENDS), help="comma-separated backends")
    ap.add_argument("--reps", type=int, default=20, help="timed iterations (default 20)")
    ap.add_argument("--grid", type=int, default=None,
                    help="cells per side for stencil, jacobi, advection (default 256, 128, 128)")
    ap.add_argument("--steps", type=int, default=None,
                    help="time steps for every pattern (default 128, 16, 64, 512)")
    ap.add_argument("--balls", type=int, default=None, help="collisions' balls (default 16)")
    ap.add_argument("--chain", type=int, default=1000,
                    help="dependent launches in the per-dispatch floor's chain (default 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="vkad's loss against numpy and gradient against central differences "
                         "at small sizes, instead of the race")
    ap.add_argument("--json", default=None, help="write the race's rows here")
    a = ap.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):  # (not under pytest's capture)
        sys.stdout.reconfigure(line_buffering=True)
    return check(a) if a.check else race(a)


if __name__ == "__main__":
    sys.exit(main())
