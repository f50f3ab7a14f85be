"""Taichi and Warp versions of DiffTaichi's programs, for bench/difftaichi.py: mass_spring,
diffmpm, diffmpm3d, wave, smoke, billiards, electric, rigid_body, volume_renderer, liquid,
rigid_body_toi, mass_spring_simple, diffmpm_simple, gradient_explosion, diffmpm_checkpointing,
rigid_body_discontinuity, mass_spring_velocity and water_renderer.

Each module holds one program in one framework, written the way that framework's users write
it, with the interface of the vkad examples in examples/difftaichi: construct with the size and
seed, iteration() returns the loss before the update and applies the same update, gradients()
returns d loss / d each controller array as numpy.

Checking a transcription needs no GPU: with Taichi 1.7.4 and Warp 1.19 installed (`pip install
taichi==1.7.4 warp-lang==1.19.0`), `python3 bench/difftaichi.py --program P --steps 400 --iters 3
--only vkad,taichi,warp` runs the peers on their CPU backends beside vkad on lavapipe and prints
each one's losses and its iteration-0 gradient's difference from vkad's. electric, rigid_body
and volume_renderer were written that way: losses equal (to 1e-7), gradients within 4e-7
(electric, 64 steps) and 1e-5 (rigid_body, 400 steps: past its ground contacts) of vkad's, and
volume_renderer's equal to vkad's (2 views of 15^2 pixels, a 16^3 density, 80 marching steps;
and 7 views of 64^2, 32^3, 1000 steps). rigid_body_toi's losses and gradients are equal to vkad's
(its 204 steps, the first three points of the scan); mass_spring_simple's losses are equal and
its gradients within 6e-8 of vkad's (1024 steps, 3 iterations); diffmpm_simple's losses are equal
and its gradients within 4e-5 of vkad's (100 steps on its 120^2 grid, 3 iterations);
gradient_explosion's losses and gradients are equal to vkad's (1000 steps, the four alphas)."""
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

