"""examples/difftaichi/volume_renderer.py (DiffTaichi's volume renderer on vkad) at a small size:
the rendered images and the loss against a float64 numpy transcription of DiffTaichi's ray_march
and compute_loss, the gradient of the loss w.r.t. voxels of the density against central
differences of that transcription, apply_grad's clamp, a replayed (graph) iteration against a
launched one, and training lowering the loss."""
import math

import numpy as np
import pytest

import vkad
from difftaichi_checks import (assert_close_by_name, assert_main_graph_equals_launches,
                               assert_plots, dtypes, load_example, replayed_and_launched)

vr = load_example("volume_renderer")

# 2 views of 15^2 pixels (DiffTaichi's: 7 of 512^2), an 8^3 density (128^3), 80 marching steps
# (1000): the rays run 1.6 from the camera, through the box (0.5 to 1.5 away along the axis).
# res is odd on purpose: with an even res the middle column's rays have dir[0] = 0 exactly, and
# for the camera at -pi/2 (cos = -4.4e-8 in f32) their points' z is ~1e-8, which f32 absorbs in
# z + 0.5 (voxel index 4) where float64 keeps it (index 3): a difference of f32 itself, in every
# implementation, that no tolerance covers. With res 15 no sample of this configuration lies
# within 7.4e-5 of a voxel face or the box's faces (checked below), ~500x the f32 rounding of a
# point (<= 1.5e-7), so f32 and float64 read the same voxels.
RES, DENSITY_RES, STEPS, VIEWS = 15, 8, 80, 2


def angles(dtype):
    """The views' angles as the kernels receive them: rounded to the dtype (an f32 scalar)."""
    npt = vkad.numpy_dtype(dtype)
    return [float(npt.type(vr.view_angle(v, VIEWS))) for v in range(VIEWS)]


def points(angle, res=RES, steps=STEPS):
    """DiffTaichi's ray_march's sample points in float64: [x, y, k, 3] (pixel x = pixel // res)."""
    i = np.arange(res)
    x, y = np.meshgrid(i, i, indexing="ij")
    d = np.stack([vr.FOV * (x / (res / 2.0) - 1.0), vr.FOV * (y / (res / 2.0) - 1.0),
                  -np.ones(x.shape)], -1)
    d = d / np.sqrt(np.sum(d * d, -1, keepdims=True))
    s, c = math.sin(angle), math.cos(angle)
    d = np.stack([d[..., 0] * c + d[..., 2] * s, d[..., 1], -d[..., 0] * s + d[..., 2] * c], -1)
    origin = vr.CAMERA_ORIGIN_RADIUS * np.array([s, 0.0, c])
    k = (np.arange(steps) + 1) * vr.DX
    return origin + k[None, None, :, None] * d[:, :, None, :]


def render(density, angle):
    """ray_march in float64: the view's image [y, x]."""
    n = density.shape[0]
    p = points(angle)
    idx = np.clip(np.floor((p + 0.5) * n).astype(int), 0, n - 1)
    flag = np.all((p >= -0.5) & (p < 0.5), -1)
    return np.sum(density[idx[..., 2], idx[..., 1], idx[..., 0]] * flag, -1).T


def reference(density, target_density, dtype=vkad.f32):
    """(images, target_images, loss) of DiffTaichi's forward in float64."""
    a = angles(dtype)
    images = np.stack([render(density, x) for x in a])
    targets = np.stack([render(target_density, x) for x in a])
    return images, targets, np.sum((images - targets) ** 2) / RES ** 2


def _sim(session, dtype=vkad.f32, **kw):
    return vr.VolumeRenderer(session, res=RES, density_res=DENSITY_RES, marching_steps=STEPS,
                             n_views=VIEWS, dtype=dtype, **kw)


def _density(seed=1):
    return np.random.RandomState(seed).uniform(0, 1.0 / DENSITY_RES, (DENSITY_RES,) * 3)


def test_no_sample_lies_near_a_face():
    # The premise of comparing f32 with float64 above: every sample inside the box is at least
    # 5e-5 from a voxel face, and every sample at least 5e-5 from the box's faces (measured
    # 7.46e-5), in both dtypes' angles.
    for dtype in (vkad.f32, vkad.f64):
        for angle in angles(dtype):
            p = points(angle)
            inside = np.all((p >= -0.5) & (p < 0.5), -1)
            assert inside.sum() > 1000  # the rays cross the box
            assert np.min(np.minimum(np.abs(p - 0.5), np.abs(p + 0.5))) > 5e-5
            cell = (p + 0.5) * DENSITY_RES
            assert np.min(np.abs(cell - np.round(cell)).min(-1)[inside]) / DENSITY_RES > 5e-5


