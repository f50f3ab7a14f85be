"""Launch overhead from Python: µs per launch of a tiny kernel (x[i] += a over 64 elements,
each launch after the previous), for vkad and, measured the same way, Taichi and Quadrants.

    python bench/python_launch.py [--backend vkad|vkad-bound|taichi|quadrants] [--launches N]
                                  [--reps R]
                                  [--n ELEMENTS] [--json FILE]

Per rep: N launches recorded back to back, then a synchronize. The array starts as seeded random
data and is checked after timing, exactly, against the same f32 additions made with numpy (a
wrong result exits 3). vkad-bound launches through
Session.bind (the array bound once, the scalar per call). Prints the median over reps of
µs per launch for the launches alone and for the batch including the wait. vkad's C++ figure
for the same loop is build/bench/vkad-bench-launch. Taichi and Quadrants are not dependencies:
install them into a separate venv (`pip install taichi`, `pip install quadrants`) and run this
script there with --backend; their arch is Vulkan (lavapipe where there is no GPU), as vkad's.
Numbers and machines: docs/benchmarks.md, "Launch cost".
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def measure(launch, sync, launches, reps):
    record, total = [], []
    for r in range(reps + 1):  # rep 0 warms up (compiles, allocates)
        t0 = time.perf_counter()
        for _ in range(launches):
            launch()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        if r:
            record.append((t1 - t0) / launches * 1e6)
            total.append((t2 - t0) / launches * 1e6)
    return statistics.median(record), statistics.median(total)


def initial(n):
    """The array's seeded random start (benchmarks fill inputs with non-trivial data)."""
    import numpy as np
    return np.random.default_rng(1).uniform(-1, 1, n).astype(np.float32)


def expected(x0, count):
    """x0 after `count` launches of x += 1, added in f32 in the same order as the device."""
    import numpy as np
    x = x0.copy()
    one = np.float32(1.0)
    for _ in range(count):
        x += one
    return x


def vkad_backend(n, bound=False):
    import vkad
    s = vkad.Session()
    k = s.compile((HERE / "launch_kernel.vkir").read_text())
    x = s.ndarray(initial(n))
    if bound:
        b = s.bind(k, x=x)
        return s.device_name, (lambda: b(1.0)), s.synchronize, x.numpy
    return s.device_name, (lambda: s.launch(k, 1.0, x)), s.synchronize, x.numpy


def taichi_like_backend(mod, n):
    ti = mod
    ti.init(arch=ti.vulkan, offline_cache=False)

    @ti.kernel
    def bump(a: ti.f32, x: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        for i in x:
            x[i] += a

    x = ti.ndarray(ti.f32, n)
    x.from_numpy(initial(n))
    return f"{mod.__name__} vulkan", (lambda: bump(1.0, x)), ti.sync, x.to_numpy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="vkad", choices=["vkad", "vkad-bound", "taichi", "quadrants"])
    ap.add_argument("--launches", type=int, default=500)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.backend in ("vkad", "vkad-bound"):
        device, launch, sync, read = vkad_backend(a.n, bound=a.backend == "vkad-bound")
    else:
        device, launch, sync, read = taichi_like_backend(__import__(a.backend), a.n)
    record, total = measure(launch, sync, a.launches, a.reps)
    import numpy as np
    got, want = read(), expected(initial(a.n), a.launches * (a.reps + 1))
    if not np.array_equal(got, want):  # every launch ran, in order, on every element
        i = int(np.flatnonzero(got != want)[0])
        print(f"CHECK FAILED: x[{i}] = {got[i]}, expected {want[i]}", file=sys.stderr)
        raise SystemExit(3)
    print(f"{a.backend} ({device}), {a.launches} launches x {a.reps} reps, {a.n} elements:")
    print(f"  launch only   {record:.2f} us/launch\n  with the wait {total:.2f} us/launch")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"backend": a.backend, "device": device, "record_us": record, "total_us": total}))


if __name__ == "__main__":
    main()
