"""examples/difftaichi/water_renderer.py (DiffTaichi's wave seen through: the last step's height
gradient refracts a bottom image) at a reduced size -- a 48^2 grid, 48 steps (the drop's ripple
reaches the loss's crop): the forward against a float64 numpy transcription of initialize / fdtd /
compute_height_gradient / render_refract / compute_loss, the gradient against central
differences of that transcription (f32 and f64), a replayed (graph) iteration against a launched
one, and training lowering the loss."""
import math

import numpy as np
import pytest

import vkad
from difftaichi_checks import (assert_main_graph_equals_launches, dtypes, load_example,
                               replayed_and_launched)

wr = load_example("water_renderer")
GRID, STEPS = 48, 48


def reference(initial, n=GRID, steps=STEPS):
    """DiffTaichi's forward in float64 numpy, a neighbour outside the grid 0: (p, height
    gradient, image, loss), the target the drop's image."""
    k = wr.wave.constants(n)
    p = np.zeros((steps, n, n))
    p[0] = initial

    def padded(a):
        return np.pad(a, 1)

    def lap(a):
        q = padded(a)
        return k["inv_dx2"] * (-4 * a + q[1:-1, :-2] + q[1:-1, 2:] + q[2:, 1:-1] + q[:-2, 1:-1])

    for t in range(2, steps):
        p[t] = 2 * p[t - 1] + k["k_q"] * lap(p[t - 1]) - p[t - 2]
    q = padded(p[-1])
    grad = 0.5 * n * np.stack([q[2:, 1:-1] - q[:-2, 1:-1], q[1:-1, 2:] - q[1:-1, :-2]], -1)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    sx = np.clip(i - grad[..., 0] * wr.REFRACT_SCALE, 0, n - 1)
    sy = np.clip(j - grad[..., 1] * wr.REFRACT_SCALE, 0, n - 1)
    xi, yi = np.floor(sx).astype(int), np.floor(sy).astype(int)
    xj, yj = np.minimum(xi + 1, n - 1), np.minimum(yi + 1, n - 1)
    fx, fy = (sx - xi)[..., None], (sy - yi)[..., None]
    b = wr.bottom_image(n)
    image = (1 - fx) * ((1 - fy) * b[xi, yi] + fy * b[xi, yj]) \
        + fx * ((1 - fy) * b[xj, yi] + fy * b[xj, yj])
    return p, grad, image


