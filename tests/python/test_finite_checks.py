"""Device errors that name the statement and its Python line (issues 55 and 56; docs/debugging.md):
with vkad.Session(check_finite=True) the first NaN or infinity a @vkad.kernel stores -- in its
forward, or in its adjoint's gradients -- raises vkad.DeviceError naming the kernel and the
statement; the values are stored as without the checks; without the option nothing is raised.
An out-of-bounds access (bounds checks are always on) names its statement and line too, and so
does an adstack overflow (the loop's line): the IR carries each statement's Python location
into the adjoint vkad derives."""
import numpy as np
import pytest

import vkad


@vkad.kernel
def log_of(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        y[i] = vkad.log(x[i])


@vkad.kernel
def root(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        y[i] = vkad.sqrt(x[i])


@vkad.kernel
def shift(x: vkad.array(vkad.f32), y: vkad.array(vkad.f32)):
    for i in range(x.shape[0]):
        y[i + 1] = x[i]


@vkad.kernel
def gather_next(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(y.shape[0]):
        y[i] = x[i + 1] * 2.0


@vkad.kernel
def halve(x: vkad.array(vkad.f32, grad=True), y: vkad.array(vkad.f32, grad=True)):
    for i in range(x.shape[0]):
        v = x[i]
        while vkad.max_trip(v > 1.0, 2):
            v = vkad.sqrt(v) * 0.5
        y[i] = v


def line_of(text):
    with open(__file__) as f:
        return next(n for n, t in enumerate(f, 1) if text in t)


def inputs(n=64, zero_at=5):
    x = np.linspace(0.5, 2.0, n, dtype=np.float32)
    x[zero_at] = 0
    return x


@pytest.fixture(scope="module")
def checked():
    s = vkad.Session(validation=True, check_finite=True)
    yield s
    assert s.validation_messages() == []
    s.close()


def test_a_log_of_zero_raises_naming_the_kernel_and_statement(checked):
    s = checked
    x, y = s.ndarray(inputs()), s.zeros(64, vkad.f32)
    log_of(x, y, session=s)
    with pytest.raises(vkad.DeviceError, match=r"kernel 'log_of'.*NaN or an infinity was stored "
                                               r"by `store y\[") as e:
        s.synchronize()
    # The statement's Python line (the store in log_of above).
    assert f'File "{__file__}", line {line_of("y[i] = vkad.log(x[i])")}' in str(e.value)
    assert y.numpy()[5] == -np.inf  # stored all the same; the session goes on
    log_of(s.ndarray(np.ones(64, np.float32)), y, session=s)
    s.synchronize()


def test_an_infinite_gradient_names_the_adjoint(checked):
    s = checked
    x, y = s.ndarray(inputs()), s.zeros(64, vkad.f32)
    t = s.tape()
    with t:
        root(x, y, session=s)
    s.synchronize()  # sqrt(0) = 0: the forward is finite
    t.backward(seed={y: 1.0})
    with pytest.raises(vkad.DeviceError, match=r"kernel 'root_adjoint'.*NaN or an infinity") as e:
        s.synchronize()
    # The adjoint's statement carries the forward's location: the user's line, not vkad's IR.
    assert f'File "{__file__}", line {line_of("y[i] = vkad.sqrt(x[i])")}' in str(e.value)
    g = t.grad(x).numpy()
    assert np.isinf(g[5]) and np.isclose(g[0], 0.5 / np.sqrt(0.5), rtol=1e-5)


def test_without_the_option_nothing_is_checked(session):
    x, y = session.ndarray(inputs()), session.zeros(64, vkad.f32)
    log_of(x, y, session=session)
    session.synchronize()
    assert y.numpy()[5] == -np.inf


def test_an_out_of_bounds_store_names_its_statement_and_line(session):
    x, y = session.ndarray(np.ones(16, np.float32)), session.zeros(16, vkad.f32)
    shift(x, y, session=session)
    with pytest.raises(vkad.DeviceError, match=r"kernel 'shift'.*out-of-bounds ndarray access "
                                               r"by `store y\[") as e:
        session.synchronize()
    assert f'File "{__file__}", line {line_of("y[i + 1] = x[i]")}' in str(e.value)
    np.testing.assert_array_equal(y.numpy()[1:], np.ones(15, np.float32))


def test_an_out_of_bounds_add_in_an_adjoint_names_the_forward_line(session):
    # y's extent 16 against x's 16: the forward reads x[16] (skipped, reads 0) and its adjoint
    # adds into x_grad[16]; both errors name gather_next's line.
    x, y = session.ndarray(np.ones(16, np.float32)), session.zeros(16, vkad.f32)
    want = f'File "{__file__}", line {line_of("y[i] = x[i + 1] * 2.0")}'
    with pytest.raises(vkad.DeviceError, match=r"kernel 'gather_next'.*out-of-bounds") as e:
        gather_next(x, y, session=session)
        session.synchronize()
    assert want in str(e.value)
    t = session.tape()
    with pytest.raises(vkad.DeviceError, match=r"kernel 'gather_next'.*out-of-bounds") as e:
        with t:
            gather_next(x, y, session=session)
        session.synchronize()
    assert "(tape entry 0)" in str(e.value)  # issue 56, point 5: the launch is the tape's
    t.backward(seed={y: 1.0})
    with pytest.raises(vkad.DeviceError,
                       match=r"kernel 'gather_next_adjoint'.*out-of-bounds.*x_grad") as e:
        session.synchronize()
    assert want in str(e.value) and "(the adjoint of tape entry 0)" in str(e.value)
    g = t.grad(x).numpy()
    np.testing.assert_array_equal(g[1:], np.full(15, 2.0, np.float32))  # the rest is right


def test_an_adstack_overflow_names_the_loop_line(session):
    # 1e6 takes 4 trips (500, 11.2, 1.67, 0.65), more than the 2 max_trip states: the adjoint's
    # checkpoint stack of that loop (sqrt's derivative needs each trip's v) overflows, and the
    # error names the `while` line.
    x = session.ndarray(np.array([0.5, 3.0, 1e6, 2.0], np.float32))
    y = session.zeros(4, vkad.f32)
    t = session.tape()
    with t:
        halve(x, y, session=session)
    t.backward(seed={y: 1.0})
    with pytest.raises(vkad.DeviceError, match=r"kernel 'halve_adjoint'.*adstack.*max_trip") as e:
        session.synchronize()
    assert f'File "{__file__}", line {line_of("while vkad.max_trip(v > 1.0, 2):")}' in str(e.value)
