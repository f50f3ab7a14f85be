"""DiffTaichi's wave.py in Warp 1.19, for bench/difftaichi.py.
Checked against the vkad example on Warp's CPU device (64 steps, 64^2: gradient
within 9.3e-7) and in the H200 races (docs/benchmarks.md).

Warp's idiom: the height with a time axis in one array p[t, i, j], 2-d launches over the grid,
a wp.Tape around the forward and tape.backward(loss); on CUDA (graph=True) the zeroing of the
loss, the taped forward, the backward and the update are captured once with wp.ScopedCapture and
replayed with wp.capture_launch (the gradients are zeroed by tape.zero() before each replay, as
in warp_diffmpm.py).

Equations, constants, target, initialisation (initial = 0), loss and update (initial -=
learning_rate * grad, a kernel as DiffTaichi's apply_grad) are examples/difftaichi/wave.py's,
itself DiffTaichi's; with alpha = 0 the damping term is left out as there. Call wp.init() before
constructing.
"""
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

wv = load_example("wave")


@wp.func
def get_p(p: wp.array3d(dtype=float), t: int, i: int, j: int, n: int):
    """p[t, i, j], 0 outside the n x n grid (DiffTaichi's get_p)."""
    value = float(0.0)
    if i >= 0 and i < n and j >= 0 and j < n:
        value = p[t, i, j]
    return value


@wp.func
def neighbour_sum(p: wp.array3d(dtype=float), t: int, i: int, j: int, n: int):
    """The 5-point laplacian's terms, before the 1 / dx^2, in DiffTaichi's order."""
    return (-4.0 * get_p(p, t, i, j, n) + get_p(p, t, i, j - 1, n) + get_p(p, t, i, j + 1, n)
            + get_p(p, t, i + 1, j, n) + get_p(p, t, i - 1, j, n))


def build_kernels(n_grid: int):
    k = wv.constants(n_grid)
    inv_dx2, k_q, k_p, dx2 = k["inv_dx2"], k["k_q"], k["k_p"], k["dx"] * k["dx"]
    damped, lr = wv.ALPHA != 0.0, wv.LEARNING_RATE

    @wp.kernel
    def initialize(initial: wp.array2d(dtype=float), p: wp.array3d(dtype=float)):
        i, j = wp.tid()
        p[0, i, j] = initial[i, j]

    @wp.kernel
    def fdtd(t: int, p: wp.array3d(dtype=float)):
        i, j = wp.tid()
        n = wp.static(n_grid)
        lap_q = wp.static(inv_dx2) * neighbour_sum(p, t - 1, i, j, n)
        new_p = 2.0 * p[t - 1, i, j] + wp.static(k_q) * lap_q - p[t - 2, i, j]
        if wp.static(damped):
            new_p = new_p - wp.static(k_p) * (wp.static(inv_dx2) * neighbour_sum(p, t - 2, i, j, n))
        p[t, i, j] = new_p

    @wp.kernel
    def compute_loss(t: int, p: wp.array3d(dtype=float), target: wp.array2d(dtype=float),
                     loss: wp.array(dtype=float)):
        i, j = wp.tid()
        d = target[i, j] - p[t, i, j]
        wp.atomic_add(loss, 0, wp.static(dx2) * (d * d))

    @wp.kernel
    def apply_grad(grad: wp.array2d(dtype=float), initial: wp.array2d(dtype=float)):
        i, j = wp.tid()
        initial[i, j] = initial[i, j] - wp.static(lr) * grad[i, j]

    return initialize, fdtd, compute_loss, apply_grad


class WarpWave:
    PARAMS = ("initial",)

    def __init__(self, steps: int = wv.STEPS, n_grid: int = wv.N_GRID, seed: int = 0,
                 graph: bool = False, device=None):
        # seed: the benchmarks' common interface; DiffTaichi starts from initial = 0
        self.steps, self.n_grid = steps, n_grid
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        (self.k_initialize, self.k_fdtd, self.k_loss,
         self.k_apply_grad) = build_kernels(n_grid)
        self.p = wp.zeros((steps, n_grid, n_grid), dtype=float, device=self.device,
                          requires_grad=True)
        self.initial = wp.zeros((n_grid, n_grid), dtype=float, device=self.device,
                                requires_grad=True)
        self.target = wp.array(wv.taichi_logo(n_grid).astype(np.float32), dtype=float,
                               device=self.device)
        self.loss = wp.zeros(1, dtype=float, device=self.device, requires_grad=True)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, *args):
        wp.launch(kernel, dim=(self.n_grid, self.n_grid), inputs=list(args), device=self.device)

    def forward(self) -> None:
        """DiffTaichi's forward(): p[0] = initial (p[1] stays 0), fdtd for t = 2 .. steps - 1,
        then the loss at the last step."""
        self.loss.zero_()
        self._launch(self.k_initialize, self.initial, self.p)
        for t in range(2, self.steps):
            self._launch(self.k_fdtd, t, self.p)
        self._launch(self.k_loss, self.steps - 1, self.p, self.target, self.loss)

    def _forward_backward_update(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        self._launch(self.k_apply_grad, self.initial.grad, self.initial)  # off the tape

    def iteration(self) -> float:
        """Forward on the tape, backward and DiffTaichi's update (replayed from a CUDA graph
        with graph=True). Returns the forward's loss."""
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).assign(np.asarray(value, np.float32))
