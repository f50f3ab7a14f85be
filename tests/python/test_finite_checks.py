"""Device errors that name the statement and its Python line (issues 55 and 56; docs/debugging.md):
with vkad.Session(check_finite=True) the first NaN or infinity a @vkad.kernel stores -- in its
forward, or in its adjoint's gradients -- raises vkad.DeviceError naming the kernel and the
statement; the values are stored as without the checks; without the option nothing is raised.
An out-of-bounds access (bounds checks are always on) names its statement and line too."""
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
    with pytest.raises(vkad.DeviceError, match=r"kernel 'root_adjoint'.*NaN or an infinity"):
        s.synchronize()
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
