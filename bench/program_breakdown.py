"""Where a DiffTaichi port's replayed iteration spends its time, kernel by kernel, on the device.

    python bench/program_breakdown.py [--steps 1024] [--grid 128] [--reps 10] [--json F]

A companion of bench/diffmpm_profile.py (each forward kernel's graph alone, the adjoints, an
empty kernel's floor), whose replay timing it reuses. Each variant is the diffmpm iteration (examples/difftaichi/diffmpm.py) captured as a graph and
replayed: the whole iteration (forward on the tape + backward), the forward alone, and the whole
iteration with one kernel's launches left out (the results are then wrong; only the time is
read: a kernel's share is the whole iteration's time minus that variant's). Two floors beside
them: a chain of dependent launches of a one-line kernel over the particles and over the grid
cells, as many as the iteration has steps (times 4 kernels), forward only: what the dispatches
and barriers alone cost on this device. ms per replay (median), and the launches a replay
issues after the graph's rework.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "difftaichi"))


import vkad  # noqa: E402
from diffmpm import SCENES, DiffMPM, Scene  # noqa: E402
from diffmpm_profile import timed as replay_ms  # noqa: E402

KERNELS = ("compute_actuation", "p2g", "grid_op", "g2p")


class Partial(DiffMPM):
    """DiffMPM whose forward leaves out the launches of the kernels in `skip`."""

    skip: tuple = ()

    def launcher(self, name, recorded=True):
        return (lambda t: None) if name in self.skip else super().launcher(name, recorded)


def timed(s, body, reps):
    """(median ms per replay, launches per replay) of `body` captured as a graph."""
    body()  # makes the tape's gradient arrays the graph binds
    with s.capture("variant") as g:
        body()
    n0 = s.stats()["launches"]
    s.replay(g)
    s.synchronize()
    launches = s.stats()["launches"] - n0
    return replay_ms(s, g, reps), launches


def chain(s, n, width, reps):
    """n dependent launches of y[f + 1, i] = y[f, i + 1 mod width] * 0.5 + 1 over `width`
    elements: a neighbour read, so no two fuse (the session `s` rolls none either)."""
    kb = vkad.KernelBuilder("chain")
    f = kb.scalar("f", vkad.i32)
    y = kb.ndarray("y", vkad.f32, 2)
    with kb.parallel_for("i", 0, y.shape[1]) as i:
        y[f + 1, i] = y[f, (i + 1) % y.shape[1]] * 0.5 + 1.0
    k = s.compile(kb)
    arr = s.zeros((n + 1, width), vkad.f32, "y")
    return timed(s, lambda: [s.launch(k, f, arr) for f in range(n)], reps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--grid", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = {}
    with vkad.Session() as s:
        def variant(label, skip=(), body="iteration"):
            Partial.skip = skip
            sim = Partial(s, steps=a.steps, n_grid=a.grid, graph=False)
            fn = sim.forward_backward if body == "iteration" else \
                (lambda: sim.forward(recorded=False))
            rows[label] = timed(s, fn, a.reps)
            print(f"{label:32s} {rows[label][0]:9.3f} ms {rows[label][1]:6d} launches", flush=True)
            del sim

        variant("iteration")
        variant("forward", (), "forward")
        for k in KERNELS:
            variant(f"iteration without {k}", (k,))
        for k in KERNELS:
            variant(f"forward without {k}", (k,), "forward")
        n_particles = SCENES["robot"](Scene(a.grid)).n_particles
    os.environ["VKAD_GRAPH_RESIDENT"] = "0"  # read when a session is made
    with vkad.Session() as s:
        for width in (n_particles, a.grid * a.grid):
            label = f"chain of {4 * (a.steps - 1)} over {width}"
            rows[label] = chain(s, 4 * (a.steps - 1), width, a.reps)
            print(f"{label:32s} {rows[label][0]:9.3f} ms {rows[label][1]:6d} launches", flush=True)
        full = rows["iteration"][0]
        for k in KERNELS:
            print(f"share of {k:18s} {full - rows[f'iteration without {k}'][0]:8.3f} ms "
                  f"(forward {rows['forward'][0] - rows[f'forward without {k}'][0]:.3f})")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"device": s.device_name, "steps": a.steps, "grid": a.grid,
                           "rows": {k: {"ms": v[0], "launches": v[1]} for k, v in rows.items()}},
                          fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
