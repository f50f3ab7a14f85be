"""DLPack both ways (docs/interop.md): vkad arrays viewed
by numpy and torch without a copy (data pointers prove it), writes on each side seen after the
documented synchronisation, the capsule protocol (names, versions, consumption, deleters),
lifetimes (an exported array outlives Session.free, collection and close), imports by copy, and
the errors. Host-visible devices (lavapipe) here; tests/python/test_dlpack_cuda.py covers CUDA."""
import ctypes
import gc

import numpy as np
import pytest

import vkad

_name = ctypes.pythonapi.PyCapsule_GetName
_name.restype = ctypes.c_char_p
_name.argtypes = [ctypes.py_object]


def capsule_name(cap) -> str:
    return _name(cap).decode()


@pytest.fixture(scope="module")
def host(session):
    if session.empty(1).__dlpack_device__() != (1, 0):
        pytest.skip(f"{session.device_name}: arrays are not host-visible (CUDA path instead)")
    return session


def scale_kernel(s):
    kb = vkad.KernelBuilder("scale")
    x = kb.ndarray("x", vkad.f32, 1)
    y = kb.ndarray("y", vkad.f32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        y[i] = x[i] * 2.0 + 1.0
    return s.compile(kb)


def data_ptr(v: np.ndarray) -> int:
    return v.__array_interface__["data"][0]


def writable(v: np.ndarray) -> np.ndarray:
    """numpy < 2 makes every DLPack import read-only; a second numpy array over the same bytes
    (valid while `v` holds the export) writes them as numpy >= 2's view itself would."""
    if v.flags.writeable:
        return v
    raw = (ctypes.c_byte * v.nbytes).from_address(data_ptr(v))
    return np.frombuffer(raw, dtype=v.dtype).reshape(v.shape)


def test_numpy_view_is_vkads_memory(host):
    s = host
    a = s.ndarray(np.arange(12, dtype=np.float32).reshape(3, 4), name="a")
    v = np.from_dlpack(a)
    assert v.shape == (3, 4) and v.dtype == np.float32 and v.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(v, np.arange(12).reshape(3, 4))
    # The same bytes at every export (no copy), and a write through the view is vkad's data.
    assert data_ptr(np.from_dlpack(a)) == data_ptr(v)
    writable(v)[1, 2] = 42.0
    assert a.numpy()[1, 2] == 42.0
    assert a._dlpack_exports == 2 or a._dlpack_exports == 1  # the second view may be gone
    del v
    gc.collect()
    assert a._dlpack_exports == 0


def test_numpy_write_is_seen_by_the_next_launch(host):
    s = host
    scale = scale_kernel(s)
    x, y = s.zeros(64, name="x"), s.zeros(64, name="y")
    v = np.from_dlpack(x)
    writable(v)[:] = np.arange(64, dtype=np.float32)  # before the launch: no call needed
    s.launch(scale, x, y)
    np.testing.assert_array_equal(y.numpy(), np.arange(64) * 2.0 + 1.0)


def test_vkad_writes_are_seen_after_export_or_synchronize(host):
    s = host
    scale = scale_kernel(s)
    x = s.ndarray(np.arange(1 << 16, dtype=np.float32), name="x")
    y = s.zeros(1 << 16, name="y")
    s.launch(scale, x, y)  # recorded, not submitted: the export submits and waits for it
    w = np.from_dlpack(y)
    np.testing.assert_array_equal(w, np.arange(1 << 16) * 2.0 + 1.0)
    s.fill(y, 7.0)  # a later vkad write to a live view: seen after synchronize()
    s.synchronize()
    assert (w == 7.0).all()


def test_capsule_names_and_versions(host):
    a = host.ndarray(np.arange(3, dtype=np.int64), name="a")
    legacy = a.__dlpack__()
    assert capsule_name(legacy) == "dltensor"
    versioned = a.__dlpack__(max_version=(1, 0))
    assert capsule_name(versioned) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == "dltensor"  # a pre-1.0 consumer
    assert a._dlpack_exports >= 2
    # Never consumed: the capsules' destructors call the deleters.
    del legacy, versioned
    gc.collect()
    assert a._dlpack_exports == 0
    # A consumer that takes the versioned capsule renames it and owns the deleter (numpy >= 2.1
    # asks for it; older numpy for the legacy one): either way the export is released after.
    v = np.from_dlpack(a)
    np.testing.assert_array_equal(v, [0, 1, 2])
    del v
    gc.collect()
    assert a._dlpack_exports == 0


def test_exported_array_outlives_free_and_collection(host):
    s = host
    before = s.stats()["ndarrays"]
    a = s.ndarray(np.full(8, 3.0, np.float32), name="kept")
    v = np.from_dlpack(a)
    s.free(a)  # consumers hold it: freed for vkad, memory kept
    assert a.freed
    with pytest.raises(vkad.NotFoundError, match="'kept' was freed"):
        s.launch(scale_kernel(s), a, s.zeros(8))
    with pytest.raises(vkad.NotFoundError, match="was freed"):
        a.numpy()
    with pytest.raises(vkad.NotFoundError, match="was freed"):
        a.__dlpack__()
    gc.collect()
    assert s.stats()["ndarrays"] == before + 1  # 'kept' is still there
    np.testing.assert_array_equal(v, 3.0)
    del a
    gc.collect()
    np.testing.assert_array_equal(v, 3.0)  # the view alone keeps the memory
    del v
    gc.collect()
    assert s.stats()["ndarrays"] == before  # freed with the last consumer


def test_session_close_waits_for_consumers():
    s = vkad.Session()
    if s.empty(1).__dlpack_device__() != (1, 0):
        s.close()
        pytest.skip("arrays are not host-visible")
    a = s.ndarray(np.arange(5, dtype=np.float64))
    v = np.from_dlpack(a)
    del a
    s.close()
    with pytest.raises(vkad.FailedPreconditionError, match="closed"):
        s.empty(1)
    np.testing.assert_array_equal(v, np.arange(5))  # still mapped: the session is parked
    writable(v)[0] = 9.0
    del v  # the last consumer destroys the session
    gc.collect()


def test_export_options(host):
    s = host
    a = s.ndarray(np.arange(4, dtype=np.float32))
    c = a.__dlpack__(copy=True, max_version=(1, 0))
    assert capsule_name(c) == "dltensor_versioned"
    del c
    with pytest.raises(BufferError, match=r"dl_device \(2, 0\) requested; the array is on \(1, 0\)"):
        a.__dlpack__(dl_device=(2, 0))
    a.__dlpack__(dl_device=(1, 0))
    with pytest.raises(vkad.InvalidArgumentError, match="stream must be None for a CPU"):
        a.__dlpack__(stream=1)
    b = s.ndarray(np.array([True, False]))
    with pytest.raises(BufferError, match="bool arrays are held as one u32"):
        b.__dlpack__()
    gc.collect()
    assert a._dlpack_exports == 0


def test_copy_true_is_another_buffer(host):
    s = host
    a = s.ndarray(np.arange(6, dtype=np.float32))
    v = np.from_dlpack(a)

    class Copied:  # a producer wrapper that asks vkad for a copy
        def __dlpack__(self, **kw):
            return a.__dlpack__(copy=True, **{k: w for k, w in kw.items() if k != "copy"})

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    w = np.from_dlpack(Copied())
    np.testing.assert_array_equal(w, v)
    assert data_ptr(w) != data_ptr(v)
    writable(w)[0] = 100.0
    assert v[0] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint32, np.int64, np.bool_])
