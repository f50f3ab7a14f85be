"""bench/diffmpm_budget.py (issue 57, points 4-5) at a tiny size: diffmpm with one grid and
particle rings under a memory budget against its time-axis version -- the first iteration's loss
and gradients equal (the script asserts them) -- and a longer run within half the time
version's bytes. No timing is asserted."""
import importlib.util
import pathlib
import re
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "diffmpm_budget.py"
_spec = importlib.util.spec_from_file_location("diffmpm_budget_bench", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_one_grid_in_a_budget_gets_the_time_axis_gradients(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["diffmpm_budget.py", "--steps", "24", "--grid", "32",
                                      "--iters", "1", "--fraction", "1", "--long-steps", "48"])
    bench.main()
    out = capsys.readouterr().out
    assert "gradients equal" in out
    plans = re.findall(r"plan: (\d+) levels .* peak ([\d.]+) MiB", out)
    assert len(plans) == 2 and all(int(levels) >= 2 for levels, _ in plans), out
    # what the budgeted versions hold for the differentiation is below the time version's
    held = [float(m) for m in re.findall(r"differentiation +([\d.]+) MiB", out)]
    assert len(held) == 3 and held[1] < held[0] and held[2] < held[0], out
