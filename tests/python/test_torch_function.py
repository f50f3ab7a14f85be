"""vkad.torch.function: a differentiated vkad kernel as a torch.autograd.Function. Its gradients
(the adjoint launched by backward) against central finite differences (torch.autograd.gradcheck,
float64), composition with torch layers, the copies it promises (outputs are views of vkad
memory), and its argument errors. Needs PyTorch (scripts/python_tests.sh provides Debian's)."""
import numpy as np
import pytest

import vkad

torch = pytest.importorskip("torch")
import vkad.torch  # noqa: E402


def projectile(dtype):
    """Each row i: a particle launched with velocity v0[i] under gravity and quadratic drag
    drag[i] for `steps` steps; p[i] its final position. A loop with loop-carried state, so the
    adjoint replays it through adstacks."""
    kb = vkad.KernelBuilder("projectile")
    steps = kb.scalar("steps", vkad.i32)
    dt = kb.scalar("dt", dtype)
    v0 = kb.ndarray("v0", dtype, 2, grad=True)
    drag = kb.ndarray("drag", dtype, 1, grad=True)
    p = kb.ndarray("p", dtype, 2, grad=True)
    with kb.parallel_for("main", 0, v0.shape[0]) as i:
        k = drag[i]
        x, y = kb.local(v0[i, 0] * 0.0), kb.local(v0[i, 0] * 0.0)
        u, w = kb.local(v0[i, 0]), kb.local(v0[i, 1])
        with kb.for_range(0, steps):
            speed = vkad.sqrt(u.value * u.value + w.value * w.value + 1e-6)
            nu = u.value - k * speed * u.value * dt
            nw = w.value - (k * speed * w.value + 9.81) * dt
            x.value, y.value = x.value + nu * dt, y.value + nw * dt
            u.value, w.value = nu, nw
        p[i, 0], p[i, 1] = x.value, y.value
    return kb


def session_device(s):
    return "cpu" if s.empty(1).__dlpack_device__()[0] == 1 else f"cuda:{s.empty(1).__dlpack_device__()[1]}"


@pytest.fixture(scope="module")
def sim64(session):
    from conftest import f64_ok
    if not f64_ok(session):
        pytest.skip("no f64 kernels on this device")
    return vkad.torch.function(session.differentiate(projectile(vkad.f64)), session)


