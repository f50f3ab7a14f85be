"""bench/patterns.py (issue 53's four patterns raced against Warp) on vkad at tiny sizes: each
pattern's loss against its float64 numpy transcription and its gradient against central
differences (f64), a replayed graph against launches one by one, the per-dispatch floor's chain,
and the race's table and JSON with Warp absent. No timing is asserted."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest


BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "patterns.py"
_spec = importlib.util.spec_from_file_location("patterns_bench", BENCH)
patterns = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(patterns)


@pytest.mark.parametrize("pattern", patterns.PATTERNS)
def test_gradient_against_central_differences(session, pattern):
    # check_pattern states its tolerances: in f64 the loss within 1e-10 of numpy's (the same
    # operations but for fma and the atomic sum's order) and the tape's gradient within 1e-6
    # of the largest entry of central differences whose rounding and truncation are < 2e-9 of
    # it; a wrong adjoint term is off by O(1) of its entry. Where the device has no f64 the
    # check runs in f32 with tolerances 1e-4 and 1e-2.
    r = patterns.check_pattern(pattern, session)
    assert r["ok"], r
    assert r["grad_max"] > 0 and len(r["entries"]) == 3
    if pattern == "collisions":
        # the check must go through contacts: some pair closer than two radii at some step
        size = patterns.CHECK_SIZES[pattern]
        sim = patterns.VkadPattern(pattern, session, size,
                                   patterns.make_data(pattern, size), graph=False)
        sim.forward()
        x = sim.arrays["x"].numpy()
        d = np.linalg.norm(x[:, :, None] - x[:, None, :], axis=-1)
        d[:, np.arange(size["balls"]), np.arange(size["balls"])] = np.inf
        assert d.min() < 2 * patterns.RADIUS


@pytest.mark.parametrize("pattern", patterns.PATTERNS)
def test_graph_replay_matches_launches(session, pattern):
    size = patterns.CHECK_SIZES[pattern]
    first, second = patterns.make_data(pattern, size, 0), patterns.make_data(pattern, size, 1)
    graph = patterns.VkadPattern(pattern, session, size, first, graph=True)
    graph.iteration()  # captured (and run) on the first data
    graph.settle()
    # The replay must read the arrays as they are now: the second data's input.
    graph.loss_at(second["x0"])
    session.zero(graph.arrays["loss"])  # (loss_at computed it: the replay must again)
    graph.iteration()
    launches = patterns.VkadPattern(pattern, session, size, first, graph=False)
    launches.loss_at(second["x0"])  # the same input (stencil: u[1] stays the first data's)
    launches.iteration()
    # f32 throughout. The loss: the same arithmetic, its atomic sum of n^2 (or balls) terms of
    # one sign possibly added in another order: (terms - 1) 2^-24 relative at most. The
    # gradient: the reworked adjoint (fused, gathered) sums in another order than atomics, a
    # few ulps per entry; 1e-5 relative L2 fails a stale or missing launch.
    terms = size.get("n", 0) ** 2 or size["balls"]
    assert graph.loss() == pytest.approx(launches.loss(), rel=(terms - 1) * 2.0 ** -24)
    assert graph.loss() != pytest.approx(patterns.reference_loss(pattern, size, first), rel=1e-3)
    assert patterns.relative_difference(graph.gradient(), launches.gradient()) <= 1e-5


def test_dispatch_floor_chain_is_one_dispatch_per_launch(session):
    us, dispatches = patterns.dispatch_floor(session, chain=63, reps=1)
    assert dispatches == 64 and us > 0  # made even; its result checked inside (else exit 3)


def test_race_with_vkad_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "race.json"
    rc = patterns.main(["--pattern", ",".join(patterns.PATTERNS), "--backend",
                        "vkad-graph,vkad,warp-graph", "--reps", "1", "--grid", "8", "--steps",
                        "6", "--balls", "4", "--chain", "16", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "per-dispatch floor on" in text
    # Warp races where it is installed with a CUDA device (the GPU session), else says why not.
    warp_ran = "warp-graph  skipped (" not in text
    backends = ("vkad-graph", "vkad") + (("warp-graph",) if warp_ran else ())
    rows = json.loads(out.read_text())["rows"]
    assert [(r["pattern"], r["backend"]) for r in rows] == [
        (p, b) for p in patterns.PATTERNS for b in backends]
    for r in rows:
        assert np.isfinite(r["loss"]) and r["size"]["steps"] == 6 and r["grad_l2"] > 0
        if r["backend"] != "vkad-graph":  # checked against vkad-graph's
            assert r["loss_vs_first"] <= patterns.LOSS_RTOL
            assert r["grad_vs_first"] <= patterns.GRAD_RTOL
        if r["backend"].startswith("vkad"):  # Warp's graph reports no dispatches
            assert r["dispatches"] > 0 and r["floor_ms"] > 0
