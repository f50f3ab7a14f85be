"""The reusable Tape (vkad::Tape's behaviour, python/vkad/tape.py), array.grad, and zero_many:
gradients against closed forms, no allocation after the first iteration, every error."""
import gc
import re

import numpy as np
import pytest

import vkad

STEP = """
kernel step(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = sin %1 : f32
    %3 = const 0.9 : f32
    %4 = mul %2, %3 : f32
    %5 = const 0.1 : f32
    %6 = add %4, %5 : f32
    store y[%0], %6
  }
}"""
N, STEPS = 32, 10
X0 = np.linspace(-1.5, 1.5, N).astype(np.float32)


def chain(x0, frm, to):
    """d x_to / d x_frm through y = 0.9 sin(x) + 0.1, in double."""
    x, g = x0.astype(np.float64), np.ones(len(x0))
    for k in range(to):
        if k >= frm:
            g = g * 0.9 * np.cos(x)
        x = np.sin(x) * 0.9 + 0.1
    return g


@pytest.fixture(scope="module")
def step(session):
    return session.differentiate(STEP)


def memory(s):
    st = s.stats()
    return st["ndarrays"], st["memory_block_bytes"], st["memory_used_bytes"]


def test_reused_tape_allocates_nothing_after_the_first_iteration(session, step):
    s = session
    xs = [s.ndarray(X0)] + [s.empty(N, vkad.f32) for _ in range(STEPS)]
    t = s.tape()
    first, mem = None, None
    for it in range(3):
        with t:
            for k in range(STEPS):
                s.launch(step, xs[k], xs[k + 1])
        assert len(t.launches) == STEPS
        t.backward(seed={xs[-1]: 1.0})
        g = t.grad(xs[0]).numpy()  # the readback drains every retirement
        if it == 0:
            np.testing.assert_allclose(g, chain(X0, 0, STEPS), atol=5e-3)
            np.testing.assert_allclose(t.grad(xs[4]).numpy(), chain(X0, 4, STEPS), atol=5e-3)
            first, mem = g, memory(s)
        else:
            np.testing.assert_array_equal(g, first)  # zeroed each time, not accumulated
            assert memory(s) == mem, f"iteration {it}"


def test_new_tape_per_iteration_creates_no_vulkan_objects_in_the_steady_state(session, step):
    # DiffTaichi's `with ti.ad.Tape(loss)` / Warp's idiom: a new tape each iteration. A dropped
    # tape's gradients go into the runtime's pool and the next tape's come from it.
    s = session
    xs = [s.ndarray(X0)] + [s.empty(N, vkad.f32) for _ in range(STEPS)]
    created = []
    for it in range(5):
        with s.tape() as t:
            for k in range(STEPS):
                s.launch(step, xs[k], xs[k + 1])
        t.backward(seed={xs[-1]: 1.0})
        np.testing.assert_allclose(t.grad(xs[0]).numpy(), chain(X0, 0, STEPS), atol=5e-3)
        del t
        gc.collect()  # the tape and its gradients go now, not at some later collection
        st = s.stats()
        # Pipelines aside: a specialized variant made in the background (runtime.h,
        # background_specialization) lands whenever its compile ends -- under load, iterations
        # later -- and is no allocation of the tape's.
        created.append(st["vulkan_objects_created"] - st["pipelines_created"])
    assert created[2:] == [created[1]] * 3, created
    assert s.stats()["ndarray_pool_bytes"] >= (STEPS + 1) * N * 4
    s.release_idle_memory()
    st = s.stats()
    assert st["ndarray_pool_bytes"] == 0 and st["args_ring_bytes"] == 0


def test_stats_tell_the_users_memory_from_the_runtimes(session):
    s = session
    before = s.stats()
    a = s.ndarray(np.arange(1000, dtype=np.float32))
    st = s.stats()
    assert st["user_bytes"] == before["user_bytes"] + 4000
    assert st["runtime_bytes"] >= st["args_ring_bytes"] + st["readback_ring_bytes"]
    del a


