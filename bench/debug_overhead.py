"""What the debugging tools cost a DiffTaichi port's training iteration (docs/debugging.md): the
timeline (vkad.profile) and the NaN / infinity checks (Session(check_finite=True)).

    python bench/debug_overhead.py [--program diffmpm,wave] [--iters 10] [--rounds 3]
                                   [--trace-dir DIR] [--steps S] [--replay-sample 16]

Per program (bench/difftaichi_ports.py, the ports' own sizes): after two warm-up iterations,
`rounds` alternations of `iters` iterations without a timeline and `iters` iterations inside
one vkad.profile block (its begin and end included; `--replay-sample`: its replay_sample, the
graph's first replay in the block and every such one after it timed launch by launch, the
others as one event), ms per iteration (each iteration reads its loss back, so it has
finished). Prints the median of each and their ratio (the issue's target: <= 1.05 with the
timeline on).
Then the same program on a second session with check_finite=True: its median ms per iteration
(`rounds` blocks of `iters`) against the first session's, and its losses against the first
session's first iterations (the checks change no value: equal to f32 rounding, and exactly
where the device is deterministic).
For diffmpm, also its kernels with the --debug asserts compiled in (p2g checks each particle's
stencil stays on the grid; silent: none fails), on a session of their own: median ms per
iteration against the first session's, losses compared as for the finite checks.
Checks: no loss is NaN, and the timeline has one device event per launch Session.stats()
counted in the block, less those of the replays timed as one event. With --trace-dir the last round's trace is written there.
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


def measure(program, iters, rounds, trace_dir, steps=None, replay_sample=16):
    s = vkad.Session()
    sim = make(s, program, steps=steps)
    run(sim, 2)  # compiles, captures, installs the reworked graph
    plain, timed, events, launches = [], [], 0, 0
    for r in range(rounds):
        ms, losses = run(sim, iters)
        plain.append(ms)
        before = s.stats()["launches"]
        path = os.path.join(trace_dir, f"{program}.json") if trace_dir and r == rounds - 1 else None
        t0 = time.perf_counter()
        with vkad.profile(path, session=s, replay_sample=replay_sample) as p:
            _, tlosses = run(sim, iters)
        timed.append((time.perf_counter() - t0) * 1e3 / iters)
        launches = s.stats()["launches"] - before
        spanned = p.timeline.spanned_launches
        events = sum(1 for e in p.events if e["gpu"] and e["category"] == "launch")
        if not all(map(lambda v: v == v, losses + tlosses)):
            raise SystemExit(f"CHECK FAILED: {program}: a loss is NaN")
        expected = launches - p.timeline.spanned_launches
        if p.timeline.gpu_timestamps and events != expected:
            raise SystemExit(f"CHECK FAILED: {program}: {events} launch events for {expected} "
                             "launches timed one by one")
    summary = p.summary().splitlines()
    # The finite checks: another session, every kernel compiled with them.
    c = vkad.Session(check_finite=True)
    csim = make(c, program, steps=steps)
    ref = make(vkad.Session(), program, steps=steps)
    want = [ref.iteration() for _ in range(2)]
    got = [csim.iteration() for _ in range(2)]
    for w, g in zip(want, got):
        if abs(w - g) > 1e-4 * max(1.0, abs(w)):
            raise SystemExit(f"CHECK FAILED: {program}: loss {g} with the finite checks, {w} "
                             "without")
    checked = [run(csim, iters)[0] for _ in range(rounds)]
    asserted = None
    if program == "diffmpm":  # the --debug asserts, compiled in and silent
        asim = make(vkad.Session(), program, steps=steps, debug=True)
        got = [asim.iteration() for _ in range(2)]
        for w, g in zip(want, got):
            if abs(w - g) > 1e-4 * max(1.0, abs(w)):
                raise SystemExit(f"CHECK FAILED: {program}: loss {g} with the asserts, {w} "
                                 "without")
        asserted = statistics.median(run(asim, iters)[0] for _ in range(rounds))
    return (statistics.median(plain), statistics.median(timed), (launches, spanned), summary,
            s.device_name, statistics.median(checked), asserted)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program", default="diffmpm,wave")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace-dir", default=None)
    ap.add_argument("--steps", type=int, default=None, help="time steps (default: the port's)")
    ap.add_argument("--replay-sample", type=int, default=16,
                    help="vkad.profile's replay_sample (1: every replay timed launch by launch)")
    a = ap.parse_args()
    for program in a.program.split(","):
        plain, timed, launches, summary, device, checked, asserted = measure(
            program, a.iters, a.rounds, a.trace_dir, a.steps, a.replay_sample)
        launches, spanned = launches
        extra = "" if asserted is None else \
            f"; asserts (silent) {asserted:.2f} (x{asserted / plain:.3f})"
        print(f"{program} ({device}): {plain:.2f} ms/iteration without a timeline, {timed:.2f} "
              f"with (x{timed / plain:.3f}); {launches - spanned} of {launches} launches timed "
              f"one by one per block of {a.iters} (replay_sample {a.replay_sample}); "
              f"check_finite {checked:.2f} (x{checked / plain:.3f}){extra}")
        for line in summary[:8]:
            print("   ", line)


if __name__ == "__main__":
    main()
