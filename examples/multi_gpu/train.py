#!/usr/bin/env python3
"""Data-parallel training over several GPUs: one vkad.Session per device, one process per
device, gradients summed with torch.distributed.

The program is a DiffTaichi-style substep simulation. P particles start at x0[p] and must reach
goal[p] after S substeps of

    u  = tanh(K (goal - x))                     K = theta[0:4] as a 2x2 matrix
    a  = A_MAX u - DAMPING v + (theta[4], theta[5] + GRAVITY)
    v' = v + a dt,   x' = x + v' dt             (one launch per substep, state x[f, p], v[f, p])

and the loss is mean_p |x[S, p] - goal[p]|^2. The six parameters theta (a controller and a
learned constant thrust) are shared by every particle, so the gradient is a sum over particles:
split the particles over N devices, let each compute the gradient of its share (a vkad tape,
captured once as a graph and replayed each iteration), sum the N partial gradients with an
all-reduce, and every rank applies the same update. The losses and gradients equal those of one
session over the whole batch up to the order of the f32 additions (check_against_single()).

    python examples/multi_gpu/train.py --devices 2 [--particles P | --per-device P]
        [--steps S] [--iters K] [--lr LR] [--check] [--json FILE]

--devices N starts N worker processes (this file with --worker), rank r on GPU r: the Vulkan
device whose UUID is CUDA device r's where CUDA is present (vkad.device_for_cuda), else the r-th
Vulkan GPU, else (no GPU: lavapipe) all ranks on the automatic device. --devices 1 runs one
session in this process, without torch. --threads runs the N ranks as threads of this process
instead (one session each; torch.distributed's gloo process groups, one per thread). --check
then evaluates one session over the whole batch at the data-parallel run's parameters and
compares (the tolerance derivation is in check_against_single).

How gradients travel (--reduce): "gloo" downloads the 6 gradient values and the loss to the
host, all-reduces a torch CPU tensor through gloo and uploads the new parameters. "nccl" (NVIDIA
GPUs, one process per GPU) takes the device's sums as CUDA tensors without a copy
(torch.from_dlpack of the vkad arrays on cuda:<ordinal>, the same GPU: device_for_cuda matched
the UUID; the export makes torch's stream wait for vkad's writes), all-reduces them with NCCL on
the GPU and brings the 7 summed numbers to the host for the update: no vkad download, no gloo
round trip through the host's network stack.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

import vkad

A_MAX, DAMPING, GRAVITY, DURATION = 2.0, 0.5, -1.0, 1.0
N_PARAMS = 6


# ----------------------------------------------------------------------------- the program

def build_step(per_term: bool = False) -> vkad.KernelBuilder:
    """One substep for every particle of the shard: x[f + 1], v[f + 1] from x[f], v[f].

    The parameters come as one row per particle, theta[p, j] (broadcast from the six values by
    build_broadcast before each iteration): the adjoint then adds each particle's gradient into
    its own row (uncontended), where reading one shared theta[j] would make every thread of
    every substep's adjoint add into the same six words (vkad issues one atomic per invocation;
    on an H100 that contention cost 0.5 s per iteration at 2^20 particles). block_sum then sums
    the rows. per_term: theta[f, p, j], a row per (step, particle), so the adjoint leaves every
    term of the gradient's sum in its own element (check_against_single)."""
    kb = vkad.KernelBuilder("step_terms" if per_term else "step")
    f = kb.scalar("f", vkad.i32)
    dt = kb.scalar("dt", vkad.f32)
    theta = kb.ndarray("theta", vkad.f32, 3 if per_term else 2, grad=True)
    goal = kb.ndarray("goal", vkad.f32, 1, element=(2,), readonly=True)
    x = kb.ndarray("x", vkad.f32, 2, element=(2,), grad=True)
    v = kb.ndarray("v", vkad.f32, 2, element=(2,), grad=True)
    with kb.parallel_for("particles", 0, x.shape[1]) as p:
        th = [theta[f, p, j] if per_term else theta[p, j] for j in range(N_PARAMS)]
        xf, vf = x[f, p], v[f, p]
        d = goal[p] - xf
        u0 = vkad.tanh(th[0] * d[0] + th[1] * d[1])
        u1 = vkad.tanh(th[2] * d[0] + th[3] * d[1])
        a = vkad.Vector([A_MAX * u0 + th[4], A_MAX * u1 + th[5] + GRAVITY]) - DAMPING * vf
        vn = vf + a * dt
        v[f + 1, p] = vn
        x[f + 1, p] = xf + vn * dt
    return kb