def test_tape_records_are_left_out_of_the_cyclic_gc(session, step):
    # A recording keeps one (kernel, args) tuple per launch, ~10^4 an iteration: tracked, they
    # pile up in the GC's older generations and CPython runs full collections (several ms)
    # mid-recording. They hold only vkad objects and numbers, so the binding untracks them at
    # once (GC off here: nothing but the binding can untrack them in the meantime).
    s = session
    xs = [s.ndarray(X0)] + [s.empty(N, vkad.f32) for _ in range(3)]
    bound = s.bind(step, x=xs[1], y=xs[2])
    t = s.tape()
    gc.disable()
    try:
        with t:
            s.launch(step, xs[0], xs[1])
            bound()
            s.launch(step.forward, xs[2], xs[3])
        assert len(t.launches) == 3
        for kernel, args in t.launches:
            assert len(args) == 2
        assert not any(gc.is_tracked(r) or gc.is_tracked(r[1]) for r in t.launches)
    finally:
        gc.enable()
    t.backward(seed={xs[-1]: 1.0})
    np.testing.assert_allclose(t.grad(xs[0]).numpy(), chain(X0, 0, 3), atol=5e-3)


def test_array_grad_is_used_and_kept_by_the_caller(session, step):
    s = session
    x = s.ndarray(X0, grad=True, name="x")
    assert x.grad is not None and x.grad.shape == (N,) and x.grad.name == "x_grad"
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(N, np.float32))
    y = s.zeros(N, vkad.f32, grad=True)
    np.testing.assert_array_equal(y.grad.numpy(), np.zeros(N, np.float32))
    z = s.empty(N, vkad.f32)
    before = s.stats()["ndarrays"]
    with s.tape() as t:
        s.launch(step, x, y)
        s.launch(step, y, z)
    t.backward(seed={z: 1.0})
    assert t.grad(x) is x.grad and t.grad(y) is y.grad
    assert s.stats()["ndarrays"] == before + 1  # only z's gradient was made
    np.testing.assert_allclose(x.grad.numpy(), chain(X0, 0, 2), atol=5e-3)
    with pytest.raises(vkad.InvalidArgumentError, match="a gradient has its array's dtype and shape"):
        x.grad = s.empty(3, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError, match="its own gradient"):
        x.grad = x
    x.grad = None
    assert x.grad is None


def test_gradient_of_a_collected_array_is_dropped(session, step):
    s = session
    t = s.tape()
    a, b = s.ndarray(X0), s.empty(N, vkad.f32)
    with t:
        s.launch(step, a, b)
    t.backward(seed={b: 1.0})
    s.synchronize()
    count = s.stats()["ndarrays"]
    handle = a.handle
    del a
    with t:  # the recording that held a is gone; its gradient goes at the next recording
        pass
    gc.collect()
    assert handle not in t._grads
    assert s.stats()["ndarrays"] == count - 2  # a and its gradient


def test_a_gradient_the_tape_made_is_a_view_that_keeps_the_tape(session, step):
    # The tape (vkad::Tape) owns its gradients: t.grad(x) views one, keeps the tape alive, and
    # frees nothing itself; Session.free refuses it.
    s = session
    x, y = s.ndarray(X0), s.empty(N, vkad.f32)
    t = s.tape()
    with t:
        s.launch(step, x, y)
    t.backward(seed={y: 1.0})
    g = t.grad(x)
    assert t.grad(x) is g and g.name == "array_grad"
    with pytest.raises(vkad.InvalidArgumentError, match="is a tape's gradient"):
        s.free(g)
    s.synchronize()
    count = s.stats()["ndarrays"]
    del t
    gc.collect()
    assert s.stats()["ndarrays"] == count  # the view holds the tape, and so its gradients
    np.testing.assert_allclose(g.numpy(), chain(X0, 0, 1), atol=5e-3)
    del g
    gc.collect()
    assert s.stats()["ndarrays"] == count - 2  # x's and y's gradients, with the tape


