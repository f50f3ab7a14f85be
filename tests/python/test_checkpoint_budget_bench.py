"""bench/checkpoint_budget.py (issue 57) at a tiny size: the ring of three arrays under a memory
budget, captured and eager, against the time-axis program on the default tape -- the same
gradient and loss (the script asserts both) -- and its table. No timing is asserted."""
import importlib.util
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "checkpoint_budget.py"
_spec = importlib.util.spec_from_file_location("checkpoint_budget_bench", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_budgeted_ring_gets_the_time_axis_gradient(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["checkpoint_budget.py", "--n", "24", "--steps", "48",
                                      "--iters", "1", "--fraction", "1.5"])
    bench.main()
    out = capsys.readouterr().out
    assert "budget: max |grad - time's| / max |grad|" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()}
    assert "levels" in lines["budget"] and "no checkpoints" in lines["time"]