def build_loss() -> vkad.KernelBuilder:
    """loss[p, 0] = |x[S, p] - goal[p]|^2 * inv_n (inv_n = 1 / the whole batch): each particle's
    share of the batch's mean loss, summed by block_sum (one atomic word for all would contend
    as theta would)."""
    kb = vkad.KernelBuilder("landing_loss")
    last = kb.scalar("last", vkad.i32)
    inv_n = kb.scalar("inv_n", vkad.f32)
    goal = kb.ndarray("goal", vkad.f32, 1, element=(2,), readonly=True)
    x = kb.ndarray("x", vkad.f32, 2, element=(2,), grad=True)
    loss = kb.ndarray("loss", vkad.f32, 2, grad=True)
    with kb.parallel_for("particles", 0, x.shape[1]) as p:
        d = x[last, p] - goal[p]
        loss[p, 0] = d.dot(d) * inv_n
    return kb


BLOCK = 256  # rows one invocation of block_sum adds


def build_block_sum() -> vkad.KernelBuilder:
    """dst[b, j] = sum of src[i, j] for i in [b BLOCK, (b + 1) BLOCK), added in order of i:
    one pass of a deterministic sum over rows (rows_sum repeats it down to one row)."""
    kb = vkad.KernelBuilder("block_sum")
    src = kb.ndarray("src", vkad.f32, 2, readonly=True)
    dst = kb.ndarray("dst", vkad.f32, 2)
    with kb.parallel_for_nd("blocks", dst.shape[0], dst.shape[1]) as (b, j):
        acc = kb.local(kb.f32(0))
        with kb.for_range(0, BLOCK) as r:
            i = b * BLOCK + r
            with kb.if_(i < src.shape[0]):
                acc.value = acc.value + src[i, j]
        dst[b, j] = acc.value
    return kb


def build_broadcast() -> vkad.KernelBuilder:
    """rows[p, j] = theta[j] for every particle p."""
    kb = vkad.KernelBuilder("broadcast")
    theta = kb.ndarray("theta", vkad.f32, 1, readonly=True)
    rows = kb.ndarray("rows", vkad.f32, 2)
    with kb.parallel_for_nd("rows", rows.shape[0], rows.shape[1]) as (p, j):
        rows[p, j] = theta[j]
    return kb


def build_init() -> vkad.KernelBuilder:
    """x[0] = x0, v[0] = 0 (once per shard; the tape never sees it)."""
    kb = vkad.KernelBuilder("init_state")
    x0 = kb.ndarray("x0", vkad.f32, 1, element=(2,), readonly=True)
    x = kb.ndarray("x", vkad.f32, 2, element=(2,))
    v = kb.ndarray("v", vkad.f32, 2, element=(2,))
    with kb.parallel_for("particles", 0, x.shape[1]) as p:
        x[0, p] = x0[p]
        v[0, p] = vkad.Vector([0.0, 0.0])
    return kb


def particles(total: int, lo: int, hi: int):
    """Start points and goals of particles lo..hi-1 of a batch of `total`: a function of the
    global index alone (a hash, not a random stream), so every split of the batch holds the same
    particles. Goals lie in a direction that turns with the index, so a rank that took the wrong
    slice has other goals."""
    g = np.arange(lo, hi, dtype=np.float64)
    h = np.sin(g * 12.9898) * 43758.5453
    r1 = h - np.floor(h)
    h = np.sin(g * 78.233) * 12345.6789
    r2 = h - np.floor(h)
    angle = 2 * math.pi * g / total
    x0 = np.stack([2 * r1 - 1, 0.5 + 0.5 * r2], 1)
    goal = x0 + np.stack([0.4 * np.cos(angle), 0.3 + 0.2 * np.sin(angle)], 1)
    return x0.astype(np.float32), goal.astype(np.float32)