def test_gradients_match_finite_differences(session, sim64):
    dev = session_device(session)
    gen = torch.Generator().manual_seed(0)
    v0 = (torch.rand(5, 2, generator=gen, dtype=torch.float64) * 4 + 1).to(dev).requires_grad_()
    drag = (torch.rand(5, generator=gen, dtype=torch.float64) * 0.3).to(dev).requires_grad_()
    p0 = torch.zeros(5, 2, dtype=torch.float64, device=dev)

    def f(v, k):
        return sim64.apply(40, 0.01, v, k, p0)

    # Central differences in f64 against the adjoint; the kernel is smooth, so eps 1e-6 gives
    # ~1e-9 truncation and rounding error against gradients of order 1.
    assert torch.autograd.gradcheck(f, (v0, drag), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_composes_with_torch_layers(session, sim64):
    dev = session_device(session)
    torch.manual_seed(1)
    layer = torch.nn.Linear(3, 2).double().to(dev)
    z = torch.randn(4, 3, dtype=torch.float64, device=dev)
    drag = torch.full((4,), 0.1, dtype=torch.float64, device=dev)

    def loss_of(weight):
        v = torch.nn.functional.linear(z, weight, layer.bias) + 3.0
        p = sim64.apply(30, 0.01, v, drag, torch.zeros(4, 2, dtype=torch.float64, device=dev))
        return (p ** 2).sum()

    w = layer.weight.detach().clone().requires_grad_()
    loss = loss_of(w)
    loss.backward()
    # The chain through torch's layer: one weight entry against a central difference.
    h = 1e-6
    wp, wm = w.detach().clone(), w.detach().clone()
    wp[1, 2] += h
    wm[1, 2] -= h
    fd = (loss_of(wp) - loss_of(wm)).item() / (2 * h)
    assert w.grad[1, 2].item() == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_outputs_are_views_and_inputs_untouched(session, sim64):
    dev = session_device(session)
    v0 = torch.tensor([[1.0, 2.0]], dtype=torch.float64, device=dev)
    drag = torch.tensor([0.2], dtype=torch.float64, device=dev)
    p0 = torch.full((1, 2), 5.0, dtype=torch.float64, device=dev)
    p = sim64.apply(10, 0.01, v0, drag, p0)
    assert p.shape == (1, 2) and p.dtype == torch.float64 and str(p.device) == dev
    assert torch.equal(p0, torch.full((1, 2), 5.0, dtype=torch.float64, device=dev))
    # A closed form check of the first step's physics: with 1 step, x = u' dt, y = w' dt.
    p1 = sim64.apply(1, 0.01, v0, drag, p0)
    speed = np.sqrt(1 + 4 + 1e-6)
    nu, nw = 1 - 0.2 * speed * 1 * 0.01, 2 - (0.2 * speed * 2 + 9.81) * 0.01
    np.testing.assert_allclose(p1.cpu().numpy(), [[nu * 0.01, nw * 0.01]], rtol=1e-12)


def test_in_place_change_of_an_output_is_refused(session, sim64):
    dev = session_device(session)
    v0 = torch.ones(2, 2, dtype=torch.float64, device=dev, requires_grad=True)
    drag = torch.full((2,), 0.1, dtype=torch.float64, device=dev)
    p = sim64.apply(5, 0.01, v0, drag, torch.zeros(2, 2, dtype=torch.float64, device=dev))
    q = p * 1.0
    p.add_(1.0)  # the output is saved for backward: torch notices
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        q.sum().backward()


def test_argument_errors(session, sim64):
    dev = session_device(session)
    ok = dict(v=torch.ones(2, 2, dtype=torch.float64, device=dev),
              k=torch.ones(2, dtype=torch.float64, device=dev),
              p=torch.zeros(2, 2, dtype=torch.float64, device=dev))
    with pytest.raises(vkad.InvalidArgumentError, match=r"argument 2 \('v0'\): expected "
                                                        "torch.float64, got torch.float32"):
        sim64.apply(3, 0.01, ok["v"].float(), ok["k"], ok["p"])
    with pytest.raises(vkad.InvalidArgumentError, match=r"argument 3 \('drag'\): expected a tensor "
                                                        r"of rank 1, got shape \(2, 1\)"):
        sim64.apply(3, 0.01, ok["v"], ok["k"].reshape(2, 1), ok["p"])
    with pytest.raises(vkad.InvalidArgumentError, match=r"argument 2 \('v0'\): the tensor is on "
                                                        "meta"):
        sim64.apply(3, 0.01, torch.empty(2, 2, dtype=torch.float64, device="meta"), ok["k"],
                    ok["p"])
    with pytest.raises(vkad.InvalidArgumentError, match=r"argument 4 \('p'\): expected a "
                                                        "torch.Tensor, got list"):
        sim64.apply(3, 0.01, ok["v"], ok["k"], [0.0])
    with pytest.raises(vkad.InvalidArgumentError, match="4 arguments given, the kernel takes 5"):
        sim64.apply(3, 0.01, ok["v"], ok["k"])
    # Non-contiguous tensors are made contiguous (a copy in torch), not refused.
    wide = torch.ones(2, 4, dtype=torch.float64, device=dev)[:, ::2]
    assert sim64.apply(3, 0.01, wide, ok["k"], ok["p"]).shape == (2, 2)
    with pytest.raises(vkad.InvalidArgumentError, match="expected what Session.differentiate"):
        vkad.torch.function("not a kernel", session)


def test_f32_kernel_trains_a_torch_parameter(session):
    sim = vkad.torch.function(session.differentiate(projectile(vkad.f32)), session)
    dev = session_device(session)
    v = torch.nn.Parameter(torch.tensor([[2.0, 2.0]], device=dev))
    drag = torch.tensor([0.1], device=dev)
    target = torch.tensor([[1.0, 0.0]], device=dev)
    opt = torch.optim.Adam([v], lr=0.1)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        p = sim.apply(50, 0.01, v, drag, torch.zeros(1, 2, device=dev))
        loss = ((p - target) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.01 * losses[0]


def test_torch_mix_example_trains(tmp_path):
    """examples/torch_mix/train.py (an MLP proposing launch velocities, the vkad simulation,
    Adam) exits 0 only when the loss fell at least 10x."""
    import os
    import pathlib
    import subprocess
    import sys
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch_mix" / "train.py"
    r = subprocess.run([sys.executable, str(example), "--iters", "80", "--batch", "64"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, VKAD_VALIDATION="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[vkad validation]" not in r.stderr, r.stderr
    assert "lower)" in r.stdout
