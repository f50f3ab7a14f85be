"""DiffTaichi's mass_spring.py kernels written as Python functions (`@vkad.kernel`, issue 55).

    python examples/difftaichi/mass_spring_kernels.py --iters 30    # as mass_spring.py

The same simulation, controller, loss and training as mass_spring.py (whose MassSpring class,
robots and program this file reuses); only the kernels are spelled as DiffTaichi spells them --
`for i in range(n)` the parallel loop, `vkad.static(range(...))` the unrolled ones, `+=` on an
array element an atomic add, a runtime `if` for the ground contact -- instead of KernelBuilder
calls. tests/python/test_kernel_frontend.py checks that the losses and gradients equal
mass_spring.py's.
"""
import math
import os
import sys

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mass_spring as ms  # noqa: E402
from mass_spring import (DT, GROUND_HEIGHT, GRAVITY, SPRING_OMEGA, DAMPING,  # noqa: E402
                         N_SIN_WAVES, N_HIDDEN, HEAD_ID)


def build_kernels(ft: vkad.DType, n_objects: int, n_springs: int, use_toi: bool):
    """mass_spring.build_kernels's kernels, as @vkad.kernel functions (same names, parameters
    and results)."""
    n_input = N_SIN_WAVES + 4 * n_objects + 2
    vec = vkad.vec(2, ft)
    state = vkad.array(vec, ndim=2, grad=True)         # x[t, i], v[t, i]
    field = vkad.array(ft, ndim=2, grad=True)          # hidden[t, i], act[t, i], weights
    row = vkad.array(ft, ndim=1, grad=True)            # biases
    const = vkad.array(ft, ndim=1, readonly=True)      # spring parameters
    index = vkad.array(vkad.i32, ndim=1, readonly=True)

    @vkad.kernel
    def compute_center(t: vkad.i32, x: state, center: vkad.array(vec, ndim=1, grad=True)):
        for _ in range(1):
            c = x[t, 0]
            for i in vkad.static(range(1, n_objects)):
                c = c + x[t, i]
            center[t] = c * (1.0 / n_objects)

    @vkad.kernel
    def nn1(t: vkad.i32, x: state, v: state, center: vkad.array(vec, ndim=1, grad=True),
            goal: vkad.array(vec, ndim=0, readonly=True), weights1: field, bias1: row,
            hidden: field):
        for i in range(N_HIDDEN):
            phase = vkad.cast(t, ft) * (SPRING_OMEGA * DT)
            actuation = weights1[i, 0] * vkad.sin(phase)
            for j in vkad.static(range(1, N_SIN_WAVES)):
                actuation += weights1[i, j] * vkad.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
            c = center[t]
            for j in vkad.static(range(n_objects)):
                offset, vel = x[t, j] - c, v[t, j]
                k = N_SIN_WAVES + 4 * j  # offsets and velocities get smaller weights
                actuation += (weights1[i, k] * offset[0] * 0.05
                              + weights1[i, k + 1] * offset[1] * 0.05)
                actuation += (weights1[i, k + 2] * vel[0] * 0.05
                              + weights1[i, k + 3] * vel[1] * 0.05)
            to_goal = goal[None] - c
            k = N_SIN_WAVES + 4 * n_objects
            actuation += weights1[i, k] * to_goal[0] + weights1[i, k + 1] * to_goal[1]
            hidden[t, i] = vkad.tanh(actuation + bias1[i])

    @vkad.kernel
    def nn2(t: vkad.i32, hidden: field, weights2: field, bias2: row, act: field):
        for i in range(n_springs):
            actuation = weights2[i, 0] * hidden[t, 0]
            for j in vkad.static(range(1, N_HIDDEN)):
                actuation += weights2[i, j] * hidden[t, j]
            act[t, i] = vkad.tanh(actuation + bias2[i])

    @vkad.kernel
    def apply_spring_force(t: vkad.i32, x: state, act: field, anchor_a: index, anchor_b: index,
                           spring_length: const, spring_stiffness: const,
                           spring_actuation: const, v_inc: state):
        for i in range(n_springs):
            a, b = anchor_a[i], anchor_b[i]
            dist = x[t, a] - x[t, b]
            length = dist.norm() + 1e-4
            target = spring_length[i] * (1.0 + spring_actuation[i] * act[t, i])
            impulse = DT * (length - target) * spring_stiffness[i] / length * dist
            v_inc[t + 1, a] -= impulse  # atomic, as in DiffTaichi
            v_inc[t + 1, b] += impulse

    @vkad.kernel(name="advance_toi" if use_toi else "advance_no_toi")
    def advance(t: vkad.i32, x: state, v: state, v_inc: state):
        for i in range(n_objects):
            old_v = math.exp(-DT * DAMPING) * v[t - 1, i] + vkad.Vector([0.0, DT * GRAVITY]) \
                + v_inc[t, i]
            old_x = x[t - 1, i]
            if vkad.static(use_toi):
                # moving down through the ground within this step: stop at the time of impact
                toi = 0.0
                new_v = old_v
                if old_x[1] + DT * old_v[1] < GROUND_HEIGHT and old_v[1] < -1e-4:
                    toi = -(old_x[1] - GROUND_HEIGHT) / old_v[1]
                    new_v = vkad.Vector([0.0, 0.0])
                new_x = old_x + toi * old_v + (DT - toi) * new_v
            else:
                # below the ground and moving down: friction projection, the velocity stops
                new_v = old_v
                if old_x[1] - GROUND_HEIGHT < 0 and old_v[1] < 0:
                    new_v = vkad.Vector([0.0, 0.0])
                new_x = old_x + DT * new_v
            v[t, i] = new_v
            x[t, i] = new_x

    @vkad.kernel
    def compute_loss(t: vkad.i32, x: state, loss: vkad.array(ft, ndim=0, grad=True)):
        for _ in range(1):
            loss[None] += -x[t, HEAD_ID][0]  # DiffTaichi: loss[None] = -x[t, head_id][0]

    kernels = {"compute_center": compute_center, "nn1": nn1, "nn2": nn2,
               "apply_spring_force": apply_spring_force, "advance": advance,
               "compute_loss": compute_loss}
    return kernels, n_input


class MassSpring(ms.MassSpring):
    """mass_spring.MassSpring with the @vkad.kernel kernels."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("build", build_kernels)
        super().__init__(*args, **kwargs)


def main(argv=None) -> int:
    ms.MassSpring, original = MassSpring, ms.MassSpring  # the program of mass_spring.py
    try:
        return ms.main(argv)
    finally:
        ms.MassSpring = original


if __name__ == "__main__":
    sys.exit(main())