def initial_theta() -> np.ndarray:
    return np.zeros(N_PARAMS, np.float32)


def sum_levels(n: int) -> List[int]:
    """Rows left after each block_sum pass over n rows, down to 1."""
    out = []
    while n > 1:
        n = -(-n // BLOCK)
        out.append(n)
    return out


class Shard:
    """Particles lo..hi-1 of a batch of `total` on one session: the parameters broadcast to one
    row per particle, forward, loss and backward on a tape, and the per-particle gradient rows
    and losses summed on the device (block_sum), all captured once as a graph; grad(theta)
    replays it and reads the loss and dL/dtheta (the shard's share of the batch's mean loss and
    of its gradient: 7 numbers)."""

    def __init__(self, session: vkad.Session, total: int, lo: int, hi: int, steps: int,
                 per_term: bool = False):
        self.s, self.total, self.steps, self.per_term = session, total, steps, per_term
        self.n = hi - lo
        s = session
        self.step = s.differentiate(build_step(per_term))
        self.loss_k = s.differentiate(build_loss())
        self.block_sum = s.compile(build_block_sum())
        self.broadcast = s.compile(build_broadcast())
        init = s.compile(build_init())
        x0, goal = particles(total, lo, hi)
        self.goal = s.ndarray(goal.reshape(self.n, 2), name="goal")
        self.x = s.empty((steps + 1, self.n, 2), vkad.f32, name="x")
        self.v = s.empty((steps + 1, self.n, 2), vkad.f32, name="v")
        self.params = s.empty(N_PARAMS, vkad.f32, name="params")
        rows_shape = (steps, self.n, N_PARAMS) if per_term else (self.n, N_PARAMS)
        self.theta = s.empty(rows_shape, vkad.f32, name="theta")
        self.loss = s.zeros((self.n, 1), vkad.f32, name="loss")
        # The sums' passes: gradient rows (n, 6) -> ... -> (1, 6), losses (n, 1) -> ... -> (1, 1)
        self.grad_sums = [s.empty((m, N_PARAMS), vkad.f32) for m in sum_levels(self.n)]
        self.loss_sums = [s.empty((m, 1), vkad.f32) for m in sum_levels(self.n)]
        x0_dev = s.ndarray(x0.reshape(self.n, 2), name="x0")
        s.launch(init, x0_dev, self.x, self.v)
        s.synchronize()
        self.tape = s.tape()
        self.set_theta(initial_theta())
        self._iteration()  # makes the tape's gradient arrays, which the graph binds
        with s.capture("data-parallel shard") as g:
            self._iteration()
        self.graph = g

    def _sum(self, src, levels) -> None:
        for dst in levels:
            self.s.launch(self.block_sum, src, dst)
            src = dst

    def _iteration(self) -> None:
        s, dt = self.s, DURATION / self.steps
        if not self.per_term:
            s.launch(self.broadcast, self.params, self.theta)
        with self.tape:
            for f in range(self.steps):
                s.launch(self.step, f, dt, self.theta, self.goal, self.x, self.v)
            s.launch(self.loss_k, self.steps, 1.0 / self.total, self.goal, self.x, self.loss)
        self.tape.backward(seed={self.loss: 1.0})
        self._sum(self.loss, self.loss_sums)
        if not self.per_term:
            self._sum(self.tape.grad(self.theta), self.grad_sums)

    def set_theta(self, theta: np.ndarray) -> None:
        theta = np.asarray(theta, np.float32)
        self.params.upload(theta)
        if self.per_term:
            self.theta.upload(np.ascontiguousarray(
                np.broadcast_to(theta, (self.steps, self.n, N_PARAMS))))

    def run(self) -> None:
        """Asynchronous: the captured forward + backward + sums at the parameters set."""
        self.s.replay(self.graph)

    def read(self):
        """(loss, dL/dtheta) of the last run(): waits for it. per_term: the gradient per
        (step, particle, parameter), each one term of the sum."""
        loss = float((self.loss_sums[-1] if self.loss_sums else self.loss).numpy()[0, 0])
        if self.per_term:
            return loss, self.tape.grad(self.theta).numpy()
        g = self.grad_sums[-1] if self.grad_sums else self.tape.grad(self.theta)
        return loss, g.numpy()[0]

    def grad(self, theta: np.ndarray):
        self.set_theta(theta)
        self.run()
        return self.read()


# ----------------------------------------------------------------------------- training

Reducer = Callable[["object"], None]  # all-reduces a torch CPU tensor (sum) in place


def make_reducer(kind: str, group=None) -> Optional[Reducer]:
    """The all-reduce of one rank. "gloo": a torch CPU tensor through torch.distributed (the
    default group, or `group`, a ProcessGroupGloo of this thread). "none": one rank, nothing to
    reduce.

    NCCL (not built yet): with NdArray.__dlpack__ (issue 25), the reducer would take the vkad
    gradient array itself, `t = torch.from_dlpack(shard.tape.grad(shard.theta))` on
    cuda:<ordinal> (device_for_cuda matched the UUID), `dist.all_reduce(t)` on an NCCL group,
    and the update would run on the device: no download, no upload. The training loop below
    keeps the reducer's call in one place so that path replaces this function only."""
    if kind == "none":
        return None
    if kind == "gloo":
        import torch.distributed as dist
        if group is not None:
            return lambda t: group.allreduce([t]).wait()
        return lambda t: dist.all_reduce(t)
    if kind == "nccl":
        import torch.distributed as dist

        def reduce_on_device(t):  # a CUDA tensor (train() builds it from DLPack views)
            dist.all_reduce(t)
        reduce_on_device.on_device = True  # type: ignore[attr-defined]
        return reduce_on_device
    raise ValueError(f"unknown --reduce {kind!r}: gloo, nccl or none")


def train(shard: Shard, reduce: Optional[Reducer], iters: int, lr: float,
          warmup: int = 0) -> Dict:
    """Gradient descent on theta: each iteration replays the shard's graph, reads its loss and
    gradient, sums them over the ranks and steps theta -= lr * grad (every rank the same).
    Returns the history (theta before each iteration, its loss and all-reduced gradient) and
    times (s): `compute` (upload theta, replay, read back: the device's share, waited for),
    `allreduce` (torch tensor, all-reduce: includes waiting for the slowest rank), `update`.
    The first `warmup` iterations are left out of the times."""
    import_torch = reduce is not None
    if import_torch:
        import torch
    theta = initial_theta().astype(np.float32)
    hist = {"theta": [], "loss": [], "grad": [], "local_grad": [], "local_loss": []}
    times = {"compute": 0.0, "allreduce": 0.0, "update": 0.0, "total": 0.0}
    on_device = getattr(reduce, "on_device", False)
    for it in range(warmup + iters):
        t0 = time.perf_counter()
        if on_device:
            # The sums stay on the GPU: DLPack views of vkad's arrays (no copy, no host wait;
            # torch's stream waits for vkad's writes), one 7-number buffer, NCCL's all-reduce,
            # then the 7 numbers to the host.
            shard.set_theta(theta)
            shard.run()
            g_view = torch.from_dlpack(shard.grad_sums[-1] if shard.grad_sums
                                       else shard.tape.grad(shard.theta))
            l_view = torch.from_dlpack(shard.loss_sums[-1] if shard.loss_sums else shard.loss)
            buf = torch.cat([g_view.reshape(-1)[:N_PARAMS], l_view.reshape(-1)[:1]])
            local = buf.cpu().numpy().copy()  # this rank's share, for the history
            t1 = time.perf_counter()
            reduce(buf)
            total = buf.cpu().numpy()
        else:
            loss, g = shard.grad(theta)
            t1 = time.perf_counter()
            local = np.concatenate([g.astype(np.float32), np.float32([loss])])
            if reduce is not None:
                buf = torch.from_numpy(local.copy())
                reduce(buf)
                total = buf.numpy()
            else:
                total = local
        t2 = time.perf_counter()
        if it >= warmup:
            hist["theta"].append(theta.tolist())
            hist["loss"].append(float(total[-1]))
            hist["grad"].append(total[:N_PARAMS].tolist())
            hist["local_grad"].append(local[:N_PARAMS].tolist())
            hist["local_loss"].append(float(local[-1]))
        theta = (theta - np.float32(lr) * total[:N_PARAMS]).astype(np.float32)
        t3 = time.perf_counter()
        if it >= warmup:
            times["compute"] += t1 - t0
            times["allreduce"] += t2 - t1
            times["update"] += t3 - t2
            times["total"] += t3 - t0
    hist["final_theta"] = theta.tolist()
    return {"history": hist, "times": times, "iters": iters}


def shard_range(total: int, world: int, rank: int):
    """Rank r's particles: contiguous, sizes differing by at most one."""
    return total * rank // world, total * (rank + 1) // world


def pick_device(rank: int, world: int, requested: Optional[str] = None) -> str:
    """The Vulkan device of rank `rank`, as a Session(device=) value (a UUID or ""):
    CUDA device `rank`'s twin where CUDA is present, else the rank-th Vulkan GPU, else the
    automatic device (lavapipe: every rank shares it)."""
    if requested:
        return requested.split(",")[rank] if "," in requested else requested
    if rank < len(vkad.cuda_uuids()):
        try:
            return vkad.device_for_cuda(rank).uuid
        except vkad.NotFoundError as e:  # a CUDA GPU Vulkan does not show: go by position
            print(f"rank {rank}: {e}; taking the rank-th Vulkan GPU", file=sys.stderr)
    gpus = [d for d in vkad.devices(cuda=False) if d.usable and not d.cpu]
    if len(gpus) >= world:
        return gpus[rank].uuid
    return ""


def run_rank(rank: int, world: int, args, reduce_kind: str, group=None) -> Dict:
    """One rank: its session, its shard, training; the record it returns."""
    device = pick_device(rank, world, args.device)
    session = vkad.Session(device=device or None)
    lo, hi = shard_range(args.particles, world, rank)
    t0 = time.perf_counter()
    shard = Shard(session, args.particles, lo, hi, args.steps)
    setup = time.perf_counter() - t0
    out = train(shard, make_reducer(reduce_kind, group), args.iters, args.lr, args.warmup)
    out.update(rank=rank, world=world, particles=[lo, hi], device=session.device_name,
               device_uuid=session.device_uuid, setup_s=setup,
               validation_messages=session.validation_messages())
    session.close()
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_processes(args, world: int, script: Optional[str] = None) -> List[Dict]:
    """`world` worker processes (`script`, default this file, with --worker), torch.distributed
    over localhost; each writes its record to a file this process reads. A worker that fails
    stops the run: the others, which would wait for it in their next all-reduce until the
    process group's timeout, are killed, and SystemExit names the rank."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="vkad-multi-gpu-") as tmp:
        procs = []
        for rank in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), WORLD_SIZE=str(world))
            cmd = [sys.executable, os.path.abspath(script or __file__), "--worker",
                   "--out", os.path.join(tmp, f"rank{rank}.json")] + args.passthrough
            procs.append(subprocess.Popen(cmd, env=env))
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                codes = [p.wait() for p in procs]
                # Its peers fail right after a failing rank (their all-reduce loses it), maybe
                # before it has exited: the first failure is the one stamped first.
                stamps = []
                for r in range(world):
                    try:
                        with open(os.path.join(tmp, f"rank{r}.json.failed")) as f:
                            stamps.append((json.load(f), r))
                    except (OSError, ValueError):
                        pass
                first, why = failed[0], ""
                if stamps:
                    stamp, first = min(stamps, key=lambda s: s[0]["time"])
                    why = f": {stamp['error']}"
                raise SystemExit(f"rank {first} failed (exit code {codes[first]}){why}; the "
                                 f"other ranks were stopped (worker exit codes {codes})")
            time.sleep(0.05)
        codes = [p.returncode for p in procs]
        if any(codes):
            raise SystemExit(f"worker exit codes {codes}")
        return [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]


def launch_threads(args, world: int, rank_fn: Optional[Callable[..., Dict]] = None) -> List[Dict]:
    """`world` ranks as threads of this process, one session each, gloo process groups over one
    in-memory store (torch.distributed.ProcessGroupGloo per thread); each runs `rank_fn` (default
    run_rank) with run_rank's arguments."""
    import datetime
    import torch.distributed as dist
    store = dist.HashStore()
    out: List[Optional[Dict]] = [None] * world
    errors: List[BaseException] = []
    # Each rank's group outlives every rank's thread: a group destroyed as its thread ends, while
    # the other rank's group is still connected to it, has aborted the process (gloo's teardown;
    # seen as "Fatal Python error: Aborted" in a finished rank's thread while the other closed its
    # session: twice in the last two sessions' full suite runs on the 2-core machine, never alone).
    groups: List[object] = []

    def body(rank):
        try:
            group = dist.ProcessGroupGloo(store, rank, world, datetime.timedelta(seconds=120))
            groups.append(group)
            out[rank] = (rank_fn or run_rank)(rank, world, args, "gloo", group)
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    groups.clear()  # every rank done: the groups go together
    if errors:
        raise errors[0]
    return out  # type: ignore[return-value]


def worker_main(args, rank_fn: Optional[Callable[..., Dict]] = None) -> None:
    """A worker process of launch_processes: its process group, `rank_fn` (default run_rank)
    with run_rank's arguments, its record written to args.out."""
    import datetime
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.reduce == "nccl":
        import torch
        torch.cuda.set_device(rank)  # rank r's GPU: pick_device took CUDA device r's twin
    # A bounded wait: a rank whose peer died mid-run fails instead of waiting 30 minutes
    # (launch_processes stops the others sooner).
    dist.init_process_group("nccl" if args.reduce == "nccl" else "gloo", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        record = (rank_fn or run_rank)(rank, world, args, args.reduce)
    except BaseException as e:
        # Stamped before the group goes (which makes the peers fail): launch_processes names
        # the rank that failed first.
        with open(args.out + ".failed", "w") as f:
            json.dump({"time": time.time(), "error": f"{type(e).__name__}: {e}"}, f)
        raise
    finally:
        dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(record, f)


# ----------------------------------------------------------------------------- checking

U = 2.0 ** -24  # f32 unit roundoff


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): a sum of n + 1 terms computed in f32 in any order
    (any tree) is within gamma_n * sum |terms| of the exact sum (Higham, Accuracy and Stability
    of Numerical Algorithms, 2nd ed., eq. 4.4 and section 4.3)."""
    return n * U / (1 - n * U)


def check_against_single(records: List[Dict], steps: int, total: int,
                         session: Optional[vkad.Session] = None,
                         iterations: Optional[Sequence[int]] = None) -> Dict:
    """One session over the whole batch, evaluated at the parameters each data-parallel
    iteration started from, against that iteration's all-reduced loss and gradient.

    Why they may differ, and by how much. Every particle's computation is the same in both runs
    (same kernels, same inputs, same device model), so each term of the sums is the same f32
    number; only the grouping of the f32 additions differs. A gradient component is the sum of
    m = steps * total terms a[f, p] (substep f, particle p): the adjoints add particle p's terms
    into its own row, one per substep (at most `steps` additions), block_sum adds rows in order,
    BLOCK at a time, over L passes (at most BLOCK additions per pass), and the all-reduce adds
    the W ranks' sums (at most W - 1). A term thus goes through at most
    h = steps + BLOCK * L + W - 1 rounded additions, and an f32 sum computed by any such tree is
    within gamma(h) * sum |terms| of the exact sum (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., section 4.2: each term carries a factor (1 + d) with |d| <= gamma of the
    number of additions it goes through). The data-parallel run (h_dp: L over its shard, W
    ranks) and the single session (h_1: L over the batch, W = 1) are each within their bound of
    the exact sum, so of each other within (gamma(h_dp) + gamma(h_1)) * sum |terms|. For the loss
    the terms are each particle's share (squares, so sum |terms| = the loss) and h has no
    `steps`. For the gradient, sum |terms| is measured: the same program with theta given a
    (step, particle) axis leaves every term in its own element (Shard(per_term=True)); its f64
    sum is also the exact reference, which the single session must be within gamma(h_1) * sum
    |terms| of (a check of the measurement itself).

    Returns the per-iteration comparisons and whether every one holds."""
    own = session is None
    session = session or vkad.Session()
    whole = Shard(session, total, 0, total, steps)
    terms = Shard(session, total, 0, total, steps, per_term=True)
    hist = records[0]["history"]
    for r in records[1:]:  # every rank applied the same update: identical parameters
        if r["history"]["theta"] != hist["theta"]:
            raise AssertionError(f"rank {r['rank']}'s parameters differ from rank 0's")
    world = len(records)
    rows_dp = max(r["particles"][1] - r["particles"][0] for r in records)
    h_1 = BLOCK * len(sum_levels(total))
    h_dp = BLOCK * len(sum_levels(rows_dp)) + world - 1
    rows = []
    ok = True
    picks = range(len(hist["theta"])) if iterations is None else iterations
    for it in picks:
        theta = np.float32(hist["theta"][it])
        loss1, g1 = whole.grad(theta)
        _, per = terms.grad(theta)
        per = per.astype(np.float64).reshape(-1, N_PARAMS)
        abs_sum, exact = np.abs(per).sum(0), per.sum(0)
        g_dp, loss_dp = np.float64(hist["grad"][it]), hist["loss"][it]
        g1 = g1.astype(np.float64)
        tol_g = (gamma(steps + h_dp) + gamma(steps + h_1)) * abs_sum
        tol_loss = (gamma(h_dp) + gamma(h_1)) * loss1
        row = {
            "iteration": it, "loss_data_parallel": loss_dp, "loss_single": loss1,
            "loss_diff": abs(loss_dp - loss1), "loss_tol": tol_loss,
            "grad_data_parallel": g_dp.tolist(), "grad_single": g1.tolist(),
            "grad_diff": np.abs(g_dp - g1).tolist(), "grad_tol": tol_g.tolist(),
            "grad_abs_terms": abs_sum.tolist(), "grad_exact_f64": exact.tolist(),
            "single_vs_f64": np.abs(g1 - exact).tolist(),
            "single_vs_f64_tol": (gamma(steps + h_1) * abs_sum).tolist(),
            # what a missing all-reduce would give: rank 0's own share
            "rank0_share_diff": np.abs(np.float64(records[0]["history"]["local_grad"][it])
                                       - g1).tolist(),
        }
        row["ok"] = bool(row["loss_diff"] <= tol_loss and np.all(np.abs(g_dp - g1) <= tol_g)
                         and np.all(np.abs(g1 - exact) <= gamma(steps + h_1) * abs_sum))
        ok = ok and row["ok"]
        rows.append(row)
    if own:
        session.close()
    return {"ok": ok, "iterations": rows, "additions_per_term": {"single": steps + h_1,
                                                                 "data_parallel": steps + h_dp}}


# ----------------------------------------------------------------------------- command line

def add_rank_arguments(p: argparse.ArgumentParser, check: str) -> None:
    """How the ranks run, what they are compared with and where the record goes: the arguments
    this file and diffmpm_batch.py share (`check`: the function --check names)."""
    p.add_argument("--threads", action="store_true", help="ranks as threads of one process")
    p.add_argument("--device", default=None,
                   help="Vulkan device(s) for the ranks, comma-separated (default: GPU r)")
    p.add_argument("--check", action="store_true",
                   help=f"compare with one session over the whole batch ({check})")
    p.add_argument("--json", default=None, help="write the run's record here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)


def run_ranks(args, rank_fn: Optional[Callable[..., Dict]] = None,
              script: Optional[str] = None) -> List[Dict]:
    """The run's records, one per rank: one rank in this process (--devices 1, no torch), the
    ranks as threads (--threads) or as worker processes of `script` (default this file);
    `rank_fn` (default run_rank) is each rank's work."""
    rank_fn = rank_fn or run_rank
    if args.devices == 1 and not args.threads:
        return [rank_fn(0, 1, args, "none")]
    if args.threads:
        return launch_threads(args, args.devices, rank_fn)
    return launch_processes(args, args.devices, script)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=1, help="ranks: one session (GPU) each")
    p.add_argument("--particles", type=int, default=None, help="the whole batch (default 2^16)")
    p.add_argument("--per-device", type=int, default=None,
                   help="particles per rank instead (weak scaling): --particles = N * this")
    p.add_argument("--steps", type=int, default=64, help="substeps per simulation")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2, help="iterations before the timed ones")
    p.add_argument("--lr", type=float, default=2.0)
    p.add_argument("--reduce", default="gloo",
                   help="gloo (through the host) or nccl (NVIDIA GPUs, DLPack views, one process "
                        "per GPU)")
    add_rank_arguments(p, "check_against_single")
    args = p.parse_args(argv)
    if args.per_device is not None:
        args.particles = args.per_device * args.devices
    if args.particles is None:
        args.particles = 1 << 16
    # What a worker needs to rebuild the same run.
    args.passthrough = ["--particles", str(args.particles), "--steps", str(args.steps),
                        "--iters", str(args.iters), "--warmup", str(args.warmup),
                        "--lr", repr(args.lr), "--reduce", args.reduce]
    if args.device:
        args.passthrough += ["--device", args.device]
    return args


