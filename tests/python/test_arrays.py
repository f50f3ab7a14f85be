"""ndarrays from and to numpy: every dtype, shapes, the checks, the copies."""
import os
import time

import numpy as np
import pytest

import vkad

DTYPES = [np.float32, np.float64, np.int32, np.uint32, np.int64, np.bool_]


def sample(dtype, shape, rng):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.floating):
        a = rng.standard_normal(shape).astype(dtype)
        a.flat[0] = np.finfo(dtype).max  # extremes survive the trip bit for bit
        a.flat[-1] = np.finfo(dtype).tiny
        return a
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    a.flat[0], a.flat[-1] = info.min, info.max
    return a


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 4)])
def test_round_trip_every_dtype(session, dtype, shape):
    rng = np.random.default_rng(sum(shape))
    host = sample(dtype, shape, rng)
    a = session.ndarray(host, name="a")
    assert a.shape == shape
    assert a.dtype == vkad.as_dtype(dtype)
    back = a.numpy()
    assert back.dtype == host.dtype and back.shape == host.shape
    np.testing.assert_array_equal(back, host)
    # upload into an existing array, then read again
    host2 = sample(dtype, shape, np.random.default_rng(7))
    a.upload(host2)
    np.testing.assert_array_equal(a.numpy(), host2)


def test_download_is_a_new_array(session):
    a = session.ndarray(np.arange(5, dtype=np.float32))
    x, y = a.numpy(), a.numpy()
    x[0] = 42
    assert y[0] == 0 and a.numpy()[0] == 0


def test_non_contiguous_input_is_copied_once(session):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2]  # strided: converted to a contiguous copy before the upload
    a = session.ndarray(view)
    np.testing.assert_array_equal(a.numpy(), view)


