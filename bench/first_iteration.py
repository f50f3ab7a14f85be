"""Where a DiffTaichi port's first training iteration goes (issue 28: the first iteration within
2x the steady one), phase by phase, against the steady iteration of the same process.

    python bench/first_iteration.py [--program diffmpm|mass_spring] [--iters 10] [--sync]
                                    [--no-run]

Phases of the first iteration: `record` (the forward on the tape and its backward, captured:
Python and the session's recording), `end_capture`, `replay` (to the loss read back) and
`update` (gradients read back, weights written). The capture runs what it captures
(run=True, as examples/difftaichi/*.py capture: the device runs the iteration while Python
records it, and `replay` is only the wait for the loss); --no-run captures without running and
replays after (the examples before run=True). The capture is background=True: end_capture
starts the graph's rework (rolling, recompute, scheduling, fusion, the fused kernels' compiles)
on a thread of its own, the next replays run the launches as captured and the first replay that
finds the rework done installs it (`iterations_ms` shows where); --sync reworks inside
end_capture instead (VKAD_GRAPH_TRACE=1 prints the rework's phases). `steady_ms` is the median
of the last half of the --iters iterations after the first. `construct` is the example's
constructor (its kernels compiled, its gradient arrays made) before any of them. Point
VKAD_CACHE_DIR at an empty folder for a cold start (and, on NVIDIA, __GL_SHADER_DISK_CACHE_PATH
for the driver's own cache); --idle S sleeps S seconds after the construction, the device idle.
"""
import argparse
import json
import statistics
import sys
import time

import vkad
from difftaichi_ports import PROGRAMS, make


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", default="diffmpm", choices=PROGRAMS)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sync", action="store_true", help="the rework inside end_capture")
    ap.add_argument("--no-run", action="store_true",
                    help="capture without running, then replay (the examples before run=True)")
    ap.add_argument("--steps", type=int, default=None, help="the program's own when left out")
    ap.add_argument("--loop", choices=("on", "off"), default=None,
                    help="the port's step loop through Session.loop (prepared in its constructor) "
                         "or as a Python loop; the port's default when left out")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="seconds to sleep between the construction and the first iteration "
                         "(the device idle, as while a long construction compiles on the host)")
    ap.add_argument("--retirement-depth", type=int, default=3,
                    help="submissions in flight before the host waits (Session's)")
    a = ap.parse_args()
    out = {"program": a.program}
    t0 = time.perf_counter()
    with vkad.Session(retirement_depth=a.retirement_depth) as s:
        out["session_ms"] = _ms(t0)
        t0 = time.perf_counter()
        sim = make(s, a.program, a.steps, None if a.loop is None else a.loop == "on")
        s.synchronize()
        out["construct_ms"] = _ms(t0)
        if a.idle > 0:
            # A GPU left idle for seconds lowers its clocks and takes a while to raise them
            # again: on the H200 a first iteration after 4 s of idle ran ~4x slower (docs/
            # benchmarks.md, "The first iteration"), which a construction that compiles for
            # seconds on a cold driver cache brings about as well.
            time.sleep(a.idle)
        out["idle_s"] = a.idle
        before = s.stats()
        first = time.perf_counter()
        t0 = time.perf_counter()
        run = {} if a.no_run else {"run": True}  # (a build before run=True takes --no-run)
        capture = s.capture(f"{a.program} iteration", background=not a.sync, **run)
        g = capture.__enter__()
        sim.forward_backward()
        out["record_ms"] = _ms(t0)
        recorded = s.stats()
        t0 = time.perf_counter()
        capture.__exit__(None, None, None)
        out["end_capture_ms"] = _ms(t0)
        t0 = time.perf_counter()
        if a.no_run:
            s.replay(g)
        loss = float(sim.arrays["loss"].numpy()[0])
        out["replay_ms"] = _ms(t0)
        t0 = time.perf_counter()
        grads = sim.gradients()
        w = sim.weights()
        sim.set_weights({p: w[p] - 0.0 * grads[p] for p in sim.PARAMS})
        out["update_ms"] = _ms(t0)
        out["grad_norm"] = float(sum((g.astype("float64") ** 2).sum() for g in grads.values()) ** 0.5)
        out["first_iteration_ms"] = _ms(first)
        after = s.stats()
        # The driver's pipeline creations inside the first iteration (specialized variants a
        # first launch makes), and how much of the recording they took.
        out["pipelines_record"] = recorded["pipelines_created"] - before["pipelines_created"]
        out["pipeline_record_ms"] = (recorded["pipeline_create_us"]
                                     - before["pipeline_create_us"]) / 1e3
        out["pipelines_first_iteration"] = after["pipelines_created"] - before["pipelines_created"]
        # The host blocked by the retirement depth while recording (the device pacing it: a
        # capture that runs submits as it goes) and in the whole first iteration.
        def waited(st):
            return (st.get("forced_wait_us", 0) - before.get("forced_wait_us", 0)) / 1e3
        out["record_forced_wait_ms"] = waited(recorded)
        out["forced_wait_ms"] = waited(after)
        sim._graph = g  # the example's own iteration() replays it from here on
        steady = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            sim.iteration()
            steady.append(_ms(t0))
        out["iterations_ms"] = [round(x, 2) for x in steady]
        out["steady_ms"] = statistics.median(steady[len(steady) // 2:])
        out["ratio"] = out["first_iteration_ms"] / out["steady_ms"]
        out["loss"] = loss
        out["stats"] = {k: v for k, v in s.stats().items()
                        if k in ("kernels_compiled", "compile_cache_hits", "disk_cache_hits",
                                 "disk_cache_misses", "pipeline_cache_loaded",
                                 "recomputed_launches", "rolled_launches", "rolled_loops", "reworked_loops",
                                 "forced_waits", "flushes")}
        out["device"] = s.device_name
    print("FIRST-ITERATION " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