def summarize(records: List[Dict], wall: float) -> Dict:
    iters = records[0]["iters"]
    # The slowest rank sets the pace (the others wait for it inside the all-reduce): its
    # iterations/s and its split of the time.
    t = max((r["times"] for r in records), key=lambda t: t["total"])
    slowest = t["total"]
    return {
        "ranks": len(records),
        "particles": sum(r["particles"][1] - r["particles"][0] for r in records),
        "devices": [f"{r['device']} ({r['device_uuid']})" for r in records],
        "iterations_per_s": iters / slowest if slowest > 0 else float("nan"),
        "allreduce_share": t["allreduce"] / slowest if slowest > 0 else float("nan"),
        "compute_share": t["compute"] / slowest if slowest > 0 else float("nan"),
        "allreduce_share_per_rank": [r["times"]["allreduce"] / r["times"]["total"]
                                     for r in records if r["times"]["total"] > 0],
        "setup_s": max(r["setup_s"] for r in records),
        "wall_s": wall,
        "loss_first": records[0]["history"]["loss"][0],
        "loss_last": records[0]["history"]["loss"][-1],
        "final_theta": records[0]["history"]["final_theta"],
        "validation_messages": sum(len(r["validation_messages"]) for r in records),
    }


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        worker_main(args)
        return 0
    t0 = time.perf_counter()
    records = run_ranks(args)
    wall = time.perf_counter() - t0
    summary = summarize(records, wall)
    print(f"{summary['ranks']} rank(s), {summary['particles']} particles, {args.steps} steps: "
          f"loss {summary['loss_first']:.5g} -> {summary['loss_last']:.5g}, "
          f"{summary['iterations_per_s']:.1f} iterations/s, all-reduce "
          f"{100 * summary['allreduce_share']:.1f}% of the time")
    for d in summary["devices"]:
        print("  on", d)
    result = {"args": {k: v for k, v in vars(args).items() if k != "passthrough"},
              "summary": summary, "ranks": records}
    code = 0
    if args.check:
        check = check_against_single(records, args.steps, args.particles,
                                     iterations=[0, len(records[0]["history"]["loss"]) - 1])
        result["check"] = check
        for row in check["iterations"]:
            print(f"  iteration {row['iteration']}: loss diff {row['loss_diff']:.3g} "
                  f"(tolerance {row['loss_tol']:.3g}), gradient diff "
                  f"{max(row['grad_diff']):.3g} (tolerance {min(row['grad_tol']):.3g}.."
                  f"{max(row['grad_tol']):.3g}): {'equal' if row['ok'] else 'DIFFERENT'}")
        code = 0 if check["ok"] else 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
