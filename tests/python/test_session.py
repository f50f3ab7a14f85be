"""Session options: device choice, retirement depth, and their errors."""
import gc

import numpy as np
import pytest

import vkad


def test_device_by_index_and_by_name():
    with vkad.Session(device=0) as s:
        name = s.device_name
    with vkad.Session(device=name.split()[0], retirement_depth=1) as s:
        assert s.device_name == name
        a = s.ndarray(np.arange(3, dtype=np.int32))
        np.testing.assert_array_equal(a.numpy(), [0, 1, 2])


def test_unknown_device_names_what_is_present():
    with pytest.raises(vkad.NotFoundError, match="no device name contains 'no-such-gpu'; present"):
        vkad.Session(device="no-such-gpu")


def test_a_device_index_past_unsigned_long_is_out_of_range(monkeypatch):
    # std::stoul threw out_of_range: Python saw IndexError: stoul, C and C++ aborted.
    huge = "99999999999999999999999"
    with pytest.raises(vkad.NotFoundError, match=f"device index {huge} out of range"):
        vkad.Session(device=huge)
    monkeypatch.setenv("VKAD_DEVICE", huge)
    with pytest.raises(vkad.NotFoundError, match=f"device index {huge} out of range"):
        vkad.Session()
    assert len(vkad.devices(cuda=False)) >= 1  # listing ignores the choice


def test_retirement_depth_one_keeps_results():
    # Depth 1: every flush waits for the one before; results are the same.
    with vkad.Session(retirement_depth=1) as s:
        kb = vkad.KernelBuilder("twice")
        x = kb.ndarray("x", vkad.i32, 1)
        with kb.parallel_for("main", 0, x.shape[0]) as i:
            x[i] = x[i] * 2
        k = s.compile(kb)
        a = s.ndarray(np.ones(100, np.int32))
        before = s.stats()
        for _ in range(10):
            s.launch(k, a)
            s.flush()
        np.testing.assert_array_equal(a.numpy(), np.full(100, 1024))
        after = s.stats()
        assert after["flushes"] >= 10
        # one task a launch: a dispatch each, and the compute barrier after it
        assert after["dispatches"] - before["dispatches"] == 10
        assert after["barriers"] - before["barriers"] == 10


def test_memory_peaks_keep_the_most_held_until_reset():
    # 36 MiB (a block of its own) made and freed: the current figures fall back, the peaks stay at least that much
    # above where they were, and reset_memory_peaks() starts them from what is held now.
    s = vkad.Session(spare_memory_blocks=0)
    try:
        n = 9 << 20
        for _ in range(2):
            s.synchronize()
            start = s.stats()
            a = s.zeros(n, vkad.f32)
            s.synchronize()
            del a
            gc.collect()
            s.synchronize()
            st = s.stats()
            assert st["memory_used_bytes"] < start["memory_used_bytes"] + 4 * n
            assert st["memory_block_bytes"] < start["memory_block_bytes"] + 4 * n
            assert st["memory_peak_used_bytes"] >= start["memory_used_bytes"] + 4 * n
            assert st["memory_peak_block_bytes"] >= start["memory_block_bytes"] + 4 * n
            s.reset_memory_peaks()
            st = s.stats()
            assert st["memory_peak_used_bytes"] == st["memory_used_bytes"]
            assert st["memory_peak_block_bytes"] == st["memory_block_bytes"]
    finally:
        s.close()


def test_spare_memory_blocks_zero_gives_freed_memory_back():
    for spare in (0, 1):
        s = vkad.Session(spare_memory_blocks=spare)
        try:
            s.synchronize()
            before = s.stats()["memory_block_bytes"]
            a = s.zeros(1024, vkad.f32)
            s.synchronize()
            assert s.stats()["memory_block_bytes"] > before
            del a  # freed when collected
            gc.collect()
            s.synchronize()
            after = s.stats()["memory_block_bytes"]
            if spare == 0:
                assert after == before
            else:
                assert after > before
        finally:
            s.close()


def test_capabilities_say_what_kernels_may_use():
    """s.capabilities agrees with what the session does: f64 kernels compile exactly where it
    says float64, and the subgroup figures are a Vulkan subgroup's."""
    with vkad.Session() as s:
        caps = s.capabilities
        assert set(caps) == {"float64", "int64", "atomic_float32_add", "atomic_float64_add",
                             "subgroup_size", "subgroup_arithmetic", "subgroup_shuffle",
                             "max_workgroup_invocations"}
        f64 = "kernel k(x: ndarray<f64, 1>) {\n  task t parallel %0 in [0, shape(x, 0)) {\n" \
              "    %1 = load x[%0] : f64\n    store x[%0], %1\n  }\n}\n"
        if caps["float64"]:
            s.compile(f64)
        else:
            with pytest.raises(vkad.UnsupportedError):
                s.compile(f64)
        assert caps["subgroup_size"] in (1, 2, 4, 8, 16, 32, 64, 128)
        assert caps["max_workgroup_invocations"] >= 128  # Vulkan's required minimum
        # ballot and relative shuffles are reported only beside the arithmetic they extend
        assert not caps["subgroup_shuffle"] or caps["subgroup_arithmetic"]
        assert not caps["atomic_float64_add"] or caps["float64"]
