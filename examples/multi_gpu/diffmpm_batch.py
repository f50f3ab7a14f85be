#!/usr/bin/env python3
"""DiffTaichi's diffmpm trained data-parallel over a batch of scenes, one vkad session per GPU.

The batch is B robots (DiffTaichi's robot, examples/difftaichi/diffmpm.py; scene k shifted right
by k * SHIFT) driven by one controller (weights, bias); the batch's loss is the mean of the
robots' losses (DiffTaichi's: minus the solid particles' mean x at the last step), so its
gradient is the mean of theirs. Rank r of N simulates its share of the scenes (contiguous,
several per rank where B > N), each a DiffMPM on the rank's session, its training iteration
captured as a graph once and replayed; the rank sums its scenes' losses and gradients, the ranks
all-reduce the sums (torch.distributed: gloo through the host, or NCCL on the GPUs), and every
rank takes the same step, DiffTaichi's w -= LEARNING_RATE * gradient. The loss curve is the one
of one session running the whole batch (--check runs that and compares): the same scenes, the
same kernels, only the order of the B-term sums differs.

    python examples/multi_gpu/diffmpm_batch.py --devices 4 [--batch B] [--steps S] [--grid G]
        [--iters K] [--threads] [--reduce gloo|nccl] [--check] [--json FILE]

The processes, threads, devices and reducers are examples/multi_gpu/train.py's (--devices N
starts N worker processes, rank r on GPU r; --threads runs them as threads of this process; on
lavapipe every rank shares the CPU device). What is not overlapped: the controller's gradient is
complete only when the whole backward has run (every step reads the weights), so the all-reduce
follows the backward; with 20 numbers it costs a host round trip, not bandwidth.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np

import vkad

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "difftaichi"))
import diffmpm  # noqa: E402  (examples/difftaichi/diffmpm.py)


def _load_train():
    # Under the name tests/python/test_multi_gpu.py loads it by (dataclasses look modules up by
    # name): one module either way.
    if "multi_gpu_train" in sys.modules:
        return sys.modules["multi_gpu_train"]
    spec = importlib.util.spec_from_file_location("multi_gpu_train", os.path.join(HERE, "train.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["multi_gpu_train"] = module
    spec.loader.exec_module(module)
    return module


mg = _load_train()  # the ranks' processes and threads, devices and reducers

SHIFT = 0.02  # scene k's robot starts k * SHIFT to the right of DiffTaichi's


class Scenes:
    """One rank's share of the batch: scenes [lo, hi), a DiffMPM each on `session`."""

    def __init__(self, session: vkad.Session, lo: int, hi: int, steps: int, n_grid: int):
        self.sims = [diffmpm.DiffMPM(session, steps, n_grid, shift=(SHIFT * k, 0.0), seed=0)
                     for k in range(lo, hi)]

    def initial_weights(self) -> Dict[str, np.ndarray]:
        # DiffTaichi's initialisation from seed 0: every rank's scenes start from the same.
        return self.sims[0].weights()

    def finish_rework(self) -> None:
        """Each scene's Simulation.finish_rework: the timed iterations replay reworked graphs."""
        for sim in self.sims:
            sim.finish_rework()

    def grad(self, w: Dict[str, np.ndarray]):
        """The scenes' summed loss and gradient (flattened, PARAMS in order) at weights `w`."""
        loss, g = 0.0, None
        for sim in self.sims:
            sim.set_weights(w)
            loss += sim.run_iteration(sim.forward_backward)
            grads = sim.gradients()
            flat = np.concatenate([grads[p].astype(np.float64).ravel() for p in sim.PARAMS])
            g = flat if g is None else g + flat
        return loss, g