def test_the_target_is_difftaichis_torus():
    # create_torus_density on 8^3: voxel corners at multiples of 1/8 - 0.5. The torus lies
    # around the x axis (in_torus(y, x, z)): its tube (radius 0.1) holds corners at x = 0
    # only (x = +-1/8 is 0.125 > 0.1 from its core), where the ring 0.3 < sqrt(y^2 + z^2) < 0.5
    # holds 24 corners, and 2 more exactly on its outer edge (0.5 - 0.4 - 0.1 < 0 after rounding,
    # in f32 as in float64).
    t = vr.torus_density(DENSITY_RES)
    assert t.shape == (8, 8, 8) and set(np.unique(t)) == {0.0, 1.0 / 8}
    i, j, k = np.nonzero(t)  # z, y, x
    assert len(i) == 26 and np.all(k == 4)
    r = np.hypot(j / 8 - 0.5, i / 8 - 0.5)
    assert np.all((r > 0.3 - 1e-12) & (r < 0.5 + 1e-12))
    assert t[1, 4, 4] > 0 and t[4, 4, 4] == 0 and t[4, 1, 4] > 0 and t[4, 4, 1] == 0
    assert np.sum(np.isclose(r, 0.5)) == 2


def test_forward_matches_a_float64_transcription(session):
    # The same samples read the same voxels (test_no_sample_lies_near_a_face), so the images are
    # sums of the same densities (~50 samples per ray inside the box): in f32 a ray's sum errs by
    # <= 50 x 6e-8 = 3e-6 of its value, typically ~sqrt(50) x 6e-8 = 4e-7 (measured 4.0e-7 of
    # the largest image value, 4.9; the targets, sums of 1/8, are exact); the loss (450 squares,
    # 4.76) to ~1e-6 relative (measured 2.6e-8). f64: measured 7e-16. Tolerances: images 2e-6
    # of the largest value (f32) / 1e-12, the loss rel 1e-5 / 1e-12.
    density = _density()
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        sim.set_weights({"density": density})
        d = sim.weights()["density"]  # rounded to the dtype
        want_images, want_targets, want_loss = reference(d, sim.target_density, dtype)
        loss = sim.loss()
        f32 = dtype == vkad.f32
        scale = np.abs(want_images).max()
        assert scale > 0.3 and np.abs(want_targets).max() > 0.3  # the rays see the density
        np.testing.assert_allclose(sim.images(), want_images, rtol=0,
                                   atol=(2e-6 if f32 else 1e-12) * scale, err_msg=str(dtype))
        np.testing.assert_allclose(sim.target_images(), want_targets, rtol=0,
                                   atol=(2e-6 if f32 else 1e-12) * scale, err_msg=str(dtype))
        assert loss == pytest.approx(want_loss, rel=1e-5 if f32 else 1e-12), dtype


# voxels of the density (z, y, x): one between the rays (30 of the 512 are read by no sample at
# 15^2 pixels: gradient 0), one the camera at -pi/2 (on -x) sees first, the middle, the
# torus's, one near the far faces, and one at random
PICKS = [(1, 2, 7), (4, 3, 0), (4, 4, 4), (1, 4, 4), (6, 5, 7), (2, 6, 3)]


def test_loss_gradient_matches_central_differences(session):
    # The loss is quadratic in the density (the images are linear in it), so central
    # differences of the float64 transcription have no truncation error; their rounding is
    # ~eps |L| / h ~ 2e-16 x 4.8 / 1e-4 = 1e-11, 1e-11 of the largest gradient (1.06; measured
    # 6e-12 against vkad's f64 gradient). vkad's gradient adds each sample's 2 (image - target)
    # / res^2 into its voxel with atomic adds: in f32 ~1e-6 relative (measured 3.5e-7 of the
    # largest); tolerance 1e-5 of the largest (f32) / 1e-9 (f64). The picked voxels' gradients
    # are 0 and 0.11 .. 0.88 of the largest: a missed or doubled sample (~2 x 2 / 225 x the
    # residual, ~1e-2 of it), or a wrong flag, is off by far more. The last entry is the
    # derivative along a random direction through every voxel.
    density = _density(2)
    direction = np.random.RandomState(3).randn(*density.shape)
    h = 1e-4
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        sim.set_weights({"density": density})
        d0 = sim.weights()["density"]
        target = sim.target_density
        fd = []
        for idx in PICKS:
            e = np.zeros_like(d0)
            e[idx] = h
            fd.append((reference(d0 + e, target, dtype)[2]
                       - reference(d0 - e, target, dtype)[2]) / (2 * h))
        fd.append((reference(d0 + h * direction, target, dtype)[2]
                   - reference(d0 - h * direction, target, dtype)[2]) / (2 * h))
        sim.forward_backward()
        g = sim.gradients()["density"].astype(np.float64)
        got = np.array([g[idx] for idx in PICKS] + [np.sum(g * direction)])
        scale = np.abs(g).max()
        assert fd[0] == 0 and np.abs(fd[1:]).min() > 2e-2 * scale, (fd, scale)
        tol = (1e-5 if dtype == vkad.f32 else 1e-9) * scale
        np.testing.assert_allclose(got, fd, rtol=0, atol=tol, err_msg=str(dtype))
        # and every voxel: the transcription's gradient, 2 / res^2 sum (image - target) per
        # sample, scattered into the voxels the samples read
        images, targets, _ = reference(d0, target, dtype)
        want = np.zeros_like(d0)
        for v, angle in enumerate(angles(dtype)):
            p = points(angle)
            idx = np.clip(np.floor((p + 0.5) * DENSITY_RES).astype(int), 0, DENSITY_RES - 1)
            flag = np.all((p >= -0.5) & (p < 0.5), -1)
            r = 2 * (images[v] - targets[v]).T / RES ** 2  # [x, y]
            np.add.at(want, (idx[..., 2][flag], idx[..., 1][flag], idx[..., 0][flag]),
                      np.broadcast_to(r[:, :, None], flag.shape)[flag])
        np.testing.assert_allclose(g, want, rtol=0, atol=tol, err_msg=str(dtype))


