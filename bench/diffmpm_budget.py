"""DiffTaichi's diffmpm with one grid, in a memory budget, against its time-axis version
(issue 57, points 4-5; docs/tape.md, "A memory budget").

examples/difftaichi/diffmpm.py (--dim 3: diffmpm3d.py) two ways, each in a session of its own,
both captured as a graph (the first iteration captured while it runs, the rework finished, then
replays):

- time:   every step's particles and grid kept (x[f, p], grid_v_in[f, i, j], ...) on the
          default tape (the example's default);
- budget: two-row particle rings and one grid cleared every step (DiffTaichi's own layout), the
          tape given memory_budget = the time version's particle and grid bytes / --fraction: it
          plans its checkpoints and runs the forward again where it keeps no copy.

Checks that the first iteration's losses and gradients agree (f32, the grid's atomic sums in
another order: rtol 1e-3), then prints ms per training iteration, what each holds for the
differentiation (the state arrays, their gradients, the tape's copies), the session's device
memory now and at its peak (vkad's stats; beside it, where there is nvidia-smi, how much more the
GPU's used memory is than before the session), the checkpoint plan, and the ratios. --long-steps N also runs the budget version for N
steps within half the time version's bytes for differentiation, and says whether it holds more device
memory than the time version (issue 57, point 5: 10,240 steps in the memory of 1,024).

    python bench/diffmpm_budget.py --steps 1024 --iters 10 --long-steps 10240   # the GPU machine
    python bench/diffmpm_budget.py --dim 3 --steps 512 --iters 3 --long-steps 2048   # GPU, 3-D
    python bench/diffmpm_budget.py --steps 64 --grid 32 --iters 2 --fraction 2   # a quick check

--profile adds each form's device time per kernel over one more iteration (vkad.profile with
every launch timed: the proportions, not the untimed figure; docs/debugging.md). --warp also
runs Warp's tape of the full-memory (time-axis) program in a CUDA graph
(bench/difftaichi_peers/warp_diffmpm.py, 2-D only), in a process of its own after vkad's: its ms
per iteration, its first loss against vkad's, and its peak memory (Warp's memory pool high-water
mark, and nvidia-smi's growth over the process, which counts the CUDA context too).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import vkad

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "difftaichi"))
import diffmpm  # noqa: E402
import diffmpm3d  # noqa: E402

STATE = ("x", "v", "C", "F", "grid_v_in", "grid_m_in", "grid_v_out")


def mib(b):
    return b / (1 << 20)


def state_bytes(sim):
    """The particle and grid arrays: what the tape differentiates through (their gradients are
    as many bytes again)."""
    return sum(sim.arrays[k].nbytes for k in STATE)


def smi_used():
    """The device memory nvidia-smi says is used on the first GPU, in bytes (None without
    nvidia-smi): the check on vkad's own figures."""
    if shutil.which("nvidia-smi") is None:
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    try:
        return int(q.stdout.split()[0]) << 20  # MiB
    except (ValueError, IndexError):
        return None


def warp_child(steps, grid, iters):
    """--warp-child: Warp's CUDA graph of the time-axis diffmpm (the race's transcription), one
    JSON line: ms per iteration (the median after the first), first loss, gradients, peaks."""
    import json
    import statistics
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import difftaichi  # the race's Warp program, made as the race makes it
    smi_before = smi_used()
    sim, info = difftaichi._make_warp(argparse.Namespace(f64=False, steps=steps, grid=grid, seed=0),
                                      "diffmpm", cache=None, graph=True)
    import warp as wp
    losses, ms = [], []
    for it in range(iters + 1):
        t0 = time.perf_counter()
        losses.append(sim.iteration())  # reads the loss back: the iteration has finished
        ms.append((time.perf_counter() - t0) * 1e3)
        if it == 0:
            grads = {p: g.astype(np.float64).tolist() for p, g in sim.gradients().items()}
    smi_now = smi_used()
    print(json.dumps({"ms": statistics.median(ms[1:]), "loss": losses[0], "grads": grads,
                      "version": info["version"],
                      "pool_peak": wp.get_mempool_used_mem_high("cuda:0"),
                      "smi": None if smi_now is None or smi_before is None
                      else smi_now - smi_before}))


