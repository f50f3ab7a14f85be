"""@vkad.kernel in a module with `from __future__ import annotations` (every annotation a string):
names from the module, the closure and the defining function's locals resolve, as the same
kernel written without the import (a local used only in an annotation is no closure cell)."""
from __future__ import annotations

import numpy as np
import pytest

import vkad


def make_kernel(n_components):
    vec = vkad.vec(n_components, vkad.f32)  # used only in the annotation below
    ft = vkad.f32

    @vkad.kernel
    def double(x: vkad.array(vec, ndim=1), a: ft):
        for i in range(x.shape[0]):
            x[i] = x[i] * a

    return double


def test_a_local_used_only_in_an_annotation_resolves(session):
    k = make_kernel(2)
    x0 = np.arange(8, dtype=np.float32).reshape(4, 2)
    x = session.ndarray(x0)  # (4, 2): four 2-vectors
    k(x, 3.0, session=session)
    np.testing.assert_array_equal(x.numpy(), 3 * x0)


def test_an_unknown_name_in_a_string_annotation_names_the_parameter():
    with pytest.raises(vkad.InvalidArgumentError, match="annotation of 'x'.*nowhere"):
        @vkad.kernel
        def k(x: vkad.array(nowhere, ndim=1)):  # noqa: F821 - the name is what is tested
            for i in range(x.shape[0]):
                x[i] = 0.0
