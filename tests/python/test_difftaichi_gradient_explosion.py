"""examples/difftaichi/gradient_explosion.py (DiffTaichi's damped point whose gradient explodes
without damping) at DiffTaichi's own sizes (num_steps up to 950, one scalar per step: already
small): the forward against a float64 numpy transcription of advance / compute_loss, the gradient
against central differences of that transcription and against its closed form (f32 and f64), a
replayed (graph) evaluation against a launched one, and DiffTaichi's scan (quadratic growth
without damping, linear with it). DiffTaichi has no optimiser for this program, so there is no
training to test."""
import math

import numpy as np
import pytest

import vkad
from difftaichi_checks import dtypes, load_example

ge = load_example("gradient_explosion")
DT = ge.DT
# (alpha, num_steps): no damping and DiffTaichi's strongest, short and at the scan's longest
POINTS = ((0, 950), (1, 500), (3, 950), (10, 950), (10, 50))


def reference(a, damping, num_steps, steps=ge.STEPS):
    """DiffTaichi's gradient(alpha, num_steps) in float64 numpy: (x, v, loss)."""
    x, v = np.zeros(steps), np.zeros(steps)
    for t in range(1, num_steps):
        v[t] = damping * v[t - 1] + a
        x[t] = x[t - 1] + DT * v[t]
    return x, v, x[max(num_steps - 1, 0)]


def _sim(session, dtype=vkad.f32, **kw):
    return ge.GradientExplosion(session, dtype=dtype, **kw)


def test_forward_matches_a_float64_transcription(session):
    # f64: the same operations in the same order: equal to 1e-12 relative. f32: v[t] = d v[t-1]
    # + 1 rounds by <= 2^-24 relative a step, so after t steps v is off by <= t * 6e-8
    # relative (949 steps: 5.7e-5; exact for alpha = 0, where every v[t] is an integer); x adds
    # dt v to a sum up to 450, rounding by <= ulp(450) / 2 = 1.5e-5 a step: <= 949 * 1.5e-5 =
    # 1.4e-2 absolute, 3e-5 of 450 (measured: x 1.6e-6, v 3.8e-6 of their largest, the loss
    # 1.4e-6 relative). Tolerance 1e-4 of each array's largest element, and 1e-4 relative on
    # the loss.
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        for alpha, n in POINTS:
            loss = sim.evaluate(alpha, n)
            x, v, want = reference(1.0, math.exp(-DT * alpha), n)
            rel = 1e-4 if dtype == vkad.f32 else 1e-12
            for name, w in (("x", x), ("v", v)):
                got = sim.arrays[name].numpy()
                np.testing.assert_allclose(got[:n], w[:n], rtol=0, atol=rel * np.abs(w).max(),
                                           err_msg=f"{dtype} {name} alpha={alpha} n={n}")
            assert loss == pytest.approx(want, rel=rel), (dtype, alpha, n)


def test_gradient_matches_its_closed_form_and_central_differences(session):
    # x is linear in a from rest, so d loss / d a = loss / a = loss at a = 1 (why DiffTaichi's
    # gradient() returns the loss); without damping it is dt T (T + 1) / 2, T = num_steps - 1.
    # Central differences of the f64 transcription: its loss (up to 450) carries the rounding
    # of T <= 949 additions, <= 949 * ulp(450) / 2 = 2.7e-11. In a the loss is linear (no
    # truncation): h = 1e-3, error <= 2.7e-11 / 2e-3 ~ 1e-8, 3e-11 relative. In damping it is
    # a polynomial of degree T: at h = 1e-7 truncation ~h^2 / 6 * dt T^5 / 60 ~ 2e-5 and
    # rounding 2.7e-11 / 2e-7 = 1.4e-4, against gradients ~1e5: ~1e-9 relative. Tolerance 1e-7
    # relative for both in f64 (the device's f64 adjoint is exact to ~1e-13); in f32 the adjoint
    # sums T terms as the forward does: 1e-4 relative (the forward's bound; measured <= 6.4e-6). Where the damping
    # matters least (alpha = 0, n = 950) it still moves the loss by dt T^3 / 6 ~ 1.4e5 per unit.
    for dtype in dtypes(session):
        sim = _sim(session, dtype, graph=False)
        rel = 1e-4 if dtype == vkad.f32 else 1e-10
        fd_rel = max(rel, 1e-7)
        for alpha, n in POINTS:
            loss = sim.evaluate(alpha, n)
            g = {p: float(a[0]) for p, a in sim.gradients().items()}
            d = math.exp(-DT * alpha)
            assert g["a"] == pytest.approx(loss, rel=rel), (dtype, alpha, n)
            assert g["a"] == pytest.approx(reference(1.0, d, n)[2], rel=rel)
            if alpha == 0:
                assert g["a"] == pytest.approx(DT * (n - 1) * n / 2, rel=rel)
            h = 1e-3
            fd_a = (reference(1.0 + h, d, n)[2] - reference(1.0 - h, d, n)[2]) / (2 * h)
            h = 1e-7
            fd_d = (reference(1.0, d + h, n)[2] - reference(1.0, d - h, n)[2]) / (2 * h)
            assert g["a"] == pytest.approx(fd_a, rel=fd_rel)
            assert g["damping"] == pytest.approx(fd_d, rel=fd_rel), (dtype, alpha, n)