def test_from_dlpack_numpy_copies(session, dtype):
    if dtype == np.bool_ and int(np.__version__.split(".")[0]) < 2:
        pytest.skip(f"numpy {np.__version__} does not export bool through DLPack")
    rng = np.random.default_rng(3)
    host_array = (rng.standard_normal((3, 5)) * 100).astype(dtype)
    a = vkad.from_dlpack(host_array, session, name="imported")
    assert a.shape == (3, 5) and a.dtype == vkad.as_dtype(dtype)
    np.testing.assert_array_equal(a.numpy(), host_array)
    host_array[...] = 0  # a copy: the vkad array keeps what it was given
    assert a.numpy().any()
    assert session.from_dlpack(np.arange(3, dtype=np.int32)).numpy().tolist() == [0, 1, 2]


def test_from_dlpack_vkad_array_is_itself(session):
    a = session.zeros(3)
    assert vkad.from_dlpack(a) is a
    b = vkad.from_dlpack(a, session, copy=True)
    assert b is not a and b.numpy().tolist() == [0, 0, 0]


def test_from_dlpack_of_another_sessions_array_imports_a_copy(session):
    # It returned the array itself, which the other session's launches then refused.
    a = session.ndarray(np.arange(5, dtype=np.float32), name="a")
    other = vkad.Session()
    try:
        b = other.from_dlpack(a)
        assert b is not a and other._owns(b) and not other._owns(a)
        assert b.numpy().tolist() == [0, 1, 2, 3, 4]
        k = other.compile("kernel twice(x: ndarray<f32, 1>) {\n"
                          "  task t parallel %0 in [0, shape(x, 0)) {\n"
                          "    %1 = load x[%0] : f32\n    %2 = add %1, %1 : f32\n"
                          "    store x[%0], %2\n  }\n}\n")
        other.launch(k, b)
        assert b.numpy().tolist() == [0, 2, 4, 6, 8]
        assert a.numpy().tolist() == [0, 1, 2, 3, 4], "the original is untouched"
        c = vkad.from_dlpack(a, other, copy=True)
        assert other._owns(c) and c.numpy().tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(vkad.InvalidArgumentError,
                           match=r"copy=False\): ndarray 'a' belongs to another session"):
            other.from_dlpack(a, copy=False)
    finally:
        other.close()


