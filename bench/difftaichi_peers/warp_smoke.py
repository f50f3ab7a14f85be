"""DiffTaichi's smoke_taichi.py in Warp 1.19, for bench/difftaichi.py.
Checked against the vkad example on Warp's CPU device (16 steps, 32^2: gradient
within 1.1e-7) and in the H200 races (docs/benchmarks.md).

Warp's idiom: every field with a time axis (v, v_updated as wp.vec2 arrays, div, smoke: `steps`
rows; p: rows a = k + 10 t of the Jacobi iterations), 2-d launches over the grid, a wp.Tape
around the forward and tape.backward(loss); on CUDA (graph=True) the zeroing of the loss, the
taped forward, the backward and the update are captured once with wp.ScopedCapture and replayed
with wp.capture_launch (the gradients are zeroed by tape.zero() before each replay, as in
warp_wave.py). advect is two kernels (the vec2 velocity, the scalar smoke), as Taichi
instantiates DiffTaichi's template twice. Warp's integer % truncates toward 0 (C's), so imod
adds the divisor to a negative remainder, as DiffTaichi's imod does.

Equations, constants, target (drawn: examples/difftaichi/smoke.py's taichi_image), initialisation
(v[0] = 0, smoke[0] the 16-cell checkerboard), loss and update (v[0] -= 400 v.grad[0], a kernel
as DiffTaichi's apply_grad) are examples/difftaichi/smoke.py's, itself DiffTaichi's; p has
10 * steps + 1 rows as there. Call wp.init() before constructing.
"""
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

sm = load_example("smoke")


@wp.func
def imod(i: int, n: int):
    r = i % n
    if r < 0:
        r = r + n
    return r


@wp.func
def dec_index(i: int, n: int):
    j = i - 1
    if j < 0:
        j = n - 1
    return j


@wp.func
def inc_index(i: int, n: int):
    j = i + 1
    if j >= n:
        j = 0
    return j


def build_kernels(n_grid: int, learning_rate: float):
    dx, nj, inv_n2 = 1.0 / n_grid, sm.NUM_JACOBI, 1.0 / n_grid ** 2

    @wp.kernel
    def advect_v(t: int, v: wp.array3d(dtype=wp.vec2), v_updated: wp.array3d(dtype=wp.vec2)):
        """DiffTaichi's advect(v, v_updated, -1, t)."""
        y, x = wp.tid()
        n = wp.static(n_grid)
        vel = v[t - 1, y, x]
        center_x = float(y) - vel[0]
        center_y = float(x) - vel[1]
        left = wp.floor(center_x)
        top = wp.floor(center_y)
        rw = center_x - left
        bw = center_y - top
        left_ix = imod(int(left), n)
        right_ix = inc_index(left_ix, n)
        top_ix = imod(int(top), n)
        bot_ix = inc_index(top_ix, n)
        v_updated[t, y, x] = (1.0 - rw) * ((1.0 - bw) * v[t - 1, left_ix, top_ix]
                                           + bw * v[t - 1, left_ix, bot_ix]) \
            + rw * ((1.0 - bw) * v[t - 1, right_ix, top_ix] + bw * v[t - 1, right_ix, bot_ix])

    @wp.kernel
    def advect_smoke(t: int, v: wp.array3d(dtype=wp.vec2), smoke: wp.array3d(dtype=float)):
        """DiffTaichi's advect(smoke, smoke, 0, t)."""
        y, x = wp.tid()
        n = wp.static(n_grid)
        vel = v[t, y, x]
        center_x = float(y) - vel[0]
        center_y = float(x) - vel[1]
        left = wp.floor(center_x)
        top = wp.floor(center_y)
        rw = center_x - left
        bw = center_y - top
        left_ix = imod(int(left), n)
        right_ix = inc_index(left_ix, n)
        top_ix = imod(int(top), n)
        bot_ix = inc_index(top_ix, n)
        smoke[t, y, x] = (1.0 - rw) * ((1.0 - bw) * smoke[t - 1, left_ix, top_ix]
                                       + bw * smoke[t - 1, left_ix, bot_ix]) \
            + rw * ((1.0 - bw) * smoke[t - 1, right_ix, top_ix]
                    + bw * smoke[t - 1, right_ix, bot_ix])

    @wp.kernel
    def compute_div(t: int, v_updated: wp.array3d(dtype=wp.vec2), div: wp.array3d(dtype=float)):
        y, x = wp.tid()
        n = wp.static(n_grid)
        div[t, y, x] = wp.static(-0.5 * dx) * (
            v_updated[t, inc_index(y, n), x][0] - v_updated[t, dec_index(y, n), x][0]
            + v_updated[t, y, inc_index(x, n)][1] - v_updated[t, y, dec_index(x, n)][1])

    @wp.kernel
    def compute_p(t: int, k: int, div: wp.array3d(dtype=float), p: wp.array3d(dtype=float)):
        y, x = wp.tid()
        n = wp.static(n_grid)
        a = k + t * wp.static(nj)
        p[a + 1, y, x] = (div[t, y, x] + p[a, dec_index(y, n), x] + p[a, inc_index(y, n), x]
                          + p[a, y, dec_index(x, n)] + p[a, y, inc_index(x, n)]) / 4.0

    @wp.kernel
    def update_v(t: int, v_updated: wp.array3d(dtype=wp.vec2), p: wp.array3d(dtype=float),
                 v: wp.array3d(dtype=wp.vec2)):
        y, x = wp.tid()
        n = wp.static(n_grid)
        a = wp.static(nj) * t - 1
        vu = v_updated[t, y, x]
        v[t, y, x] = wp.vec2(
            vu[0] - 0.5 * (p[a, inc_index(y, n), x] - p[a, dec_index(y, n), x]) / wp.static(dx),
            vu[1] - 0.5 * (p[a, y, inc_index(x, n)] - p[a, y, dec_index(x, n)]) / wp.static(dx))

    @wp.kernel
    def compute_loss(t: int, smoke: wp.array3d(dtype=float), target: wp.array2d(dtype=float),
                     loss: wp.array(dtype=float)):
        i, j = wp.tid()
        d = target[i, j] - smoke[t, i, j]
        wp.atomic_add(loss, 0, d * d * wp.static(inv_n2))

    @wp.kernel
    def apply_grad(grad: wp.array3d(dtype=wp.vec2), v: wp.array3d(dtype=wp.vec2)):
        i, j = wp.tid()
        v[0, i, j] = v[0, i, j] - wp.static(learning_rate) * grad[0, i, j]

    return dict(advect_v=advect_v, advect_smoke=advect_smoke, compute_div=compute_div,
                compute_p=compute_p, update_v=update_v, compute_loss=compute_loss,
                apply_grad=apply_grad)


