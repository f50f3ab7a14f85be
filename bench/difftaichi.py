#!/usr/bin/env python3
"""DiffTaichi's programs raced: vkad against Taichi and Warp (issues 28, 54).

mass_spring, diffmpm, wave, smoke, billiards, diffmpm3d, electric, rigid_body,
volume_renderer, liquid, rigid_body_toi, mass_spring_simple, diffmpm_simple,
gradient_explosion, diffmpm_checkpointing, rigid_body_discontinuity, mass_spring_velocity and
water_renderer: the same programs, sizes, initialisation, loss and update in each implementation:
  vkad        examples/difftaichi/<program>.py (a replayed graph per iteration;
              --vkad-no-graph launches the kernels one by one)
  taichi      bench/difftaichi_peers/taichi_*.py: DiffTaichi's idiom, ti.ad.Tape; arch=cuda
              when Taichi finds CUDA, else cpu (a program without one is reported skipped)
  warp        bench/difftaichi_peers/warp_*.py: wp.Tape (cuda:0 when present, else cpu)
  warp-graph  the same with the tape's forward and backward captured in a CUDA graph (CUDA only)

    python3 bench/difftaichi.py [--program mass_spring|diffmpm|diffmpm3d|...|volume_renderer|
                                           liquid|rigid_body_toi|mass_spring_simple|
                                           diffmpm_simple|gradient_explosion|
                                           diffmpm_checkpointing|rigid_body_discontinuity|
                                           mass_spring_velocity|water_renderer|both|all]
                                [--iters 20] [--steps S] [--grid G] [--res R] [--f64]
                                [--only vkad,taichi,warp,warp-graph]
                                [--vkad-no-graph] [--warm-cache] [--json OUT]

Each implementation runs in its own subprocess, so Taichi's and Warp's initialisation and JIT are
their own and a framework that is not installed is reported as skipped. Reported per
implementation: ms per training iteration (forward + backward + update, which reads the loss and
gradients back: median of iterations 2..N; rigid_body_toi, gradient_explosion and
rigid_body_discontinuity, which DiffTaichi does not train, one point of their scans: forward + backward), the first iteration's ms (Taichi's and Warp's JIT,
graph capture; vkad compiles when the example is constructed, before it) and the seconds from launching the subprocess to the end of the first iteration (interpreter,
imports, initialisation, compilation), the loss curve, and the gradient at iteration 0 (its norm,
and its relative difference from vkad's), and for vkad the compute dispatches one iteration records
and the barriers after them (stats()["dispatches"] and ["barriers"] over an extra, untimed
iteration: a device waits its dependent-dispatch latency at each barrier). vkad's later iterations replay the
reworked graph: after the iteration that captured it the race waits, untimed, for the capture's
background rework (Session.finish_rework) and reports the wait in the JSON (rework_wait_ms) --
a large graph's rework (seconds) would otherwise outlast a short race, which would then time
the graph as captured. Framework kernel caches (Taichi's offline cache, Warp's
kernel cache, vkad's kernel and pipeline caches) point at a fresh temporary folder per run unless
--warm-cache, so the first iteration includes compiling; the GPU driver's own caches are not
touched.
"""
import argparse
import json
import math
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMPLS = ("vkad", "taichi", "warp", "warp-graph")
PROGRAMS = ("mass_spring", "diffmpm", "wave", "smoke", "billiards", "diffmpm3d", "electric",
            "rigid_body", "volume_renderer", "liquid", "rigid_body_toi", "mass_spring_simple",
            "diffmpm_simple", "gradient_explosion", "diffmpm_checkpointing",
            "rigid_body_discontinuity", "mass_spring_velocity", "water_renderer")
STEPS = {"mass_spring": 2048 // 3, "diffmpm": 1024, "wave": 256, "smoke": 100,
         "billiards": 1024, "diffmpm3d": 512, "electric": 512,
         "rigid_body": 2048,
         "volume_renderer": 1000,  # the examples' STEPS (volume_renderer: MARCHING_STEPS)
         "liquid": 512, "rigid_body_toi": 204, "mass_spring_simple": 1024,
         "diffmpm_simple": 1024, "gradient_explosion": 1000, "diffmpm_checkpointing": 1024,
         "rigid_body_discontinuity": 2048, "mass_spring_velocity": 1024, "water_renderer": 256}
