"""Where a DiffTaichi port's replayed iteration goes: forward against backward, and both against
the dispatches' floor on this device.

    python bench/iteration_breakdown.py [--program wave,smoke,billiards] [--reps 20] [--json F]

For each program (bench/difftaichi_ports.py, the ports' own sizes) three graphs are captured and
replayed, each replay followed by a synchronize (median ms of --reps):
  forward     the simulation alone (the port's forward(), not recorded on a tape)
  iteration   the port's iteration as the race times it (forward on the tape, backward, update)
  floor       as many dependent launches as the iteration records dispatches, of a kernel that
              reads a neighbour and adds 1 (a 1-d task of 4,096 threads): what the dispatches and
              barriers alone cost here (vkad-bench-dispatch gives the same per dispatch)
Beside each: the dispatches one replay records (Session.stats()["dispatches"]) and ms per
dispatch. The backward's share is iteration - forward (the update is one small launch). The
forward graph's result is checked against a launch-by-launch forward's loss.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

import vkad  # noqa: E402
from difftaichi_ports import make  # noqa: E402
from diffmpm_profile import timed  # noqa: E402

# b[i] = a[i + 1] + 1 (the last element its own) over 4,096 elements: each launch reads a
# neighbour of what the previous one wrote and is too wide for one workgroup, so no graph pass
# fuses, rolls or reorders the chain (ping-pong between two arrays).
BUMP = """
kernel bump(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [0, 4096) {
    %one = const 1 : i32
    %next = add %i, %one : i32
    %last = const 4095 : i32
    %j = min %next, %last : i32
    %v = load a[%j] : f32
    %onef = const 1 : f32
    %w = add %v, %onef : f32
    store b[%i], %w
  }
}"""


def replay_ms(s, g, reps):
    """Median ms of a replay and its synchronize (diffmpm_profile.timed), and the dispatches one
    replay records."""
    before = s.stats()["dispatches"]
    s.replay(g)
    s.synchronize()
    dispatches = s.stats()["dispatches"] - before
    return timed(s, g, reps), dispatches


def breakdown(program, reps):
    s = vkad.Session()
    sim = make(s, program)
    # The forward's loss launch by launch: what the forward graph must give.
    sim.forward(recorded=False)
    want = float(sim.arrays["loss"].numpy().ravel()[0])
    with s.capture(f"{program} forward") as fwd:
        sim.forward(recorded=False)
    got_ms, fwd_disp = replay_ms(s, fwd, reps)
    got = float(sim.arrays["loss"].numpy().ravel()[0])
    # The loss is an atomic sum; a GPU need not add its n terms in the same order twice: two
    # orders differ by at most (n - 1) u of the sum of |terms| (u = 2^-24 in f32). The ports'
    # losses sum at most 256^2 terms of one sign: 4e-3 of the loss.
    if not np.isclose(got, want, rtol=(256 * 256 - 1) * 2.0 ** -24, atol=1e-7):
        raise SystemExit(f"{program}: the forward graph's loss {got} differs from {want}")
    sim.iteration()  # the first iteration captures the iteration's graph
    it_ms, it_disp = replay_ms(s, sim._graph, reps)
    bump = s.compile(BUMP)
    chain = it_disp + it_disp % 2  # even: each replay ends in x
    x, y = s.zeros(4096, vkad.f32), s.zeros(4096, vkad.f32)
    with s.capture("floor") as floor:
        for k in range(chain):
            s.launch(bump, *((x, y) if k % 2 == 0 else (y, x)))
    floor_ms, floor_disp = replay_ms(s, floor, reps)
    n = float(x.numpy()[0])
    if n != (reps + 2) * chain:
        raise SystemExit(f"floor: x[0] = {n}, expected {(reps + 2) * chain}")
    return {"program": program, "device": s.device_name,
            "forward_ms": got_ms, "forward_dispatches": fwd_disp,
            "iteration_ms": it_ms, "iteration_dispatches": it_disp,
            "backward_ms": it_ms - got_ms, "floor_ms": floor_ms, "floor_dispatches": floor_disp}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="wave,smoke,billiards")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows, failed = [], 0
    print(f"{'program':12} {'part':10} {'ms':>8} {'dispatches':>10} {'us/dispatch':>11}")
    for program in a.program.split(","):
        try:
            r = breakdown(program, a.reps)
        except (vkad.Error, SystemExit) as e:  # the others still run; the exit status says it
            print(f"{program:12} failed: {e}")
            failed += 1
            continue
        rows.append(r)
        for part in ("forward", "iteration", "floor"):
            ms, d = r[f"{part}_ms"], r[f"{part}_dispatches"]
            print(f"{r['program']:12} {part:10} {ms:8.3f} {d:10d} {1e3 * ms / max(d, 1):11.2f}")
        print(f"{r['program']:12} {'backward':10} {r['backward_ms']:8.3f} "
              f"{r['iteration_dispatches'] - r['forward_dispatches']:10d}", flush=True)
    if rows:
        print(f"device: {rows[0]['device']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
