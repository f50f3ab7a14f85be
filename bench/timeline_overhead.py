"""What the timeline (vkad.profile, docs/debugging.md) costs a DiffTaichi port's training
iteration, and what it sees.

    python bench/timeline_overhead.py [--program diffmpm,wave] [--iters 10] [--rounds 3]
                                      [--trace-dir DIR]

Per program (bench/difftaichi_ports.py, the ports' own sizes): after two warm-up iterations,
`rounds` alternations of `iters` iterations without a timeline and `iters` iterations inside
one vkad.profile block (its begin and end included), ms per iteration (each iteration reads its
loss back, so it has finished). Prints the median of each and their ratio (the issue's target: <= 1.05 with the timeline on).
Checks: no loss is NaN, and the timeline has one device event per launch Session.stats()
counted in the block. With --trace-dir the last round's trace is written there.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import vkad  # noqa: E402
from difftaichi_ports import make  # noqa: E402


def run(sim, iters):
    t0 = time.perf_counter()
    losses = [sim.iteration() for _ in range(iters)]
    return (time.perf_counter() - t0) * 1e3 / iters, losses


def measure(program, iters, rounds, trace_dir):
    s = vkad.Session()
    sim = make(s, program)
    run(sim, 2)  # compiles, captures, installs the reworked graph
    plain, timed, events, launches = [], [], 0, 0
    for r in range(rounds):
        ms, losses = run(sim, iters)
        plain.append(ms)
        before = s.stats()["launches"]
        path = os.path.join(trace_dir, f"{program}.json") if trace_dir and r == rounds - 1 else None
        t0 = time.perf_counter()
        with vkad.profile(path, session=s) as p:
            _, tlosses = run(sim, iters)
        timed.append((time.perf_counter() - t0) * 1e3 / iters)
        launches = s.stats()["launches"] - before
        events = sum(1 for e in p.events if e["gpu"] and e["category"] == "launch")
        if not all(map(lambda v: v == v, losses + tlosses)):
            raise SystemExit(f"CHECK FAILED: {program}: a loss is NaN")
        if p.timeline.gpu_timestamps and events != launches:
            raise SystemExit(f"CHECK FAILED: {program}: {events} launch events for {launches} "
                             "launches")
    summary = p.summary().splitlines()
    return statistics.median(plain), statistics.median(timed), launches, summary, s.device_name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program", default="diffmpm,wave")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace-dir", default=None)
    a = ap.parse_args()
    for program in a.program.split(","):
        plain, timed, launches, summary, device = measure(program, a.iters, a.rounds, a.trace_dir)
        print(f"{program} ({device}): {plain:.2f} ms/iteration without a timeline, {timed:.2f} "
              f"with (x{timed / plain:.3f}); {launches} launches timed per block of {a.iters}")
        for line in summary[:8]:
            print("   ", line)


if __name__ == "__main__":
    main()
