"""A torch model with a vkad simulation inside it, trained end to end (docs/interop.md, "vkad
kernels in a PyTorch model").

A small MLP (torch) reads a target point and proposes a launch velocity; a vkad kernel simulates
the projectile (gravity, quadratic drag, `steps` Euler steps, a loop the adjoint replays through
adstacks); the loss (torch) is the squared miss distance. loss.backward() runs torch's backward
through the MLP and vkad's adjoint through the simulation; Adam updates the MLP. Every target in
a batch is one row of the kernel's parallel range.

    python examples/torch_mix/train.py [--iters 300] [--batch 256] [--steps 100] [--device D]

CPU tensors with lavapipe (the views of vkad's memory are host memory); CUDA tensors on an
NVIDIA GPU (vkad's memory imported into CUDA). Exit status 0 when the loss fell 10x.
"""
import argparse
import sys
import time

import torch

import vkad
import vkad.torch


def projectile(steps_hint: int) -> vkad.KernelBuilder:
    kb = vkad.KernelBuilder("projectile")
    steps = kb.scalar("steps", vkad.i32)
    dt = kb.scalar("dt", vkad.f32)
    v0 = kb.ndarray("v0", vkad.f32, 2, grad=True)     # (B, 2) launch velocities
    drag = kb.ndarray("drag", vkad.f32, 1)            # (B,) drag coefficients
    p = kb.ndarray("p", vkad.f32, 2, grad=True)       # (B, 2) landing points
    with kb.parallel_for("main", 0, v0.shape[0]) as i:
        k = drag[i]
        x, y = kb.local(kb.f32(0)), kb.local(kb.f32(0))
        u, w = kb.local(v0[i, 0]), kb.local(v0[i, 1])
        with kb.for_range(0, steps):
            speed = vkad.sqrt(u.value * u.value + w.value * w.value + 1e-6)
            nu = u.value - k * speed * u.value * dt
            nw = w.value - (k * speed * w.value + 9.81) * dt
            x.value, y.value = x.value + nu * dt, y.value + nw * dt
            u.value, w.value = nu, nw
        p[i, 0], p[i, 1] = x.value, y.value
    return kb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--device", default=None, help="vkad device (index or name substring)")
    args = ap.parse_args(argv)

    s = vkad.Session(device=args.device)
    t0 = time.perf_counter()
    sim = vkad.torch.function(s.differentiate(projectile(args.steps)), s)
    kind, index = s.empty(1).__dlpack_device__()
    dev = torch.device("cpu") if kind == 1 else torch.device("cuda", index)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 2)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    dt = 1.0 / args.steps  # one second of flight
    drag = torch.full((args.batch,), 0.05, device=dev)
    zeros = torch.zeros(args.batch, 2, device=dev)
    losses = []
    for it in range(args.iters):
        target = torch.rand(args.batch, 2, device=dev) * torch.tensor([2.0, 0.5], device=dev)
        v0 = model(target) * 4.0 + torch.tensor([1.0, 5.0], device=dev)
        p = sim.apply(args.steps, dt, v0, drag, zeros)
        loss = ((p - target) ** 2).sum(dim=1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if it == 0:
            first = time.perf_counter() - t0
        if it % 50 == 0 or it == args.iters - 1:
            print(f"iteration {it:4d}: loss {loss.item():.4e}")
    elapsed = time.perf_counter() - t0 - first
    print(f"{s.device_name} ({dev}): loss {losses[0]:.4e} -> {losses[-1]:.4e} "
          f"({losses[0] / losses[-1]:.0f}x lower); first iteration {first * 1e3:.0f} ms, then "
          f"{(args.iters - 1) / elapsed:.1f} iterations/s")
    return 0 if losses[-1] * 10 <= losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
