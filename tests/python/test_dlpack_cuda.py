"""DLPack on NVIDIA GPUs (docs/interop.md): vkad arrays
as CUDA tensors without a copy (the same data pointer at every export), the stream handshake
(torch's stream waits for vkad's timeline semaphore), torch -> vkad copies, lifetimes. Skipped
unless the session's arrays export as kDLCUDA and PyTorch sees CUDA."""
import gc

import numpy as np
import pytest

import vkad

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cuda(session):
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    kind, index = session.empty(1).__dlpack_device__()
    if kind != 2:
        pytest.skip(f"{session.device_name}: arrays are not CUDA memory")
    return torch.device("cuda", index)


def fill_kernel(s):
    kb = vkad.KernelBuilder("iota")
    y = kb.ndarray("y", vkad.f32, 1)
    with kb.parallel_for("main", 0, y.shape[0]) as i:
        y[i] = vkad.cast(i, vkad.f32) * 0.5
    return s.compile(kb)


def test_same_pointer_at_every_export(session, cuda):
    a = session.zeros(1 << 20, name="a")
    t1 = torch.from_dlpack(a)
    t2 = torch.from_dlpack(a)
    assert t1.device == cuda and t1.data_ptr() == t2.data_ptr()
    info = session.interop_info()
    assert info["cuda"] and info["cuda_mapped_blocks"] >= 1


def test_vkad_write_then_torch_read_without_host_sync(session, cuda):
    n = 1 << 22
    a = session.empty(n, vkad.f32, name="a")
    session.launch(fill_kernel(session), a)  # asynchronous; the export orders torch after it
    t = torch.from_dlpack(a)
    expect = torch.arange(n, device=cuda, dtype=torch.float32) * 0.5
    assert torch.equal(t, expect)


def test_torch_write_then_vkad_read(session, cuda):
    a = session.zeros(1000, name="a")
    t = torch.from_dlpack(a)
    t.fill_(2.5)
    torch.cuda.synchronize()  # the documented rule: torch's writes done before vkad reads
    np.testing.assert_array_equal(a.numpy(), 2.5)


def test_round_trip_torch_vkad_torch(session, cuda):
    t = torch.randn(3, 1000, device=cuda, dtype=torch.float64)
    a = vkad.from_dlpack(t, session)  # a device copy
    back = torch.from_dlpack(a)
    assert torch.equal(back, t) and back.data_ptr() != t.data_ptr()


def test_exported_array_outlives_free(session, cuda):
    a = session.ndarray(np.arange(16, dtype=np.float32))
    t = torch.from_dlpack(a)
    session.free(a)
    del a
    gc.collect()
    assert torch.equal(t.cpu(), torch.arange(16, dtype=torch.float32))
    del t
    gc.collect()
    assert session.interop_info()["exports"] == 0
