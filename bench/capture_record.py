"""The caller's cost of recording a DiffTaichi port's training iteration: the forward on the tape
and its backward, captured without running (the host's part of a capture alone), timed per
half, median of --iters captures after the first (which is reported apart: its vectors and
pages are fresh).

    python bench/capture_record.py [--program diffmpm|mass_spring] [--iters 10]

Prints `RECORD {json}`: first_forward_ms, first_backward_ms, forward_ms, backward_ms (medians),
end_ms (the median end_capture: the record handed to the background rework), launches (per
capture). Each capture after the first waits for the previous capture's
background rework first (it is installed at the next capture's begin), outside the timings.
"""
import argparse
import json
import statistics
import sys
import time

import vkad
from difftaichi_ports import PROGRAMS, make


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", default="diffmpm", choices=PROGRAMS)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    with vkad.Session() as s:
        sim = make(s, a.program)
        s.synchronize()
        fwd, bwd, end, launches = [], [], [], 0
        for _ in range(a.iters + 1):
            capture = s.capture(f"{a.program} recording", background=True)
            g = capture.__enter__()
            t0 = time.perf_counter()
            with sim.tape:
                sim.forward()
            t1 = time.perf_counter()
            sim.tape.backward(seed={sim.arrays["loss"]: 1.0})
            t2 = time.perf_counter()
            capture.__exit__(None, None, None)
            t3 = time.perf_counter()
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            end.append((t3 - t2) * 1e3)
            launches = g.launches
            del g
        out = {"program": a.program, "device": s.device_name,
               "first_forward_ms": fwd[0], "first_backward_ms": bwd[0],
               "forward_ms": statistics.median(fwd[1:]), "backward_ms": statistics.median(bwd[1:]),
               "end_ms": statistics.median(end[1:]),
               "launches": launches}
        print("RECORD " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
