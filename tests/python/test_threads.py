"""Blocking waits release the GIL; a session is safe to share between Python threads."""
import sys
import threading
import time

import numpy as np

import vkad


def busy_kernel(session):
    """A kernel that keeps the device busy: `trips` iterations of dependent math per element
    (below lavapipe's loop-pass limit)."""
    kb = vkad.KernelBuilder("busy")
    trips = kb.scalar("trips", vkad.i32)
    x = kb.ndarray("x", vkad.f32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        acc = kb.local(x[i])
        with kb.for_range(0, trips):
            acc.value = vkad.sin(acc.value) * 1.0001 + 0.5
        x[i] = acc.value
    return session.compile(kb)


def long_launch(session, k):
    """An array and trip count for which one launch takes a while (so a second thread surely
    wakes during the wait): trips doubled up to 16384 (below lavapipe's loop-pass limit), then
    the array, until a synchronized launch takes 0.2 s. Calibration, not an assertion."""
    trips, n = 256, 1 << 16
    x = session.zeros(n, vkad.f32)
    while True:
        t0 = time.perf_counter()
        session.launch(k, trips, x)
        session.synchronize()
        if time.perf_counter() - t0 > 0.2 or n >= 1 << 24:
            return trips, x
        if trips < 16384:
            trips *= 2
        else:
            n *= 2
            x = session.zeros(n, vkad.f32)


def test_second_thread_runs_during_synchronize(session):
    k = busy_kernel(session)
    trips, x = long_launch(session, k)
    go, done = threading.Event(), threading.Event()
    counter = [0]

    def worker():
        go.wait()
        for _ in range(1000):
            counter[0] += 1
        done.set()

    th = threading.Thread(target=worker)
    th.start()
    # With a 100 s switch interval this thread keeps the GIL until it blocks: the worker can
    # only run if synchronize() releases it while waiting for the device.
    old = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        session.launch(k, trips, x)
        go.set()
        session.synchronize()
        finished_during_wait = done.is_set()
    finally:
        sys.setswitchinterval(old)
    th.join()
    assert finished_during_wait, "the worker thread made no progress while synchronize waited"
    assert counter[0] == 1000


def test_second_thread_runs_during_download(session):
    k = busy_kernel(session)
    trips, x = long_launch(session, k)
    go, done = threading.Event(), threading.Event()

    def worker():
        go.wait()
        done.set()

    th = threading.Thread(target=worker)
    th.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        session.launch(k, trips, x)
        go.set()
        x.numpy()
        finished_during_wait = done.is_set()
    finally:
        sys.setswitchinterval(old)
    th.join()
    assert finished_during_wait


def test_threads_sharing_a_session(session):
    # Four threads launch and read back on one session; the binding's lock serialises the
    # calls (vkad's own guard would otherwise refuse overlapping ones).
    kb = vkad.KernelBuilder("addone")
    x = kb.ndarray("x", vkad.i32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        x[i] = x[i] + 1
    k = session.compile(kb)
    arrays = [session.zeros(1024, vkad.i32) for _ in range(4)]
    errors = []

    def worker(a):
        try:
            for _ in range(50):
                session.launch(k, a)
                a.numpy()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(a,)) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a in arrays:
        np.testing.assert_array_equal(a.numpy(), np.full(1024, 50))
