"""What the wheel ships beside the code: type stubs and the py.typed marker."""
import pathlib

import vkad


def test_stubs_and_marker_are_installed():
    pkg = pathlib.Path(vkad.__file__).parent
    stub = (pkg / "_vkad.pyi").read_text()
    assert (pkg / "py.typed").exists()
    for name in ["class Session", "def launch(self, kernel: Kernel | Differentiated",
                 "def numpy(self) -> numpy.typing.NDArray", "class NdArray", "class DType"]:
        assert name in stub, name


def test_every_error_code_has_a_class():
    # The extension maps each vkad::ErrorCode name to the class whose `code` it is.
    from vkad.errors import ERRORS
    assert len({e.code for e in ERRORS}) == len(ERRORS) == 12
    assert all(issubclass(e, vkad.Error) for e in ERRORS)


def test_version_is_the_one_in_VERSION():
    # The file VERSION is the one place the version is written (docs/cpp.md, "Embedding").
    import importlib.metadata
    assert vkad.__version__ == vkad._vkad.__version__
    assert vkad.__version__.count(".") == 2
    try:
        assert importlib.metadata.version("vkad") == vkad.__version__
    except importlib.metadata.PackageNotFoundError:
        pass  # imported from a build tree, not an installed wheel