def test_python_lists_and_dtype_conversion(session):
    a = session.ndarray([1.5, 2.5], dtype=vkad.f32)
    assert a.dtype == vkad.f32
    np.testing.assert_array_equal(a.numpy(), np.array([1.5, 2.5], np.float32))
    b = session.ndarray([[1, 2], [3, 4]], dtype="i64")
    assert b.dtype == vkad.i64 and b.shape == (2, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_zero_and_fill_on_device(session, dtype):
    a = session.empty((3, 4), dtype)
    session.fill(a, 1)
    np.testing.assert_array_equal(a.numpy(), np.ones((3, 4), dtype))
    session.zero(a)
    np.testing.assert_array_equal(a.numpy(), np.zeros((3, 4), dtype))
    z = session.zeros(6, dtype)
    np.testing.assert_array_equal(z.numpy(), np.zeros(6, dtype))


def test_fill_converts_like_a_cast(session):
    a = session.empty(3, vkad.i32)
    session.fill(a, -2.75)  # truncates toward zero
    np.testing.assert_array_equal(a.numpy(), [-2, -2, -2])
    f = session.empty(2, vkad.f64)
    session.fill(f, 0.1)
    np.testing.assert_array_equal(f.numpy(), [0.1, 0.1])


@pytest.mark.parametrize("dtype,value", [(vkad.i32, 1e20), (vkad.i32, 2 ** 31), (vkad.u32, -1),
                                         (vkad.f32, 1e300), (vkad.bool_, 0.5),
                                         (vkad.i64, float("nan"))],
                         ids=["i32-1e20", "i32-2^31", "u32-neg", "f32-1e300", "bool-half", "i64-nan"])
def test_fill_refuses_values_the_dtype_cannot_hold(session, dtype, value):
    a = session.zeros(3, dtype, name="kept")
    with pytest.raises(vkad.InvalidArgumentError, match=r"fill 'kept': value .* does not fit"):
        session.fill(a, value)
    np.testing.assert_array_equal(a.numpy(), np.zeros(3, vkad.numpy_dtype(dtype)))


def test_empty_needs_a_dtype(session):
    with pytest.raises(vkad.InvalidArgumentError, match="dtype None"):
        session.empty(4, None)
    with pytest.raises(vkad.InvalidArgumentError, match="dtype None"):
        session.zeros(4, None)


def test_wrong_dtype_upload(session):
    a = session.empty(4, vkad.f32, name="w")
    with pytest.raises(vkad.InvalidArgumentError, match=r"upload to ndarray 'w' \(f32.*float64"):
        a.upload(np.zeros(4))
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        a.upload(np.zeros(4, np.int32))


def test_wrong_shape_upload(session):
    a = session.empty((2, 3), vkad.f32, name="s")
    with pytest.raises(vkad.InvalidArgumentError, match=r"shape \(2, 3\).*shape \(3, 2\)"):
        a.upload(np.zeros((3, 2), np.float32))
    with pytest.raises(vkad.InvalidArgumentError, match=r"shape \(6,\)"):
        a.upload(np.zeros(6, np.float32))


def test_unsupported_numpy_dtype(session):
    with pytest.raises(vkad.InvalidArgumentError, match="float16"):
        session.ndarray(np.zeros(3, np.float16))
    with pytest.raises(vkad.InvalidArgumentError, match="dtype"):
        session.empty(3, "complex64")


def test_bad_shapes(session):
    with pytest.raises(vkad.InvalidArgumentError, match="empty"):
        session.empty((0,), vkad.f32, name="z")
    with pytest.raises(vkad.InvalidArgumentError, match="rank"):
        session.empty((1,) * 9, vkad.f32)


def test_freed_array(session):
    a = session.ndarray(np.ones(3, np.float32), name="gone")
    session.free(a)
    assert "freed" in repr(a)
    with pytest.raises(vkad.NotFoundError):
        a.numpy()
    with pytest.raises(vkad.NotFoundError):
        session.zero(a)
    with pytest.raises(vkad.NotFoundError):
        session.free(a)


def test_arrays_are_freed_when_collected(session):
    before = session.stats()["ndarrays"]
    a = session.empty(1000, vkad.f32)
    assert session.stats()["ndarrays"] == before + 1
    del a
    assert session.stats()["ndarrays"] == before


def test_array_of_another_session(session):
    other = vkad.Session()
    a = other.empty(2, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError, match="another session"):
        session.zero(a)
    del a
    other.close()


def test_closed_session():
    s = vkad.Session()
    a = s.empty(2, vkad.f32)
    s.close()
    with pytest.raises(vkad.FailedPreconditionError, match="closed"):
        a.numpy()
    with pytest.raises(vkad.FailedPreconditionError, match="closed"):
        s.empty(2, vkad.f32)


def test_stats_is_a_dict(session):
    st = session.stats()
    for key in ["launches", "flushes", "forced_waits", "ndarrays", "kernels_cached",
                "memory_block_bytes", "memory_used_bytes", "adstack_heap_bytes",
                "vulkan_objects_created", "kernels_compiled", "compile_cache_hits", "user_bytes",
                "runtime_bytes", "args_ring_bytes", "readback_ring_bytes", "spare_block_bytes",
                "ndarray_pool_bytes", "live_buffers", "memory_peak_block_bytes",
                "memory_peak_used_bytes"]:
        assert isinstance(st[key], int)


def test_forced_waits_report_the_time_the_device_set_the_pace():
    # Depth 1: a flush with two submissions in flight waits for the older one. A kernel slow
    # enough to still run when the next flush comes (lavapipe: a loop of sines per element)
    # makes the host wait, and the stats say for how long.
    s = vkad.Session(retirement_depth=1)
    try:
        kb = vkad.KernelBuilder("slow")
        x = kb.ndarray("x", vkad.f32, 1)
        with kb.parallel_for("main", 0, x.shape[0]) as i:
            acc = kb.local(x[i])
            with kb.for_range(0, 2000):
                acc.value = vkad.sin(acc.value) + 0.5
            x[i] = acc.value
        k = s.compile(kb)
        a = s.zeros(1 << 14, vkad.f32)
        before = s.stats()
        t0 = time.perf_counter()
        for _ in range(4):
            s.launch(k, a)
            s.flush()
        elapsed_us = (time.perf_counter() - t0) * 1e6
        s.synchronize()
        after = s.stats()
        waits = after["forced_waits"] - before["forced_waits"]
        if waits == 0:
            pytest.skip("the device kept up with every flush: no forced wait to time")
        # A forced wait blocks on a submission not yet complete (polling released the
        # complete ones first): some time, and no more than the flushes took in all.
        waited_us = after["forced_wait_us"] - before["forced_wait_us"]
        assert 0 < waited_us <= elapsed_us
    finally:
        s.close()


def _in_place(name, op, c):
    """IR text of a kernel doing x[i] = x[i] <op> c, in place."""
    return f"""
kernel {name}(x: ndarray<f32, 1>) {{
  task main parallel %i in [0, shape(x, 0)) {{
    %v = load x[%i] : f32
    %c = const {c} : f32
    %y = {op} %v, %c : f32
    store x[%i], %y
  }}
}}
"""


def test_stats_count_the_pipelines_the_driver_makes(session):
    # A kernel never compiled before in this session gets its pipeline made by the driver (at
    # compile or at its first launch): counted, with the time taken; launching it again makes
    # none.
    ir = _in_place("plus_seven", "add", 7.0)
    before = session.stats()
    k = session.compile(ir)
    x = session.ndarray(np.array([1.0, 2.0], dtype=np.float32))
    session.launch(k, x)
    after = session.stats()
    assert after["pipelines_created"] >= before["pipelines_created"] + 1
    assert after["pipeline_create_us"] >= before["pipeline_create_us"]
    session.launch(k, x)
    assert session.stats()["pipelines_created"] == after["pipelines_created"]
    assert np.array_equal(x.numpy(), np.array([15.0, 16.0], dtype=np.float32))


@pytest.mark.parametrize("specialize", [True, False])
def test_a_session_specializes_kernels_to_their_shapes_unless_told_not_to(specialize):
    # specialize_shapes (the default): besides the generic pipeline made at compile, each shape
    # a kernel is launched with asks for one of its own (counted when asked for, made on a
    # thread); off, the generic one serves every shape. The results are the same.
    if specialize and (os.environ.get("VKAD_SPECIALIZE_SHAPES") == "0"
                       or os.environ.get("VKAD_ADSTACK_SPECIALIZE") == "off"):
        pytest.skip("shape specialization turned off in the environment")
    with vkad.Session(specialize_shapes=specialize) as s:
        k = s.compile(_in_place("times_three", "mul", 3.0))
        compiled = s.stats()["pipelines_created"]
        for n in (3, 5, 3):
            x = s.ndarray(np.arange(n, dtype=np.float32))
            s.launch(k, x)
            assert np.array_equal(x.numpy(), 3.0 * np.arange(n, dtype=np.float32))
        made = s.stats()["pipelines_created"] - compiled
        assert made == (2 if specialize else 0)  # shapes 3 and 5; 3 again asks for nothing


def test_a_kernel_compiled_again_comes_from_the_compile_cache(session):
    ir = _in_place("thrice", "mul", 3.0)
    session.compile(ir)
    before = session.stats()
    k = session.compile(ir)
    after = session.stats()
    assert after["kernels_compiled"] == before["kernels_compiled"]
    assert after["compile_cache_hits"] == before["compile_cache_hits"] + 1
    x = session.ndarray(np.array([1.0, 2.0], dtype=np.float32))
    session.launch(k, x)
    assert np.array_equal(x.numpy(), np.array([3.0, 6.0], dtype=np.float32))