@pytest.mark.parametrize("looped", [False, True])
def test_a_gradient_view_launched_on_its_own_tape_goes_with_the_tape(session, step, looped):
    # The view keeps the tape; launched on that tape (as a launch, or in a Session.loop's body),
    # the tape's record keeps the view: a cycle through the binding. The cyclic GC must see it,
    # or the tape and its gradients stay until the process ends.
    s = session
    x, y, z = s.ndarray(X0), s.empty(N, vkad.f32), s.empty(N, vkad.f32)
    t = s.tape()
    with t:
        s.launch(step, x, y)
    t.backward(seed={y: 1.0})
    g = t.grad(x)
    with t:
        if looped:
            s.loop(0, 1, lambda i: s.launch(step, g, z))
        else:
            s.launch(step, g, z)
    assert isinstance(t.launches[0], vkad.LoopRecord) == looped
    s.synchronize()
    count = s.stats()["ndarrays"]
    del t, g
    gc.collect()
    assert s.stats()["ndarrays"] == count - 2  # x's and y's gradients, with the tape


def test_unsetting_array_grad_gives_the_gradient_back_to_the_tape(session, step):
    s = session
    x, y = s.ndarray(X0), s.empty(N, vkad.f32)
    mine = s.zeros(N, vkad.f32)
    t = s.tape()
    for it in range(3):  # array.grad set, unset, set again
        x.grad = mine if it != 1 else None
        if it == 1:
            s.fill(mine, 7.0)
        with t:
            s.launch(step, x, y)
        t.backward(seed={y: 1.0})
        g = t.grad(x)
        assert (g is mine) == (it != 1)
        np.testing.assert_allclose(g.numpy(), chain(X0, 0, 1), atol=5e-3)
        if it == 1:  # unset: the tape's own gradient, the caller's array left alone
            np.testing.assert_array_equal(mine.numpy(), np.full(N, 7.0, np.float32))


def test_zero_many(session):
    s = session
    junk = np.full(N, 7.5, np.float32)
    a, b, c = s.ndarray(junk), s.ndarray(junk), s.ndarray(junk)
    s.zero_many([a, c])
    np.testing.assert_array_equal(a.numpy(), np.zeros(N, np.float32))
    np.testing.assert_array_equal(c.numpy(), np.zeros(N, np.float32))
    np.testing.assert_array_equal(b.numpy(), junk)
    dead = s.ndarray(junk)
    s.free(dead)
    a.upload(junk)
    with pytest.raises(vkad.NotFoundError, match="zero_many: ndarray handle .* was freed"):
        s.zero_many([a, b, dead])
    np.testing.assert_array_equal(a.numpy(), junk)  # nothing recorded
    with pytest.raises(vkad.InvalidArgumentError, match="zero_many: expected a vkad ndarray"):
        s.zero_many([a, 3])
    s.zero_many([])


def test_tape_errors_match_the_cpp_tape(session, step):
    # (A differentiated scalar parameter is no longer refused: test_scalar_grad.py.)
    s = session
    x, y = s.ndarray(X0), s.empty(N, vkad.f32)
    launches = s.stats()["launches"]
    with s.tape() as t:
        s.launch(step, x, y)
    assert len(t.launches) == 1 and s.stats()["launches"] == launches + 1
    with pytest.raises(vkad.InvalidArgumentError, match="value 1e\\+300 does not fit f32"):
        t.backward(seed={y: 1e300})
    with pytest.raises(vkad.InvalidArgumentError, match="8 bytes given, the array holds 128"):
        t.backward(seed={y: np.ones(2)})
    t.backward(seed={y: np.float32(2.0)})  # a numpy number is a value
    np.testing.assert_allclose(t.grad(x).numpy(), 2 * chain(X0, 0, 1), atol=5e-3)


# --- a launch that overwrites what an earlier one read is refused (api/tape_hazards.h) ---------

P2G = """
kernel p2g(x: ndarray<f32, 1> grad, grid: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %s = sin %v : f32
    store grid[%i], %s
  }
}"""
G2P = """
kernel g2p(grid: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(grid, 0)) {
    %v = load grid[%i] : f32
    %two = const 2.0 : f32
    %w = mul %v, %two : f32
    store y[%i], %w
  }
}"""
TIME_STEP = """
kernel time_step(x: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : f32
    %s = sin %xv : f32
    %a = const 0.9 : f32
    %b = const 0.1 : f32
    %m = mul %s, %a : f32
    %n = add %m, %b : f32
    store x[%f1, %p], %n
  }
}"""
TAKE_ROW = """
kernel take_row(x: ndarray<f32, 2> grad, y: ndarray<f32, 1> grad, f: i32) {
  task main parallel %p in [0, shape(y, 0)) {
    %f = arg f : i32
    %v = load x[%f, %p] : f32
    store y[%p], %v
  }
}"""
PUT_ROW = """
kernel put_row(x: ndarray<f32, 2> grad, z: ndarray<f32, 1> grad, g: i32) {
  task main parallel %p in [0, shape(z, 0)) {
    %g = arg g : i32
    %v = load z[%p] : f32
    store x[%g, %p], %v
  }
}"""
SQ_LOSS = """
kernel sq_loss(x: ndarray<f32, 1> grad, loss: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %q = mul %v, %v : f32
    %zero = const 0 : i32
    atomic_add loss[%zero], %q
  }
}"""


