"""Kernels from IR text and from the Python builder; launches and their argument checks."""
import numpy as np
import pytest

import vkad

SAXPY = """
kernel saxpy(a: f32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = arg a : f32
    %2 = load x[%0] : f32
    %3 = load y[%0] : f32
    %4 = mul %1, %2 : f32
    %5 = add %4, %3 : f32
    store y[%0], %5
  }
}
"""


def test_ir_text_kernel(session):
    k = session.compile(SAXPY)
    assert k.name == "saxpy" and k.param_names == ["a", "x", "y"]
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    y = np.arange(50, dtype=np.float32)
    dx, dy = session.ndarray(x), session.ndarray(y)
    session.launch(k, 2.5, dx, dy)
    # Vulkan lets a driver contract a * x + y into an fma (NVIDIA does): the device result is
    # round(a*x + y) or round(round(a*x) + y). Each is within half an ulp of the exact value
    # plus, unfused, half an ulp of the product, so they differ from the unfused f32 reference
    # by at most ulp(result) + ulp(a*x) / 2 (spacing at the reference's magnitude, doubled to
    # cover a result in the next binade).
    ax = np.float32(2.5) * x
    ref = ax + y
    tol = 2 * np.spacing(np.abs(ref)) + 0.5 * np.spacing(np.abs(ax))
    got = dy.numpy()
    assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref) - tol)


