"""DiffTaichi's diffmpm3d.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom, as warp_diffmpm.py (the 2-D program): particle state in arrays with a time axis
(x[f, p], v, C, F), a wp.Tape around the forward and tape.backward(loss); on CUDA (graph=True)
the zeroing, the taped forward and the backward are captured once with wp.ScopedCapture and
replayed with wp.capture_launch. A Warp tape replays each launch's adjoint on the arrays as they
are at backward time, so a grid reused every step (DiffTaichi's) would give wrong gradients: the
grid has a time axis, grid_v_in[f, i, j, k] etc., zeroed once per simulation (the vkad example's
layout too). The 3x3x3 stencil and the sine waves are unrolled (wp.static bounds).

Physics, constants, the robot, initialisation, loss and update are
examples/difftaichi/diffmpm3d.py's (itself DiffTaichi's); the floor is sticky as in DiffTaichi
(its friction branch runs after the velocity was zeroed and changes nothing). The update runs on
the host in numpy, as the vkad example's does. Call wp.init() before constructing. Not run in
the repository's tests (Warp is not installed there): a transcription of warp_diffmpm.py.
"""
import math
from typing import Dict

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

mpm = load_example("diffmpm3d")
DT, P_VOL, E, MU, LA = mpm.DT, mpm.P_VOL, mpm.E, mpm.MU, mpm.LA
GRAVITY, N_SIN_WAVES, ACTUATION_OMEGA = mpm.GRAVITY, mpm.N_SIN_WAVES, mpm.ACTUATION_OMEGA
ACT_STRENGTH, BOUND = mpm.ACT_STRENGTH, mpm.BOUND


@wp.func
def bspline_weights(fx: float):
    """The quadratic B-spline weights of the three nodes along one axis."""
    return wp.vec3(0.5 * (1.5 - fx) * (1.5 - fx), 0.75 - (fx - 1.0) * (fx - 1.0),
                   0.5 * (fx - 0.5) * (fx - 0.5))


