#!/usr/bin/env python3
"""The substep program of a differentiable simulation, in vkad and its peers.

S substeps of  b = sin(a) * 0.9 + 0.1  over P elements, one array per substep (x_0 .. x_S), a
tape, and backward from the seed dL/dx_S = 1 to dL/dx_0: what DiffTaichi, Warp's examples and
Genesis run, reduced to its launch pattern (2 S small launches per iteration). Reported: ms per
iteration (forward + tape + backward, synchronised at the end of each iteration), median of
--reps after warm-up, beside the memory floor: the bytes every implementation must move, the
x_j and dL/dx_j arrays the program writes (8 bytes per element and substep; inputs may be
recomputed from x_0 in registers, as a fused replay does) at --bandwidth GB/s, and the traffic of
the launches one by one (forward: read a, write b; backward: read a, read dL/db,
read-modify-write dL/da: 20 bytes per element and substep).

    python3 bench/substep.py [--backend vkad,vkad-graph,warp,warp-graph,jax,torch]
                             [--P 16384,1048576]
                             [--steps 1000] [--reps R] [--bandwidth 4000] [--json FILE]

Backends that are not installed are skipped with a line saying so. Each backend checks its
gradient against the closed form dL/dx_0 = prod_k 0.9 cos(x_k) at a few elements, so a fast
wrong program cannot pass. vkad uses its Python tape (persistent gradients, reused each
iteration); warp its Tape, and with warp-graph that tape captured in a CUDA graph; jax
jit(grad) of a lax.scan; torch eager autograd.
"""
import argparse
import json
import math
import statistics
import sys
import time


def x0_host(P):
    import numpy as np
    return (0.001 * (np.arange(P) % 1000)).astype(np.float32)


def closed_form(x0, steps, idx):
    """dL/dx_0 at elements idx, in float64 (the chain of 0.9 cos(x_k))."""
    out = []
    for i in idx:
        x, g = float(x0[i]), 1.0
        for _ in range(steps):
            g *= 0.9 * math.cos(x)
            x = math.sin(x) * 0.9 + 0.1
        out.append(g)
    return out


def check(name, got, want):
    for g, w in zip(got, want):
        # f32 chains of `steps` factors: a relative error of a few 1e-4 at 1000 steps.
        if not abs(g - w) <= 2e-3 * abs(w) + 1e-30:
            raise SystemExit(f"{name}: gradient {g} != closed form {w}")


def timed(iteration, sync, reps):
    iteration()
    iteration()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        iteration()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


STEP_IR = """
kernel step(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : f32
    %s = sin %x : f32
    %c9 = const 0.9 : f32
    %m = mul %s, %c9 : f32
    %c1 = const 0.1 : f32
    %y = add %m, %c1 : f32
    store b[%i], %y
  }
}
"""


def run_vkad(P, steps, reps, idx, graph=False):
    import numpy as np
    import vkad
    s = vkad.Session()
    k = s.differentiate(STEP_IR)
    xs = [s.ndarray(x0_host(P))] + [s.empty(P, vkad.f32) for _ in range(steps)]
    tape = s.tape()

    def iteration():
        with tape:
            for j in range(steps):
                s.launch(k, xs[j], xs[j + 1])
        tape.backward(seed={xs[steps]: 1.0})

    if graph:  # the whole iteration captured once (Session.capture), then one replay each
        iteration()
        with s.capture("substep") as g:
            iteration()
        ms = timed(lambda: s.replay(g), s.synchronize, reps)
    else:
        ms = timed(iteration, s.synchronize, reps)
    got = tape.grad(xs[0]).numpy()
    check("vkad", [float(got[i]) for i in idx], closed_form(x0_host(P), steps, idx))
    how = "python tape captured and replayed" if graph else "python tape"
    return f"vkad {getattr(vkad, '__version__', '')} {how}, {s.device_name}", ms


