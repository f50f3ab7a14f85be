"""DLPack exchange between vkad and PyTorch / CuPy / JAX on an NVIDIA GPU (docs/interop.md, "Sharing
arrays with PyTorch, JAX and numpy"). Prints and writes JSON (--out):

- the same data pointer at every torch.from_dlpack(vkad_array);
- the time of one exchange of a 1 GiB array (torch.from_dlpack(a), a the vkad array; median of
  repeated exports after the first, which imports the memory block into CUDA), against the time
  torch needs to copy 1 GiB on the same GPU (what an exchange through a copy would cost);
- a round trip torch -> vkad (a device copy) -> torch, checked equal;
- cupy.from_dlpack / jax.dlpack.from_dlpack of the same vkad array, where installed.

    python bench/dlpack_exchange.py [--gib 1] [--repeat 200] [--out dlpack.json]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import vkad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    s = vkad.Session()
    out = {"device": s.device_name, "interop": s.interop_info()}
    n = int(args.gib * (1 << 30)) // 4
    a = s.zeros(n, vkad.f32, name="big")
    kind, index = a.__dlpack_device__()
    out["dlpack_device"] = [kind, index]
    if kind != 2:
        print(json.dumps(out, indent=1))
        print("not a CUDA device: nothing to measure", file=sys.stderr)
        return 1
    dev = torch.device("cuda", index)
    t0 = time.perf_counter()
    first = torch.from_dlpack(a)
    out["first_export_us"] = (time.perf_counter() - t0) * 1e6
    ptrs = {first.data_ptr()}
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        t = torch.from_dlpack(a)
        times.append((time.perf_counter() - t0) * 1e6)
        ptrs.add(t.data_ptr())
        del t
    out["export_us_median"] = statistics.median(times)
    out["export_us_min"] = min(times)
    out["data_ptr_stable"] = len(ptrs) == 1
    out["bytes"] = n * 4
    # What a copying exchange would cost: torch copying the same bytes on the same GPU.
    src = torch.empty(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    copies = []
    for _ in range(10):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        copies.append((time.perf_counter() - t0) * 1e6)
    out["torch_copy_1gib_us_median"] = statistics.median(copies)
    out["copy_over_export"] = out["torch_copy_1gib_us_median"] / out["export_us_median"]
    del src, dst
    # Ordering: a vkad write, then torch reads through the view with no host synchronisation.
    kb = vkad.KernelBuilder("iota")
    y = kb.ndarray("y", vkad.f32, 1)
    with kb.parallel_for("main", 0, y.shape[0]) as i:
        y[i] = vkad.cast(i % 1000, vkad.f32)
    iota = s.compile(kb)
    s.launch(iota, a)
    view = torch.from_dlpack(a)
    expect = (torch.arange(n, device=dev) % 1000).float()
    out["vkad_write_seen_by_torch"] = bool(torch.equal(view, expect))
    del view, expect, first
    # Round trip torch -> vkad -> torch.
    t = torch.randn(1 << 20, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    b = vkad.from_dlpack(t, s)
    out["torch_to_vkad_4mib_us"] = (time.perf_counter() - t0) * 1e6
    back = torch.from_dlpack(b)
    out["round_trip_equal"] = bool(torch.equal(back, t))
    out["round_trip_same_pointer"] = back.data_ptr() == t.data_ptr()
    # torch writes, vkad reads (after torch.cuda.synchronize, the documented rule).
    back.fill_(1.5)
    torch.cuda.synchronize()
    out["torch_write_seen_by_vkad"] = bool((b.numpy() == 1.5).all())
    del back
    try:
        import cupy
        c = cupy.from_dlpack(a)
        out["cupy_equal"] = bool((cupy.asnumpy(c[:2000]) == np.arange(2000) % 1000).all())
        out["cupy_same_pointer"] = int(c.data.ptr) == torch.from_dlpack(a).data_ptr()
        del c
    except Exception as e:  # noqa: BLE001 -- report, do not fail the run
        out["cupy_error"] = f"{type(e).__name__}: {e}"
    try:
        import jax
        import jax.dlpack
        small = s.ndarray(np.arange(1000, dtype=np.float32))
        j = jax.dlpack.from_dlpack(small)
        out["jax_equal"] = bool((np.asarray(j) == np.arange(1000)).all())
        out["jax_device"] = str(j.devices())
        out["jax_same_pointer"] = j.unsafe_buffer_pointer() == torch.from_dlpack(small).data_ptr()
    except Exception as e:  # noqa: BLE001
        out["jax_error"] = f"{type(e).__name__}: {e}"
    out["interop_after"] = s.interop_info()
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
