"""examples/diffsim in Python: learn N particles' initial velocities so that after T steps (gravity,
drag, springs) they land on targets. diffsim.py [particles [steps [iterations]]]; .[examples]: tqdm, plot"""
import sys, numpy as np, vkad
N, T, ITERS = ([int(a) for a in sys.argv[1:4]] + [65536, 256, 40][len(sys.argv[1:4]):])
GRAVITY, DRAG, SPRING, LR, SAMPLE = 2.0, 0.4, 3.0, 0.5, 24

def simulate(trace):  # the loss kernel, or (trace) the one recording trajectories
    kb = vkad.KernelBuilder("trace" if trace else "simulate")
    steps, dt, p0 = kb.scalar("steps", vkad.i32), kb.scalar("dt", vkad.f32), kb.ndarray("p0", vkad.f32, 2, readonly=True)
    v0, target = kb.ndarray("v0", vkad.f32, 2, grad=not trace), kb.ndarray("target", vkad.f32, 2, readonly=True)
    out = kb.ndarray("traj", vkad.f32, 3) if trace else kb.ndarray("loss", vkad.f32, 1, grad=True)
    with kb.parallel_for("particles", 0, out.shape[0]) as i:
        ax, ay = p0[i, 0], p0[i, 1]
        px, py, vx, vy = kb.local(ax), kb.local(ay), kb.local(v0[i, 0]), kb.local(v0[i, 1])
        if trace: out[i, 0, 0], out[i, 0, 1] = ax, ay  # noqa: E701
        with kb.for_range(0, steps) as t:
            x, y, u, w = px.value, py.value, vx.value, vy.value
            speed = vkad.sqrt(u * u + w * w + 1e-6)
            vx.value = nu = u + (-DRAG * speed * u - SPRING * (x - ax)) * dt
            vy.value = nw = w + (-DRAG * speed * w - SPRING * (y - ay) - GRAVITY) * dt
            px.value, py.value = nx, ny = x + nu * dt, y + nw * dt
            if trace: out[i, t + 1, 0], out[i, t + 1, 1] = nx, ny  # noqa: E701
        if not trace:
            dx, dy = px.value - target[i, 0], py.value - target[i, 1]
            out[i] = dx * dx + dy * dy
    return kb

kb = vkad.KernelBuilder("update")  # v0 -= lr * grad
lr, v0, g = kb.scalar("lr", vkad.f32), kb.ndarray("v0", vkad.f32, 2), kb.ndarray("g", vkad.f32, 2)
with kb.parallel_for("particles", 0, v0.shape[0]) as i:
    v0[i, 0], v0[i, 1] = v0[i, 0] - lr * g[i, 0], v0[i, 1] - lr * g[i, 1]
s = vkad.Session()
sim, trace, update = s.differentiate(simulate(False)), s.compile(simulate(True)), s.compile(kb)
u = np.random.default_rng(1).random((N, 4), dtype=np.float32)
p0 = np.stack([2 * u[:, 0] - 1, 0.5 * u[:, 1]], 1)  # anchors; targets within +-0.4, -0.5..0.1
targets = p0 + np.stack([0.8 * u[:, 2] - 0.4, 0.6 * u[:, 3] - 0.5], 1)
args, loss, traj = (T, 1.0 / T, s.ndarray(p0), s.zeros((N, 2)), s.ndarray(targets)), s.empty(N), s.empty((SAMPLE, T + 1, 2))
def run(kernel, out):  # a launch, then the readback (the only wait)
    s.launch(kernel, *args, out)
    return out.numpy()
before, losses = run(trace, traj), [run(sim, loss).mean()]
try: from tqdm import tqdm  # noqa: E701
except ImportError: tqdm = iter  # noqa: E701
for it in tqdm(range(1, ITERS + 1)):
    with s.tape() as tape:
        s.launch(sim, *args, loss)  # recorded: backward() launches its adjoint
    tape.backward(seed={loss: 1.0})
    s.launch(update, LR, args[3], tape.grad(args[3]))
    if it % 5 == 0:
        losses.append(run(sim, loss).mean())
print(f"{s.device_name}: loss {losses[0]:.4e} -> {losses[-1]:.4e} ({losses[0] / losses[-1]:.1f}x lower)")
try:
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.semilogy(np.arange(len(losses)) * 5, losses), a.set_title("loss"), b.set_title("before, after, targets")
    for tr, c in ((before, "#bbb"), (run(trace, traj), "#36c")):
        b.plot(tr[:, :, 0].T, tr[:, :, 1].T, c=c, lw=0.8)
    b.scatter(targets[:SAMPLE, 0], targets[:SAMPLE, 1], c="#c33", s=9), fig.savefig("diffsim.png")
except ImportError: pass  # noqa: E701
sys.exit(0 if losses[0] >= 10 * losses[-1] else 1)
