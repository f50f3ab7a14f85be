"""bench/port_profile.py (a DiffTaichi port's steady iteration and per-kernel device time) on
the session's device at a tiny size: its figures are the session's own (dispatches and
barriers of one replay, a kernel summary of one timed iteration), and its check -- the captured
iteration's first loss against the program launched one by one -- fails where they differ.
No timing is asserted."""
import importlib.util
import pathlib
import sys

import pytest


BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("port_profile", BENCH / "port_profile.py")
port_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(port_profile)


def test_reports_the_replays_dispatches_and_kernels(session):
    r = port_profile.profile_program(session, "diffmpm", 8, 2)
    assert r["ms_per_iteration"] > 0
    assert 0 < r["barriers"] <= r["dispatches"]
    names = {k["name"] for k in r["kernels"]}
    assert any("p2g" in n for n in names), names
    assert abs(r["eager_loss"] - r["losses"][0]) <= 1e-4
    assert set(r["gradient_norms"]) == {"weights", "bias"}


def test_a_loss_unlike_the_launched_programs_fails_the_check(session, monkeypatch):
    real_make = port_profile.make

    def make(s, program, **kw):  # the one-by-one program's particles start 0.01 to the right
        sim = real_make(s, program, **kw)
        if kw.get("graph") is False:
            x = sim.arrays["x"].numpy()
            x[0, :, 0] += 0.01
            sim.arrays["x"].upload(x)
        return sim

    monkeypatch.setattr(port_profile, "make", make)
    with pytest.raises(SystemExit, match="CHECK FAILED: diffmpm"):
        port_profile.profile_program(session, "diffmpm", 8, 1)
