"""DiffTaichi's water_renderer.py on vkad: a wave's start learns the image its refraction shows.

    python examples/difftaichi/water_renderer.py                 # 256^2 grid, 256 steps, 10 iters

DiffTaichi's examples/water_renderer.py (github.com/taichi-dev/difftaichi) is its wave.py
simulation -- a height field p[t, i, j] on 256^2 cells, c = 340, no damping, dt = dx / (sqrt(3)
c), 256 steps of fdtd from p[0] = initial -- seen through: compute_height_gradient(t) takes the
last step's central differences, and render_refract looks up the bottom image (256^2 x 3) at each
cell moved by -2 x that gradient (clamped to the image, bilinear). Gradient descent on `initial`
(rate 0.1, 10 iterations, from 0) then changes the rendered image. So the port is
examples/difftaichi/wave.py's Wave (its initialize and fdtd kernels, its step loop) with this
file's compute_height_gradient, render_refract, loss and update (@vkad.kernel functions).

**Its image and its loss are downloads; the port draws both from what the script carries.**
DiffTaichi reads squirrel.jpg (not in its repository) as the bottom image, and its loss is an
adversarial one: VGG16 with ImageNet weights (adversarial.py, torchvision's pretrained download)
scores the 224^2 centre of the rendered image for class 1, and its input gradient times 0.001
seeds refracted_image.grad. Here the bottom image is a smooth colour pattern (bottom_image(): two
sine gratings per channel, values in [0.25, 0.75], a gradient everywhere so that every moved
sample changes the image), and the target is the image the script itself renders first: the
surface after a unit drop at the centre, DiffTaichi's `initial[n // 2, n // 2] = 1;
forward('water_renderer/initial')`. The loss is 0.001 x 0.5 sum (image - target)^2 over the same
224^2 centre, so d loss / d image is 0.001 x (image - target) where DiffTaichi's is 0.001 x VGG's:
the same seeding scale of a loss the device can compute, and training from initial = 0 learns a
height field whose refraction reproduces the drop's.

What vkad does instead of Taichi's behaviour:
- DiffTaichi's laplacian and gradient read p[t, i +- 1, j +- 1] without a bound check ("TODO:
  there may be out-of-bound accesses here"); the port uses wave.py's fdtd (a neighbour outside
  the grid reads 0, as DiffTaichi's wave.py) and the same rule in compute_height_gradient.
- render_refract's clamp leaves sample_x = n - 1 possible, where DiffTaichi reads
  bottom_image[n, ...] with weight frac_x = 0; the port clamps that neighbour to n - 1 (the same
  value: its weight is 0).
- DiffTaichi records compute_height_gradient and render_refract on its tape as here; the loss is
  a kernel (compute_loss) rather than host code seeding refracted_image.grad, so the iteration
  (zeroing, forward, backward, the update) is captured as one graph and replayed.
- DiffTaichi's p has max_steps = 256 rows; the same here. With matplotlib,
  water_renderer_loss.png and water_renderer_final.png (the bottom image, the target, the
  rendered image and the learned initial height) go into --out.
"""
import importlib.util
import os
import sys
from typing import List, Optional, Sequence

import numpy as np

import vkad

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from training import arguments, open_session, train  # noqa: E402
from vkad import Vector  # noqa: E402

# examples/difftaichi/wave.py (the simulation this one renders), by its path: `import wave` may
# find the standard library's module of that name
_spec = importlib.util.spec_from_file_location("difftaichi_wave", os.path.join(HERE, "wave.py"))
wave = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wave)

# DiffTaichi's constants (examples/water_renderer.py); the wave's are wave.py's
N_GRID, STEPS = wave.N_GRID, wave.STEPS
LEARNING_RATE = 0.1
ITERS = 10
REFRACT_SCALE = 2.0   # render_refract's `scale`
CROP = (16, 240)      # the 224^2 centre DiffTaichi feeds to VGG
SEED_SCALE = 0.001    # DiffTaichi's refracted_image.grad = vgg_grad * 0.001


def bottom_image(n_grid: int = N_GRID) -> np.ndarray:
    """The bottom image in place of squirrel.jpg: (n, n, 3) float64 in [0.25, 0.75], a sine
    grating along each axis per channel (periods 32 and 24 cells, phases by channel)."""
    i, j = np.meshgrid(np.arange(n_grid), np.arange(n_grid), indexing="ij")
    k = np.arange(3)[None, None, :]
    return 0.5 + 0.125 * (np.sin(2 * np.pi * i[..., None] / 32 + 2 * np.pi * k / 3)
                          + np.cos(2 * np.pi * j[..., None] / 24 - k))


