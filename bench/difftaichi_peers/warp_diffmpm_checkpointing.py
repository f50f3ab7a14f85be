"""DiffTaichi's diffmpm_checkpointing.py in Warp 1.19, for bench/difftaichi.py.

Warp has no checkpointing: a wp.Tape keeps what its adjoints read, so this is
warp_diffmpm_simple.py's program (the particle state and the grid with a time axis, the whole
forward on one tape, the iteration captured in a CUDA graph with graph=True) with DiffTaichi's
checkpointing block (N = 80 particles per side at spacing 0.5): its full-memory tape, where
DiffTaichi's keeps one grid and recomputes it, and vkad's stays within a memory budget.

Scene, constants, loss and update are examples/difftaichi/diffmpm_checkpointing.py's. Call
wp.init() before constructing.
"""
import numpy as np
import warp as wp

from . import load_example
from .warp_diffmpm_simple import WarpDiffMPMSimple

ck = load_example("diffmpm_checkpointing")


class WarpDiffMPMCheckpointing(WarpDiffMPMSimple):
    def __init__(self, steps: int = ck.STEPS, n_grid: int = ck.N_GRID, n: int = ck.N,
                 seed: int = 0, graph: bool = False, device=None):
        super().__init__(steps=steps, n_grid=n_grid, n=n, seed=seed, graph=graph, device=device)
        x0 = np.zeros((steps, n * n, 2), np.float32)
        x0[0] = ck.simple.block(n, n_grid, ck.SPACING)  # DiffTaichi's checkpointing block
        self.x = wp.array(x0, dtype=wp.vec2, device=self.device, requires_grad=True)