def handle(a):
    return f"{a.handle >> 32}:{a.handle & 0xffffffff}"


def test_reused_grid_is_refused_with_the_cpp_tapes_message(session):
    s = session
    p2g, g2p = s.differentiate(P2G), s.differentiate(G2P)
    x0, x1 = s.ndarray(X0), s.ndarray(X0)
    grid, y0 = s.empty(N, vkad.f32, "grid"), s.empty(N, vkad.f32)
    t = s.tape()
    with t:
        s.launch(p2g, x0, grid)
        s.launch(g2p, grid, y0)
        launches = s.stats()["launches"]
        with pytest.raises(vkad.InvalidArgumentError) as e:
            s.launch(p2g, x1, grid)
    msg = str(e.value)
    assert msg.startswith(
        f"tape.launch: launch 2 ('p2g') writes ndarray 'grid' ({handle(grid)}) (parameter "
        "'grid') at rows that depend on the thread, a loop or data, which launch 1 ('g2p') read "
        "(parameter 'grid'). Backward runs launch 1's adjoint"), msg
    assert "Keep one row or one array per step" in msg and '"Tapes and memory"' in msg
    assert "t.memory_budget" in msg  # the way to keep the reused array
    assert len(t.launches) == 2 and s.stats()["launches"] == launches  # nor launched
    with t:  # a new recording forgets what the last one read
        s.launch(p2g, x1, grid)


def test_time_axis_over_many_launches_is_accepted_and_matches_the_closed_form(session):
    s = session
    step = s.differentiate(TIME_STEP)
    steps = 100
    host = np.zeros((steps + 1, N), np.float32)
    host[0] = X0
    x = s.ndarray(host, name="x")
    t = s.tape()
    with t:
        for f in range(steps):
            s.launch(step, x, f)
    seed = np.zeros((steps + 1, N), np.float32)
    seed[steps] = 1.0
    t.backward(seed={x: seed})
    np.testing.assert_allclose(t.grad(x).numpy()[0], chain(X0, 0, steps), rtol=2e-2, atol=1e-6)
    with t:
        for f in range(5):
            s.launch(step, x, f)
        with pytest.raises(vkad.InvalidArgumentError,
                           match=r"launch 5 \('time_step'\) writes ndarray 'x' \(.*\) \(parameter "
                                 r"'x'\) at row 2 of axis 0, which launch 2 \('time_step'\) read "
                                 r"there \(parameter 'x'\)"):
            s.launch(step, x, 1)


def test_scalar_rows_that_collide_are_refused(session):
    s = session
    take, put = s.differentiate(TAKE_ROW), s.differentiate(PUT_ROW)
    x = s.ndarray(np.ones((8, N), np.float32), name="x")
    y, z = s.empty(N, vkad.f32), s.ndarray(np.full(N, 2.0, np.float32))
    with s.tape() as t:
        s.launch(take, x, y, 3)
        s.launch(put, x, z, 4)  # row 4 was not read
        with pytest.raises(vkad.InvalidArgumentError) as e:
            s.launch(put, x, z, 3)
    assert (f"launch 2 ('put_row') writes ndarray 'x' ({handle(x)}) (parameter 'x') at row 3 of "
            "axis 0, which launch 0 ('take_row') read there (parameter 'x')") in str(e.value)
    assert len(t.launches) == 2


