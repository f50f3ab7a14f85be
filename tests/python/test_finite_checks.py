"""The NaN / infinity checks from Python (issue 56, point 2; docs/debugging.md): with
vkad.Session(check_finite=True) the first NaN or infinity a @vkad.kernel stores -- in its
forward, or in its adjoint's gradients -- raises vkad.DeviceError naming the kernel and the
statement; the values are stored as without the checks; without the option nothing is raised."""
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
    with open(__file__) as f:
        line = next(n for n, t in enumerate(f, 1) if "y[i] = vkad.log(x[i])" in t)
    assert f'File "{__file__}", line {line}' in str(e.value), str(e.value)
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