def test_from_dlpack_errors(session):
    s = session
    with pytest.raises(vkad.InvalidArgumentError, match=r"strides \(2,\) of shape \(3,\) are not "
                                                        "C-contiguous"):
        s.from_dlpack(np.arange(6.0)[::2])
    with pytest.raises(vkad.InvalidArgumentError, match=r"strides \(1, 3\) of shape \(3, 2\)"):
        s.from_dlpack(np.arange(6.0).reshape(2, 3).T)
    with pytest.raises(vkad.InvalidArgumentError, match="code 2, 16 bits.*not one vkad holds"):
        s.from_dlpack(np.zeros(4, np.float16))
    with pytest.raises(vkad.InvalidArgumentError, match="rank 0; vkad arrays have rank 1 to 8"):
        s.from_dlpack(np.zeros((), np.float32))
    with pytest.raises(vkad.InvalidArgumentError, match="extent 0 of axis 0"):
        s.from_dlpack(np.zeros((0,), np.float32))
    with pytest.raises(vkad.InvalidArgumentError, match=r"copy=False\): a vkad array owns"):
        s.from_dlpack(np.zeros(2, np.float32), copy=False)
    with pytest.raises(vkad.InvalidArgumentError, match="list is not a DLPack producer"):
        s.from_dlpack([1.0, 2.0])
    cap = np.arange(3.0).__dlpack__()
    s.from_dlpack(cap)
    with pytest.raises(vkad.InvalidArgumentError, match="capsule was already consumed"):
        s.from_dlpack(cap)
    other = vkad.Session()
    try:
        with pytest.raises(vkad.InvalidArgumentError, match="Sessions are open; say which one"):
            vkad.from_dlpack(np.zeros(2, np.float32))
    finally:
        other.close()
    # The session is fine afterwards.
    assert s.from_dlpack(np.ones(2, np.float32)).numpy().tolist() == [1.0, 1.0]


def test_foreign_capsule_name(session):
    cap = ctypes.pythonapi.PyCapsule_New
    cap.restype = ctypes.py_object
    cap.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    other = cap(ctypes.c_void_p(8), b"not_a_tensor", None)
    with pytest.raises(vkad.InvalidArgumentError, match="'not_a_tensor' is not a DLPack tensor"):
        session.from_dlpack(other)


# ------------------------------------------------------------------ torch (CPU)

try:
    import torch
    import torch.utils.dlpack as torch_dlpack
except ImportError:  # the torch parts run where torch is installed (scripts/python_tests.sh)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


@needs_torch
def test_torch_views_vkad_memory(host):
    s = host
    a = s.ndarray(np.arange(10, dtype=np.float32), name="a")
    t = torch_dlpack.from_dlpack(a)
    assert t.device.type == "cpu" and t.dtype == torch.float32
    assert t.data_ptr() == data_ptr(np.from_dlpack(a))  # the same bytes, exported twice
    assert torch_dlpack.from_dlpack(a).data_ptr() == t.data_ptr()
    t.mul_(3.0)  # a torch write, seen by vkad's next use
    np.testing.assert_array_equal(a.numpy(), np.arange(10) * 3.0)
    y = s.zeros(10)
    s.launch(scale_kernel(s), a, y)
    ty = torch_dlpack.from_dlpack(y)  # waits for the launch
    assert torch.equal(ty, torch.arange(10, dtype=torch.float32) * 6.0 + 1.0)


@needs_torch
def test_torch_round_trip(session):
    s = session
    t = torch.linspace(-1, 1, 7, dtype=torch.float64)
    a = vkad.from_dlpack(t, s)  # one copy in
    np.testing.assert_array_equal(a.numpy(), t.numpy())
    cap = torch_dlpack.to_dlpack(torch.arange(4, dtype=torch.int64))  # a bare legacy capsule
    b = s.from_dlpack(cap)
    assert b.numpy().tolist() == [0, 1, 2, 3]
    with pytest.raises(vkad.InvalidArgumentError, match="already consumed"):
        s.from_dlpack(cap)
    with pytest.raises(vkad.InvalidArgumentError, match="not C-contiguous"):
        s.from_dlpack(torch.arange(12.0).reshape(3, 4).t())
    if s.empty(1).__dlpack_device__() == (1, 0):
        back = torch_dlpack.from_dlpack(a)
        assert torch.equal(back, t)


def test_dlpack_round_trip_script_exits_silently(host):
    """A script that exchanges arrays through DLPack both ways and keeps the views in its
    globals exits with nothing on stderr: the exports still held at interpreter exit are
    released while the interpreter finalizes (nanobind reported the array, its types and
    functions as leaked when they were not)."""
    import os
    import subprocess
    import sys
    script = (
        "import numpy as np, vkad\n"
        "s = vkad.Session()\n"
        "a = s.ndarray(np.arange(8, dtype=np.float32), name='a')\n"
        "v = np.from_dlpack(a)\n"  # a view of vkad's memory, held to the end
        "b = s.from_dlpack(np.linspace(0, 1, 8, dtype=np.float32))\n"  # a copy in
        "w = np.from_dlpack(b)\n"
        "assert v[3] == 3.0 and abs(w[-1] - 1.0) < 1e-6\n"
        "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
    assert p.stderr == ""
