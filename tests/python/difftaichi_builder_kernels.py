"""examples/difftaichi/mass_spring.py's and diffmpm.py's kernels written with KernelBuilder calls,
as the ports defined them before they were written with `@vkad.kernel` (issue 55).

The reference that keeps the front end checked: test_kernel_frontend.py runs each port with these
kernels (the classes' `build=` hook) and with its own, and asserts the same losses and gradients;
bench/frontend_lowering.py times building them against lowering the ports' kernels. Same kernel
names, parameters and results as the ports' build_kernels; the constants are the ports'.
"""
import importlib.util
import math
import pathlib

import vkad
from vkad import Matrix, Vector

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "difftaichi"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"builder_ref_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ms, dm = _load("mass_spring"), _load("diffmpm")


def mass_spring_kernels(ft: vkad.DType, n_objects: int, n_springs: int, toi: bool):
    """The forward kernels, one KernelBuilder each, launched with step t (an i32 parameter).
    Loops over objects, sine waves and hidden units are unrolled at build time (DiffTaichi's
    ti.static): each is a handful of masses or units."""
    DT, GROUND_HEIGHT, GRAVITY, SPRING_OMEGA, DAMPING, N_SIN_WAVES, N_HIDDEN, HEAD_ID = (
        ms.DT, ms.GROUND_HEIGHT, ms.GRAVITY, ms.SPRING_OMEGA, ms.DAMPING, ms.N_SIN_WAVES,
        ms.N_HIDDEN, ms.HEAD_ID)
    n_input = N_SIN_WAVES + 4 * n_objects + 2
    kernels = {}

    def array(kb, name, rank, element=(), grad=True):
        return kb.ndarray(name, ft, rank, grad=grad, readonly=not grad, element=element)

    kb = vkad.KernelBuilder("compute_center")
    t = kb.scalar("t", vkad.i32)
    x, center = array(kb, "x", 2, (2,)), array(kb, "center", 1, (2,))
    with kb.parallel_for("center", 0, 1):
        c = x[t, 0]
        for i in range(1, n_objects):
            c = c + x[t, i]
        center[t] = c * (1.0 / n_objects)
    kernels["compute_center"] = kb

    kb = vkad.KernelBuilder("nn1")
    t = kb.scalar("t", vkad.i32)
    x, v, center = array(kb, "x", 2, (2,)), array(kb, "v", 2, (2,)), array(kb, "center", 1, (2,))
    goal = array(kb, "goal", 0, (2,), grad=False)
    weights1, bias1 = array(kb, "weights1", 2), array(kb, "bias1", 1)
    hidden = array(kb, "hidden", 2)
    with kb.parallel_for("hidden", 0, N_HIDDEN) as i:
        phase = vkad.cast(t, ft) * (SPRING_OMEGA * DT)
        act = weights1[i, 0] * vkad.sin(phase)
        for j in range(1, N_SIN_WAVES):
            act = act + weights1[i, j] * vkad.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
        c = center[t]
        for j in range(n_objects):
            offset, vel = x[t, j] - c, v[t, j]
            k = N_SIN_WAVES + 4 * j  # offsets and velocities get smaller weights: many inputs
            act = act + weights1[i, k] * offset[0] * 0.05 + weights1[i, k + 1] * offset[1] * 0.05
            act = act + weights1[i, k + 2] * vel[0] * 0.05 + weights1[i, k + 3] * vel[1] * 0.05
        to_goal = goal[None] - c
        k = N_SIN_WAVES + 4 * n_objects
        act = act + weights1[i, k] * to_goal[0] + weights1[i, k + 1] * to_goal[1]
        hidden[t, i] = vkad.tanh(act + bias1[i])
    kernels["nn1"] = kb

    kb = vkad.KernelBuilder("nn2")
    t = kb.scalar("t", vkad.i32)
    hidden, weights2 = array(kb, "hidden", 2), array(kb, "weights2", 2)
    bias2 = array(kb, "bias2", 1)
    act = array(kb, "act", 2)
    with kb.parallel_for("act", 0, n_springs) as i:
        a = weights2[i, 0] * hidden[t, 0]
        for j in range(1, N_HIDDEN):
            a = a + weights2[i, j] * hidden[t, j]
        act[t, i] = vkad.tanh(a + bias2[i])
    kernels["nn2"] = kb

    kb = vkad.KernelBuilder("apply_spring_force")
    t = kb.scalar("t", vkad.i32)
    x, act = array(kb, "x", 2, (2,)), array(kb, "act", 2)
    anchor_a = kb.ndarray("anchor_a", vkad.i32, 1, readonly=True)
    anchor_b = kb.ndarray("anchor_b", vkad.i32, 1, readonly=True)
    rest = array(kb, "spring_length", 1, grad=False)
    stiffness = array(kb, "spring_stiffness", 1, grad=False)
    actuation = array(kb, "spring_actuation", 1, grad=False)
    v_inc = array(kb, "v_inc", 2, (2,))
    with kb.parallel_for("springs", 0, n_springs) as i:
        a, b = anchor_a[i], anchor_b[i]
        dist = x[t, a] - x[t, b]
        length = dist.norm() + 1e-4
        target = rest[i] * (1.0 + actuation[i] * act[t, i])
        impulse = DT * (length - target) * stiffness[i] / length * dist
        v_inc.atomic_add((t + 1, a), -impulse)
        v_inc.atomic_add((t + 1, b), impulse)
    kernels["apply_spring_force"] = kb

    kb = vkad.KernelBuilder("advance_toi" if toi else "advance_no_toi")
    t = kb.scalar("t", vkad.i32)
    x, v, v_inc = array(kb, "x", 2, (2,)), array(kb, "v", 2, (2,)), array(kb, "v_inc", 2, (2,))
    with kb.parallel_for("objects", 0, n_objects) as i:
        old_v = math.exp(-DT * DAMPING) * v[t - 1, i] + Vector([0.0, DT * GRAVITY]) + v_inc[t, i]
        old_x = x[t - 1, i]
        if toi:
            # Moving down through the ground within this step: stop at the time of impact.
            hits = ((old_x + DT * old_v)[1] < GROUND_HEIGHT) & (old_v[1] < -1e-4)
            # select evaluates both sides: divide by -1 where there is no impact, so the
            # unused side (and its adjoint) stays finite
            toi_t = vkad.select(hits, -(old_x[1] - GROUND_HEIGHT)
                                / vkad.select(hits, old_v[1], -1.0), 0.0)
            new_v = vkad.select(hits, Vector.zero(2), old_v)
            new_x = old_x + toi_t * old_v + (DT - toi_t) * new_v
        else:
            # Below the ground and moving down: friction projection, the velocity becomes 0.
            stuck = (old_x[1] - GROUND_HEIGHT < 0) & (old_v[1] < 0)
            new_v = vkad.select(stuck, Vector.zero(2), old_v)
            new_x = old_x + DT * new_v
        v[t, i] = new_v
        x[t, i] = new_x
    kernels["advance"] = kb

    kb = vkad.KernelBuilder("compute_loss")
    t = kb.scalar("t", vkad.i32)
    x, loss = array(kb, "x", 2, (2,)), array(kb, "loss", 0)
    with kb.parallel_for("loss", 0, 1):
        loss.atomic_add(None, -x[t, HEAD_ID][0])  # DiffTaichi: loss[None] = -x[t, head_id][0]
    kernels["compute_loss"] = kb
    return kernels, n_input


