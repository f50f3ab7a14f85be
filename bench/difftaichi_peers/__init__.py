"""Taichi and Warp versions of DiffTaichi's mass_spring, diffmpm and wave, for bench/difftaichi.py.

Each module holds one program in one framework, written the way that framework's users write
it, with the interface of the vkad examples in examples/difftaichi: construct with the size and
seed, iteration() returns the loss before the update and applies the same update, gradients()
returns d loss / d each controller array as numpy."""
import importlib.util
import pathlib
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "difftaichi"


def load_example(name: str):
    """examples/difftaichi/<name>.py as a module. The ports take their constants, robots and
    scenes from it, so every implementation simulates the same bodies by construction; importing
    it imports vkad (numpy and the extension, ~0.2 s) but starts no Vulkan device."""
    key = f"difftaichi_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]