UNPORTED = set()  # programs without a Taichi or Warp transcription in difftaichi_peers
PEERS = {"taichi": set(PROGRAMS) - UNPORTED, "warp": set(PROGRAMS) - UNPORTED}
# the examples' N_GRID (programs with a grid; diffmpm3d's and liquid's are 64^3;
# volume_renderer's is its density, DENSITY_RES^3)
GRIDS = {"diffmpm": 128, "wave": 256, "smoke": 128, "diffmpm3d": 64, "volume_renderer": 128,
         "liquid": 64, "diffmpm_simple": 120, "diffmpm_checkpointing": 120, "water_renderer": 256}
GRID_DIMS = {"diffmpm3d": 3, "volume_renderer": 3, "liquid": 3}  # the others' grids are 2-d
# the examples' image resolution (programs that render: volume_renderer's RES^2 pixels per view)
RESES = {"volume_renderer": 512}
RESULT = "DIFFTAICHI-RESULT "  # the child's last line of stdout: this, then its JSON


def _checkpointing_side(n_grid: int) -> int:
    """diffmpm_checkpointing's particles per side on an n_grid^2 grid: DiffTaichi's 80 at 120,
    fewer where its block (spacing 0.5, in DiffTaichi's cells) would reach the walls."""
    sys.path.insert(0, str(ROOT / "bench"))
    from difftaichi_peers import load_example
    ck = load_example("diffmpm_checkpointing")
    return ck.simple.block_side(n_grid, ck.N, ck.SPACING)


class Skipped(Exception):
    """The implementation cannot run here (not installed, no CUDA for a graph)."""


# --- one implementation, in a child process -----------------------------------------------------

