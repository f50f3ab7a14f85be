"""The on-disk caches from Python (docs/caches.md): a second session, and a second
process, read compiled kernels from the directory the first filled; "" turns them off."""
import os
import subprocess
import sys

import numpy as np

import vkad

CUBE = """kernel cube(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = mul %1, %1 : f32
    %3 = mul %2, %1 : f32
    store y[%0], %3
  }
}
"""


def run_cube(s):
    d = s.differentiate(CUBE)
    x = s.ndarray(np.array([1, 2, 3], np.float32))
    y = s.empty(3, vkad.f32)
    with s.tape() as t:
        s.launch(d, x, y)
    t.backward(seed={y: 1.0})
    np.testing.assert_allclose(t.grad(x).numpy(), [3, 12, 27])


def test_second_session_reads_the_kernels(tmp_path):
    s = vkad.Session(cache_dir=str(tmp_path))
    run_cube(s)
    assert s.stats()["disk_cache_misses"] == 2 and s.stats()["disk_cache_hits"] == 0
    s.close()
    assert len([p for p in os.listdir(tmp_path) if p.startswith("kernel-")]) == 2
    s = vkad.Session(cache_dir=str(tmp_path))
    run_cube(s)
    st = s.stats()
    assert st["disk_cache_hits"] == 2 and st["kernels_compiled"] == 0
    s.close()


def test_another_process_reads_them(tmp_path):
    code = ("import vkad, sys; s = vkad.Session(cache_dir=sys.argv[1]); "
            "s.differentiate(sys.argv[2]); print(s.stats()['disk_cache_hits']); s.close()")
    out = [subprocess.run([sys.executable, "-c", code, str(tmp_path), CUBE], check=True,
                          capture_output=True, text=True).stdout.strip() for _ in range(2)]
    assert out == ["0", "2"]


def test_empty_dir_turns_the_caches_off(tmp_path):
    s = vkad.Session(cache_dir="")
    run_cube(s)
    assert s.stats()["disk_cache_misses"] == 0
    s.close()


def test_pipeline_stats_are_printed_or_their_absence_said(tmp_path):
    # VKAD_PIPELINE_STATS=1 (docs/graphs.md, "Diagnostics"): each pipeline the driver makes prints
    # its statistics with the kernel's and task's name, or, where the driver lacks
    # VK_KHR_pipeline_executable_properties (lavapipe), one line says so.
    code = ("import vkad, sys; s = vkad.Session(cache_dir=''); "
            "s.differentiate(sys.argv[1]); s.close()")
    env = dict(os.environ, VKAD_PIPELINE_STATS="1")
    err = subprocess.run([sys.executable, "-c", code, CUBE], check=True, capture_output=True,
                         text=True, env=env).stderr
    if "lacks VK_KHR_pipeline_executable_properties" not in err:
        assert "vkad pipeline 'cube.main':" in err and "vkad pipeline 'cube_adjoint." in err, err
    env["VKAD_PIPELINE_STATS"] = "0"
    err = subprocess.run([sys.executable, "-c", code, CUBE], check=True, capture_output=True,
                         text=True, env=env).stderr
    assert "vkad pipeline" not in err and "VKAD_PIPELINE_STATS" not in err, err
