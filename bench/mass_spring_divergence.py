#!/usr/bin/env python3
"""Why bench/difftaichi.py's mass_spring implementations disagree at 682 steps: iteration 0's loss
and gradient of vkad (f32, f64), Taichi (f32, f64) and Warp (f32) on this machine, per step count,
with the time-of-impact ground contact (DiffTaichi's default) and without it (--no-toi's friction
projection), and the f64 simulation's sensitivity to a perturbation of the initial positions.

    python3 bench/mass_spring_divergence.py [--steps 100,200,400,550,600,682] [--only vkad,taichi,warp]

Each implementation runs in a subprocess (Taichi on arch=cpu, Warp on cpu, vkad on its first
device). Gradients are compared as relative differences ||g - g_ref|| / ||g_ref|| against vkad f64.
"""
import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = (("vkad", "f64"), ("taichi", "f64"), ("vkad", "f32"), ("taichi", "f32"), ("warp", "f32"))
TAG = "MSDIV "


def child(impl, prec, steps, toi):
    sys.path.insert(0, str(ROOT / "bench"))
    from difftaichi_peers import load_example
    ms = load_example("mass_spring")
    out = {}
    if impl == "vkad":
        import vkad
        s = vkad.Session()
        for st in steps:
            sim = ms.MassSpring(s, steps=st, dtype=vkad.f64 if prec == "f64" else vkad.f32,
                                toi=toi, graph=False)
            sim.forward_backward()
            out[st] = float(sim.arrays["loss"].numpy()[0]), sim.gradients()
    elif impl == "taichi":
        import taichi as ti
        real = ti.f64 if prec == "f64" else ti.f32
        ti.init(arch=ti.cpu, default_fp=real, log_level=ti.ERROR)
        from difftaichi_peers.taichi_mass_spring import TaichiMassSpring
        for st in steps:
            sim = TaichiMassSpring(steps=st, toi=toi, real=real)
            sim.v_inc.fill(0)
            with ti.ad.Tape(loss=sim.loss):
                sim.forward()
            out[st] = float(sim.loss[None]), sim.gradients()
    else:
        import warp as wp
        wp.config.quiet = True
        wp.init()
        from difftaichi_peers.warp_mass_spring import WarpMassSpring
        for st in steps:
            sim = WarpMassSpring(steps=st, toi=toi, device="cpu")
            sim._forward_backward()
            out[st] = float(sim.loss.numpy()[0]), sim.gradients()
    return {st: (loss, [float(x) for p in ms.MassSpring.PARAMS for x in np.ravel(g[p])])
            for st, (loss, g) in out.items()}


def perturbation(steps):
    """vkad f64, toi: x[0] += eps * N(0, 1); the change of the loss and of the gradient."""
    sys.path.insert(0, str(ROOT / "bench"))
    from difftaichi_peers import load_example
    import vkad
    ms = load_example("mass_spring")
    sim = ms.MassSpring(vkad.Session(), steps=steps, dtype=vkad.f64, graph=False)
    x0 = sim.positions()

    def run(eps):
        x = x0.copy()
        x[0] += eps * np.random.RandomState(2).randn(*x[0].shape)
        sim.arrays["x"].upload(x)
        sim.forward_backward()
        g = sim.gradients()
        return float(sim.arrays["loss"].numpy()[0]), np.concatenate([g[p].ravel() for p in sim.PARAMS])

    l0, g0 = run(0.0)
    rows = []
    for eps in (1e-12, 1e-10, 1e-9, 1e-8, 1e-7):
        l, g = run(eps)
        rows.append((eps, abs(l - l0), float(np.linalg.norm(g - g0) / np.linalg.norm(g0))))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", default="100,200,400,550,600,682")
    ap.add_argument("--only", default="vkad,taichi,warp")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # impl prec toi|notoi
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",")]
    if a.child:
        impl, prec, toi = a.child
        print(TAG + json.dumps(child(impl, prec, steps, toi == "toi")), flush=True)
        return 0
    only = set(a.only.split(","))
    for toi in ("toi", "notoi"):
        res = {}
        for impl, prec in CONFIGS:
            if impl not in only:
                continue
            p = subprocess.run([sys.executable, __file__, "--steps", a.steps, "--child", impl, prec,
                                toi], capture_output=True, text=True)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith(TAG)]
            if not lines:
                print(f"{impl} {prec} {toi}: failed\n" + "\n".join(p.stderr.splitlines()[-5:]))
                continue
            res[f"{impl} {prec}"] = {int(k): v for k, v in json.loads(lines[-1][len(TAG):]).items()}
        ref = res.get("vkad f64")
        names = list(res)
        print(f"\n{'time of impact' if toi == 'toi' else 'no time of impact (friction projection)'}:"
              " loss[0], and |grad0| of vkad f64 and each gradient's relative difference from it")
        print(f"{'steps':>5} " + " ".join(f"{n:>12}" for n in names) + f" {'|g| vkad f64':>12} "
              + " ".join(f"{'rd ' + n:>14}" for n in names if n != "vkad f64"))
        for st in steps:
            row = f"{st:5d} " + " ".join(f"{res[n][st][0]:12.8f}" for n in names)
            if ref:
                g0 = np.array(ref[st][1])
                row += f" {np.linalg.norm(g0):12.4g} " + " ".join(
                    f"{np.linalg.norm(np.array(res[n][st][1]) - g0) / np.linalg.norm(g0):14.1e}"
                    for n in names if n != "vkad f64")
            print(row)
    if "vkad" in only:
        print(f"\nvkad f64, time of impact, {steps[-1]} steps: x[0] += eps * N(0, 1)")
        for eps, dl, rd in perturbation(steps[-1]):
            print(f"  eps {eps:.0e}: |d loss| {dl:.1e}, gradient relative change {rd:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