def train_batch(scenes: Scenes, reduce, iters: int, batch: int, warmup: int = 0) -> Dict:
    """DiffTaichi's gradient descent on the batch's mean loss: each iteration the rank's scenes'
    sums, all-reduced (sum; `reduce` None: one rank), divided by the batch, one step on every
    rank. Returns the history (the batch's loss and gradient per iteration, this rank's own
    sums) and times (s) as train.py's train() does. After the first iteration (which captures
    each scene's graph) the rank waits, untimed, for the graphs' background rework."""
    w = scenes.initial_weights()
    shapes = [(p, w[p].shape) for p in diffmpm.DiffMPM.PARAMS]
    on_device = getattr(reduce, "on_device", False)
    if reduce is not None:
        import torch
    hist = {"loss": [], "grad": [], "local_loss": [], "local_grad": []}
    times = {"compute": 0.0, "allreduce": 0.0, "update": 0.0, "total": 0.0}
    for it in range(warmup + iters):
        t0 = time.perf_counter()
        loss, g = scenes.grad(w)
        local = np.concatenate([g, [loss]])
        t1 = time.perf_counter()
        if reduce is None:
            total = local
        else:
            buf = torch.from_numpy(local.copy())
            if on_device:  # NCCL all-reduces CUDA tensors
                buf = buf.cuda()
            reduce(buf)
            total = buf.cpu().numpy()
        t2 = time.perf_counter()
        mean = total / batch
        if it >= warmup:
            hist["loss"].append(float(mean[-1]))
            hist["grad"].append(mean[:-1].tolist())
            hist["local_loss"].append(float(loss))
            hist["local_grad"].append(g.tolist())
        at = 0
        for p, shape in shapes:
            n = int(np.prod(shape))
            w[p] = w[p] - diffmpm.LEARNING_RATE * mean[at:at + n].reshape(shape)
            at += n
        t3 = time.perf_counter()
        if it == 0:
            scenes.finish_rework()
        if it >= warmup:
            times["compute"] += t1 - t0
            times["allreduce"] += t2 - t1
            times["update"] += t3 - t2
            times["total"] += t3 - t0
    return {"history": hist, "times": times, "iters": iters,
            "final_weights": {p: w[p].tolist() for p in w}}


def run_rank(rank: int, world: int, args, reduce_kind: str, group=None) -> Dict:
    """One rank: its session, its scenes, training; the record it returns (train.py's fields,
    `scenes` for `particles`)."""
    device = mg.pick_device(rank, world, args.device)
    session = vkad.Session(device=device or None)
    lo, hi = mg.shard_range(args.batch, world, rank)
    t0 = time.perf_counter()
    scenes = Scenes(session, lo, hi, args.steps, args.grid)
    setup = time.perf_counter() - t0
    out = train_batch(scenes, mg.make_reducer(reduce_kind, group), args.iters, args.batch,
                      args.warmup)
    out.update(rank=rank, world=world, scenes=[lo, hi], device=session.device_name,
               device_uuid=session.device_uuid, setup_s=setup,
               validation_messages=session.validation_messages())
    del scenes
    session.close()
    return out


def single(args, session: Optional[vkad.Session] = None) -> Dict:
    """One session over the whole batch (the scenes one after another), the same iterations."""
    own = session is None
    s = session or vkad.Session(device=args.device or None)
    out = train_batch(Scenes(s, 0, args.batch, args.steps, args.grid), None,
                      args.iters, args.batch, args.warmup)
    if own:
        s.close()
    return out


