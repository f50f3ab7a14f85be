"""A DiffTaichi port's steady training iteration and where its device time goes, per kernel.

    python bench/port_profile.py [--program diffmpm3d,liquid] [--steps N] [--iters 8] [--json OUT]

For each program: three iterations (the first captures the graph), a wait for the capture's
background rework (Simulation.finish_rework, so the replays timed are the reworked graph's),
--iters iterations timed one by one (median ms), one iteration's dispatches and barriers
(`stats()`), and one more iteration under `vkad.profile(replay_sample=1)` (every launch
timed: the timestamps slow a dispatch-bound replay by ~10%) summed by kernel. The check: the
first iteration's loss -- the graph's capture run -- against the same program launched one
by one in the same session (graph=False), within 1e-4 of the loss (f32 atomics add in any
order); exit 3 with `CHECK FAILED` otherwise. To compare two builds, run it once with each on
the path (docs/benchmarks.md, "Where a port's kernels go").
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import vkad
from difftaichi_ports import PROGRAMS, make


def profile_program(s: vkad.Session, program: str, steps, iters: int) -> dict:
    kw = {} if steps is None else {"steps": steps}
    sim = make(s, program, **kw)
    losses = [sim.iteration() for _ in range(3)]
    gradient_norms = {k: float(np.linalg.norm(v)) for k, v in sim.gradients().items()}
    sim.finish_rework()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sim.iteration()
        ms.append((time.perf_counter() - t0) * 1e3)
    before = s.stats()
    sim.iteration()
    after = s.stats()
    with vkad.profile(session=s, replay_sample=1) as p:
        sim.iteration()
    eager = make(s, program, graph=False, **kw)
    eager_loss = eager.iteration()
    if not abs(eager_loss - losses[0]) <= 1e-4 * max(1.0, abs(eager_loss)):
        raise SystemExit(f"CHECK FAILED: {program}: the captured iteration's loss {losses[0]!r}, "
                         f"launched one by one {eager_loss!r}")
    return {"program": program, "ms_per_iteration": statistics.median(ms), "losses": losses,
            "eager_loss": eager_loss, "gradient_norms": gradient_norms,
            "dispatches": after["dispatches"] - before["dispatches"],
            "barriers": after["barriers"] - before["barriers"],
            "kernels": p.timeline.kernels(), "summary": p.summary()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="diffmpm3d,liquid",
                    help=f"comma-separated, of: {', '.join(PROGRAMS)}")
    ap.add_argument("--steps", type=int, default=None, help="the ports' own by default")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    programs = a.program.split(",")
    for p in programs:
        if p not in PROGRAMS:
            ap.error(f"unknown program {p!r}: one of {', '.join(PROGRAMS)}")
    out = []
    with vkad.Session() as s:
        print(f"device: {s.device_name}")
        for program in programs:
            r = profile_program(s, program, a.steps, a.iters)
            print(f"== {program}: {r['ms_per_iteration']:.3f} ms/iter, dispatches "
                  f"{r['dispatches']}, barriers {r['barriers']}; losses {r['losses']} (launched "
                  f"one by one: {r['eager_loss']!r}); gradient norms {r['gradient_norms']}")
            print(r.pop("summary"), flush=True)
            out.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