def test_loss_accumulated_with_atomics_is_accepted(session):
    s = session
    loss_k, g2p = s.differentiate(SQ_LOSS), s.differentiate(G2P)
    loss, out = s.zeros(1, vkad.f32, name="loss"), s.empty(1, vkad.f32)
    xs = [s.ndarray(np.full(N, 0.5 + k, np.float32)) for k in range(5)]
    t = s.tape()
    with t:
        for x in xs:
            s.launch(loss_k, x, loss)
    t.backward(seed={loss: 1.0})
    for k, x in enumerate(xs):
        np.testing.assert_allclose(t.grad(x).numpy(), np.full(N, 2 * (0.5 + k)), rtol=1e-5)
    with t:
        s.launch(g2p, loss, out)  # reads the loss; adding to it afterwards changes what it read
        with pytest.raises(vkad.InvalidArgumentError,
                           match=r"launch 1 \('sq_loss'\) atomically adds to ndarray 'loss'"):
            s.launch(loss_k, xs[0], loss)


def test_captured_tape_launches_are_checked(session):
    s = session
    take, put = s.differentiate(TAKE_ROW), s.differentiate(PUT_ROW)
    x = s.ndarray(np.ones((8, N), np.float32), name="x")
    y, z = s.empty(N, vkad.f32), s.ndarray(np.full(N, 2.0, np.float32))
    t = s.tape()
    with s.capture("hazards") as g:
        with t:
            s.launch(take, x, y, 3)
            with pytest.raises(vkad.InvalidArgumentError, match="at row 3 of axis 0"):
                s.launch(put, x, z, 3)
            s.launch(put, x, z, 2)
        t.backward(seed={y: 1.0})
    s.replay(g)
    np.testing.assert_array_equal(t.grad(z).numpy(), np.zeros(N, np.float32))
    np.testing.assert_array_equal(t.grad(x).numpy()[3], np.ones(N, np.float32))


@pytest.mark.parametrize("k", [1, 3, 4])
def test_checkpointed_tape_differentiates_a_ring_of_two_arrays(session, step, k):
    """A ring (step f reads ring[f % 2], writes ring[(f + 1) % 2]): refused by the default tape,
    differentiated by a checkpointed one to the closed form, twice, with the forward's end
    state left in the arrays."""
    ring = [session.ndarray(X0, name="ring0"), session.zeros(N, name="ring1")]
    plain = session.tape()
    with pytest.raises(vkad.InvalidArgumentError, match="overwrites|writes"):
        with plain:
            for f in range(STEPS):
                session.launch(step, ring[f % 2], ring[(f + 1) % 2])
    t = session.tape()
    for bad in ("3", 2.5, True, None):  # were accepted as 3 and 2 (and True as 1)
        with pytest.raises(vkad.InvalidArgumentError, match="is not an integer"):
            t.checkpoint_every = bad
    assert t.checkpoint_every == 0
    t.checkpoint_every = np.int64(k)  # any integer type
    assert t.checkpoint_every == k and type(t.checkpoint_every) is int
    want = chain(X0, 0, STEPS)
    x = X0.astype(np.float64)
    for _ in range(STEPS):
        x = np.sin(x) * 0.9 + 0.1
    for _ in range(2):
        ring[0].upload(X0)
        with t:
            for f in range(STEPS):
                session.launch(step, ring[f % 2], ring[(f + 1) % 2])
        with pytest.raises(vkad.FailedPreconditionError, match="launches are recorded"):
            t.checkpoint_every = 2
        t.backward(seed={ring[STEPS % 2]: 1.0})
        # Sin within 2^-11 absolute per step (Vulkan), 10 steps: 5e-3 relative is generous.
        np.testing.assert_allclose(t.grad(ring[0]).numpy(), want, rtol=5e-3, atol=1e-6)
        np.testing.assert_allclose(ring[STEPS % 2].numpy(), x, rtol=1e-5, atol=1e-6)