def run_warp(steps, grid, iters):
    """warp_child in a process of its own (CUDA beside no Vulkan device): its result, or None
    with the reason printed where Warp or CUDA is missing."""
    import json
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--warp-child",
                        "--steps", str(steps), "--grid", str(grid), "--iters", str(iters)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("warp: not run (" + (p.stderr.strip().splitlines() or ["no output"])[-1] + ")")
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(mod, steps, grid, iters, budget=None, profile=False):
    """A session with one simulation: its first iterations (the captured one among them: the
    example runs a budget's first recording as launched, to plan, and captures the second), the
    rework finished, then `iters` timed iterations. Returns what the report needs; `profile`:
    with one more iteration's device timeline, every launch timed (its per-kernel summary)."""
    smi_before = smi_used()
    with vkad.Session() as s:
        t0 = time.perf_counter()
        make = mod.DiffMPM if mod is diffmpm else mod.DiffMPM3D
        sim = make(s, steps=steps, n_grid=grid, memory_budget=budget)
        first_loss = sim.iteration()
        grads = sim.gradients()
        while sim._graph is None:
            sim.iteration()
        s.finish_rework(sim._graph)
        first_s = time.perf_counter() - t0
        sim.iteration()  # the reworked graph's first replay
        d0 = s.stats()["dispatches"]
        t0 = time.perf_counter()
        losses = [sim.iteration() for _ in range(iters)]
        ms = (time.perf_counter() - t0) * 1e3 / iters
        dispatches = (s.stats()["dispatches"] - d0) / iters
        held = state_bytes(sim)
        summary = None
        if profile:  # after the timed iterations: a timed replay runs ~1.5x slower
            with vkad.profile(session=s, replay_sample=1) as p:
                sim.iteration()
            summary = p.summary()
        s.synchronize()
        st = s.stats()
        smi_now = smi_used()
        out = {"loss": first_loss, "grads": grads, "ms": ms, "first_s": first_s,
               "peak": st["memory_peak_block_bytes"], "peak_used": st["memory_peak_used_bytes"],
               "smi": None if smi_now is None or smi_before is None else smi_now - smi_before,
               "losses": losses, "state": held, "grads_bytes": held,
               "copies": sim.tape.checkpoint_bytes, "device": s.stats()["memory_used_bytes"],
               "blocks": s.stats()["memory_block_bytes"], "at": time.time(),
               "plan": sim.tape.checkpoint_plan() if budget else None,
               "dispatches": dispatches, "profile": summary}
        return out


