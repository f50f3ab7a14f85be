"""A long simulation in a fixed memory budget, at graph speed (issue 57; docs/tape.md, "A memory
budget").

A 2-D wave (DiffTaichi's wave.py: a 5-point stencil over two time levels, zero boundary), S
steps on an n x n grid, differentiated with respect to the initial height through a squared
error at the last step, three ways in one process:

- time:   the height with a time axis, p[t, i, j], on the default tape: (S + 1) n^2 floats and as
          many again for their gradient; one iteration captured as a graph and replayed;
- budget: a ring of three n x n arrays on a tape with memory_budget = the time axis's bytes
          (heights and gradients) / --fraction, its copies launches of copy kernels in the graph;
          captured and replayed the same way;
- eager:  the budget tape launched one by one (no graph), for scale.

The gradient of each is checked against the time-axis one (f32: the same operations, run again;
only the loss's atomic sum may add in another order) and the losses agree. Prints ms per
iteration, the bytes each holds for the differentiation (heights, gradients, the tape's
copies), the checkpoint plan, and the ratios; a memory bound floor beside it: the bytes an
iteration must move at least (every launch's reads and writes once, the time-axis version's
forward and backward) over the device's bandwidth when --bandwidth-gbs is given.

    python bench/checkpoint_budget.py --n 256 --steps 256 --iters 20      # the GPU machine
    python bench/checkpoint_budget.py --n 32 --steps 40 --iters 2          # a quick check
"""
import argparse
import time

import numpy as np

import vkad

STENCIL = """
    %one = const 1 : i32
    %im = sub %i, %one : i32
    %ip = add %i, %one : i32
    %jm = sub %j, %one : i32
    %jp = add %j, %one : i32
    %c0 = load B[%i, %j] : f32
    %n1 = load B[%im, %j] : f32
    %n2 = load B[%ip, %j] : f32
    %n3 = load B[%i, %jm] : f32
    %n4 = load B[%i, %jp] : f32
    %s1 = add %n1, %n2 : f32
    %s2 = add %n3, %n4 : f32
    %s = add %s1, %s2 : f32
    %four = const 4.0 : f32
    %c4 = mul %c0, %four : f32
    %lap = sub %s, %c4 : f32
    %kk = arg k : f32
    %kl = mul %kk, %lap : f32
    %two = const 2.0 : f32
    %c2 = mul %c0, %two : f32
    %pa = load A[%i, %j] : f32
    %x = add %c2, %kl : f32
    %y = sub %x, %pa : f32
    store C[%i, %j], %y
"""

# The ring: c = 2 b + k lap(b) - a on the interior (the boundary stays 0).
FDTD = ("""
kernel fdtd(a: ndarray<f32, 2> grad, b: ndarray<f32, 2> grad, c: ndarray<f32, 2> grad, k: f32) {
  task main parallel %i in [1, add(shape(b, 0), -1)), %j in [1, add(shape(b, 1), -1)) {
""" + STENCIL.replace("B[", "b[").replace("A[", "a[").replace("C[", "c[") + """  }
}""")

# The time axis: row t from rows t - 1 and t - 2.
FDTD_T = ("""
kernel fdtd_t(p: ndarray<f32, 3> grad, t: i32, k: f32) {
  task main parallel %i in [1, add(shape(p, 1), -1)), %j in [1, add(shape(p, 2), -1)) {
    %t = arg t : i32
    %o1 = const 1 : i32
    %o2 = const 2 : i32
    %t1 = sub %t, %o1 : i32
    %t2 = sub %t, %o2 : i32
""" + STENCIL.replace("B[", "p[%t1, ").replace("A[", "p[%t2, ").replace("C[", "p[%t, ") + """  }
}""")

# The initial height on the interior: every array's boundary stays 0 (a ring array is read as
# another step's state later).
INIT = """
kernel init(x: ndarray<f32, 2> grad, a: ndarray<f32, 2> grad) {
  task main parallel %i in [1, add(shape(x, 0), -1)), %j in [1, add(shape(x, 1), -1)) {
    %v = load x[%i, %j] : f32
    store a[%i, %j], %v
  }
}"""

INIT_T = """
kernel init_t(x: ndarray<f32, 2> grad, p: ndarray<f32, 3> grad) {
  task main parallel %i in [1, add(shape(x, 0), -1)), %j in [1, add(shape(x, 1), -1)) {
    %v = load x[%i, %j] : f32
    %z = const 0 : i32
    store p[%z, %i, %j], %v
  }
}"""

LOSS = """
kernel loss(a: ndarray<f32, 2> grad, target: ndarray<f32, 2>, l: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(a, 0)), %j in [0, shape(a, 1)) {
    %v = load a[%i, %j] : f32
    %w = load target[%i, %j] : f32
    %d = sub %v, %w : f32
    %q = mul %d, %d : f32
    %z = const 0 : i32
    atomic_add l[%z], %q
  }
}"""

LOSS_T = """
kernel loss_t(p: ndarray<f32, 3> grad, t: i32, target: ndarray<f32, 2>, l: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(p, 1)), %j in [0, shape(p, 2)) {
    %t = arg t : i32
    %v = load p[%t, %i, %j] : f32
    %w = load target[%i, %j] : f32
    %d = sub %v, %w : f32
    %q = mul %d, %d : f32
    %z = const 0 : i32
    atomic_add l[%z], %q
  }
}"""