def build_kernels(n_grid: int, n_solid: int):
    dx, inv_dx = 1.0 / n_grid, float(n_grid)

    @wp.kernel
    def compute_actuation(t: int, weights: wp.array2d(dtype=float), bias: wp.array(dtype=float),
                          actuation: wp.array2d(dtype=float)):
        i = wp.tid()
        phase = float(t) * wp.static(ACTUATION_OMEGA * DT)
        act = weights[i, 0] * wp.sin(phase)
        for j in range(1, wp.static(N_SIN_WAVES)):
            act += weights[i, j] * wp.sin(phase + wp.static(2.0 * math.pi / N_SIN_WAVES) * float(j))
        actuation[t, i] = wp.tanh(act + bias[i])

    @wp.kernel
    def p2g(f: int, x: wp.array2d(dtype=wp.vec3), v: wp.array2d(dtype=wp.vec3),
            C: wp.array2d(dtype=wp.mat33), F: wp.array2d(dtype=wp.mat33),
            actuation: wp.array2d(dtype=float), actuator_id: wp.array(dtype=int),
            particle_type: wp.array(dtype=int), grid_v_in: wp.array4d(dtype=wp.vec3),
            grid_m_in: wp.array4d(dtype=float)):
        p = wp.tid()
        xp = x[f, p]
        # Taichi's base cell: the cast truncates toward 0, as int() does here
        bx = int(xp[0] * wp.static(inv_dx) - 0.5)
        by = int(xp[1] * wp.static(inv_dx) - 0.5)
        bz = int(xp[2] * wp.static(inv_dx) - 0.5)
        fx = xp * wp.static(inv_dx) - wp.vec3(float(bx), float(by), float(bz))
        wx = bspline_weights(fx[0])
        wy = bspline_weights(fx[1])
        wz = bspline_weights(fx[2])
        Cp = C[f, p]
        new_F = (wp.identity(n=3, dtype=float) + DT * Cp) @ F[f, p]
        J = wp.determinant(new_F)
        if particle_type[p] == 0:  # fluid (DiffTaichi: "need pow(x, 1/3)")
            sqrtJ = wp.sqrt(J)
            new_F = wp.mat33(sqrtJ, 0.0, 0.0, 0.0, sqrtJ, 0.0, 0.0, 0.0, 1.0)
        F[f + 1, p] = new_F

        act_id = actuator_id[p]
        act = actuation[f, wp.max(0, act_id)] * ACT_STRENGTH
        if act_id == -1:
            act = 0.0
        A = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0) * act

        mass = float(1.0)
        ident = wp.identity(n=3, dtype=float)
        cauchy = wp.mat33()
        if particle_type[p] == 0:
            mass = 4.0
            cauchy = ident * (J - 1.0) * E
        else:  # neo-Hookean
            cauchy = MU * (new_F @ wp.transpose(new_F)) + ident * (LA * wp.log(J) - MU)
        cauchy = cauchy + new_F @ A @ wp.transpose(new_F)
        stress = -wp.static(DT * P_VOL * 4.0 * inv_dx * inv_dx) * cauchy
        affine = stress + mass * Cp
        momentum = mass * v[f, p]
        for i in range(wp.static(3)):
            for j in range(wp.static(3)):
                for k in range(wp.static(3)):
                    dpos = (wp.vec3(float(i), float(j), float(k)) - fx) * wp.static(dx)
                    weight = wx[i] * wy[j] * wz[k]
                    wp.atomic_add(grid_v_in, f, bx + i, by + j, bz + k,
                                  weight * (momentum + affine @ dpos))
                    wp.atomic_add(grid_m_in, f, bx + i, by + j, bz + k, weight * mass)

    @wp.kernel
    def grid_op(f: int, grid_v_in: wp.array4d(dtype=wp.vec3), grid_m_in: wp.array4d(dtype=float),
                grid_v_out: wp.array4d(dtype=wp.vec3)):
        i, j, k = wp.tid()
        inv_m = 1.0 / (grid_m_in[f, i, j, k] + 1e-10)
        v_out = inv_m * grid_v_in[f, i, j, k] - wp.vec3(0.0, wp.static(DT * GRAVITY), 0.0)
        # walls, floor and ceiling stop what moves into them (the floor is sticky, see above)
        if i < BOUND and v_out[0] < 0.0:
            v_out = wp.vec3(0.0, 0.0, 0.0)
        if i > wp.static(n_grid - BOUND) and v_out[0] > 0.0:
            v_out = wp.vec3(0.0, 0.0, 0.0)
        if k < BOUND and v_out[2] < 0.0:
            v_out = wp.vec3(0.0, 0.0, 0.0)
        if k > wp.static(n_grid - BOUND) and v_out[2] > 0.0:
            v_out = wp.vec3(0.0, 0.0, 0.0)
        if j < BOUND and v_out[1] < 0.0:
            v_out = wp.vec3(0.0, 0.0, 0.0)
        if j > wp.static(n_grid - BOUND) and v_out[1] > 0.0:
            v_out = wp.vec3(0.0, 0.0, 0.0)
        grid_v_out[f, i, j, k] = v_out

    @wp.kernel
    def g2p(f: int, grid_v_out: wp.array4d(dtype=wp.vec3), x: wp.array2d(dtype=wp.vec3),
            v: wp.array2d(dtype=wp.vec3), C: wp.array2d(dtype=wp.mat33)):
        p = wp.tid()
        xp = x[f, p]
        bx = int(xp[0] * wp.static(inv_dx) - 0.5)
        by = int(xp[1] * wp.static(inv_dx) - 0.5)
        bz = int(xp[2] * wp.static(inv_dx) - 0.5)
        fx = xp * wp.static(inv_dx) - wp.vec3(float(bx), float(by), float(bz))
        wx = bspline_weights(fx[0])
        wy = bspline_weights(fx[1])
        wz = bspline_weights(fx[2])
        new_v = wp.vec3(0.0, 0.0, 0.0)
        new_C = wp.mat33()
        for i in range(wp.static(3)):
            for j in range(wp.static(3)):
                for k in range(wp.static(3)):
                    dpos = wp.vec3(float(i), float(j), float(k)) - fx
                    g_v = grid_v_out[f, bx + i, by + j, bz + k]
                    weight = wx[i] * wy[j] * wz[k]
                    new_v += weight * g_v
                    new_C += wp.static(4.0 * inv_dx) * weight * wp.outer(g_v, dpos)
        v[f + 1, p] = new_v
        x[f + 1, p] = xp + DT * new_v
        C[f + 1, p] = new_C

    @wp.kernel
    def compute_loss(t: int, x: wp.array2d(dtype=wp.vec3), particle_type: wp.array(dtype=int),
                     loss: wp.array(dtype=float)):
        p = wp.tid()
        # DiffTaichi: minus the mean x of the solid particles at the last step
        if particle_type[p] == 1:
            wp.atomic_add(loss, 0, -wp.static(1.0 / n_solid) * x[t, p][0])

    return compute_actuation, p2g, grid_op, g2p, compute_loss


