"""DiffTaichi's water_renderer.py in Taichi 1.7, for bench/difftaichi.py.

taichi_wave.py's height field, initialize and fdtd (DiffTaichi's wave) with this program's
fields and kernels: height_gradient (a Vector field), the bottom and refracted images (n, n, 3),
compute_height_gradient(t) (central differences, a neighbour outside the grid 0 as get_p),
render_refract (the bottom image at each cell moved by -2 x the gradient, clamped, bilinear), and
apply_grad at rate 0.1, all inside `ti.ad.Tape(loss=...)` but the update. As in the vkad example
(examples/difftaichi/water_renderer.py, which says why): the bottom image is its drawn pattern in
place of squirrel.jpg, the loss 0.001 x 0.5 sum (image - target)^2 over the 224^2 centre in
place of VGG16's, the target the image of a unit drop at the centre (rendered here by this
implementation, as DiffTaichi's main() renders it), and the bilinear lookup's far neighbour
clamped at the edge (weight 0 there). The caller runs ti.init (arch, default_fp = `real`) before
constructing.
"""
import numpy as np
import taichi as ti

from . import load_example
from .taichi_wave import TaichiWave

wr = load_example("water_renderer")


@ti.data_oriented
class TaichiWaterRenderer(TaichiWave):
    def __init__(self, steps: int = wr.STEPS, n_grid: int = wr.N_GRID, seed: int = 0,
                 real=ti.f32):
        super().__init__(steps=steps, n_grid=n_grid, seed=seed, real=real)
        self.real, self.lr = real, wr.LEARNING_RATE
        self.crop = wr.crop(n_grid)
        n = n_grid
        self.height_gradient = ti.Vector.field(2, real, shape=(n, n), needs_grad=True)
        self.bottom_image = ti.field(real, shape=(n, n, 3))
        self.refracted_image = ti.field(real, shape=(n, n, 3), needs_grad=True)
        self.target_image = ti.field(real, shape=(n, n, 3))
        self.bottom_image.from_numpy(wr.bottom_image(n).astype(self._np_real))
        # DiffTaichi's main(): initial = 1 at the centre, the first render, initial = 0 again
        drop = np.zeros((n, n))
        drop[n // 2, n // 2] = 1
        self.set_params({"initial": drop})
        self.render()
        self.target_image.copy_from(self.refracted_image)
        self.set_params({"initial": np.zeros((n, n))})

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def compute_height_gradient(self, t: ti.i32):
        for i, j in ti.ndrange(self.n_grid, self.n_grid):
            self.height_gradient[i, j] = 0.5 * self.n_grid * ti.Vector([
                self.get_p(t, i + 1, j) - self.get_p(t, i - 1, j),
                self.get_p(t, i, j + 1) - self.get_p(t, i, j - 1)])

    @ti.kernel
    def render_refract(self):
        n = ti.static(self.n_grid)
        for i, j in ti.ndrange(n, n):
            grad = self.height_gradient[i, j]
            sample_x = i - grad[0] * wr.REFRACT_SCALE
            sample_y = j - grad[1] * wr.REFRACT_SCALE
            sample_x = ti.min(n - 1, ti.max(0, sample_x))
            sample_y = ti.min(n - 1, ti.max(0, sample_y))
            xi = ti.cast(ti.floor(sample_x), ti.i32)
            yi = ti.cast(ti.floor(sample_y), ti.i32)
            xj, yj = ti.min(xi + 1, n - 1), ti.min(yi + 1, n - 1)
            frac_x = sample_x - xi
            frac_y = sample_y - yi
            for k in ti.static(range(3)):
                self.refracted_image[i, j, k] = (1.0 - frac_x) * (
                    (1 - frac_y) * self.bottom_image[xi, yi, k]
                    + frac_y * self.bottom_image[xi, yj, k]) + frac_x * (
                    (1 - frac_y) * self.bottom_image[xj, yi, k]
                    + frac_y * self.bottom_image[xj, yj, k])

    @ti.kernel
    def compute_image_loss(self):
        lo, hi = ti.static(self.crop)
        for i, j in ti.ndrange((lo, hi), (lo, hi)):
            err = 0.0
            for k in ti.static(range(3)):
                d = self.refracted_image[i, j, k] - self.target_image[i, j, k]
                err += d * d
            self.loss[None] += 0.5 * wr.SEED_SCALE * err

    # --- the program ---------------------------------------------------------------------------

    def render(self) -> None:
        """DiffTaichi's forward(): the wave, the last step's height gradient, the render."""
        self.initialize()
        for t in range(2, self.steps):
            self.fdtd(t)
        self.compute_height_gradient(self.steps - 1)
        self.render_refract()

    def forward(self) -> None:
        self.render()
        self.compute_image_loss()