def report(name, r):
    held = r["state"] + r["grads_bytes"] + r["copies"]
    print(f"{name:>8}: {r['ms']:9.2f} ms/iteration ({r['dispatches']:.0f} dispatches), first "
          f"(capture + rework) {r['first_s']:.1f} s;"
          f" differentiation {mib(held):8.1f} MiB (state {mib(r['state']):.1f}, gradients "
          f"{mib(r['grads_bytes']):.1f}, copies {mib(r['copies']):.1f}); device memory in live "
          f"buffers {mib(r['device']):.1f} MiB, in blocks {mib(r['blocks']):.1f} MiB (at "
          f"{r['at']:.1f} s)")
    smi = "" if r["smi"] is None else (
        f"; nvidia-smi: {mib(r['smi']):.0f} MiB more than before the session (the driver's own "
        f"beside vkad's {mib(r['blocks']):.1f} MiB of blocks)")
    print(f"          peak device memory (vkad's stats): {mib(r['peak']):.1f} MiB of blocks, "
          f"{mib(r['peak_used']):.1f} MiB in live buffers{smi}")
    if r["profile"]:
        print(r["profile"])
    if r["plan"]:
        p = r["plan"]
        print(f"          plan: {p['levels']} levels {p['segments']}, peak "
              f"{mib(p['peak_bytes']):.2f} MiB, every launch run {p['recompute']} times")
    return held


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dim", type=int, choices=(2, 3), default=2,
                    help="diffmpm (2, default) or diffmpm3d (3)")
    ap.add_argument("--steps", type=int, default=None, help="default: the example's")
    ap.add_argument("--grid", type=int, default=None, help="default: the example's")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=8.0,
                    help="the budget: the time version's state bytes / this (default 8)")
    ap.add_argument("--long-steps", type=int, default=0,
                    help="also run the budget version this many steps within half the time "
                         "version's state and gradient bytes")
    ap.add_argument("--profile", action="store_true",
                    help="print each form's device time per kernel over one more iteration "
                         "(vkad.profile, every launch timed: docs/debugging.md)")
    ap.add_argument("--warp", action="store_true",
                    help="also Warp's CUDA graph of the time-axis program (2-D; CUDA and Warp)")
    ap.add_argument("--warp-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    mod = diffmpm if a.dim == 2 else diffmpm3d
    if a.warp_child:
        warp_child(a.steps or mod.STEPS, a.grid or mod.N_GRID, a.iters)
        return
    a.steps = a.steps or mod.STEPS
    a.grid = a.grid or mod.N_GRID
    print(f"{mod.__name__} robot, {a.grid}^{a.dim} grid, {a.steps} steps, {a.iters} iterations "
          "timed")
    full = run(mod, a.steps, a.grid, a.iters, profile=a.profile)
    budget = int(full["state"] / a.fraction)
    ring = run(mod, a.steps, a.grid, a.iters, budget, profile=a.profile)
    np.testing.assert_allclose(ring["loss"], full["loss"], rtol=1e-4)
    for name in ("weights", "bias"):
        np.testing.assert_allclose(ring["grads"][name], full["grads"][name], rtol=1e-3,
                                   atol=1e-7, err_msg=name)
    print(f"first iteration: loss {full['loss']:.6f} both, gradients equal (rtol 1e-3)")
    held_full = report("time", full)
    held_ring = report("budget", ring)
    print(f"budget {mib(budget):.1f} MiB (1/{a.fraction:g} of the time version's state): "
          f"{ring['ms'] / full['ms']:.2f}x its ms per iteration, {held_ring / held_full:.3f}x "
          f"its differentiation bytes")
    if a.long_steps:
        # The long run's budget: half what the time version holds for differentiation (the
        # rest of what the session holds, the graph's and the recording's, beside it); the
        # check is on the device memory in live buffers, all of it.
        long_budget = int(held_full // 2)
        long = run(mod, a.long_steps, a.grid, max(1, a.iters // 4), long_budget)
        report(f"{a.long_steps}", long)
        print(f"{a.long_steps} steps in {mib(long['device']):.1f} MiB of live buffers (the "
              f"{a.steps}-step time version: {mib(full['device']):.1f}): "
              f"{long['ms'] / full['ms']:.2f}x its ms per iteration "
              f"({long['ms'] / full['ms'] * a.steps / a.long_steps:.2f}x per step); peak "
              f"device memory {mib(long['peak']):.1f} MiB of blocks against the time version's "
              f"{mib(full['peak']):.1f}")
        assert all(np.isfinite(long["losses"]))
        # (a verdict, not a check: at small sizes the runtime's own rings, a few MiB, outweigh
        # both versions' arrays)
        print("within the time version's device memory" if long["device"] <= full["device"]
              else "MORE device memory than the time version")
    if a.warp and a.dim == 2:
        w = run_warp(a.steps, a.grid, a.iters)
        if w is not None:
            np.testing.assert_allclose(w["loss"], full["loss"], rtol=1e-4)
            for name in ("weights", "bias"):
                np.testing.assert_allclose(np.array(w["grads"][name]), full["grads"][name],
                                           rtol=1e-3, atol=1e-7, err_msg=f"warp {name}")
            smi = "" if w["smi"] is None else f", nvidia-smi +{mib(w['smi']):.0f} MiB"
            print(f"    warp {w['version']} tape in a CUDA graph (time axis): {w['ms']:9.2f} "
                  f"ms/iteration, first loss and gradients equal vkad's (rtol 1e-3); peak "
                  f"{mib(w['pool_peak']):.1f} MiB in its memory pool{smi}")
            print(f"against it: vkad time axis {full['ms'] / w['ms']:.2f}x, budget "
                  f"{ring['ms'] / w['ms']:.2f}x its ms per iteration; budget's peak "
                  f"{mib(ring['peak']):.1f} MiB of blocks against its "
                  f"{mib(w['pool_peak']):.1f} MiB")


if __name__ == "__main__":
    main()
