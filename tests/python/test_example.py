"""examples/python/diffsim.py trains: it exits 0 only when the loss fell at least 10x."""
import os
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "diffsim.py"


def test_diffsim_example_trains(tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLE), "512", "64", "20"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, VKAD_VALIDATION="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[vkad validation]" not in r.stderr, r.stderr  # the layer's messages, printed
    assert "lower)" in r.stdout
