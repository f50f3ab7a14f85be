"""DiffTaichi's diffmpm_simple.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: particle state and the grid in arrays with a time axis (x[f, p], v, C, F;
grid_v_in[f, i, j], grid_m_in, grid_v_out, as DiffTaichi has them), set_v, p2g(f) / grid_op(f) /
g2p(f) launched per step, compute_x_avg and compute_loss, a wp.Tape around the forward and
tape.backward(loss); on CUDA (graph=True) the zeroing of the grid's accumulators and x_avg, the
taped forward, the backward and the update are captured once with wp.ScopedCapture and replayed
with wp.capture_launch (the gradients zeroed by tape.zero() before each replay). The 3x3 stencil
is unrolled (wp.static bounds); the polar rotation is Taichi's closed form (warp_diffmpm.py's
polar_rotation); grid_op's walls zero one component, as DiffTaichi's.

Scene, constants, loss and update (init_v -= rate * gradient, a kernel) are
examples/difftaichi/diffmpm_simple.py's, itself DiffTaichi's. Call wp.init() before
constructing.
"""
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_diffmpm import bspline_weights, polar_rotation
from .warp_taped import run_taped

mpm = load_example("diffmpm_simple")
DT, P_VOL, P_MASS, MU, LA = mpm.DT, mpm.P_VOL, mpm.P_MASS, mpm.MU, mpm.LA
GRAVITY, BOUND, LR = mpm.GRAVITY, mpm.BOUND, mpm.LEARNING_RATE
TARGET_X, TARGET_Y = mpm.TARGET


def build_kernels(n_grid: int, n_particles: int):
    dx, inv_dx = 1.0 / n_grid, float(n_grid)

    @wp.kernel
    def set_v(init_v: wp.array(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2)):
        i = wp.tid()
        v[0, i] = init_v[0]

    @wp.kernel
    def p2g(f: int, x: wp.array2d(dtype=wp.vec2), v: wp.array2d(dtype=wp.vec2),
            C: wp.array2d(dtype=wp.mat22), F: wp.array2d(dtype=wp.mat22),
            grid_v_in: wp.array3d(dtype=wp.vec2), grid_m_in: wp.array3d(dtype=float)):
        p = wp.tid()
        xp = x[f, p]
        bx = int(xp[0] * wp.static(inv_dx) - 0.5)  # truncates toward 0, as ti.cast
        by = int(xp[1] * wp.static(inv_dx) - 0.5)
        fx = xp * wp.static(inv_dx) - wp.vec2(float(bx), float(by))
        wx = bspline_weights(fx[0])
        wy = bspline_weights(fx[1])
        Cp = C[f, p]
        new_F = (wp.identity(n=2, dtype=float) + DT * Cp) @ F[f, p]
        F[f + 1, p] = new_F
        J = wp.determinant(new_F)
        r = polar_rotation(new_F)
        cauchy = (2.0 * MU) * (new_F - r) @ wp.transpose(new_F) + wp.diag(
            wp.vec2(LA * (J - 1.0) * J))
        stress = -wp.static(DT * P_VOL * 4.0 * inv_dx * inv_dx) * cauchy
        affine = stress + P_MASS * Cp
        momentum = P_MASS * v[f, p]
        for i in range(wp.static(3)):
            for j in range(wp.static(3)):
                dpos = (wp.vec2(float(i), float(j)) - fx) * wp.static(dx)
                weight = wx[i] * wy[j]
                wp.atomic_add(grid_v_in, f, bx + i, by + j, weight * (momentum + affine @ dpos))
                wp.atomic_add(grid_m_in, f, bx + i, by + j, weight * P_MASS)

    @wp.kernel
    def grid_op(f: int, grid_v_in: wp.array3d(dtype=wp.vec2), grid_m_in: wp.array3d(dtype=float),
                grid_v_out: wp.array3d(dtype=wp.vec2)):
        i, j = wp.tid()
        inv_m = 1.0 / (grid_m_in[f, i, j] + 1e-10)
        v_out = inv_m * grid_v_in[f, i, j]
        vx = v_out[0]
        vy = v_out[1] - wp.static(DT * GRAVITY)
        if i < BOUND and vx < 0.0:
            vx = 0.0
        if i > wp.static(n_grid - BOUND) and vx > 0.0:
            vx = 0.0
        if j < BOUND and vy < 0.0:
            vy = 0.0
        if j > wp.static(n_grid - BOUND) and vy > 0.0:
            vy = 0.0
        grid_v_out[f, i, j] = wp.vec2(vx, vy)

    @wp.kernel
    def g2p(f: int, grid_v_out: wp.array3d(dtype=wp.vec2), x: wp.array2d(dtype=wp.vec2),
            v: wp.array2d(dtype=wp.vec2), C: wp.array2d(dtype=wp.mat22)):
        p = wp.tid()
        xp = x[f, p]
        bx = int(xp[0] * wp.static(inv_dx) - 0.5)
        by = int(xp[1] * wp.static(inv_dx) - 0.5)
        fx = xp * wp.static(inv_dx) - wp.vec2(float(bx), float(by))
        wx = bspline_weights(fx[0])
        wy = bspline_weights(fx[1])
        new_v = wp.vec2(0.0, 0.0)
        new_C = wp.mat22(0.0, 0.0, 0.0, 0.0)
        for i in range(wp.static(3)):
            for j in range(wp.static(3)):
                dpos = wp.vec2(float(i), float(j)) - fx
                g_v = grid_v_out[f, bx + i, by + j]
                weight = wx[i] * wy[j]
                new_v += weight * g_v
                new_C += wp.static(4.0 * inv_dx) * weight * wp.outer(g_v, dpos)
        v[f + 1, p] = new_v
        x[f + 1, p] = xp + DT * new_v
        C[f + 1, p] = new_C

    @wp.kernel
    def compute_x_avg(t: int, x: wp.array2d(dtype=wp.vec2), x_avg: wp.array(dtype=wp.vec2)):
        i = wp.tid()
        wp.atomic_add(x_avg, 0, wp.static(1.0 / n_particles) * x[t, i])

    @wp.kernel
    def compute_loss(x_avg: wp.array(dtype=wp.vec2), loss: wp.array(dtype=float)):
        dx_ = x_avg[0][0] - TARGET_X
        dy_ = x_avg[0][1] - TARGET_Y
        loss[0] = 0.5 * (dx_ * dx_ + dy_ * dy_)

    @wp.kernel
    def apply_grad(init_v: wp.array(dtype=wp.vec2), grad: wp.array(dtype=wp.vec2)):
        init_v[0] = init_v[0] - LR * grad[0]

    return dict(set_v=set_v, p2g=p2g, grid_op=grid_op, g2p=g2p, compute_x_avg=compute_x_avg,
                compute_loss=compute_loss, apply_grad=apply_grad)