class WarpDiffMPM3D:
    PARAMS = ("weights", "bias")
    LEARNING_RATE = mpm.LEARNING_RATE
    SCENE = staticmethod(mpm.robot)  # fills a Scene: the robot (warp_liquid's adds its fluid)

    def __init__(self, steps: int = mpm.STEPS, n_grid: int = mpm.N_GRID, seed: int = 0,
                 graph: bool = False, device=None, scene=None):
        self.steps, self.n_grid = steps, n_grid
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        # scene: a function that fills a Scene (default SCENE; tests move it on a coarse grid)
        sc = self.scene = (scene or self.SCENE)(mpm.Scene(n_grid, seed))
        self.n_particles, self.n_actuators = n, n_act = sc.n_particles, sc.n_actuators
        (self.k_actuation, self.k_p2g, self.k_grid_op, self.k_g2p,
         self.k_loss) = build_kernels(n_grid, sc.n_solid_particles)

        def zeros(shape, dtype=float):
            return wp.zeros(shape, dtype=dtype, device=self.device, requires_grad=True)

        x0 = np.zeros((steps, n, 3), np.float32)
        x0[0] = sc.x
        F0 = np.zeros((steps, n, 3, 3), np.float32)
        F0[0] = np.eye(3)
        self.x = wp.array(x0, dtype=wp.vec3, device=self.device, requires_grad=True)
        self.F = wp.array(F0, dtype=wp.mat33, device=self.device, requires_grad=True)
        self.v, self.C = zeros((steps, n), wp.vec3), zeros((steps, n), wp.mat33)
        grid = (steps - 1, n_grid, n_grid, n_grid)  # one grid per step (see the docstring)
        self.grid_v_in, self.grid_m_in = zeros(grid, wp.vec3), zeros(grid)
        self.grid_v_out = zeros(grid, wp.vec3)
        self.actuation = zeros((steps, n_act))
        self.loss = zeros(1)
        self.actuator_id = wp.array(np.array(sc.actuator_id, np.int32), dtype=int,
                                    device=self.device)
        self.particle_type = wp.array(np.array(sc.particle_type, np.int32), dtype=int,
                                      device=self.device)
        # DiffTaichi's initialisation: weights ~ N(0, 0.01^2), zero bias.
        rng = np.random.RandomState(seed)
        self.weights, self.bias = zeros((n_act, N_SIN_WAVES)), zeros(n_act)
        self.set_params({"weights": rng.randn(n_act, N_SIN_WAVES) * 0.01})
        self.tape = None
        self._graph = None

    def _launch(self, kernel, dim, *args):
        wp.launch(kernel, dim=dim, inputs=list(args), device=self.device)

    def forward(self) -> None:
        """DiffTaichi's forward(): steps - 1 steps from x[0], F[0] = I, v[0] = C[0] = 0, then
        the loss at the last step. DiffTaichi's clear_grid, once for all the steps' grids."""
        self.grid_v_in.zero_()
        self.grid_m_in.zero_()
        self.loss.zero_()
        n, g = self.n_particles, self.n_grid
        for f in range(self.steps - 1):
            self._launch(self.k_actuation, self.n_actuators, f, self.weights, self.bias,
                         self.actuation)
            self._launch(self.k_p2g, n, f, self.x, self.v, self.C, self.F, self.actuation,
                         self.actuator_id, self.particle_type, self.grid_v_in, self.grid_m_in)
            self._launch(self.k_grid_op, (g, g, g), f, self.grid_v_in, self.grid_m_in,
                         self.grid_v_out)
            self._launch(self.k_g2p, n, f, self.grid_v_out, self.x, self.v, self.C)
        self._launch(self.k_loss, n, self.steps - 1, self.x, self.particle_type, self.loss)

    def _forward_backward(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)

    def iteration(self) -> float:
        """Forward on the tape and backward (replayed from a CUDA graph with graph=True), then
        DiffTaichi's update w -= LEARNING_RATE * dL/dw. Returns the forward's loss."""
        run_taped(self, self._forward_backward)
        loss = float(self.loss.numpy()[0])
        grads = self.gradients()
        w = self.params()
        self.set_params({p: w[p] - self.LEARNING_RATE * grads[p] for p in self.PARAMS})
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).assign(np.asarray(value, np.float32))
