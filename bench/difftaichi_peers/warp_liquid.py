"""DiffTaichi's liquid.py in Warp 1.19, for bench/difftaichi.py.

DiffTaichi's liquid.py is its diffmpm3d.py with a block of fluid particles (ptype 0: pressure
(J - 1) E I, mass 4, F reset to diag(sqrt J, sqrt J, 1)) above the robot and learning rate 10:
this is warp_diffmpm3d.py (whose kernels carry the fluid branches) with liquid.py's scene (the
robot and the fluid block, placed from `seed`) and rate, in Warp's idiom as there -- particle
state and the grid with a time axis, a wp.Tape, on CUDA (graph=True) the iteration captured with
wp.ScopedCapture. DiffTaichi's grid_op keeps a floor friction branch (coeff 1.5) that sees the
velocity the floor has just zeroed and changes nothing: warp_diffmpm3d.py leaves it out, with the
same results. Physics, constants, initialisation, loss and update are
examples/difftaichi/liquid.py's (itself DiffTaichi's). Call wp.init() before constructing.
"""
from . import load_example
from .warp_diffmpm3d import WarpDiffMPM3D

liq = load_example("liquid")


class WarpLiquid(WarpDiffMPM3D):
    LEARNING_RATE = liq.LEARNING_RATE
    SCENE = staticmethod(liq.liquid)
