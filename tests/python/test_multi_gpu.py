"""Several sessions: vkad.devices() and choosing a session's device by index or UUID, CUDA
ordinals matched by UUID, examples/multi_gpu/train.py's data-parallel training with two and
four sessions on the same device (lavapipe here), as threads of one process and as processes
(torch.distributed gloo over localhost), each against one session over the whole batch within
the f32 reduction-order bound that train.check_against_single derives; and
examples/multi_gpu/diffmpm_batch.py, DiffTaichi's diffmpm over a batch of scenes, on four
processes (a scene each) and two threads (two scenes each), against one session running the
whole batch."""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import vkad
vkad_devices = sys.modules["vkad.devices"]  # the module (vkad.devices is the function)

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "multi_gpu" / "train.py"


def _load_train():
    spec = importlib.util.spec_from_file_location("multi_gpu_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["multi_gpu_train"] = module  # dataclasses / pickling look modules up by name
    spec.loader.exec_module(module)
    return module


train = _load_train()

BATCH_EXAMPLE = EXAMPLE.parent / "diffmpm_batch.py"


def _load_batch():
    spec = importlib.util.spec_from_file_location("multi_gpu_diffmpm_batch", BATCH_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["multi_gpu_diffmpm_batch"] = module
    spec.loader.exec_module(module)
    return module


batch = _load_batch()


def test_devices_are_listed_in_index_order_with_uuids(session):
    listed = vkad.devices()
    assert listed, "a session exists, so a device does"
    assert [d.index for d in listed] == list(range(len(listed)))
    assert sum(d.automatic for d in listed) == 1
    for d in listed:
        assert vkad.normalize_uuid(d.uuid) == d.uuid and len(d.uuid) == 36
        assert d.usable == (d.unusable == "")
        assert d.cpu == (d.kind == "CPU")
    auto = next(d for d in listed if d.automatic)
    assert session.device_uuid == auto.uuid and session.device_name == auto.name


def test_a_session_opens_the_device_its_uuid_or_index_names():
    for d in vkad.devices():
        if not d.usable:
            continue
        for how in (d.uuid, "GPU-" + d.uuid.upper(), d.index):
            s = vkad.Session(device=how)
            try:
                assert s.device_uuid == d.uuid, how
                assert s.validation_messages() == []
            finally:
                s.close()


def test_an_unknown_uuid_is_not_found_naming_the_devices_present():
    first = vkad.devices()[0]
    with pytest.raises(vkad.NotFoundError, match="no device has UUID 00000000-0000-0000-0000-"
                                                 "0000000000ff; present: .*" + first.uuid):
        vkad.Session(device="GPU-00000000-0000-0000-0000-0000000000ff")


def test_uuid_forms_normalize():
    raw = bytes(range(16))
    want = "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert vkad.normalize_uuid(raw) == want
    assert vkad.normalize_uuid("GPU-" + want.upper()) == want
    assert vkad.normalize_uuid(want.replace("-", "")) == want
    assert vkad.normalize_uuid("GPU-0001") is None
    assert vkad.normalize_uuid(b"short") is None


def test_cuda_ordinals_are_matched_by_uuid(monkeypatch):
    """With CUDA reporting the second of two UUIDs as ordinal 0 (and the first as 1), the
    Vulkan device with that UUID gets ordinal 0: matching goes by UUID, not by position."""
    listed = vkad.devices(cuda=False)
    target = listed[0].uuid
    other = "ffffffff-ffff-ffff-ffff-ffffffffffff"
    monkeypatch.setattr(vkad_devices, "cuda_uuids", lambda: [target, other])
    assert vkad.devices()[0].cuda_ordinal == 0
    assert vkad.device_for_cuda(0).index == listed[0].index
    with pytest.raises(vkad.NotFoundError, match="CUDA device 1 .* is not a Vulkan device"):
        vkad.device_for_cuda(1)
    with pytest.raises(vkad.NotFoundError, match="CUDA device 2: this process sees 2"):
        vkad.device_for_cuda(2)
    monkeypatch.setattr(vkad_devices, "cuda_uuids", lambda: [other, target])
    assert vkad.devices()[0].cuda_ordinal == 1
    monkeypatch.setattr(vkad_devices, "cuda_uuids", lambda: [])
    assert vkad.devices()[0].cuda_ordinal is None


# The data-parallel runs: 2048 particles, 8 substeps, 3 iterations; two ranks of 1024, or four
# of 512.
ARGS = ["--particles", "2048", "--steps", "8", "--iters", "3", "--warmup", "0", "--lr", "2.0"]


def _check(records, session):
    """Every rank on this session's device, no validation message, the same parameters, and
    every iteration equal to one session over the whole batch within the derived bound; and
    the bound is tight enough to see a missing all-reduce (rank 0's own share of the
    gradient lies outside it)."""
    world = len(records)
    share = 2048 // world
    assert [r["particles"] for r in records] == [[r * share, (r + 1) * share]
                                                 for r in range(world)]
    for r in records:
        assert r["device_uuid"] == session.device_uuid
        assert r["validation_messages"] == []
    check = train.check_against_single(records, steps=8, total=2048, session=session)
    for row in check["iterations"]:
        assert row["ok"], row
        assert np.all(np.array(row["grad_tol"]) < 0.01 * np.array(row["grad_abs_terms"]))
        assert any(d > t for d, t in zip(row["rank0_share_diff"], row["grad_tol"])), \
            "the tolerance would not notice a rank's gradient left unreduced"
    losses = records[0]["history"]["loss"]
    assert losses[-1] < losses[0], "training lowers the loss"


def _args(session, *more, devices=2):
    # Every rank on the test session's device (on a machine with several GPUs the example would
    # otherwise give rank r the r-th).
    return train.parse(ARGS + ["--devices", str(devices), "--device", session.device_uuid] +
                       list(more))


def test_two_sessions_on_threads_equal_one_session(session):
    pytest.importorskip("torch.distributed")
    records = train.launch_threads(_args(session, "--threads"), 2)
    _check(records, session)


def test_two_processes_with_gloo_equal_one_session(session):
    pytest.importorskip("torch.distributed")
    records = train.launch_processes(_args(session), 2)
    _check(records, session)


def test_four_processes_with_gloo_equal_one_session(session):
    pytest.importorskip("torch.distributed")
    records = train.launch_processes(_args(session, devices=4), 4)
    _check(records, session)


# DiffTaichi's diffmpm over a batch of four robots: 64 steps on a 32^2 grid, 3 iterations.
BATCH_ARGS = ["--steps", "64", "--grid", "32", "--iters", "3", "--warmup", "0"]


def _check_batch(records, session, args):
    """Every rank on this session's device with its share of the scenes, no validation message,
    the ranks' loss curve and gradients equal to one session running the whole batch (the
    example's compare(): 1e-4 of the loss), and the scenes different enough that a scene or a
    rank left out of the sums would show (rank 0's own mean loss lies outside the tolerance)."""
    world = len(records)
    per = args.batch // world
    assert [r["scenes"] for r in records] == [[r * per, (r + 1) * per] for r in range(world)]
    for r in records:
        assert r["device_uuid"] == session.device_uuid
        assert r["validation_messages"] == []
    one = batch.single(args, session)
    check = batch.compare(records, one)
    assert check["ok"], check
    own = records[0]["history"]["local_loss"][0] / per
    whole = one["history"]["loss"][0]
    assert abs(own - whole) > 10 * 1e-4 * abs(whole), (own, whole)
    assert np.any(np.array(records[0]["history"]["grad"][0]) != 0)
    losses = one["history"]["loss"]
    assert losses[-1] != losses[0], "the controller's steps change the batch's loss"


def test_diffmpm_scenes_on_four_processes_equal_one_session(session):
    pytest.importorskip("torch.distributed")
    args = batch.parse(BATCH_ARGS + ["--devices", "4", "--batch", "4", "--device",
                                     session.device_uuid])
    records = batch.mg.launch_processes(args, 4, script=str(BATCH_EXAMPLE))
    _check_batch(records, session, args)


def test_diffmpm_scenes_two_per_thread_equal_one_session(session):
    pytest.importorskip("torch.distributed")
    args = batch.parse(BATCH_ARGS + ["--devices", "2", "--batch", "4", "--threads", "--device",
                                     session.device_uuid])
    records = batch.mg.launch_threads(args, 2, batch.run_rank)
    _check_batch(records, session, args)


def test_a_batch_smaller_than_the_ranks_is_refused():
    with pytest.raises(SystemExit):
        batch.parse(["--devices", "4", "--batch", "2"])


def test_a_failing_worker_stops_the_others_and_is_named(session):
    """Rank 3 of four cannot open its device: the run ends with SystemExit naming it, the three
    others (waiting for it in their first all-reduce) stopped instead of left to the process
    group's timeout."""
    pytest.importorskip("torch.distributed")
    uuid = session.device_uuid
    args = train.parse(ARGS + ["--devices", "4", "--device", ",".join([uuid] * 3 + ["no-such"])])
    with pytest.raises(SystemExit, match="rank 3 failed"):
        train.launch_processes(args, 4)
