"""DiffTaichi's liquid.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's liquid.py is its diffmpm3d.py with a block of fluid particles (ptype 0: pressure
(J - 1) E I, mass 4, F reset to diag(sqrt J, sqrt J, 1)) above the robot and learning rate 10:
this is taichi_diffmpm3d.py (whose kernels carry the fluid branches) with liquid.py's scene (the
robot and the fluid block, placed from `seed`) and rate, in DiffTaichi's idiom as there --
particle state with a time axis, one grid cleared and reused by every step, recomputed in the
backward by a @ti.ad.grad_replaced step ("we do not store the grid history (to save space)").
DiffTaichi's grid_op keeps a floor friction branch (coeff 1.5) that sees the velocity the floor
has just zeroed and changes nothing: taichi_diffmpm3d.py leaves it out, with the same results.
Physics, constants, initialisation, loss and update are examples/difftaichi/liquid.py's (itself
DiffTaichi's). The caller runs ti.init (arch, default_fp = `real`) before constructing.
"""
import taichi as ti

from . import load_example
from .taichi_diffmpm3d import TaichiDiffMPM3D

liq = load_example("liquid")


@ti.data_oriented
class TaichiLiquid(TaichiDiffMPM3D):
    LEARNING_RATE = liq.LEARNING_RATE
    SCENE = staticmethod(liq.liquid)