def test_builder_matches_numpy(session):
    kb = vkad.KernelBuilder("mix")
    a = kb.scalar("a", vkad.f32)
    n = kb.scalar("n", vkad.i32)
    x = kb.ndarray("x", vkad.f32, 1, readonly=True)
    y = kb.ndarray("y", vkad.f32, 1)
    q = kb.ndarray("q", vkad.i32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        v = x[i]
        acc = kb.local(vkad.f32)
        with kb.for_range(0, n) as t:
            acc += vkad.sin(v * vkad.cast(t, vkad.f32)) + 0.5
        big = v > 0.0
        with kb.if_(big):
            y[i] = acc.value + vkad.sqrt(vkad.abs(v)) * a
        with kb.else_():
            m = vkad.max(v, -0.25)
            y[i] = vkad.select(v < -0.5, -acc.value, m * m)
        # i32 floordiv / mod round toward -inf, as Python's // and %
        k = i - 7
        q[i] = (k // 3) * 100 + k % 3
    text = kb.finish()
    assert "for %" in text and "} else {" in text
    kern = session.compile(kb)
    xs = np.linspace(-1, 1, 33, dtype=np.float32)
    dx, dy, dq = session.ndarray(xs), session.empty(33, vkad.f32), session.empty(33, vkad.i32)
    session.launch(kern, 1.5, 4, dx, dy, dq)
    acc = sum(np.sin(xs.astype(np.float64) * t) + 0.5 for t in range(4))
    ref = np.where(xs > 0, acc + np.sqrt(np.abs(xs)) * 1.5,
                   np.where(xs < -0.5, -acc, np.maximum(xs, -0.25) ** 2))
    # (pow of a negative base is undefined on devices, as in GLSL: m * m, not m ** 2)
    np.testing.assert_allclose(dy.numpy(), ref, rtol=1e-5, atol=1e-5)
    ks = np.arange(33) - 7
    np.testing.assert_array_equal(dq.numpy(), (ks // 3) * 100 + ks % 3)


def test_scalar_conversion_to_param_dtype(session):
    kb = vkad.KernelBuilder("scalars")
    a, b, c, d = (kb.scalar(n, t) for n, t in
                  [("a", vkad.f64), ("b", vkad.u32), ("c", vkad.i32), ("d", vkad.bool_)])
    out = kb.ndarray("out", vkad.f64, 1)
    with kb.serial_for("one", 0, 1) as i:
        out[i] = a.value + vkad.cast(b, vkad.f64) + vkad.cast(c, vkad.f64) + \
            vkad.select(d, kb.f64(1000), kb.f64(0))
    k = session.compile(kb)
    o = session.empty(1, vkad.f64)
    session.launch(k, 0.25, np.uint32(4000000000), -(2 ** 31), True, o)
    assert o.numpy()[0] == 0.25 + 4000000000 - 2 ** 31 + 1000  # all exact in f64
    session.launch(k, 1, 7, np.int64(3), 0, o)  # ints for a float, 0 for a bool
    assert o.numpy()[0] == 11


def test_wrong_argument_count(session):
    k = session.compile(SAXPY)
    x = session.empty(4, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError,
                       match=r"launch 'saxpy': 2 arguments given, the kernel takes 3: "
                             r"saxpy\(a: f32, x: ndarray<f32, 1>, y: ndarray<f32, 1>\)"):
        session.launch(k, 1.0, x)


def test_wrong_argument_types(session):
    k = session.compile(SAXPY)
    x, y = session.empty(4, vkad.f32), session.empty(4, vkad.f32)
    bad = vkad.InvalidArgumentError
    with pytest.raises(bad, match=r"argument 0 \('a': f32\): expected a number"):
        session.launch(k, "two", x, y)
    with pytest.raises(bad, match=r"argument 1 \('x'.*expected a vkad ndarray, got float"):
        session.launch(k, 1.0, 3.0, y)
    with pytest.raises(bad, match=r"argument 2 \('y'.*got ndarray"):
        session.launch(k, 1.0, x, np.zeros(4, np.float32))


def test_integer_range_checked(session):
    kb = vkad.KernelBuilder("ints")
    n = kb.scalar("n", vkad.i32)
    u = kb.scalar("u", vkad.u32)
    out = kb.ndarray("out", vkad.i32, 1)
    with kb.serial_for("one", 0, 1) as i:
        out[i] = n.value + vkad.cast(u, vkad.i32)
    k = session.compile(kb)
    o = session.empty(1, vkad.i32)
    with pytest.raises(vkad.InvalidArgumentError, match=r"'n': i32\): 2147483648 is out of range"):
        session.launch(k, 2 ** 31, 0, o)
    with pytest.raises(vkad.InvalidArgumentError, match=r"'u': u32\): -1 is out of range"):
        session.launch(k, 0, -1, o)
    with pytest.raises(vkad.InvalidArgumentError, match=r"'n': i32\): expected an integer, got"):
        session.launch(k, 1.5, 0, o)
    session.launch(k, np.int64(-5), np.uint8(7), o)
    assert o.numpy()[0] == 2


def test_float_scalar_range_checked_before_narrowing(session):
    # 1e300 does not fit f32: refused by the runtime as in C++ and C (it was narrowed to +inf
    # here first and ran).
    k = session.compile(SAXPY)
    x = session.ndarray(np.ones(4, np.float32))
    y = session.ndarray(np.zeros(4, np.float32))
    with pytest.raises(vkad.InvalidArgumentError,
                       match=r"argument 0 \('a'\): value 1e\+300 does not fit f32"):
        session.launch(k, 1e300, x, y)
    np.testing.assert_array_equal(y.numpy(), np.zeros(4, np.float32))  # nothing ran
    session.launch(k, float("inf"), x, y)  # inf is an f32 value
    assert np.all(np.isposinf(y.numpy()))
    y.upload(np.zeros(4, np.float32))
    session.launch(k, -3.4e38, x, y)  # within FLT_MAX: accepted, rounded to f32
    np.testing.assert_array_equal(y.numpy(), np.full(4, np.float32(-3.4e38)))


def test_array_dtype_and_rank_mismatch_in_launch(session):
    k = session.compile(SAXPY)
    good = session.empty(4, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError, match="'x'"):
        session.launch(k, 1.0, session.empty(4, vkad.i32), good)
    with pytest.raises(vkad.InvalidArgumentError, match="'y'"):
        session.launch(k, 1.0, good, session.empty((2, 2), vkad.f32))


def test_launch_with_freed_array(session):
    k = session.compile(SAXPY)
    x, y = session.empty(4, vkad.f32), session.empty(4, vkad.f32, name="freed_y")
    session.free(y)
    with pytest.raises(vkad.NotFoundError):
        session.launch(k, 1.0, x, y)


def test_parse_error_names_line_and_column(session):
    with pytest.raises(vkad.InvalidArgumentError, match=r"line 3, column \d+"):
        session.compile("kernel k(x: ndarray<f32, 1>) {\n  task t parallel %0 in [0, 4) {\n"
                        "    %1 = frobnicate %0 : f32\n  }\n}\n")


def test_verifier_error_names_statement(session):
    kb = vkad.KernelBuilder("bad")
    x = kb.ndarray("x", vkad.f32, 1, readonly=True)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        x[i] = x[i] + 1.0  # a store into a readonly array
    with pytest.raises(vkad.InvalidArgumentError, match="store x"):
        session.compile(kb)


def test_no_grad_param(session):
    with pytest.raises(vkad.InvalidArgumentError, match="no parameter is marked grad"):
        session.differentiate(SAXPY)


def test_kernel_of_another_session(session):
    other = vkad.Session()
    k = other.compile(SAXPY)
    x = session.empty(4, vkad.f32)
    with pytest.raises(vkad.InvalidArgumentError, match="another session"):
        session.launch(k, 1.0, x, x)
    del k
    other.close()


def test_released_kernel(session):
    k = session.compile(SAXPY)
    session.release(k)
    x = session.empty(4, vkad.f32)
    with pytest.raises(vkad.NotFoundError):
        session.launch(k, 1.0, x, x)


def test_builder_type_errors():
    kb = vkad.KernelBuilder("types")
    x = kb.ndarray("x", vkad.f32, 1)
    n = kb.ndarray("n", vkad.i32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        with pytest.raises(TypeError, match="add: types f32 and i32 differ"):
            x[i] + n[i]
        with pytest.raises(TypeError, match="no truth value"):
            if x[i] > 0.0:
                pass
        with pytest.raises(TypeError, match="store into 'x': types f32 and i32"):
            x[i] = n[i]
        with pytest.raises(IndexError, match="rank 1, indexed with 2"):
            x[i, i]
    with pytest.raises(RuntimeError, match="inside"):
        x[kb.i32(0)]


def test_many_asynchronous_launches(session):
    # Each launch reads what the previous one wrote: order is kept without any wait.
    kb = vkad.KernelBuilder("inc")
    x = kb.ndarray("x", vkad.i32, 1)
    with kb.parallel_for("main", 0, x.shape[0]) as i:
        x[i] = x[i] * 2 + 1
    k = session.compile(kb)
    a = session.zeros(256, vkad.i32)
    launches = session.stats()["launches"]
    for _ in range(20):
        session.launch(k, a)
    session.flush()
    for _ in range(10):
        session.launch(k, a)
    a.upload(np.full(256, 3, np.int32))  # recorded between launches, kept in order
    session.launch(k, a)
    assert session.stats()["launches"] == launches + 31
    np.testing.assert_array_equal(a.numpy(), np.full(256, 7))
    session.synchronize()


def test_device_error_raised_at_synchronize(session):
    kb = vkad.KernelBuilder("oob")
    x = kb.ndarray("x", vkad.f32, 1)
    with kb.parallel_for("shift", 0, x.shape[0]) as i:
        x[i + 1] = 1.0  # the last iteration writes past the end
    k = session.compile(kb)
    a = session.zeros(8, vkad.f32)
    session.launch(k, a)  # asynchronous: nothing raised yet
    with pytest.raises(vkad.DeviceError, match=r"kernel 'oob', task 'shift'.*out-of-bounds") as e:
        session.synchronize()
    assert isinstance(e.value, vkad.Error) and e.value.code == "device-side error"
    session.synchronize()  # reported once; the session stays usable
    np.testing.assert_array_equal(session.ndarray(np.ones(2, np.float32)).numpy(), [1, 1])


def test_error_classes_carry_codes(session):
    with pytest.raises(vkad.Error) as e:
        session.compile("kernel")
    assert type(e.value) is vkad.InvalidArgumentError and e.value.code == "invalid argument"
    assert isinstance(e.value, ValueError) and "line 1" in str(e.value)


def test_prepare_makes_pipelines_and_launches_nothing(session):
    k = session.compile(SAXPY)
    x, y = session.empty(4, vkad.f32), session.empty(4, vkad.f32)
    before = session.stats()["launches"]
    session.prepare(k, 1.0, x, y)
    assert session.stats()["launches"] == before
    with pytest.raises(vkad.InvalidArgumentError, match="prepare"):
        session.prepare(k, 1.0, x)
    session.free(y)
    with pytest.raises(vkad.NotFoundError):
        session.prepare(k, 1.0, x, y)