def drop(n=GRID):
    d = np.zeros((n, n))
    d[n // 2, n // 2] = 1
    return d


def loss_of(image, target, n=GRID):
    lo, hi = wr.crop(n)
    return 0.5 * wr.SEED_SCALE * np.sum((image[lo:hi, lo:hi] - target[lo:hi, lo:hi]) ** 2)


# a height field away from DiffTaichi's start (initial = 0, where every sample lies on a cell:
# bilinear interpolation's kink, so one-sided): half a drop and a smooth seeded bump field
def moved(n=GRID):
    rng = np.random.RandomState(5)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    bumps = sum(rng.randn() * 0.02 * np.exp(-((i - rng.uniform(8, n - 8)) ** 2
                                               + (j - rng.uniform(8, n - 8)) ** 2) / 18)
                for _ in range(6))
    return 0.5 * drop(n) + bumps


def _sim(session, dtype=vkad.f32, **kw):
    return wr.WaterRenderer(session, steps=STEPS, n_grid=GRID, dtype=dtype, **kw)


def test_the_target_is_the_drops_image(session):
    # DiffTaichi's main(): initial = 1 at the centre, its first render, initial = 0 again; the
    # ripple moves the image (it differs from the bottom image inside the loss's crop) and the
    # training starts from 0, whose image is the bottom image itself.
    sim = _sim(session, graph=False)
    assert not sim.weights()["initial"].any()
    _, _, want = reference(drop())
    np.testing.assert_allclose(sim.target_image, want, rtol=0, atol=1e-5)
    lo, hi = wr.crop(GRID)
    assert np.abs(want - sim.bottom)[lo:hi, lo:hi].max() > 0.05
    sim.loss()
    np.testing.assert_allclose(sim.image(), sim.bottom, rtol=0, atol=1e-6)
    assert wr.crop(256) == (16, 240)  # DiffTaichi's 224^2 centre


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations (the loss's atomic sum in another order): measured equal, loss
    # 6e-16; tolerance 1e-12 on the heights and images, 1e-10 relative on the loss. f32: 46
    # steps of fdtd round each height by ~6e-8 of its size (<= 1 at the drop) a step, growing
    # at most linearly (<= 3e-6; measured 1.6e-7); the height gradient is 24 x neighbours'
    # differences (measured 1.7e-6), the sample moves 2 x that and the image ~0.2 x the
    # sample's move (the pattern's slope; measured 1.7e-7), the loss 1.3e-7 relative:
    # tolerances p 2e-6, height gradient 2e-5, image 2e-6, loss 1e-5 relative (the drop's own
    # loss is 0: 1e-12 absolute).
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        tol = ({"p": 2e-6, "g": 2e-5, "image": 2e-6, "loss": 1e-5} if dtype == vkad.f32 else
               {"p": 1e-12, "g": 1e-12, "image": 1e-12, "loss": 1e-10})
        for initial in (drop(), moved()):
            sim.set_weights({"initial": initial})
            loss = sim.loss()
            p, grad, image = reference(initial)
            np.testing.assert_allclose(sim.heights(), p, rtol=0, atol=tol["p"], err_msg="p")
            np.testing.assert_allclose(sim.arrays["height_gradient"].numpy(), grad, rtol=0,
                                       atol=tol["g"], err_msg="height gradient")
            np.testing.assert_allclose(sim.image(), image, rtol=0, atol=tol["image"])
            want = loss_of(image, sim.target_image)
            assert loss == pytest.approx(want, rel=tol["loss"], abs=1e-12)


def test_gradient_matches_central_differences(session):
    # d loss / d initial at cells of the moved field and along a random direction, against
    # central differences of the f64 transcription at h = 1e-6 (the samples lie off the cells'
    # kinks: the differences at h and h / 10 agree, checked). Truncation ~h^2, rounding ~1e-16
    # |L| / h: tolerance 1e-8 of the largest in f64 (measured 5.9e-11). In f32 the adjoint
    # retraces the forward's rounding (above): measured 1.1e-5 of the largest, tolerance 2e-4.
    h = 1e-6
    w0 = moved()
    target = reference(drop())[2]
    rng = np.random.RandomState(1)
    direction = rng.randn(GRID, GRID)
    cells = [(GRID // 2, GRID // 2), (GRID // 2 + 3, GRID // 2 - 5), (10, 30)]

    def fd(d, step):
        return (loss_of(reference(w0 + step * d)[2], target)
                - loss_of(reference(w0 - step * d)[2], target)) / (2 * step)

    wants = []
    for c in cells + [None]:
        d = direction if c is None else np.zeros((GRID, GRID))
        if c is not None:
            d[c] = 1
        wants.append(fd(d, h))
        assert wants[-1] == pytest.approx(fd(d, h / 10), rel=1e-4, abs=1e-9)
    wants = np.array(wants)
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        sim.set_weights({"initial": w0})
        sim.forward_backward()
        g = sim.gradients()["initial"].astype(np.float64)
        got = np.array([g[c] for c in cells] + [np.sum(g * direction)])
        scale = np.abs(wants).max()
        tol = (2e-4 if dtype == vkad.f32 else 1e-8) * scale
        np.testing.assert_allclose(got, wants, rtol=0, atol=tol, err_msg=str(dtype))
        assert np.abs(wants[:3]).min() > 1e-3 * scale  # the cells' gradients are there


def test_a_replayed_iteration_equals_a_launched_one(session):
    # The captured iteration (zeroing, forward, backward, DiffTaichi's update) replayed against
    # every launch from Python: the same losses and initial heights to f32 rounding (the loss's
    # atomic sum in another order) over three iterations.
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    losses = replayed_and_launched(session, sims)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    w = [sim.weights()["initial"] for sim in sims]
    np.testing.assert_allclose(w[0], w[1], rtol=0, atol=1e-6 * np.abs(w[1]).max())
    assert sims[0]._graph is not None and sims[1]._graph is None


def test_training_lowers_the_loss(session):
    # DiffTaichi's update, initial -= 0.1 d loss / d initial, from 0: the first update is that
    # to f32 rounding, and each of five iterations lowers the loss.
    sim = _sim(session)
    losses = [sim.iteration()]
    g = sim.gradients()["initial"].astype(np.float64)
    assert np.abs(g).max() > 0
    np.testing.assert_allclose(sim.weights()["initial"], -wr.LEARNING_RATE * g, rtol=1e-6,
                               atol=1e-12)
    losses += [sim.iteration() for _ in range(4)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert math.isfinite(sim.loss()) and sim.loss() < losses[-1]


def test_main_runs_and_writes_plots(tmp_path, capsys):
    args = ["--iters", "2", "--steps", "24", "--grid", "32", "--out", str(tmp_path)]
    out = assert_main_graph_equals_launches(wr.main, args, capsys)
    assert "32^2 grid, 24 steps, 2 iterations" in out
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        assert not list(tmp_path.iterdir())
        return
    assert (tmp_path / "water_renderer_loss.png").stat().st_size > 0
    assert (tmp_path / "water_renderer_final.png").stat().st_size > 0
