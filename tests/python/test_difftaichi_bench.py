"""bench/difftaichi.py (the race of DiffTaichi's programs, issue 28) with --only vkad at tiny
sizes: its subprocess protocol, table and JSON, so the GPU run that fills docs/benchmarks.md
does not find them broken. Taichi and Warp are not needed (nor tried) here."""
import json
import math
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "difftaichi.py"


def test_vkad_only_run_writes_the_results(tmp_path):
    out = tmp_path / "race.json"
    p = subprocess.run([sys.executable, str(BENCH), "--only", "vkad", "--iters", "3",
                        "--steps", "12", "--grid", "32", "--res", "15", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "mass_spring: 12 steps" in p.stdout and "diffmpm: 12 steps, 32^2 grid" in p.stdout
    assert "wave: 12 steps, 32^2 grid" in p.stdout
    assert "smoke: 12 steps, 32^2 grid" in p.stdout
    assert "diffmpm3d: 12 steps, 32^3 grid" in p.stdout
    assert "electric: 12 steps, 3 iterations" in p.stdout
    assert "rigid_body: 12 steps, 3 iterations" in p.stdout
    assert "liquid: 12 steps, 32^3 grid" in p.stdout
    assert "rigid_body_toi: 12 steps, 3 iterations" in p.stdout
    assert "mass_spring_simple: 12 steps, 3 iterations" in p.stdout
    assert "diffmpm_simple: 12 steps, 32^2 grid" in p.stdout
    assert "gradient_explosion: 12 steps, 3 iterations" in p.stdout
    assert "diffmpm_checkpointing: 12 steps, 32^2 grid" in p.stdout
    assert "rigid_body_discontinuity: 12 steps, 3 iterations" in p.stdout
    assert "mass_spring_velocity: 12 steps, 3 iterations" in p.stdout
    assert "water_renderer: 12 steps, 32^2 grid" in p.stdout
    data = json.loads(out.read_text())
    assert data["python"] and "commit" in data and data["device"]
    rows = {r["program"]: r for r in data["results"]}
    assert set(rows) == {"mass_spring", "diffmpm", "wave", "smoke", "billiards", "diffmpm3d",
                         "electric", "rigid_body", "volume_renderer", "liquid",
                         "rigid_body_toi", "mass_spring_simple", "diffmpm_simple",
                         "gradient_explosion", "diffmpm_checkpointing",
                         "rigid_body_discontinuity", "mass_spring_velocity", "water_renderer"}
    # the controllers' sizes: mass_spring robot 0 (32 x 36 + 32 + 11 x 32 + 11 weights),
    # diffmpm's 4 actuators x 4 sine waves + 4 biases; wave's initial height, 32 x 32; smoke's
    # initial velocity, 32 x 32 x 2; diffmpm3d's 16 actuators x 4 sine waves + 16 biases;
    # electric's controller (8 x 64 + 64 + 64 x 8 + 8); rigid_body robot 0's
    # (32 x (10 + 6 x 5 + 2) + 32 + 7 x 32 + 7); liquid's, diffmpm3d's
    # controller; rigid_body_toi's ball's start (init_x, init_v: 4 numbers, not trained);
    # mass_spring_simple's 3 rest lengths; diffmpm_simple's init_v; gradient_explosion's a and
    # damping (not trained); diffmpm_checkpointing's init_v; rigid_body_discontinuity's box's
    # start (init_x, init_v, angle, spin: not trained); mass_spring_velocity's robot 1 controller
    # (32 x (10 + 4 x 14 + 2) + 32 + 30 x 32 + 30); water_renderer's initial height, 32 x 32
    for program, n_params in (("mass_spring", 32 * 36 + 32 + 11 * 32 + 11), ("diffmpm", 20),
                              ("wave", 32 * 32), ("smoke", 32 * 32 * 2), ("diffmpm3d", 80),
                              ("electric", 8 * 64 + 64 + 64 * 8 + 8),
                              ("rigid_body", 32 * 42 + 32 + 7 * 32 + 7), ("liquid", 80),
                              ("rigid_body_toi", 4), ("mass_spring_simple", 3),
                              ("diffmpm_simple", 2), ("gradient_explosion", 2),
                              ("diffmpm_checkpointing", 2), ("rigid_body_discontinuity", 6),
                              ("mass_spring_velocity", 32 * 68 + 32 + 30 * 32 + 30),
                              ("water_renderer", 32 * 32)):
        r = rows[program]
        assert r["status"] == "ok", r
        assert r["impl"] == "vkad" and r["name"] == "vkad graph" and r["steps"] == 12
        assert len(r["losses"]) == len(r["iter_ms"]) == 3
        assert all(math.isfinite(x) for x in r["losses"])
        assert len(r["grad0"]) == n_params
        assert r["grad0_norm"] > 0 and r["grad0_rel_diff_vs_vkad"] == 0
        assert r["ms_per_iter"] > 0 and r["first_iter_ms"] > 0
        # a replayed iteration records dispatches (a rolled step loop is one)
        assert r["dispatches_per_iter"] > 0, r["dispatches_per_iter"]
        # ... and the barriers after them: at least the last's, at most one each
        assert 0 < r["barriers_per_iter"] <= r["dispatches_per_iter"], r
        # the race waited for the capture's rework, so later iterations replay the reworked graph
        assert r["rework_wait_ms"] >= 0, r
        # the process's start came before the end of its first iteration
        assert r["start_to_first_iter_s"] * 1e3 >= r["first_iter_ms"]
    # billiards: the cue ball's init_x and init_v (4 numbers); in 12 steps the cue ball reaches
    # no other ball, so the target ball stays put and its gradient is 0
    assert "billiards: 12 steps, 3 iterations" in p.stdout
    r = rows["billiards"]
    assert r["status"] == "ok", r
    assert r["impl"] == "vkad" and r["name"] == "vkad graph" and r["steps"] == 12
    assert len(r["losses"]) == len(r["iter_ms"]) == 3 and len(r["grad0"]) == 4
    assert all(math.isfinite(x) for x in r["losses"] + r["grad0"])
    # volume_renderer: 12 marching steps of 0.02 end 0.24 from the camera, before the box (0.5
    # away): images and targets are 0, and so are the loss and the gradient (the rendering at a
    # size that reaches the density: the next test)
    assert "volume_renderer: 12 steps, 32^3 grid, 15^2 pixels, 3 iterations" in p.stdout
    r = rows["volume_renderer"]
    assert r["status"] == "ok", r
    assert r["name"] == "vkad graph" and r["steps"] == 12 and r["grid"] == 32 and r["res"] == 15
    assert r["losses"] == [0.0] * 3 and len(r["grad0"]) == 32 ** 3 and r["grad0_norm"] == 0


def test_volume_renderer_through_its_density(tmp_path):
    # 80 marching steps cross the box: DiffTaichi's 7 views of 15^2 pixels of an 8^3 density,
    # trained from 0 (the example's learning rate for that size): the loss falls.
    out = tmp_path / "race.json"
    p = subprocess.run([sys.executable, str(BENCH), "--program", "volume_renderer", "--only",
                        "vkad", "--iters", "3", "--steps", "80", "--grid", "8", "--res", "15",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "volume_renderer: 80 steps, 8^3 grid, 15^2 pixels, 3 iterations" in p.stdout
    (r,) = json.loads(out.read_text())["results"]
    assert r["status"] == "ok", r
    assert r["impl"] == "vkad" and r["name"] == "vkad graph" and r["steps"] == 80
    assert r["grid"] == 8 and r["res"] == 15
    assert len(r["grad0"]) == 8 ** 3 and r["grad0_norm"] > 0
    assert max(r["grad0"]) <= 0  # from density 0 the images are darker than the targets
    assert r["losses"][0] > r["losses"][1] > r["losses"][2] > 0
    assert r["dispatches_per_iter"] > 0


def test_unknown_implementation_is_refused():
    p = subprocess.run([sys.executable, str(BENCH), "--only", "vkad,jax"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "unknown ['jax']" in p.stderr


def test_f64_runs_vkad_in_float64_and_skips_the_f32_warp_transcriptions(tmp_path):
    # --f64: the race's comparison for programs chaotic in f32 (issue 54). The vkad child runs
    # the example with dtype f64 (its loss differs from the f32 run's in the last digits: the
    # flag reached it), Warp's transcriptions are f32 and report skipped without importing Warp.
    import vkad
    with vkad.Session() as s:
        if not s.capabilities.get("float64"):
            import pytest
            pytest.skip("the device has no float64")
    runs = {}
    for f64 in (False, True):
        out = tmp_path / f"race{int(f64)}.json"
        p = subprocess.run([sys.executable, str(BENCH), "--program", "mass_spring", "--only",
                            "vkad,warp", "--iters", "2", "--steps", "12", "--json", str(out)]
                           + ["--f64"] * f64, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        runs[f64] = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    assert "float64" in p.stdout
    vk32, vk64 = runs[False]["vkad"], runs[True]["vkad"]
    assert vk64["status"] == "ok" and vk64["name"] == "vkad graph f64"
    assert vk32["name"] == "vkad graph"
    assert all(math.isfinite(x) for x in vk64["losses"] + vk64["grad0"])
    assert vk64["losses"][0] != vk32["losses"][0]
    assert abs(vk64["losses"][0] - vk32["losses"][0]) <= 1e-5 * abs(vk64["losses"][0])
    assert runs[True]["warp"]["status"] == "skipped"
    assert "f32" in runs[True]["warp"]["reason"]