class WarpDiffMPMSimple:
    PARAMS = ("init_v",)

    def __init__(self, steps: int = mpm.STEPS, n_grid: int = mpm.N_GRID, n: int = mpm.N,
                 seed: int = 0, graph: bool = False, device=None):
        self.steps, self.n_grid, self.n_particles = steps, n_grid, n * n
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.k = build_kernels(n_grid, self.n_particles)
        d, count = self.device, self.n_particles

        def zeros(shape, dtype):
            return wp.zeros(shape, dtype=dtype, device=d, requires_grad=True)

        x0 = np.zeros((steps, count, 2), np.float32)
        x0[0] = mpm.block(n, n_grid)
        F0 = np.zeros((steps, count, 2, 2), np.float32)
        F0[0] = np.eye(2)
        self.x = wp.array(x0, dtype=wp.vec2, device=d, requires_grad=True)
        self.v = zeros((steps, count), wp.vec2)
        self.C = zeros((steps, count), wp.mat22)
        self.F = wp.array(F0, dtype=wp.mat22, device=d, requires_grad=True)
        grid = (steps - 1, n_grid, n_grid)
        self.grid_v_in = zeros(grid, wp.vec2)
        self.grid_m_in = zeros(grid, float)
        self.grid_v_out = zeros(grid, wp.vec2)
        self.init_v = zeros(1, wp.vec2)
        self.x_avg = zeros(1, wp.vec2)
        self.loss = zeros(1, float)
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        k, n = self.k, self.n_particles
        self._launch(k["set_v"], n, self.init_v, self.v)
        for f in range(self.steps - 1):
            self._launch(k["p2g"], n, f, self.x, self.v, self.C, self.F, self.grid_v_in,
                         self.grid_m_in)
            self._launch(k["grid_op"], (self.n_grid, self.n_grid), f, self.grid_v_in,
                         self.grid_m_in, self.grid_v_out)
            self._launch(k["g2p"], n, f, self.grid_v_out, self.x, self.v, self.C)
        self._launch(k["compute_x_avg"], n, self.steps - 1, self.x, self.x_avg)
        self._launch(k["compute_loss"], 1, self.x_avg, self.loss)

    def _forward_backward_update(self) -> None:
        self.grid_v_in.zero_()
        self.grid_m_in.zero_()
        self.x_avg.zero_()
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        self._launch(self.k["apply_grad"], 1, self.init_v, self.init_v.grad)

    def iteration(self) -> float:
        """The grid's accumulators and x_avg zeroed, forward on the tape, backward and the
        update (replayed from a CUDA graph with graph=True). Returns the forward's loss."""
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {"init_v": self.init_v.grad.numpy()[0]}
