"""DiffTaichi's diffmpm.py kernels written as Python functions (`@vkad.kernel`, issue 55).

    python examples/difftaichi/diffmpm_kernels.py --iters 30       # as diffmpm.py

The same MLS-MPM robot (and fish), controller, loss and training as diffmpm.py (whose DiffMPM
class, scenes and program this file reuses); only the kernels are spelled as DiffTaichi spells
them: `for p in range(n)` and `for i, j in vkad.ndrange(n, m)` the parallel loops,
`vkad.static(range(3))` the unrolled stencil, runtime `if`s for the fluid, the actuators and
the walls, `+=` on grid cells atomic adds. tests/python/test_kernel_frontend.py checks that its
losses and gradients equal diffmpm.py's.
"""
import math
import os
import sys

import vkad
from vkad import Matrix, Vector

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffmpm as dm  # noqa: E402
from diffmpm import (DT, P_VOL, E, MU, LA, GRAVITY, N_SIN_WAVES, ACTUATION_OMEGA,  # noqa: E402
                     ACT_STRENGTH, BOUND)


def build_kernels(ft: vkad.DType, n_grid: int, n_solid: int, fluid: bool):
    """diffmpm.build_kernels's kernels, as @vkad.kernel functions (same names, parameters and
    results)."""
    dx, inv_dx = 1.0 / n_grid, float(n_grid)
    particles = vkad.array(vkad.vec(2, ft), ndim=2, grad=True)     # x[f, p], v[f, p]
    matrices = vkad.array(vkad.mat(2, 2, ft), ndim=2, grad=True)   # C[f, p], F[f, p]
    grid_v = vkad.array(vkad.vec(2, ft), ndim=3, grad=True)        # grid_v_in[f, i, j]
    grid_m = vkad.array(ft, ndim=3, grad=True)
    field = vkad.array(ft, ndim=2, grad=True)
    ids = vkad.array(vkad.i32, ndim=1, readonly=True)

    @vkad.kernel
    def compute_actuation(t: vkad.i32, weights: field, bias: vkad.array(ft, grad=True),
                          actuation: field):
        for i in range(weights.shape[0]):
            phase = vkad.cast(t, ft) * (ACTUATION_OMEGA * DT)
            act = weights[i, 0] * vkad.sin(phase)
            for j in vkad.static(range(1, N_SIN_WAVES)):
                act += weights[i, j] * vkad.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
            actuation[t, i] = vkad.tanh(act + bias[i])

    @vkad.kernel
    def p2g(f: vkad.i32, x: particles, v: particles, C: matrices, F: matrices,
            actuation: field, actuator_id: ids, particle_type: ids, grid_v_in: grid_v,
            grid_m_in: grid_m):
        for p in range(x.shape[1]):
            base = vkad.cast(x[f, p] * inv_dx - 0.5, vkad.i32)
            fx = x[f, p] * inv_dx - vkad.cast(base, ft)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_F = (Matrix.identity(2) + DT * C[f, p]) @ F[f, p]
            J = new_F.determinant()
            if vkad.static(fluid) and particle_type[p] == 0:  # a fluid keeps its volume change
                sqrtJ = vkad.sqrt(J)
                new_F = Matrix([[sqrtJ, 0.0], [0.0, sqrtJ]])
            F[f + 1, p] = new_F
            r, s = vkad.polar_decompose(new_F)

            act_id = actuator_id[p]
            act = actuation[f, vkad.max(0, act_id)] * ACT_STRENGTH
            if act_id == -1:
                act = 0.0
            A = Matrix([[0.0, 0.0], [0.0, 1.0]]) * act

            cauchy = Matrix.zero(2)
            mass = 0.0
            if vkad.static(fluid) and particle_type[p] == 0:
                mass = 4.0
                cauchy = Matrix([[1.0, 0.0], [0.0, 0.1]]) * (J - 1) * E
            else:
                mass = 1.0
                cauchy = 2 * MU * (new_F - r) @ new_F.T + Matrix.diag(2, LA * (J - 1) * J)
            cauchy += new_F @ A @ new_F.T
            stress = -(DT * P_VOL * 4 * inv_dx * inv_dx) * cauchy
            affine = stress + mass * C[f, p]
            momentum = mass * v[f, p]
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    offset = Vector([i, j])
                    dpos = (offset - fx) * dx
                    weight = w[i][0] * w[j][1]
                    grid_v_in[f, base + offset] += weight * (momentum + affine @ dpos)
                    grid_m_in[f, base + offset] += weight * mass

    @vkad.kernel
    def grid_op(f: vkad.i32, grid_v_in: grid_v, grid_m_in: grid_m, grid_v_out: grid_v):
        for i, j in vkad.ndrange(grid_m_in.shape[1], grid_m_in.shape[2]):
            inv_m = 1 / (grid_m_in[f, i, j] + 1e-10)
            v_out = inv_m * grid_v_in[f, i, j]
            v_out[1] -= DT * GRAVITY
            # walls and floor stop what moves into them (DiffTaichi's floor friction sees the
            # velocity it has just zeroed and changes nothing: the floor is sticky)
            if i < BOUND and v_out[0] < 0:
                v_out = Vector([0.0, 0.0])
            if i > n_grid - BOUND and v_out[0] > 0:
                v_out = Vector([0.0, 0.0])
            if j < BOUND and v_out[1] < 0:
                v_out = Vector([0.0, 0.0])
            if j > n_grid - BOUND and v_out[1] > 0:
                v_out = Vector([0.0, 0.0])
            grid_v_out[f, i, j] = v_out

    @vkad.kernel
    def g2p(f: vkad.i32, x: particles, v: particles, C: matrices, grid_v_out: grid_v):
        for p in range(x.shape[1]):
            xp = x[f, p]
            base = vkad.cast(xp * inv_dx - 0.5, vkad.i32)
            fx = xp * inv_dx - vkad.cast(base, ft)
            w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
            new_v = Vector.zero(2)
            new_C = Matrix.zero(2)
            for i in vkad.static(range(3)):
                for j in vkad.static(range(3)):
                    dpos = Vector([i, j]) - fx
                    g_v = grid_v_out[f, base[0] + i, base[1] + j]
                    weight = w[i][0] * w[j][1]
                    new_v += weight * g_v
                    new_C += 4 * inv_dx * weight * g_v.outer_product(dpos)
            v[f + 1, p] = new_v
            x[f + 1, p] = xp + DT * new_v
            C[f + 1, p] = new_C

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: particles, loss: vkad.array(ft, ndim=0, grad=True),
                     particle_type: ids):
        for p in range(x.shape[1]):
            if particle_type[p] == 1:  # minus the mean x of the solid particles
                loss[None] += -(1.0 / n_solid) * x[t, p][0]

    return {"compute_actuation": compute_actuation, "p2g": p2g, "grid_op": grid_op, "g2p": g2p,
            "compute_loss": compute_loss}


class DiffMPM(dm.DiffMPM):
    """diffmpm.DiffMPM with the @vkad.kernel kernels."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("build", build_kernels)
        super().__init__(*args, **kwargs)


def main(argv=None) -> int:
    dm.DiffMPM, original = DiffMPM, dm.DiffMPM  # the program of diffmpm.py
    try:
        return dm.main(argv)
    finally:
        dm.DiffMPM = original


if __name__ == "__main__":
    sys.exit(main())
