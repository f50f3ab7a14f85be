#!/usr/bin/env python3
"""The adjoint-floor kernels in PyTorch and JAX, for docs/benchmarks.md beside vkad's numbers.

Same kernels, sizes and inputs as `vkad-bench-adjoint-floor --x0 mod`:
  sin loop    x <- sin(x) * 0.9 + 0.1 for L steps, dL/dx0 with L = sum(x_L)
  recurrence  v <- 0.5 v + 0.25 sin(v) w for L steps from v0 = x, dL/dx and dL/dw
N = 2^24 floats, x0 = 0.001 (i mod 1000), w = 0.25 + 0.0005 (i mod 1000); L = 16, 64, 256.
Reported: ms per forward and per gradient (forward + backward, what a user of either framework
runs), median of --reps timed calls after warm-up, each synchronised. Frameworks that are not
installed are skipped with a line saying so.

  python3 bench/peers.py [--n N] [--steps 16,64,256] [--reps R] [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time


def timed(fn, sync, reps):
    fn()
    fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def run_torch(n, steps, reps, rows):
    try:
        import torch
    except ImportError as e:
        print(f"pytorch: skipped ({e})")
        return
    if not torch.cuda.is_available():
        print("pytorch: skipped (no CUDA device)")
        return
    dev = torch.device("cuda")
    i = torch.arange(n, device=dev)
    x0 = 0.001 * (i % 1000).float()
    w0 = 0.25 + 0.0005 * (i % 1000).float()
    sync = torch.cuda.synchronize
    name = f"pytorch {torch.__version__} eager, {torch.cuda.get_device_name(0)}"

    def sin_loop(x, L):
        for _ in range(L):
            x = torch.sin(x) * 0.9 + 0.1
        return x

    def recurrence(x, w, L):
        v = x
        for _ in range(L):
            v = 0.5 * v + 0.25 * torch.sin(v) * w
        return v

    for L in steps:
        with torch.no_grad():
            f = timed(lambda: sin_loop(x0, L), sync, reps)

        def grad_sin():
            x = x0.clone().requires_grad_(True)
            sin_loop(x, L).sum().backward()
            return x.grad

        g = timed(grad_sin, sync, reps)
        rows.append({"framework": name, "kernel": "sin_loop", "L": L, "n": n, "forward_ms": f, "grad_ms": g})
        with torch.no_grad():
            f = timed(lambda: recurrence(x0, w0, L), sync, reps)

        def grad_rec():
            x = x0.clone().requires_grad_(True)
            w = w0.clone().requires_grad_(True)
            recurrence(x, w, L).sum().backward()
            return x.grad, w.grad

        g = timed(grad_rec, sync, reps)
        rows.append({"framework": name, "kernel": "recurrence", "L": L, "n": n, "forward_ms": f, "grad_ms": g})


def run_jax(n, steps, reps, rows):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        print(f"jax: skipped ({e})")
        return
    devs = jax.devices()
    name = f"jax {jax.__version__} jit, {devs[0].device_kind}"
    i = jnp.arange(n)
    x0 = 0.001 * (i % 1000).astype(jnp.float32)
    w0 = 0.25 + 0.0005 * (i % 1000).astype(jnp.float32)

    for L in steps:
        def sin_loop(x, L=L):
            return jax.lax.fori_loop(0, L, lambda _, x: jnp.sin(x) * 0.9 + 0.1, x)

        def recurrence(x, w, L=L):
            return jax.lax.fori_loop(0, L, lambda _, v: 0.5 * v + 0.25 * jnp.sin(v) * w, x)

        fs = jax.jit(sin_loop)
        gs = jax.jit(jax.grad(lambda x: jnp.sum(sin_loop(x))))
        fr = jax.jit(recurrence)
        gr = jax.jit(jax.grad(lambda x, w: jnp.sum(recurrence(x, w)), argnums=(0, 1)))
        res = {}

        def sync():
            for v in res.values():
                jax.block_until_ready(v)

        def call(key, fn, *a):
            res[key] = fn(*a)

        f = timed(lambda: call("f", fs, x0), sync, reps)
        g = timed(lambda: call("g", gs, x0), sync, reps)
        rows.append({"framework": name, "kernel": "sin_loop", "L": L, "n": n, "forward_ms": f, "grad_ms": g})
        f = timed(lambda: call("f", fr, x0, w0), sync, reps)
        g = timed(lambda: call("g", gr, x0, w0), sync, reps)
        rows.append({"framework": name, "kernel": "recurrence", "L": L, "n": n, "forward_ms": f, "grad_ms": g})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--steps", default="16,64,256")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",")]
    if any(L <= 0 for L in steps):
        ap.error("--steps: every step count must be positive")
    rows = []
    run_torch(a.n, steps, a.reps, rows)
    run_jax(a.n, steps, a.reps, rows)
    print(f"{'framework':<48} {'kernel':<11} {'L':>4} {'forward ms':>11} {'grad ms':>9}")
    for r in rows:
        print(f"{r['framework'][:48]:<48} {r['kernel']:<11} {r['L']:>4} {r['forward_ms']:>11.3f} {r['grad_ms']:>9.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