def test_apply_grad_descends_and_clamps_at_zero(session):
    # DiffTaichi's apply_grad: density = max(density - lr grad, 0). With lr 0.1 from a random
    # density (its images brighter than the targets: the gradient mostly > 0) voxels step below
    # 0 and are clamped (measured 102 of 512), the others stay positive (410; 30 of them read by
    # no ray keep their value).
    lr = 0.1
    sim = _sim(session, learning_rate=lr)
    sim.set_weights({"density": _density(4)})
    d0 = sim.weights()["density"]
    sim.iteration()
    g = sim.gradients()["density"].astype(np.float64)
    want = np.maximum(d0 - lr * g, 0)
    np.testing.assert_allclose(sim.weights()["density"], want, rtol=0, atol=1e-7)
    clamped = d0 - lr * g < 0
    assert clamped.sum() > 50 and np.sum(want > 0) > 200, (clamped.sum(), np.sum(want > 0))


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured and replayed iteration (zeroing, 2 views x (ray_march, compute_loss), their
    # adjoints, apply_grad on the device) against every launch made from Python: the same losses,
    # gradients and updated densities to f32 rounding (atomic sums in another order).
    lr = 0.03
    sims = [_sim(session, graph=g, learning_rate=lr) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    assert losses[1][2] < losses[1][0]  # three different densities
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert_close_by_name(sims[0].weights(), sims[1].weights(), atol_of_max=1e-6)
    assert_close_by_name(sims[0].gradients(), sims[1].gradients(), atol_of_max=1e-5)
    assert sims[0]._graph is not None and sims[1]._graph is None
    # captured: 2 views x (ray_march, compute_loss), their adjoints and apply_grad; a replay
    # runs them with at least the views' compute_loss adjoints (2-d tasks over the same pixels,
    # each writing its own view's row of images.grad) as one fused launch (the graph's fusion is
    # on by default): 8 launches on lavapipe, 7 on an H200, whose session keeps the ray_march
    # kernels' IR and fuses the views' ray_march too (VKAD_GRAPH_TRACE=1 shows the plan)
    assert sims[0]._graph.launches == 4 * VIEWS + 1
    before = session.stats()["launches"]
    sims[0].iteration()
    assert 0 < session.stats()["launches"] - before <= 4 * VIEWS


def test_training_lowers_the_loss(session):
    # From density 0 (DiffTaichi's clear_density) at lr 0.03: lr x the loss's largest curvature
    # (7.4 here) = 0.22, DiffTaichi's own 15 x 0.0149 at its size (the example's docstring). Each
    # of five iterations lowers the loss (measured 0.359 -> 0.148 at the fifth, 0.122 after it),
    # and the first update is density = -lr dL/d density exactly (from 0, the gradient is <= 0:
    # nothing clamps).
    lr = 0.03
    sim = _sim(session, learning_rate=lr)
    first = sim.loss()
    assert sim.weights()["density"].max() == 0
    losses = [sim.iteration()]
    g = sim.gradients()["density"].astype(np.float64)
    assert g.max() <= 0 < -g.min()
    np.testing.assert_allclose(sim.weights()["density"], -lr * g, rtol=1e-6, atol=0)
    losses += [sim.iteration() for _ in range(4)]
    assert losses[0] == pytest.approx(first, rel=1e-6)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert sim.loss() < 0.6 * first, (first, losses)


def test_main_runs_writes_plots_and_its_graph_equals_launches(tmp_path, capsys):
    args = ["--iters", "3", "--steps", str(STEPS), "--res", str(RES), "--density-res",
            str(DENSITY_RES), "--views", str(VIEWS), "--out", str(tmp_path)]
    out = assert_main_graph_equals_launches(vr.main, args, capsys, launched=["--no-graph"])
    assert "2 views of 15^2 pixels, 8^3 density, 80 marching steps, 3 iterations" in out
    assert_plots(tmp_path, "volume_renderer")
