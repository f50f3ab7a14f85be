"""Where a diffmpm training iteration's time goes: graphs of parts of it, replayed alone.

    python bench/diffmpm_profile.py [--steps 1024] [--reps 10] [--json OUT]

Prints ms per replay (median of --reps) of: the whole iteration (forward + backward, as the
example replays it), the forward alone, each forward kernel launched steps - 1 times alone, and
an empty kernel launched as many times as the iteration launches (the dispatch-and-barrier
floor). The ratios say whether the launches or the kernels' own work dominate.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "difftaichi"))

import vkad  # noqa: E402
from diffmpm import DiffMPM  # noqa: E402


def timed(s: vkad.Session, g, reps: int) -> float:
    s.replay(g)
    s.synchronize()
    ms = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.replay(g)
        s.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {}
    with vkad.Session() as s:
        sim = DiffMPM(s, a.steps)
        out["device"] = s.device_name
        sim.forward_backward()
        with s.capture("iteration") as g:
            sim.forward_backward()
        out["launches_per_iteration"] = s.stats().get("launches", 0)
        out["iteration_ms"] = timed(s, g, a.reps)
        with s.capture("forward") as g:
            sim.forward(recorded=False)
        out["forward_ms"] = timed(s, g, a.reps)
        for name in ("compute_actuation", "p2g", "grid_op", "g2p"):
            with s.capture(name) as g:
                for f in range(a.steps - 1):
                    sim._launch(name, f, recorded=False)
            out[f"{name}_x{a.steps - 1}_ms"] = timed(s, g, a.reps)
        # Each adjoint alone: the tape's recorded launches of one kernel, their adjoints replayed.
        tape = sim.tape
        for name in ("compute_actuation", "p2g", "grid_op", "g2p"):
            fwd_k = sim.kernels[name]
            with s.capture(name + "_adjoint") as g:
                for kernel, args in tape.launches:
                    if kernel is not fwd_k and getattr(kernel, "forward", None) is not fwd_k.forward:
                        continue
                    fwd = getattr(kernel, "forward", kernel)
                    grads = [tape.grad(args[p]) for p, _ in fwd.gradients]
                    s.launch(fwd.adjoint, *args, *grads)
            out[f"{name}_adjoint_ms"] = timed(s, g, a.reps)
        n = 8 * (a.steps - 1)
        for threads in (1, sim.scene.n_particles, sim.n_grid * sim.n_grid):
            kb = vkad.KernelBuilder("empty")
            y = kb.ndarray("y", vkad.f32, 1)
            with kb.parallel_for("i", 0, y.shape[0]) as i:
                y[i] = y[i] + 1.0
            k = s.compile(kb)
            y = s.zeros(threads, vkad.f32, "y")
            with s.capture("empty") as g:
                for _ in range(n):
                    s.launch(k, y)
            out[f"empty_{threads}_threads_x{n}_ms"] = timed(s, g, a.reps)
    for key, v in out.items():
        print(f"{key:40s} {v:.3f}" if isinstance(v, float) else f"{key:40s} {v}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