def crop(n_grid: int):
    """The loss's rows and columns: DiffTaichi's [16, 240) at 256, scaled for other grids."""
    lo = CROP[0] * n_grid // N_GRID
    return lo, n_grid - lo


# --- kernels -------------------------------------------------------------------------------------

def build_kernels(ft: vkad.DType, n_grid: int):
    """compute_height_gradient(t), render_refract and compute_loss (differentiated), and
    apply_grad (the update), as @vkad.kernel functions."""
    inv_dx = float(n_grid)
    lo, hi = crop(n_grid)
    vec = vkad.vec(2, ft)
    image = vkad.array(ft, ndim=3, grad=True)  # refracted_image[i, j, k]

    @vkad.func
    def get_p(p, t, i, j):  # p[t, i, j], 0 outside the grid (wave.py's rule)
        inside = i >= 0 and i < n_grid and j >= 0 and j < n_grid
        return vkad.select(inside, p[t, min(max(i, 0), n_grid - 1),
                                     min(max(j, 0), n_grid - 1)], 0.0)

    @vkad.kernel
    def compute_height_gradient(t: vkad.i32, p: vkad.array(ft, ndim=3, grad=True),
                                height_gradient: vkad.array(vec, ndim=2, grad=True)):
        for i, j in vkad.ndrange(n_grid, n_grid):
            height_gradient[i, j] = 0.5 * inv_dx * Vector([
                get_p(p, t, i + 1, j) - get_p(p, t, i - 1, j),
                get_p(p, t, i, j + 1) - get_p(p, t, i, j - 1)])

    @vkad.kernel
    def render_refract(height_gradient: vkad.array(vec, ndim=2, grad=True),
                       bottom_image: vkad.array(ft, ndim=3, readonly=True),
                       refracted_image: image):
        for i, j in vkad.ndrange(n_grid, n_grid):
            grad = height_gradient[i, j]
            sample_x = vkad.cast(i, ft) - grad[0] * REFRACT_SCALE
            sample_y = vkad.cast(j, ft) - grad[1] * REFRACT_SCALE
            sample_x = min(n_grid - 1.0, max(0.0, sample_x))
            sample_y = min(n_grid - 1.0, max(0.0, sample_y))
            xi = vkad.cast(vkad.floor(sample_x), vkad.i32)
            yi = vkad.cast(vkad.floor(sample_y), vkad.i32)
            xj, yj = min(xi + 1, n_grid - 1), min(yi + 1, n_grid - 1)  # weight 0 at the edge
            frac_x = sample_x - vkad.cast(xi, ft)
            frac_y = sample_y - vkad.cast(yi, ft)
            for k in vkad.static(range(3)):
                refracted_image[i, j, k] = (1.0 - frac_x) * (
                    (1.0 - frac_y) * bottom_image[xi, yi, k] + frac_y * bottom_image[xi, yj, k]
                ) + frac_x * ((1.0 - frac_y) * bottom_image[xj, yi, k]
                              + frac_y * bottom_image[xj, yj, k])

    @vkad.kernel
    def compute_loss(refracted_image: image,
                     target_image: vkad.array(ft, ndim=3, readonly=True),
                     loss: vkad.array(ft, ndim=0, grad=True)):
        for i, j in vkad.ndrange((lo, hi), (lo, hi)):
            d = refracted_image[i, j, 0] - target_image[i, j, 0]
            err = d * d
            for k in vkad.static(range(1, 3)):
                d = refracted_image[i, j, k] - target_image[i, j, k]
                err += d * d
            loss[None] += 0.5 * SEED_SCALE * err

    @vkad.kernel
    def apply_grad(initial: vkad.array(ft, ndim=2),
                   initial_grad: vkad.array(ft, ndim=2, readonly=True)):
        for i, j in vkad.ndrange(n_grid, n_grid):  # DiffTaichi's gradient descent
            initial[i, j] = initial[i, j] - LEARNING_RATE * initial_grad[i, j]

    return {"compute_height_gradient": compute_height_gradient,
            "render_refract": render_refract, "compute_loss": compute_loss}, apply_grad


