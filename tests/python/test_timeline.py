"""The timeline from Python (issue 56, point 3; docs/debugging.md): `with vkad.profile(path)` times
each launch of a tape's forward and adjoint kernels and a replayed graph's launches on the device,
writes a Chrome trace whose events are those launches, and summarises device time per kernel;
the results and gradients inside the block are unchanged; nothing is recorded outside a block;
misuse raises and the session stays usable."""
import json

import numpy as np
import pytest

import vkad

N = 2048


@vkad.kernel
def square_sum(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        y[i] = x[i] * x[i] + 1.0


@vkad.kernel
def scale(x: vkad.array(vkad.f32), a: vkad.f32):
    for i in range(x.shape[0]):
        x[i] = x[i] * a


def device_events(timeline):
    return [e for e in timeline.events if e["gpu"]]


def test_a_tape_in_a_profile_block_is_traced_and_its_gradient_unchanged(session, tmp_path):
    s = session
    x0 = np.linspace(-1, 1, N, dtype=np.float32)
    xs, ys, zs = s.ndarray(x0), s.zeros(N, vkad.f32), s.zeros(N, vkad.f32)
    path = tmp_path / "trace.json"
    with vkad.profile(path, session=s) as p:
        t = s.tape()
        with t:
            square_sum(xs, ys, session=s)
            square_sum(ys, zs, session=s)
        t.backward(seed={zs: 1.0})
        g = t.grad(xs).numpy()
    y = x0 * x0 + 1
    np.testing.assert_allclose(g, 2 * y * 2 * x0, rtol=1e-5, atol=1e-6)
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert len(spans) == len(p.events)
    assert any(e["name"] == "synchronize" or e["cat"] == "wait" for e in spans), \
        "the wait for the gradient is a host span"
    if not p.timeline.gpu_timestamps:
        pytest.skip("the device has no timestamp queries: host spans only")
    names = [e["name"] for e in device_events(p.timeline)]
    assert names.count("square_sum") == 2
    assert names.count("square_sum_adjoint") == 2
    gpu = [e for e in spans if e["tid"] == 1]
    assert [e["name"] for e in gpu] == names
    assert all(e["dur"] >= 0 for e in gpu)
    rows = {r["name"]: r for r in p.timeline.kernels()}
    assert rows["square_sum"]["count"] == 2
    assert abs(sum(r["share"] for r in rows.values()) - 1) < 1e-9
    assert "square_sum_adjoint" in p.summary()


def test_a_replayed_graph_names_its_launches_and_graph(session):
    s = session
    x = s.ndarray(np.ones(N, np.float32))
    with s.capture("halve twice") as g:
        scale(x, 0.5, session=s)
        scale(x, 0.5, session=s)
    with vkad.profile(session=s) as p:
        s.replay(g)
    np.testing.assert_array_equal(x.numpy(), np.full(N, 0.25, np.float32))
    replays = [e for e in p.events if e["category"] == "replay"]
    assert len(replays) == 1 and replays[0]["graph"] == "halve twice"
    if not p.timeline.gpu_timestamps:
        pytest.skip("no timestamp queries")
    d = device_events(p.timeline)
    assert d and all(e["graph"] == "halve twice" and e["name"] for e in d)


def test_replays_between_sampled_ones_are_one_event_each(session):
    # replay_sample=3: replays 0 and 3 of the graph timed launch by launch, 1, 2 and 4 as one
    # device event each (category "replay"), left out of the per-kernel summary
    s = session
    x = s.ndarray(np.ones(N, np.float32))
    with s.capture("halve") as g:
        scale(x, 0.5, session=s)
    with vkad.profile(session=s, replay_sample=3) as p:
        for _ in range(5):
            s.replay(g)
    np.testing.assert_array_equal(x.numpy(), np.full(N, 2.0 ** -5, np.float32))
    t = p.timeline
    assert (t.replay_sample, t.replays_timed, t.replays_spanned, t.spanned_launches) == (3, 2, 3, 3)
    if not t.gpu_timestamps:
        pytest.skip("no timestamp queries")
    d = device_events(t)
    assert [e["category"] for e in d] == ["launch", "replay", "replay", "launch", "replay"]
    assert all(e["graph"] == "halve" for e in d)
    rows = {r["name"]: r for r in t.kernels()}
    assert set(rows) == {"scale"} and rows["scale"]["count"] == 2
    assert "3 of 5 graph replays timed as one event" in p.summary()
    with pytest.raises(vkad.InvalidArgumentError, match="replay_sample is 0"):
        s.begin_timeline(10, 0)


def test_nothing_is_recorded_outside_a_block_and_misuse_raises(session):
    s = session
    x = s.ndarray(np.ones(N, np.float32))
    with pytest.raises(vkad.FailedPreconditionError, match="no timeline"):
        s.end_timeline()
    s.begin_timeline()
    with pytest.raises(vkad.FailedPreconditionError, match="already"):
        s.begin_timeline()
    first = s.end_timeline()
    assert first.events is not None and first.dropped == 0
    # An error in the block propagates and ends the timeline: the next block works.
    with pytest.raises(ZeroDivisionError):
        with vkad.profile(session=s):
            scale(x, 2.0, session=s)
            1 / 0
    with vkad.profile(session=s, max_events=2) as p:
        for _ in range(5):
            scale(x, 1.0, session=s)
        s.synchronize()
    assert len(p.events) == 2 and p.timeline.dropped > 0
    assert "not kept" in p.summary()
    with pytest.raises(vkad.InvalidArgumentError, match="cannot write"):
        p.timeline.save("/nonexistent-dir/x/trace.json")
