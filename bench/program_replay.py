"""ms per replay of one training iteration's captured graph (forward + backward), for the
DiffTaichi ports: what graph scheduling and fusion change, without the host's update.

    python bench/program_replay.py [--program diffmpm|mass_spring] [--reps 10]
    VKAD_GRAPH_SCHEDULE=0 / VKAD_GRAPH_FUSION=0 for the variants.
"""
import argparse
import statistics
import sys
import time

import numpy as np

import vkad
from difftaichi_ports import PROGRAMS, make


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", default="diffmpm", choices=PROGRAMS)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    with vkad.Session() as s:
        sim = make(s, a.program)
        sim.forward_backward()
        t0 = time.perf_counter()
        with s.capture("iteration") as g:
            sim.forward_backward()
        capture_ms = (time.perf_counter() - t0) * 1e3
        n0 = s.stats()["launches"]
        s.replay(g)
        s.synchronize()
        launches = s.stats()["launches"] - n0
        ms = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            s.replay(g)
            s.synchronize()
            ms.append((time.perf_counter() - t0) * 1e3)
        # What the replay computed (the same in every variant: a wrong rework shows here).
        loss = float(sim.arrays["loss"].numpy()[0])
        grads = sim.gradients()
        norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values())))
        print(f"{a.program}: {statistics.median(ms):.3f} ms per replay, {launches} launches, "
              f"capture {capture_ms:.0f} ms, loss {loss:.6f}, |grad| {norm:.6f} "
              f"({s.device_name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