class WaterRenderer(wave.Wave):
    """Wave with DiffTaichi's renderer: forward() simulates, takes the last step's height
    gradient, renders the refracted image and its loss; iteration() runs forward, backward and
    DiffTaichi's update (rate 0.1) and returns the loss (before the update). The target is the
    image of a unit drop at the centre (target_image()), rendered at construction."""

    NAME = "water_renderer"

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 loop: bool = True):
        # wave.py's loss target is unused here (DiffTaichi's water_renderer declares it too)
        super().__init__(session, steps, n_grid, dtype, seed, graph, loop=False,
                         target=np.zeros((n_grid, n_grid)))
        kernels, apply_grad = build_kernels(dtype, n_grid)
        self.kernels.update({name: session.differentiate(k) for name, k in kernels.items()})
        s, npt = session, vkad.numpy_dtype(dtype)
        self.bottom = bottom_image(n_grid)
        self.arrays.update({
            "height_gradient": s.zeros((n_grid, n_grid, 2), dtype, "height_gradient"),
            "bottom_image": s.ndarray(self.bottom, npt, "bottom_image"),
            "refracted_image": s.zeros((n_grid, n_grid, 3), dtype, "refracted_image"),
            "target_image": s.zeros((n_grid, n_grid, 3), dtype, "target_image"),
        })
        self.lazy_grad(["p", "initial", "height_gradient", "refracted_image"])
        self._apply_grad = self.bind_update(s.compile(apply_grad))
        self.target_image = self.render_drop()
        self.arrays["target_image"].upload(self.target_image.astype(npt))
        self.loop = loop
        if loop:
            self.s.prepare_loop(2, steps, self._step(True))

    def render_drop(self) -> np.ndarray:
        """The image of DiffTaichi's first render: initial = 1 at the centre cell, then 0 again
        (its main()). (n, n, 3) float64."""
        drop = np.zeros((self.n_grid, self.n_grid))
        drop[self.n_grid // 2, self.n_grid // 2] = 1
        self.set_weights({"initial": drop})
        self.forward(recorded=False)
        image = self.arrays["refracted_image"].numpy().astype(np.float64)
        self.set_weights({"initial": np.zeros_like(drop)})
        return image

    def forward(self, recorded: bool = True) -> None:
        """DiffTaichi's forward(): initialize, fdtd(t) for t = 2 .. steps - 1, the last step's
        height gradient, render_refract; then the loss. Asynchronous."""
        self.s.zero(self.arrays["loss"])
        self.launcher("initialize", recorded)()
        self.step_loop(2, self.steps, self._step(recorded))
        self.launcher("compute_height_gradient", recorded)(self.steps - 1)
        self.launcher("render_refract", recorded)()
        self.launcher("compute_loss", recorded)()

    def image(self) -> np.ndarray:
        """The last forward's refracted image, (n, n, 3)."""
        return self.arrays["refracted_image"].numpy()


# --- the program ---------------------------------------------------------------------------------

def plot(sim: WaterRenderer, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve; the bottom image, the target, the rendered image and the learned initial
    height; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(losses)
    ax.set_xlabel("iteration"), ax.set_ylabel("loss")
    ax.set_title("water_renderer on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "water_renderer_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    initial = sim.weights()["initial"]
    panels = [("bottom image", sim.bottom), ("target (a drop)", sim.target_image),
              ("rendered (learned)", sim.image()), ("initial height (learned)", None)]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    for ax, (title, img) in zip(axes, panels):
        if img is None:
            ax.imshow(initial, cmap="RdBu")
        else:
            ax.imshow(np.clip(img, 0, 1))
        ax.set_title(title), ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    written.append(os.path.join(out, "water_renderer_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS, seed=False)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID}; dx = 1 / grid)")
    ap.add_argument("--no-loop", action="store_true",
                    help="the step loop as a Python loop of launches instead of Session.loop")
    a = ap.parse_args(argv)
    with open_session(a) as s:
        sim = WaterRenderer(s, a.steps, a.grid, vkad.f64 if a.f64 else vkad.f32,
                            graph=not a.no_graph, loop=not a.no_loop)
        print(f"{s.device_name}: {a.grid}^2 grid, {a.steps} steps, {a.iters} iterations")
        losses = train(sim, a.iters, "water_renderer", profile=a.profile, session=s)
        final = sim.loss()
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f}")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
