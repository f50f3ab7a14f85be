"""Shared fixtures: one session per test module, and no validation message allowed (run with
VKAD_VALIDATION=1, as scripts/python_tests.sh does, to turn the Khronos layer on). The on-disk
caches are off for every session a test makes without naming a directory (VKAD_CACHE=0, set
here before any session exists), so the suite never writes the user's ~/.cache/vkad."""
import os

os.environ["VKAD_CACHE"] = "0"

import pytest  # noqa: E402

import vkad  # noqa: E402


@pytest.fixture(scope="module")
def session():
    s = vkad.Session()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _no_validation_messages(request):
    if "session" not in request.fixturenames:
        yield
        return
    s = request.getfixturevalue("session")
    before = len(s.validation_messages())
    yield
    after = s.validation_messages()
    assert len(after) == before, "validation messages:\n" + "\n".join(after[before:])


def f64_ok(session) -> bool:
    """Whether the device runs f64 kernels (lavapipe does; some GPUs do not)."""
    try:
        session.compile("kernel probe(x: ndarray<f64, 1>) {\n"
                        "  task t parallel %0 in [0, shape(x, 0)) {\n"
                        "    %1 = load x[%0] : f64\n    store x[%0], %1\n  }\n}\n")
        return True
    except vkad.UnsupportedError:
        return False