def test_intermediate_gradients_of_a_checkpointed_tape_are_a_documented_property(session):
    """Issue 50, point 5: on a time axis the plain tape leaves dL/dx[f] on every row the
    recording wrote; a checkpointed one consumes each store's seed, so those rows hold 0 (the
    gradient w.r.t. the array as the recording found it). Row 0, the input, agrees. Which one a
    tape gives is Tape.keeps_intermediate_gradients."""
    s = session
    ts = s.differentiate(TIME_STEP)  # x[f + 1] = 0.9 sin(x[f]) + 0.1
    host = np.zeros((STEPS + 1, N), np.float32)
    host[0] = X0
    seed = np.zeros_like(host)
    seed[STEPS] = 1
    grads = {}
    for k in (0, 2):
        x = s.ndarray(host)
        t = s.tape()
        t.checkpoint_every = k
        assert t.keeps_intermediate_gradients == (k == 0)
        with t:
            for f in range(STEPS):
                s.launch(ts, x, f)
        t.backward(seed={x: seed})
        grads[k] = t.grad(x).numpy()
    np.testing.assert_allclose(grads[0][0], chain(X0, 0, STEPS), rtol=5e-3, atol=1e-6)
    np.testing.assert_allclose(grads[2][0], grads[0][0], rtol=1e-6, atol=1e-7)
    for f in range(1, STEPS + 1):
        np.testing.assert_allclose(grads[0][f], chain(X0, f, STEPS), rtol=5e-3, atol=1e-6)
        np.testing.assert_array_equal(grads[2][f], np.zeros(N, np.float32))


SCALED_STEP = """
kernel step(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad, c: f32) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = sin %1 : f32
    %3 = arg c : f32
    %4 = mul %2, %3 : f32
    %5 = const 0.1 : f32
    %6 = add %4, %5 : f32
    store y[%0], %6
  }
}"""


def test_a_checkpointed_iteration_is_captured_and_replayed_with_updates(session):
    """Issue 57, point 1: a checkpointing tape's iteration (its copies are launches of copy
    kernels inside a capture) is captured and replayed: the closed-form gradient on two inputs,
    and after an update of every launch's c (forward launches, their launches again and the
    adjoints, found by Graph.launch_names: the copies are None there) the gradient for the new
    c -- which would not hold if the Graph's launch indices and the runtime's disagreed."""
    s = session
    step = s.differentiate(SCALED_STEP)
    ring = [s.ndarray(X0, name="ring0"), s.zeros(N, name="ring1")]
    t = s.tape()
    t.checkpoint_every = 3
    with s.capture("checkpointed") as g:
        with t:
            for f in range(STEPS):
                s.launch(step, ring[f % 2], ring[(f + 1) % 2], 0.9)
        t.backward(seed={ring[STEPS % 2]: 1.0})
    names = g.launch_names
    assert None in names and "step" in names and "step_adjoint" in names
    # Session.copy inside a capture is a launch too (None there), the names after it in step.
    other = s.zeros(N)
    with s.capture("copy") as g2:
        s.copy(ring[0], other)
        s.launch(step, other, ring[1], 0.5)
    assert g2.launch_names == [None, "step"]
    ring[0].upload(X0)
    s.replay(g2, updates=[("step", 2, 0.25)])
    np.testing.assert_allclose(ring[1].numpy(), np.sin(X0) * 0.25 + 0.1, rtol=1e-3, atol=1e-3)
    assert len(names) > 3 * STEPS  # launches, the segments' launches again, adjoints, copies

    def closed_form(x0, c):
        x, d = x0.astype(np.float64), np.ones(len(x0))
        for _ in range(STEPS):
            d = d * c * np.cos(x)
            x = np.sin(x) * c + 0.1
        return d, x

    for scale in (1.0, 0.5):
        ring[0].upload((X0 * scale).astype(np.float32))
        s.replay(g)
        want, end = closed_form(X0 * scale, 0.9)
        np.testing.assert_allclose(t.grad(ring[0]).numpy(), want, rtol=5e-3, atol=1e-6)
        np.testing.assert_allclose(ring[STEPS % 2].numpy(), end, rtol=1e-5, atol=1e-6)
    with pytest.raises(vkad.InvalidArgumentError, match="checkpointing tape's copy"):
        s.replay(g, updates=[(names.index(None), 0, 1.0)])
    updates = [(i, 2, 0.7) for i, n in enumerate(names) if n is not None]
    ring[0].upload(X0)
    s.replay(g, updates=updates)
    want, end = closed_form(X0, 0.7)
    np.testing.assert_allclose(t.grad(ring[0]).numpy(), want, rtol=5e-3, atol=1e-6)
    np.testing.assert_allclose(ring[STEPS % 2].numpy(), end, rtol=1e-5, atol=1e-6)