K = 0.2  # (c dt / dx)^2: stable below 0.5


def mib(b):
    return f"{b / 2**20:.1f} MiB"


class Wave:
    """One iteration's recording, for either form."""

    def __init__(self, s, n, steps, ring, budget=0):
        self.s, self.n, self.steps, self.ring = s, n, steps, ring
        rng = np.random.default_rng(1)
        xs = np.zeros((n, n), np.float32)
        c = n // 2
        yy, xx = np.mgrid[0:n, 0:n]
        xs += np.exp(-((yy - c) ** 2 + (xx - c) ** 2) / (0.01 * n * n)).astype(np.float32)
        self.x = s.ndarray(xs, name="initial")
        self.target = s.ndarray(rng.standard_normal((n, n)).astype(np.float32) * 0.1,
                                name="target")
        self.l = s.zeros(1, name="loss")
        if ring:
            self.fdtd, self.init, self.loss = (s.differentiate(k) for k in (FDTD, INIT, LOSS))
            self.r = [s.zeros((n, n), name=f"ring{i}") for i in range(3)]
            self.held = 3 * n * n * 4
        else:
            self.fdtd, self.init, self.loss = (s.differentiate(k) for k in (FDTD_T, INIT_T,
                                                                             LOSS_T))
            self.p = s.zeros((steps, n, n), name="p")
            self.held = steps * n * n * 4
        self.tape = s.tape()
        if budget:
            self.tape.memory_budget = budget

    def record(self):
        s, t = self.s, self.tape
        with t:
            s.zero(self.l)
            if self.ring:
                r = self.r
                s.zero(r[1])
                s.launch(self.init, self.x, r[0])
                for f in range(2, self.steps):
                    s.launch(self.fdtd, r[(f - 2) % 3], r[(f - 1) % 3], r[f % 3], K)
                s.launch(self.loss, r[(self.steps - 1) % 3], self.target, self.l)
            else:
                s.launch(self.init, self.x, self.p)
                for f in range(2, self.steps):
                    s.launch(self.fdtd, self.p, f, K)
                s.launch(self.loss, self.p, self.steps - 1, self.target, self.l)
        t.backward(seed={self.l: 1.0})

    def grad(self):
        return self.tape.grad(self.x).numpy()


def timed(s, run, iters):
    s.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    s.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=8.0,
                    help="the budget is the time axis's heights and gradients over this")
    ap.add_argument("--bandwidth-gbs", type=float, default=0.0,
                    help="the device's memory bandwidth, for the floor line")
    a = ap.parse_args()
    s = vkad.Session()
    print(f"device: {s.device_name}; {a.n}^2 grid, {a.steps} steps")
    time_bytes = 2 * a.steps * a.n * a.n * 4  # heights and their gradient
    budget = int(time_bytes / a.fraction)

    rows = []
    grads = {}
    for name, ring, graph in (("time", False, True), ("budget", True, True),
                              ("eager", True, False)):
        w = Wave(s, a.n, a.steps, ring, budget if ring else 0)
        if ring:
            # One recording first: its backward plans the cut the captured one then takes (a
            # first recording of unknown length cuts level 0 by doubling; docs/tape.md).
            w.record()
        if graph:
            with s.capture(name) as g:
                w.record()
            s.finish_rework(g)
            run = lambda: s.replay(g)  # noqa: E731
        else:
            run = w.record
        run()
        run()
        ms = timed(s, run, a.iters if graph else max(1, a.iters // 4))
        grads[name] = w.grad()
        loss = float(w.l.numpy()[0])
        copies = w.tape.checkpoint_bytes if ring else 0
        held = 2 * w.held + copies  # arrays, their gradients, the copies
        plan = w.tape.checkpoint_plan()["text"] if ring else "no checkpoints"
        rows.append((name, ms, held, loss, plan))
        if graph:
            g.release()
    want = grads["time"]
    scale = np.abs(want).max()
    for name in ("budget", "eager"):
        err = np.abs(grads[name] - want).max() / scale
        print(f"{name}: max |grad - time's| / max |grad| = {err:.2e}")
        assert err < 1e-4, f"{name}'s gradient differs from the time axis's by {err:.2e}"
    base = rows[0][1]
    print(f"budget: {mib(budget)} of copies (the time axis's {mib(time_bytes)} / {a.fraction:g})")
    print(f"{'':8} {'ms/iter':>9} {'x time':>7} {'held':>11} {'loss':>12}  plan")
    for name, ms, held, loss, plan in rows:
        print(f"{name:8} {ms:9.3f} {ms / base:7.2f} {mib(held):>11} {loss:12.6g}  {plan}")
        assert abs(loss - rows[0][3]) <= 1e-4 * abs(rows[0][3]) + 1e-6, "losses differ"
    if a.bandwidth_gbs:
        # The time axis's iteration reads and writes each step's rows at least once forward and
        # about three times backward (the adjoint reads the seed and two rows, scatters into two).
        floor = 4 * a.steps * a.n * a.n * 4 * 2 / (a.bandwidth_gbs * 1e9) * 1e3
        print(f"floor (memory, time axis): {floor:.3f} ms/iter at {a.bandwidth_gbs:g} GB/s")


if __name__ == "__main__":
    main()
