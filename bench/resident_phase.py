#!/usr/bin/env python3
"""What one phase of a resident kernel costs (docs/graphs.md, "Resident step loops"), against
the dependent dispatch it replaces.

A step loop of T launches of one small kernel -- x[t + 1, i] = x[t, i] + 1 (+ a dot product of
`--dot` terms, loads of a row of weights and of x[t], where the kernel has one), `width`
invocations -- run two ways in one process: rolled into one resident kernel (a workgroup walks
the steps, a workgroup barrier between them: Session.loop's default) and launched step by step
(VKAD_GRAPH_RESIDENT=0 for that session: each launch a dependent dispatch). Both are checked: the
weights are 0 and x starts at 0, so x[T, i] must be exactly T (integers in f32). Prints
microseconds per step each way; the dispatch's is the floor a resident phase is measured
against (vkad-bench-dispatch measures the bare one).

    python3 bench/resident_phase.py                        # T = 4096, widths 1, 32, 256
    python3 bench/resident_phase.py --steps 512 --reps 3   # lavapipe
    python3 bench/resident_phase.py --json phase.json
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import vkad

CHECK = 3  # exit status when a result is wrong (bench/bench_util.h's convention)


def build(width: int, dot: int):
    @vkad.kernel
    def step(t: vkad.i32, x: vkad.array(vkad.f32, ndim=2), w: vkad.array(vkad.f32, ndim=2)):
        for i in range(width):
            acc = x[t, i] + 1.0
            for j in vkad.static(range(dot)):
                acc += w[i, j] * x[t, j % width]
            x[t + 1, i] = acc
    return step


def run(width: int, dot: int, steps: int, reps: int, rolled: bool) -> dict:
    """ms for the loop (median of `reps`), and whether the results are right."""
    if not rolled:
        os.environ["VKAD_GRAPH_RESIDENT"] = "0"  # read when a session opens
    try:
        with vkad.Session() as s:
            x = s.zeros((steps + 1, width), vkad.f32, "x")
            w = s.zeros((width, max(dot, 1)), vkad.f32, "w")
            launch = s.bind(s.compile(build(width, dot)), x=x, w=w)

            def body(t):
                launch(t)
            s.prepare_loop(0, steps, body)
            s.loop(0, steps, body)  # compiles, makes pipelines
            s.synchronize()
            before = s.stats()["rolled_loops"]
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                s.loop(0, steps, body)
                s.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            got = x.numpy()[steps]
            return {"ms": float(np.median(times)), "device": s.device_name,
                    "rolled": s.stats()["rolled_loops"] - before == reps,
                    "ok": bool(np.all(got == float(steps)))}
    finally:
        os.environ.pop("VKAD_GRAPH_RESIDENT", None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4096, help="launches in the loop (default 4096)")
    ap.add_argument("--widths", default="1,32,256", help="invocations per launch")
    ap.add_argument("--dots", default="0,64", help="terms of the dot product per invocation")
    ap.add_argument("--reps", type=int, default=10, help="timed loops, median (default 10)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows, failed = [], False
    print(f"{'width':>5} {'dot':>4} {'rolled us/step':>15} {'launched us/step':>17} "
          f"{'launched / rolled':>17}")
    for width in (int(v) for v in a.widths.split(",")):
        for dot in (int(v) for v in a.dots.split(",")):
            r = run(width, dot, a.steps, a.reps, rolled=True)
            d = run(width, dot, a.steps, a.reps, rolled=False)
            us_r, us_d = r["ms"] * 1e3 / a.steps, d["ms"] * 1e3 / a.steps
            bad = not (r["ok"] and d["ok"] and r["rolled"] and not d["rolled"])
            failed = failed or bad
            print(f"{width:5d} {dot:4d} {us_r:15.3f} {us_d:17.3f} {us_d / us_r:16.1f}x"
                  + ("  CHECK FAILED" if bad else ""))
            rows.append(dict(width=width, dot=dot, steps=a.steps, rolled_us=us_r,
                             launched_us=us_d, rolled=r["rolled"], results_ok=r["ok"] and d["ok"],
                             device=r["device"]))
    print(f"device: {rows[0]['device'] if rows else '-'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if failed:
        print("CHECK FAILED: a result was wrong, or a loop did not run the way asked",
              file=sys.stderr)
        return CHECK
    return 0


if __name__ == "__main__":
    sys.exit(main())