def test_a_memory_budget_picks_the_schedule_and_gets_the_gradients(session):
    """Issue 57, point 2: t.memory_budget instead of K. A ring of 256 steps under budgets from
    roomy to the least (as a refusal names it) gets the closed-form gradient (captured as a
    graph too); checkpoint_plan() says the schedule before backward, holding fewer bytes or
    taking more levels as the budget shrinks; the copies stay within the budget; one below the
    least is refused, naming it."""
    s = session
    step = s.differentiate(SCALED_STEP)
    steps = 256  # long enough that three levels hold less than two
    ring = [s.ndarray(X0, name="ring0"), s.zeros(N, name="ring1")]
    x, want = X0.astype(np.float64), np.ones(N)
    for _ in range(steps):
        want = want * 0.9 * np.cos(x)
        x = np.sin(x) * 0.9 + 0.1
    state = 2 * N * 4  # both ring arrays

    def record(t):
        ring[0].upload(X0)
        with t:
            for f in range(steps):
                s.launch(step, ring[f % 2], ring[(f + 1) % 2], 0.9)

    # The least this recording needs, as a refusal names it.
    t = s.tape()
    t.memory_budget = 4 * state
    with pytest.raises(vkad.InvalidArgumentError, match=r"at least \d+ bytes") as refused:
        record(t)
        t.checkpoint_plan()
    least = int(re.search(r"at least (\d+) bytes", str(refused.value)).group(1))
    levels = []
    for budget in (1 << 20, 2 * least, least + least // 4, least):
        t = s.tape()
        t.memory_budget = budget
        assert t.memory_budget == budget and not t.keeps_intermediate_gradients
        with pytest.raises(vkad.FailedPreconditionError, match="nothing is recorded"):
            t.checkpoint_plan()
        for _ in range(2):
            ring[0].upload(X0)
            with t:
                s.loop(0, steps, lambda f: s.launch(step, ring[f % 2], ring[(f + 1) % 2], 0.9))
            plan = t.checkpoint_plan()
            assert plan["launches"] == steps and plan["segments"][-1] == 1
            assert plan["recompute"] == plan["levels"] == len(plan["segments"])
            assert plan["peak_bytes"] <= budget, plan["text"]
            t.backward(seed={ring[steps % 2]: 1.0})
            np.testing.assert_allclose(t.grad(ring[0]).numpy(), want, rtol=5e-3, atol=1e-6,
                                       err_msg=plan["text"])
            np.testing.assert_allclose(ring[steps % 2].numpy(), x, rtol=1e-5, atol=1e-6)
            assert t.checkpoint_bytes <= budget
        levels.append((plan["levels"], -plan["peak_bytes"]))
    # Fewer bytes, never fewer levels: the plans are ordered as their budgets.
    assert levels == sorted(levels) and levels[-1] != levels[0], levels
    # Captured with a budget: the replay gives the same gradient.
    t = s.tape()
    t.memory_budget = least
    with s.capture("budget") as g:
        with t:
            for f in range(steps):
                s.launch(step, ring[f % 2], ring[(f + 1) % 2], 0.9)
        t.backward(seed={ring[steps % 2]: 1.0})
    ring[0].upload(X0)
    s.replay(g)
    np.testing.assert_allclose(t.grad(ring[0]).numpy(), want, rtol=5e-3, atol=1e-6)
    # Too small: refused with the least named (by the launch or by backward).
    t = s.tape()
    t.memory_budget = 2 * state
    with pytest.raises(vkad.InvalidArgumentError, match=r"memory budget .* at least \d+ bytes"):
        ring[0].upload(X0)
        with t:
            for f in range(steps):
                s.launch(step, ring[f % 2], ring[(f + 1) % 2], 0.9)
        t.backward(seed={ring[steps % 2]: 1.0})
    for bad in (-1, 2.5, "1"):
        with pytest.raises(vkad.InvalidArgumentError, match="memory_budget"):
            t.memory_budget = bad


GRID_P2G = """
kernel p2g(x: ndarray<f32, 1> grad, cell: ndarray<i32, 1>, g: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %j = load cell[%i] : i32
    atomic_add g[%j], %v
  }
}"""
GRID_G2P = """
kernel g2p(x: ndarray<f32, 1> grad, g: ndarray<f32, 1> grad, cell: ndarray<i32, 1>,
           y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %j = load cell[%i] : i32
    %m = load g[%j] : f32
    %s = sin %m : f32
    %h = const 0.5 : f32
    %a = mul %s, %h : f32
    %v = load x[%i] : f32
    %k = const 0.9 : f32
    %b = mul %v, %k : f32
    %y = add %a, %b : f32
    store y[%i], %y
  }
}"""


def test_a_grid_cleared_every_step_is_recorded_by_a_checkpointing_tape(session):
    """Issue 57, point 3: DiffTaichi's one grid, zeroed and refilled every step (s.zero inside
    `with t:` is vkad::Tape::fill). A memory-budget tape records the zero and runs it again,
    giving the gradient of a fresh grid per step (numpy, float64); the default tape refuses the
    zero of a grid the recording wrote, pointing to memory_budget."""
    s = session
    p2g, g2p = s.differentiate(GRID_P2G), s.differentiate(GRID_G2P)
    cells, steps = 7, 8
    cell_host = (np.arange(N) * 5 % cells).astype(np.int32)
    cell = s.ndarray(cell_host)
    ring = [s.ndarray(X0), s.zeros(N)]
    grid = s.zeros(cells)

    def forward(x0):
        x = x0.astype(np.float64)
        for _ in range(steps):
            g = np.bincount(cell_host, weights=x, minlength=cells)
            x = 0.5 * np.sin(g[cell_host]) + 0.9 * x
        return x

    def loss_of(x0):
        return float(np.sum(forward(x0)))

    eps = 1e-4
    want = np.array([(loss_of(X0 + eps * np.eye(N)[i]) - loss_of(X0 - eps * np.eye(N)[i]))
                     / (2 * eps) for i in range(N)])
    plain = s.tape()
    with pytest.raises(vkad.InvalidArgumentError, match="memory_budget"):
        with plain:
            s.zero(grid)  # untouched yet: runs
            s.launch(p2g, ring[0], cell, grid)
            s.zero(grid)
    t = s.tape()
    t.memory_budget = 1 << 16
    for _ in range(2):
        ring[0].upload(X0)
        with t:
            for f in range(steps):
                s.zero(grid)
                s.launch(p2g, ring[f % 2], cell, grid)
                s.launch(g2p, ring[f % 2], grid, cell, ring[(f + 1) % 2])
        fills = [r for r in t.launches if r[0] is None]
        assert len(fills) == steps - 1  # the first found the grid untouched
        t.backward(seed={ring[steps % 2]: 1.0})
        # Vulkan's sin / cos are within 2^-11 absolute: 8 steps of 0.5 sin(...) stay in 2e-3.
        np.testing.assert_allclose(ring[steps % 2].numpy(), forward(X0), atol=2e-3)
        np.testing.assert_allclose(t.grad(ring[0]).numpy(), want, rtol=5e-3, atol=2e-3)
    # Captured, the fills with it (a fill's adjoint is a fill, not a launch: the Graph's launch
    # names stay those of the runtime's launches).
    with s.capture("grid") as g:
        with t:
            for f in range(steps):
                s.zero(grid)
                s.launch(p2g, ring[f % 2], cell, grid)
                s.launch(g2p, ring[f % 2], grid, cell, ring[(f + 1) % 2])
        t.backward(seed={ring[steps % 2]: 1.0})
    assert sum(1 for n in g.launch_names if n and n.startswith("g2p_adjoint")) == steps
    for scale in (1.0, 0.5):
        ring[0].upload((X0 * scale).astype(np.float32))
        s.replay(g)
        np.testing.assert_allclose(ring[steps % 2].numpy(), forward(X0 * scale), atol=2e-3)
    want_half = np.array([(loss_of(0.5 * X0 + eps * np.eye(N)[i])
                           - loss_of(0.5 * X0 - eps * np.eye(N)[i])) / (2 * eps)
                          for i in range(N)])
    np.testing.assert_allclose(t.grad(ring[0]).numpy(), want_half, rtol=5e-3, atol=2e-3)