def compare(records: List[Dict], one: Dict, rtol: float = 1e-4) -> Dict:
    """The ranks' loss curve and gradients against one session's, iteration by iteration: the
    relative loss difference and the gradient difference over the gradient's norm. The same
    scenes run the same kernels on either side; what differs is the order of the B-term sums
    (and, on a GPU, of the grid's atomic adds), so `rtol` (1e-4) is far above f32 rounding of
    a few iterations and far below what a missing scene or rank would change (1/B of it)."""
    rows = []
    ok = True
    for i, (la, lb) in enumerate(zip(records[0]["history"]["loss"], one["history"]["loss"])):
        ga = np.array(records[0]["history"]["grad"][i])
        gb = np.array(one["history"]["grad"][i])
        loss_diff = abs(la - lb) / max(abs(lb), 1e-30)
        grad_diff = float(np.linalg.norm(ga - gb) / max(np.linalg.norm(gb), 1e-30))
        row_ok = loss_diff <= rtol and grad_diff <= 10 * rtol
        ok = ok and row_ok
        rows.append({"iteration": i, "loss": la, "single_loss": lb, "loss_diff": loss_diff,
                     "grad_diff": grad_diff, "ok": row_ok})
    same = all(r["history"]["loss"] == records[0]["history"]["loss"] for r in records)
    return {"ok": ok and same, "ranks_agree": same, "iterations": rows}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=1, help="ranks: one session (GPU) each")
    p.add_argument("--batch", type=int, default=None,
                   help="scenes in the batch (default: one per rank)")
    p.add_argument("--per-device", type=int, default=None,
                   help="scenes per rank instead (weak scaling): --batch = N * this")
    p.add_argument("--steps", type=int, default=diffmpm.STEPS)
    p.add_argument("--grid", type=int, default=diffmpm.N_GRID)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=1, help="iterations before the timed ones")
    p.add_argument("--reduce", default="gloo", help="gloo (through the host) or nccl")
    mg.add_rank_arguments(p, "compare()")
    args = p.parse_args(argv)
    if args.per_device is not None:
        args.batch = args.per_device * args.devices
    if args.batch is None:
        args.batch = args.devices
    if args.batch < args.devices:
        p.error(f"--batch {args.batch} gives some of the {args.devices} ranks no scene")
    args.passthrough = ["--batch", str(args.batch), "--steps", str(args.steps), "--grid",
                        str(args.grid), "--iters", str(args.iters), "--warmup",
                        str(args.warmup), "--reduce", args.reduce]
    if args.device:
        args.passthrough += ["--device", args.device]
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        mg.worker_main(args, run_rank)
        return 0
    t0 = time.perf_counter()
    records = mg.run_ranks(args, run_rank, script=__file__)
    wall = time.perf_counter() - t0
    slowest = max(r["times"]["total"] for r in records)
    hist = records[0]["history"]
    t = max((r["times"] for r in records), key=lambda t: t["total"])
    summary = {
        "ranks": len(records), "batch": args.batch, "wall_s": wall,
        "iterations_per_s": args.iters / slowest if slowest > 0 else float("nan"),
        "allreduce_share": t["allreduce"] / slowest if slowest > 0 else float("nan"),
        "compute_share": t["compute"] / slowest if slowest > 0 else float("nan"),
        "loss_first": hist["loss"][0], "loss_last": hist["loss"][-1],
        "setup_s": max(r["setup_s"] for r in records),
        "devices": [f"{r['device']} ({r['device_uuid']})" for r in records],
        "validation_messages": sum(len(r["validation_messages"]) for r in records),
    }
    print(f"{summary['ranks']} rank(s), {args.batch} scenes, {args.steps} steps, {args.grid}^2: "
          f"loss {summary['loss_first']:.5f} -> {summary['loss_last']:.5f}, "
          f"{summary['iterations_per_s']:.2f} iterations/s, all-reduce "
          f"{100 * summary['allreduce_share']:.1f}% of the time")
    result = {"args": {k: v for k, v in vars(args).items() if k != "passthrough"},
              "summary": summary, "ranks": records}
    code = 0
    if args.check:
        check = compare(records, single(args))
        result["check"] = check
        for row in check["iterations"]:
            print(f"  iteration {row['iteration']}: loss {row['loss']:.6f} against one "
                  f"session's {row['single_loss']:.6f} (diff {row['loss_diff']:.2g}), gradient "
                  f"diff {row['grad_diff']:.2g}: {'equal' if row['ok'] else 'DIFFERENT'}")
        code = 0 if check["ok"] else 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