class WarpSmoke:
    PARAMS = ("v",)  # its row 0

    def __init__(self, steps: int = sm.STEPS, n_grid: int = sm.N_GRID, seed: int = 0,
                 graph: bool = False, device=None, learning_rate: float = sm.LEARNING_RATE):
        # seed: the benchmarks' common interface; DiffTaichi starts from v[0] = 0
        self.steps, self.n_grid, self.nj = steps, n_grid, sm.NUM_JACOBI
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.k = build_kernels(n_grid, learning_rate)
        g, d = (n_grid, n_grid), self.device
        self.v = wp.zeros((steps,) + g, dtype=wp.vec2, device=d, requires_grad=True)
        self.v_updated = wp.zeros((steps,) + g, dtype=wp.vec2, device=d, requires_grad=True)
        self.div = wp.zeros((steps,) + g, dtype=float, device=d, requires_grad=True)
        self.p = wp.zeros((self.nj * steps + 1,) + g, dtype=float, device=d, requires_grad=True)
        smoke0 = np.zeros((steps,) + g, np.float32)
        smoke0[0] = sm.initial_smoke(n_grid)  # DiffTaichi's init()
        self.smoke = wp.array(smoke0, dtype=float, device=d, requires_grad=True)
        self.target = wp.array(sm.taichi_image(n_grid).astype(np.float32), dtype=float, device=d)
        self.loss = wp.zeros(1, dtype=float, device=d, requires_grad=True)
        self.tape = None
        self._graph = None

    def _launch(self, name, *args):
        wp.launch(self.k[name], dim=(self.n_grid, self.n_grid), inputs=list(args),
                  device=self.device)

    def forward(self) -> None:
        """DiffTaichi's forward(): the step for t = 1 .. steps - 1, then the loss."""
        self.loss.zero_()
        for t in range(1, self.steps):
            self._launch("advect_v", t, self.v, self.v_updated)
            self._launch("compute_div", t, self.v_updated, self.div)
            for k in range(self.nj):
                self._launch("compute_p", t, k, self.div, self.p)
            self._launch("update_v", t, self.v_updated, self.p, self.v)
            self._launch("advect_smoke", t, self.v, self.smoke)
        self._launch("compute_loss", self.steps - 1, self.smoke, self.target, self.loss)

    def _forward_backward_update(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        self._launch("apply_grad", self.v.grad, self.v)  # off the tape

    def iteration(self) -> float:
        """Forward on the tape, backward and DiffTaichi's update (replayed from a CUDA graph
        with graph=True). Returns the forward's loss."""
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy()[0] for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).numpy()[0].astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            arr = getattr(self, p)
            a = arr.numpy()
            a[0] = value
            arr.assign(a.astype(np.float32))