def run_warp(P, steps, reps, idx, graph):
    import numpy as np
    import warp as wp
    wp.init()

    @wp.kernel
    def step(a: wp.array(dtype=float), b: wp.array(dtype=float)):
        i = wp.tid()
        b[i] = wp.sin(a[i]) * 0.9 + 0.1

    dev = wp.get_device("cuda")
    xs = [wp.array(x0_host(P), dtype=float, device=dev, requires_grad=True)]
    xs += [wp.zeros(P, dtype=float, device=dev, requires_grad=True) for _ in range(steps)]
    seed = wp.ones(P, dtype=float, device=dev)
    tape = wp.Tape()

    def record():
        with tape:
            for j in range(steps):
                wp.launch(step, dim=P, inputs=[xs[j]], outputs=[xs[j + 1]], device=dev)
        tape.backward(grads={xs[steps]: seed})

    if graph:
        record()  # compile the kernels outside the capture
        wp.synchronize()
        tape.zero()
        tape.reset()
        with wp.ScopedCapture(device=dev) as cap:
            record()
        g = cap.graph

        def iteration():
            tape.zero()
            wp.capture_launch(g)
    else:
        def iteration():
            tape.reset()
            tape.zero()
            record()

    ms = timed(iteration, wp.synchronize, reps)
    got = xs[0].grad.numpy()
    check("warp", [float(got[i]) for i in idx], closed_form(x0_host(P), steps, idx))
    name = f"warp {wp.config.version} tape" + (" in a CUDA graph" if graph else "")
    return name + f", {dev.name}", ms


def run_jax(P, steps, reps, idx):
    import jax
    import jax.numpy as jnp
    if not any(d.platform == "gpu" for d in jax.devices()):
        raise ImportError("no GPU device for jax")

    def loss(x0):
        def body(x, _):
            return jnp.sin(x) * 0.9 + 0.1, None
        return jnp.sum(jax.lax.scan(body, x0, None, length=steps)[0])

    g = jax.jit(jax.grad(loss))
    x0 = jnp.asarray(x0_host(P))
    box = {}

    def iteration():
        box["g"] = g(x0)

    ms = timed(iteration, lambda: box["g"].block_until_ready(), reps)
    got = box["g"]
    check("jax", [float(got[i]) for i in idx], closed_form(x0_host(P), steps, idx))
    return f"jax {jax.__version__} jit(grad(scan)), {jax.devices()[0].device_kind}", ms


def run_torch(P, steps, reps, idx):
    import torch
    if not torch.cuda.is_available():
        raise ImportError("no CUDA device for torch")
    x0 = torch.tensor(x0_host(P), device="cuda", requires_grad=True)

    def iteration():
        x0.grad = None
        x = x0
        for _ in range(steps):
            x = torch.sin(x) * 0.9 + 0.1
        x.sum().backward()

    ms = timed(iteration, torch.cuda.synchronize, reps)
    got = x0.grad.cpu().numpy()
    check("torch", [float(got[i]) for i in idx], closed_form(x0_host(P), steps, idx))
    return f"torch {torch.__version__} eager, {torch.cuda.get_device_name(0)}", ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="vkad,vkad-graph,warp,warp-graph,jax,torch")
    ap.add_argument("--P", default="16384,1048576")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bandwidth", type=float, default=4000.0, help="GB/s for the memory floor")
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    rows = []
    runners = {"vkad": run_vkad, "vkad-graph": lambda *x: run_vkad(*x, graph=True),
               "jax": run_jax, "torch": run_torch,
               "warp": lambda *x: run_warp(*x, graph=False),
               "warp-graph": lambda *x: run_warp(*x, graph=True)}
    for P in [int(p) for p in a.P.split(",")]:
        floor_ms = 8.0 * P * a.steps / (a.bandwidth * 1e9) * 1e3
        unfused_ms = 20.0 * P * a.steps / (a.bandwidth * 1e9) * 1e3
        print(f"P = {P}, {a.steps} substeps: memory floor {floor_ms:.2f} ms at {a.bandwidth:g} GB/s"
              f" (8 B per element and substep written; the launches one by one move 20 B:"
              f" {unfused_ms:.2f} ms)")
        idx = [0, 1, P // 2 + 7, P - 1]
        for b in a.backend.split(","):
            try:
                name, ms = runners[b](P, a.steps, a.reps, idx)
            except ImportError as e:
                print(f"  {b}: skipped ({e})")
                continue
            print(f"  {name:70s} {ms:9.2f} ms/iteration  ({ms / floor_ms:.1f}x floor)")
            if ms < floor_ms:  # past the physical limit: a wrong measurement, not a result
                print(f"  {b}: {ms:.2f} ms is below the memory floor: check the measurement")
            rows.append({"backend": b, "name": name, "P": P, "steps": a.steps, "ms": ms,
                         "floor_ms": floor_ms, "unfused_traffic_ms": unfused_ms})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