def diffmpm_kernels(ft: vkad.DType, n_grid: int, n_solid: int, fluid: bool):
    """DiffTaichi's kernels, one KernelBuilder each, launched with the step f (an i32
    parameter). The 3x3 stencil and the sine waves are unrolled at build time (ti.static);
    `fluid` adds the fluid branch of p2g (a select per particle) for scenes that have fluid."""
    DT, P_VOL, E, MU, LA, GRAVITY, N_SIN_WAVES, ACTUATION_OMEGA, ACT_STRENGTH, BOUND = (
        dm.DT, dm.P_VOL, dm.E, dm.MU, dm.LA, dm.GRAVITY, dm.N_SIN_WAVES,
        dm.ACTUATION_OMEGA, dm.ACT_STRENGTH, dm.BOUND)
    dx, inv_dx = 1.0 / n_grid, float(n_grid)
    kernels = {}

    def array(kb, name, rank, element=(), grad=True):
        return kb.ndarray(name, ft, rank, grad=grad, readonly=not grad, element=element)

    def stencil(xp):
        """Taichi's base cell, the position in it and the quadratic B-spline weights."""
        base = (xp * inv_dx - 0.5).cast(vkad.i32)  # truncates toward 0, as ti.cast
        fx = xp * inv_dx - base.cast(ft)
        w = [0.5 * (1.5 - fx) ** 2, 0.75 - (fx - 1.0) ** 2, 0.5 * (fx - 0.5) ** 2]
        return base, fx, w

    kb = vkad.KernelBuilder("compute_actuation")
    t = kb.scalar("t", vkad.i32)
    weights, bias = array(kb, "weights", 2), array(kb, "bias", 1)
    actuation = array(kb, "actuation", 2)
    with kb.parallel_for("actuators", 0, weights.shape[0]) as i:
        phase = vkad.cast(t, ft) * (ACTUATION_OMEGA * DT)
        act = weights[i, 0] * vkad.sin(phase)
        for j in range(1, N_SIN_WAVES):
            act = act + weights[i, j] * vkad.sin(phase + 2 * math.pi / N_SIN_WAVES * j)
        actuation[t, i] = vkad.tanh(act + bias[i])
    kernels["compute_actuation"] = kb

    kb = vkad.KernelBuilder("p2g")
    f = kb.scalar("f", vkad.i32)
    x, v = array(kb, "x", 2, (2,)), array(kb, "v", 2, (2,))
    C, F = array(kb, "C", 2, (2, 2)), array(kb, "F", 2, (2, 2))
    actuation = array(kb, "actuation", 2)
    actuator_id = kb.ndarray("actuator_id", vkad.i32, 1, readonly=True)
    particle_type = kb.ndarray("particle_type", vkad.i32, 1, readonly=True)
    grid_v_in, grid_m_in = array(kb, "grid_v_in", 3, (2,)), array(kb, "grid_m_in", 3)
    with kb.parallel_for("particles", 0, x.shape[1]) as p:
        base, fx, w = stencil(x[f, p])
        Cp = C[f, p]
        new_F = (Matrix.identity(2) + DT * Cp) @ F[f, p]
        J = new_F.determinant()
        is_fluid = particle_type[p] == 0
        if fluid:  # a fluid keeps only its volume change; sqrt sees 1 where unused
            new_F = vkad.select(is_fluid, Matrix.diag(2, vkad.sqrt(vkad.select(is_fluid, J, 1.0))),
                                new_F)
        F[f + 1, p] = new_F
        r, _ = vkad.polar_decompose(new_F)

        act_id = actuator_id[p]
        act = actuation[f, vkad.max(0, act_id)] * ACT_STRENGTH
        act = vkad.select(act_id == -1, 0.0, act)
        A = Matrix([[0.0, 0.0], [0.0, 1.0]]) * act

        # solid: fixed corotated elasticity; fluid: pressure from the volume change
        cauchy = 2 * MU * (new_F - r) @ new_F.T + Matrix.diag(2, LA * (J - 1) * J)
        mass = 1.0
        if fluid:
            cauchy = vkad.select(is_fluid, Matrix([[1.0, 0.0], [0.0, 0.1]]) * (J - 1) * E, cauchy)
            mass = vkad.select(is_fluid, 4.0, kb.constant(1.0, ft))
        cauchy = cauchy + new_F @ A @ new_F.T
        stress = -(DT * P_VOL * 4 * inv_dx * inv_dx) * cauchy
        affine = stress + mass * Cp
        momentum = mass * v[f, p]
        for i in range(3):
            for j in range(3):
                offset = Vector([i, j])
                dpos = (offset - fx) * dx
                weight = w[i][0] * w[j][1]
                grid_v_in.atomic_add((f, base + offset), weight * (momentum + affine @ dpos))
                grid_m_in.atomic_add((f, base + offset), weight * mass)
    kernels["p2g"] = kb

    kb = vkad.KernelBuilder("grid_op")
    f = kb.scalar("f", vkad.i32)
    grid_v_in, grid_m_in = array(kb, "grid_v_in", 3, (2,)), array(kb, "grid_m_in", 3)
    grid_v_out = array(kb, "grid_v_out", 3, (2,))
    with kb.parallel_for_nd("cells", grid_m_in.shape[1], grid_m_in.shape[2]) as (i, j):
        inv_m = 1 / (grid_m_in[f, i, j] + 1e-10)
        v_out = inv_m * grid_v_in[f, i, j] - Vector([0.0, DT * GRAVITY])
        # Walls and floor stop what moves into them. DiffTaichi's floor branch zeroes v_out
        # before its friction code, which then sees lin = v_out . normal = 0 and changes
        # nothing: the floor is sticky, and so it is here.
        stop = (((i < BOUND) & (v_out[0] < 0)) | ((i > n_grid - BOUND) & (v_out[0] > 0))
                | ((j < BOUND) & (v_out[1] < 0)) | ((j > n_grid - BOUND) & (v_out[1] > 0)))
        grid_v_out[f, i, j] = vkad.select(stop, Vector.zero(2), v_out)
    kernels["grid_op"] = kb

    kb = vkad.KernelBuilder("g2p")
    f = kb.scalar("f", vkad.i32)
    x, v = array(kb, "x", 2, (2,)), array(kb, "v", 2, (2,))
    C = array(kb, "C", 2, (2, 2))
    grid_v_out = array(kb, "grid_v_out", 3, (2,))
    with kb.parallel_for("particles", 0, x.shape[1]) as p:
        xp = x[f, p]
        base, fx, w = stencil(xp)
        new_v, new_C = Vector.zero(2), Matrix.zero(2)
        for i in range(3):
            for j in range(3):
                dpos = Vector([i, j]) - fx
                g_v = grid_v_out[f, base[0] + i, base[1] + j]
                weight = w[i][0] * w[j][1]
                new_v = new_v + weight * g_v
                new_C = new_C + 4 * inv_dx * weight * g_v.outer_product(dpos)
        v[f + 1, p] = new_v
        x[f + 1, p] = xp + DT * new_v
        C[f + 1, p] = new_C
    kernels["g2p"] = kb

    kb = vkad.KernelBuilder("compute_loss")
    t = kb.scalar("t", vkad.i32)
    x, loss = array(kb, "x", 2, (2,)), array(kb, "loss", 0)
    particle_type = kb.ndarray("particle_type", vkad.i32, 1, readonly=True)
    with kb.parallel_for("particles", 0, x.shape[1]) as p:
        # DiffTaichi: x_avg = mean of x[t] over the solid particles, loss = -x_avg[0]
        contrib = vkad.select(particle_type[p] == 1, kb.constant(1.0 / n_solid, ft), 0.0)
        loss.atomic_add(None, -contrib * x[t, p][0])
    kernels["compute_loss"] = kb
    return kernels