def _make_vkad(a, program):
    import vkad
    sys.path.insert(0, str(ROOT / "bench"))
    from difftaichi_peers import load_example
    example = load_example(program)
    session = vkad.Session()
    graph = not a.vkad_no_graph
    ft = {"dtype": vkad.f64} if a.f64 else {}  # every example takes dtype (f32 by default)
    if program == "mass_spring":
        sim = example.MassSpring(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "wave":
        sim = example.Wave(session, steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, **ft)
    elif program == "smoke":
        sim = example.Smoke(session, steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, **ft)
    elif program == "billiards":
        sim = example.Billiards(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "diffmpm3d":
        sim = example.DiffMPM3D(session, steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph,
                                **ft)
    elif program == "electric":
        sim = example.Electric(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "rigid_body":
        sim = example.RigidBody(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "volume_renderer":
        sim = example.VolumeRenderer(session, res=a.res, density_res=a.grid,
                                     marching_steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "liquid":
        sim = example.Liquid(session, steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph,
                             **ft)
    elif program == "rigid_body_toi":
        sim = example.RigidBodyTOI(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "mass_spring_simple":
        sim = example.MassSpringSimple(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "diffmpm_simple":
        # the block shrinks on a smaller grid (DiffTaichi places it in grid cells)
        sim = example.DiffMPMSimple(session, steps=a.steps, n_grid=a.grid,
                                    n=example.block_side(a.grid), seed=a.seed, graph=graph, **ft)
    elif program == "gradient_explosion":
        sim = example.GradientExplosion(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "diffmpm_checkpointing":
        # DiffTaichi's block shrunk as diffmpm_simple's; the memory budget the example's default
        sim = example.DiffMPMCheckpointing(session, steps=a.steps, n_grid=a.grid,
                                           n=_checkpointing_side(a.grid), seed=a.seed,
                                           graph=graph, **ft)
    elif program == "rigid_body_discontinuity":
        sim = example.RigidBodyDiscontinuity(session, steps=a.steps, seed=a.seed, graph=graph,
                                             **ft)
    elif program == "mass_spring_velocity":
        sim = example.MassSpringVelocity(session, steps=a.steps, seed=a.seed, graph=graph, **ft)
    elif program == "water_renderer":
        sim = example.WaterRenderer(session, steps=a.steps, n_grid=a.grid, seed=a.seed,
                                    graph=graph, **ft)
    else:
        sim = example.DiffMPM(session, steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph,
                              **ft)
    name = ("vkad graph" if graph else "vkad launches") + (" f64" if a.f64 else "")
    return sim, {"name": name, "device": session.device_name,
                 "version": getattr(vkad, "__version__", ""), "_session": session}


def _make_taichi(a, program, cache):
    if program not in PEERS["taichi"]:
        raise Skipped(f"no Taichi transcription of {program} in bench/difftaichi_peers")
    try:
        import taichi as ti
    except ImportError as e:
        raise Skipped(f"taichi not importable ({e})")
    kwargs = {"offline_cache_file_path": cache} if cache else {}
    # arch=cuda falls back to the CPU (with a warning) where Taichi finds no CUDA
    real = ti.f64 if a.f64 else ti.f32  # every transcription takes `real`
    ti.init(arch=ti.cuda, default_fp=real, **kwargs)
    sys.path.insert(0, str(ROOT / "bench"))
    arch = str(ti.lang.impl.current_cfg().arch).split(".")[-1]
    if program == "mass_spring":
        from difftaichi_peers.taichi_mass_spring import TaichiMassSpring
        sim = TaichiMassSpring(steps=a.steps, seed=a.seed, real=real)
    elif program == "wave":
        from difftaichi_peers.taichi_wave import TaichiWave
        sim = TaichiWave(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real)
    elif program == "smoke":
        from difftaichi_peers.taichi_smoke import TaichiSmoke
        sim = TaichiSmoke(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real)
    elif program == "billiards":
        from difftaichi_peers.taichi_billiards import TaichiBilliards
        sim = TaichiBilliards(steps=a.steps, seed=a.seed, real=real)
    elif program == "diffmpm3d":
        from difftaichi_peers.taichi_diffmpm3d import TaichiDiffMPM3D
        sim = TaichiDiffMPM3D(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real)
    elif program == "electric":
        from difftaichi_peers.taichi_electric import TaichiElectric
        sim = TaichiElectric(steps=a.steps, seed=a.seed, real=real)
    elif program == "rigid_body":
        from difftaichi_peers.taichi_rigid_body import TaichiRigidBody
        sim = TaichiRigidBody(steps=a.steps, seed=a.seed, real=real)
    elif program == "volume_renderer":
        from difftaichi_peers.taichi_volume_renderer import TaichiVolumeRenderer
        sim = TaichiVolumeRenderer(res=a.res, density_res=a.grid, marching_steps=a.steps,
                                   seed=a.seed, real=real)
    elif program == "liquid":
        from difftaichi_peers.taichi_liquid import TaichiLiquid
        sim = TaichiLiquid(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real)
    elif program == "rigid_body_toi":
        from difftaichi_peers.taichi_rigid_body_toi import TaichiRigidBodyTOI
        sim = TaichiRigidBodyTOI(steps=a.steps, seed=a.seed, real=real)
    elif program == "mass_spring_simple":
        from difftaichi_peers.taichi_mass_spring_simple import TaichiMassSpringSimple
        sim = TaichiMassSpringSimple(steps=a.steps, seed=a.seed, real=real)
    elif program == "diffmpm_simple":
        from difftaichi_peers.taichi_diffmpm_simple import TaichiDiffMPMSimple
        from difftaichi_peers import load_example
        sim = TaichiDiffMPMSimple(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real,
                                  n=load_example("diffmpm_simple").block_side(a.grid))
    elif program == "gradient_explosion":
        from difftaichi_peers.taichi_gradient_explosion import TaichiGradientExplosion
        sim = TaichiGradientExplosion(steps=a.steps, seed=a.seed, real=real)
    elif program == "diffmpm_checkpointing":
        from difftaichi_peers.taichi_diffmpm_checkpointing import TaichiDiffMPMCheckpointing
        sim = TaichiDiffMPMCheckpointing(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real,
                                         n=_checkpointing_side(a.grid))
    elif program == "rigid_body_discontinuity":
        from difftaichi_peers.taichi_rigid_body_discontinuity import \
            TaichiRigidBodyDiscontinuity
        sim = TaichiRigidBodyDiscontinuity(steps=a.steps, seed=a.seed, real=real)
    elif program == "mass_spring_velocity":
        from difftaichi_peers.taichi_mass_spring_velocity import TaichiMassSpringVelocity
        sim = TaichiMassSpringVelocity(steps=a.steps, seed=a.seed, real=real)
    elif program == "water_renderer":
        from difftaichi_peers.taichi_water_renderer import TaichiWaterRenderer
        sim = TaichiWaterRenderer(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real)
    else:
        from difftaichi_peers.taichi_diffmpm import TaichiDiffMPM
        sim = TaichiDiffMPM(steps=a.steps, n_grid=a.grid, seed=a.seed, real=real)
    version = ".".join(map(str, ti.__version__))  # a tuple in Taichi 1.7
    return sim, {"name": f"taichi {version} ({arch})" + (" f64" if a.f64 else ""), "device": arch,
                 "version": version}


def _make_warp(a, program, cache, graph):
    if program not in PEERS["warp"]:
        raise Skipped(f"no Warp transcription of {program} in bench/difftaichi_peers")
    if a.f64:
        raise Skipped("the Warp transcriptions are f32 (wp.float32 kernels)")
    try:
        import warp as wp
    except ImportError as e:
        raise Skipped(f"warp not importable ({e})")
    wp.config.quiet = True
    if cache:
        wp.config.kernel_cache_dir = cache
    wp.init()
    if graph and not wp.is_cuda_available():
        raise Skipped("no CUDA device for a CUDA graph")
    device = "cuda:0" if wp.is_cuda_available() else "cpu"
    sys.path.insert(0, str(ROOT / "bench"))
    if program == "mass_spring":
        from difftaichi_peers.warp_mass_spring import WarpMassSpring
        sim = WarpMassSpring(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "wave":
        from difftaichi_peers.warp_wave import WarpWave
        sim = WarpWave(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, device=device)
    elif program == "smoke":
        from difftaichi_peers.warp_smoke import WarpSmoke
        sim = WarpSmoke(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, device=device)
    elif program == "billiards":
        from difftaichi_peers.warp_billiards import WarpBilliards
        sim = WarpBilliards(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "diffmpm3d":
        from difftaichi_peers.warp_diffmpm3d import WarpDiffMPM3D
        sim = WarpDiffMPM3D(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, device=device)
    elif program == "electric":
        from difftaichi_peers.warp_electric import WarpElectric
        sim = WarpElectric(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "rigid_body":
        from difftaichi_peers.warp_rigid_body import WarpRigidBody
        sim = WarpRigidBody(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "volume_renderer":
        from difftaichi_peers.warp_volume_renderer import WarpVolumeRenderer
        sim = WarpVolumeRenderer(res=a.res, density_res=a.grid, marching_steps=a.steps,
                                 seed=a.seed, graph=graph, device=device)
    elif program == "liquid":
        from difftaichi_peers.warp_liquid import WarpLiquid
        sim = WarpLiquid(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, device=device)
    elif program == "rigid_body_toi":
        from difftaichi_peers.warp_rigid_body_toi import WarpRigidBodyTOI
        sim = WarpRigidBodyTOI(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "mass_spring_simple":
        from difftaichi_peers.warp_mass_spring_simple import WarpMassSpringSimple
        sim = WarpMassSpringSimple(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "diffmpm_simple":
        from difftaichi_peers.warp_diffmpm_simple import WarpDiffMPMSimple
        from difftaichi_peers import load_example
        sim = WarpDiffMPMSimple(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph,
                                device=device,
                                n=load_example("diffmpm_simple").block_side(a.grid))
    elif program == "gradient_explosion":
        from difftaichi_peers.warp_gradient_explosion import WarpGradientExplosion
        sim = WarpGradientExplosion(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "diffmpm_checkpointing":
        from difftaichi_peers.warp_diffmpm_checkpointing import WarpDiffMPMCheckpointing
        sim = WarpDiffMPMCheckpointing(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph,
                                       device=device, n=_checkpointing_side(a.grid))
    elif program == "rigid_body_discontinuity":
        from difftaichi_peers.warp_rigid_body_discontinuity import WarpRigidBodyDiscontinuity
        sim = WarpRigidBodyDiscontinuity(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "mass_spring_velocity":
        from difftaichi_peers.warp_mass_spring_velocity import WarpMassSpringVelocity
        sim = WarpMassSpringVelocity(steps=a.steps, seed=a.seed, graph=graph, device=device)
    elif program == "water_renderer":
        from difftaichi_peers.warp_water_renderer import WarpWaterRenderer
        sim = WarpWaterRenderer(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph,
                                device=device)
    else:
        from difftaichi_peers.warp_diffmpm import WarpDiffMPM
        sim = WarpDiffMPM(steps=a.steps, n_grid=a.grid, seed=a.seed, graph=graph, device=device)
    name = f"warp {wp.config.version} tape" + (" in a CUDA graph" if graph else "")
    return sim, {"name": name, "device": wp.get_device(device).name,
                 "version": wp.config.version}


def child(a) -> dict:
    if a.grid is None and a.program in GRIDS:
        a.grid = GRIDS[a.program]
    if a.res is None and a.program in RESES:
        a.res = RESES[a.program]
    cache = None if a.warm_cache else tempfile.mkdtemp(prefix=f"difftaichi-{a.child}-")
    try:
        if a.child == "vkad":
            if cache:  # vkad's kernel and pipeline caches cold too (read when a session opens)
                os.environ["VKAD_CACHE_DIR"] = cache
            sim, info = _make_vkad(a, a.program)
        elif a.child == "taichi":
            sim, info = _make_taichi(a, a.program, cache)
        else:
            sim, info = _make_warp(a, a.program, cache, graph=a.child == "warp-graph")
        losses, ms, grad0 = [], [], None
        session = info.pop("_session", None)
        reworked = False
        for it in range(a.iters):
            t0 = time.perf_counter()
            losses.append(sim.iteration())  # reads the loss back: the iteration has finished
            ms.append((time.perf_counter() - t0) * 1e3)
            if it == 0:
                to_first = time.time() - a.t0
                g = sim.gradients()
                grad0 = [float(x) for p in sim.PARAMS for x in g[p].ravel()]
            if session is not None and not reworked:
                # The capture's rework runs in the background and a replay installs it once done;
                # a large graph's (diffmpm_checkpointing: seconds) would not be done within a
                # short race, which would then time the graph as captured. Waited for here,
                # untimed, and reported: the steady iteration is the reworked graph's.
                t0 = time.perf_counter()
                if sim.finish_rework():
                    info["rework_wait_ms"] = (time.perf_counter() - t0) * 1e3
                    reworked = True
        dispatches = barriers = None
        if session is not None:
            # One more iteration, untimed: the compute dispatches it records and the barriers
            # after them (the dependent ones: what a device's dependent-dispatch floor
            # multiplies; vkad-bench-dispatch measures it).
            before = session.stats()
            sim.iteration()
            after = session.stats()
            dispatches = after["dispatches"] - before["dispatches"]
            barriers = after["barriers"] - before["barriers"]
        steady = ms[1:]
        return dict(info, status="ok", dispatches_per_iter=dispatches,
                    barriers_per_iter=barriers, iters=a.iters,
                    steps=a.steps,
                    grid=a.grid if a.program in GRIDS else None,
                    res=a.res if a.program in RESES else None,
                    ms_per_iter=statistics.median(steady) if steady else None,
                    ms_per_iter_min=min(steady) if steady else None,
                    first_iter_ms=ms[0], start_to_first_iter_s=to_first, iter_ms=ms,
                    losses=losses, final_loss=losses[-1],
                    grad0_norm=math.sqrt(sum(x * x for x in grad0)), grad0=grad0)
    except Skipped as e:
        return {"status": "skipped", "reason": str(e)}
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


# --- the race -----------------------------------------------------------------------------------

def run_child(a, program, impl, steps, grid, res=None) -> dict:
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", impl,
           "--program", program, "--iters", str(a.iters), "--steps", str(steps),
           "--seed", str(a.seed), "--t0", repr(time.time())]
    cmd += ["--grid", str(grid)] if grid else []
    cmd += ["--res", str(res)] if res else []
    cmd += ["--vkad-no-graph"] * a.vkad_no_graph + ["--warm-cache"] * a.warm_cache
    cmd += ["--f64"] * a.f64
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {a.timeout} s"}
    if getattr(a, "show_stderr", False):
        for ln in p.stderr.splitlines():
            print(f"[{impl} {program}] {ln}", file=sys.stderr)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-15:]
        return {"status": "failed", "reason": f"exit code {p.returncode}", "log": tail}
    return json.loads(lines[-1][len(RESULT):])


def relative_difference(a, b):
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(y * y for y in b))
    return num / den if den else float("inf")


def environment() -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                       capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        env["commit"] = None
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True)
        env["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    return env


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(program, rows, f64=False):
    print(f"\n{program}")
    head = (f"{'implementation':34} {'ms/iter':>9} {'first ms':>9} {'start->1st s':>12} "
            f"{'loss[0]':>10} {'loss[-1]':>10} {'|grad0|':>10} {'grad0 vs vkad':>13} "
            f"{'disp/iter':>9} {'barr/iter':>9}")
    print(head)
    print("-" * len(head))
    for impl, r in rows:
        if r["status"] != "ok":
            print(f"{impl:34} {r['status']}: {r.get('reason', '')}")
            for ln in r.get("log", []):
                print(f"    {ln}")
            continue
        print(f"{r['name'][:34]:34} {fmt(r['ms_per_iter'], '9.2f')} "
              f"{r['first_iter_ms']:9.1f} {r['start_to_first_iter_s']:12.2f} "
              f"{r['losses'][0]:10.6f} {r['final_loss']:10.6f} {r['grad0_norm']:10.4g} "
              f"{fmt(r.get('grad0_rel_diff_vs_vkad'), '13.2e')} "
              f"{fmt(r.get('dispatches_per_iter'), '9d')} "
              f"{fmt(r.get('barriers_per_iter'), '9d')}")
    if program.split(":")[0] == "mass_spring" and not f64:  # not mass_spring_simple
        # Not a disagreement of the implementations: bench/mass_spring_divergence.py.
        print("note: past ~550 steps mass_spring's f32 trajectories part at a ground contact "
              "(vkad f32 differs from vkad f64 as much as the peers differ); compare its "
              "gradients in f64 or without time of impact (bench/mass_spring_divergence.py)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program", choices=PROGRAMS + ("both", "all"), default="all",
                    help="one program, both (mass_spring and diffmpm) or all (default)")
    ap.add_argument("--iters", type=int, default=20, help="training iterations (default 20)")
    ap.add_argument("--steps", type=int, default=None,
                    help="time steps (default: the example's, 682 mass_spring, 1024 diffmpm, "
                         "256 wave, 100 smoke, 1024 billiards, 512 diffmpm3d, 512 liquid, "
                         "204 rigid_body_toi, 1024 mass_spring_simple, 1024 diffmpm_simple, "
                         "1000 gradient_explosion, 1024 diffmpm_checkpointing, "
                         "2048 rigid_body_discontinuity, 1024 mass_spring_velocity, "
                         "256 water_renderer; "
                         "volume_renderer's marching steps, 1000)")
    ap.add_argument("--grid", type=int, default=None,
                    help="grid cells per side of the programs with a grid (default: the "
                         "example's, 128 diffmpm, 256 wave, 128 smoke, 64 diffmpm3d, 64 liquid, "
                         "120 diffmpm_simple, 120 diffmpm_checkpointing, 256 water_renderer; "
                         "volume_renderer's density, 128)")
    ap.add_argument("--res", type=int, default=None,
                    help="pixels per side of each view of the programs that render (default: "
                         "the example's, 512 volume_renderer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--f64", action="store_true",
                    help="every implementation in float64 (vkad's dtype, Taichi's default_fp and "
                         "fields; Warp's transcriptions are f32 and are skipped): the gradient "
                         "comparison of a program chaotic in f32 (mass_spring, rigid_body)")
    ap.add_argument("--only", default=",".join(IMPLS), help="comma-separated implementations")
    ap.add_argument("--vkad-no-graph", action="store_true",
                    help="vkad launches every kernel instead of replaying a captured graph")
    ap.add_argument("--warm-cache", action="store_true",
                    help="let Taichi and Warp use their usual kernel caches")
    ap.add_argument("--show-stderr", action="store_true",
                    help="pass each implementation's stderr through, prefixed with its name "
                         "(what VKAD_PIPELINE_STATS=1 and VKAD_GRAPH_TRACE=1 print goes there)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per implementation")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--child", choices=IMPLS, help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.iters < 1:
        ap.error("--iters must be at least 1")

    if a.child:
        print(RESULT + json.dumps(child(a)), flush=True)
        return 0

    impls = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        ap.error(f"--only: unknown {unknown}; choose from {', '.join(IMPLS)}")
    programs = {"all": PROGRAMS, "both": ("mass_spring", "diffmpm")}.get(a.program, (a.program,))
    out = dict(environment(), args=vars(a), results=[])
    for program in programs:
        steps = a.steps or STEPS[program]
        grid = (a.grid or GRIDS[program]) if program in GRIDS else None
        res = (a.res or RESES[program]) if program in RESES else None
        rows = []
        for impl in impls:
            r = run_child(a, program, impl, steps, grid, res)
            rows.append((impl, r))
        ref = next((r for impl, r in rows if impl == "vkad" and r["status"] == "ok"), None)
        for impl, r in rows:
            if r["status"] == "ok" and ref is not None:
                r["grad0_rel_diff_vs_vkad"] = relative_difference(r["grad0"], ref["grad0"])
            out["results"].append(dict(r, program=program, impl=impl, steps=steps))
        dims = GRID_DIMS.get(program, 2)
        print_table(f"{program}: {steps} steps" + (f", {grid}^{dims} grid" if grid else "")
                    + (f", {res}^2 pixels" if res else "")
                    + f", {a.iters} iterations" + (", float64" if a.f64 else ""), rows, a.f64)
        if ref is not None:
            out.setdefault("device", ref["device"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