def test_num_steps_0_and_1_read_x0(session):
    # DiffTaichi's num_steps = 0 reads x[-1] (outside its field); the port reads x[0] = 0 for
    # both: no step, a zero loss and gradient.
    sim = _sim(session)
    for n in (0, 1):
        assert sim.evaluate(0, n) == 0.0
        assert all(float(a[0]) == 0.0 for a in sim.gradients().values())


def test_a_replayed_evaluation_equals_a_launched_one(session):
    # The captured and replayed evaluations (one graph per num_steps, damping uploaded before
    # each replay) against every launch made from Python: the same operations, so the same
    # losses and gradients to f32 rounding (1e-6 relative), over every point twice.
    sims = [_sim(session, graph=g, loop=g) for g in (True, False)]
    results = [[], []]
    for rnd in range(2):
        for alpha, n in POINTS:
            for sim, out in zip(sims, results):
                loss = sim.evaluate(alpha, n)
                g = sim.gradients()
                out.append((loss, float(g["a"][0]), float(g["damping"][0])))
        if rnd == 0:
            for graph in sims[0]._graphs.values():
                session.finish_rework(graph)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
    assert sorted(sims[0]._graphs) == [50, 500, 950] and not sims[1]._graphs
    assert any(isinstance(r, vkad.LoopRecord) for r in sims[0].tape.launches)
    assert not any(isinstance(r, vkad.LoopRecord) for r in sims[1].tape.launches)
    # a replay: the loop, compute_loss and their adjoints. DiffTaichi's advance is top-level
    # statements (a serial task), whose step loop rolls into one resident kernel each way:
    # 2 * 949 + 2 launches if it did not.
    assert sims[0].rolled
    before = session.stats()["launches"]
    sims[0].evaluate(1, 950)
    assert session.stats()["launches"] - before == 4
    # iteration() walks the four alphas at `steps`
    alphas = [sims[1].iteration() for _ in range(4)]
    want = [reference(1.0, math.exp(-DT * a), ge.STEPS)[2] for a in ge.ALPHAS]
    np.testing.assert_allclose(alphas, want, rtol=1e-4)


def test_difftaichis_scan_explodes_without_damping(session):
    # DiffTaichi's figure: over num_steps 0 .. 950 the undamped gradient grows quadratically
    # (dt T (T + 1) / 2: its increments grow linearly), each damped one stays below it, and the
    # most damped (alpha = 10, damping 0.99) grows linearly at the end (increments within 2% of
    # each other: v has reached its limit 1 / (1 - 0.99) = 100, x grows by dt 100 per step).
    sim = _sim(session)
    curves = ge.scan(sim, ge.STEPS)
    assert list(curves) == list(ge.ALPHAS)
    xs, undamped = curves[0]
    assert xs == list(range(0, 1000, 50))
    np.testing.assert_allclose(undamped, [DT * max(n - 1, 0) * n / 2 for n in xs], rtol=1e-4)
    inc = np.diff(undamped)
    assert np.all(np.diff(inc) > 0)  # convex: the explosion
    for alpha in ge.ALPHAS[1:]:
        assert np.all(np.array(curves[alpha][1])[2:] < np.array(undamped)[2:]), alpha
    late = np.diff(curves[10][1])[-4:]
    np.testing.assert_allclose(late, late.mean(), rtol=0.02)
    assert late.mean() == pytest.approx(DT * 100 * 50, rel=0.02)


def test_main_runs_and_writes_its_plot(tmp_path, capsys):
    assert ge.main(["--out", str(tmp_path), "--steps", "200"]) == 0
    out = capsys.readouterr().out
    assert "num_steps 0 .. 150 by 50, alpha 0, 1, 3, 10" in out
    assert "alpha  0: d loss / d a at num_steps 150: 11.1750" in out  # dt 149 * 150 / 2
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        assert not list(tmp_path.iterdir())
        return
    assert (tmp_path / "gradient_explosion_scan.png").stat().st_size > 0
