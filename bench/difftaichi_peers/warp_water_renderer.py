"""DiffTaichi's water_renderer.py in Warp 1.19, for bench/difftaichi.py.

warp_wave.py's arrays and kernels (initialize, fdtd: DiffTaichi's wave) with this program's:
compute_height_gradient(t) (central differences, a neighbour outside the grid 0), render_refract
(the bottom image at each cell moved by -2 x the gradient, clamped, bilinear), the image loss and
apply_grad at rate 0.1; a wp.Tape around the forward, tape.backward(loss), the update off the
tape (the whole iteration captured in a CUDA graph with graph=True). As in the vkad example
(examples/difftaichi/water_renderer.py, which says why): the drawn bottom image in place of
squirrel.jpg, the loss 0.001 x 0.5 sum (image - target)^2 over the 224^2 centre in place of
VGG16's, the target the image of a unit drop at the centre (rendered by this implementation),
the bilinear lookup's far neighbour clamped at the edge. Call wp.init() before constructing.
"""
import numpy as np
import warp as wp

from . import load_example
from .warp_wave import WarpWave, get_p

wr = load_example("water_renderer")


def build_kernels(n_grid: int):
    lo, hi = wr.crop(n_grid)
    scale, seed_scale, lr = wr.REFRACT_SCALE, wr.SEED_SCALE, wr.LEARNING_RATE

    @wp.kernel
    def compute_height_gradient(t: int, p: wp.array3d(dtype=float),
                                height_gradient: wp.array2d(dtype=wp.vec2)):
        i, j = wp.tid()
        n = wp.static(n_grid)
        height_gradient[i, j] = wp.static(0.5 * n_grid) * wp.vec2(
            get_p(p, t, i + 1, j, n) - get_p(p, t, i - 1, j, n),
            get_p(p, t, i, j + 1, n) - get_p(p, t, i, j - 1, n))

    @wp.kernel
    def render_refract(height_gradient: wp.array2d(dtype=wp.vec2),
                       bottom_image: wp.array3d(dtype=float),
                       refracted_image: wp.array3d(dtype=float)):
        i, j = wp.tid()
        n = wp.static(n_grid)
        grad = height_gradient[i, j]
        sample_x = wp.min(float(n - 1), wp.max(0.0, float(i) - grad[0] * wp.static(scale)))
        sample_y = wp.min(float(n - 1), wp.max(0.0, float(j) - grad[1] * wp.static(scale)))
        xi = int(wp.floor(sample_x))
        yi = int(wp.floor(sample_y))
        xj = wp.min(xi + 1, n - 1)
        yj = wp.min(yi + 1, n - 1)
        fx = sample_x - float(xi)
        fy = sample_y - float(yi)
        for k in range(3):
            refracted_image[i, j, k] = (1.0 - fx) * (
                (1.0 - fy) * bottom_image[xi, yi, k] + fy * bottom_image[xi, yj, k]) + fx * (
                (1.0 - fy) * bottom_image[xj, yi, k] + fy * bottom_image[xj, yj, k])

    @wp.kernel
    def compute_loss(refracted_image: wp.array3d(dtype=float),
                     target_image: wp.array3d(dtype=float), loss: wp.array(dtype=float)):
        a, b = wp.tid()
        i = a + wp.static(lo)
        j = b + wp.static(lo)
        err = float(0.0)
        for k in range(3):
            d = refracted_image[i, j, k] - target_image[i, j, k]
            err += d * d
        wp.atomic_add(loss, 0, wp.static(0.5 * seed_scale) * err)

    @wp.kernel
    def apply_grad(grad: wp.array2d(dtype=float), initial: wp.array2d(dtype=float)):
        i, j = wp.tid()
        initial[i, j] = initial[i, j] - wp.static(lr) * grad[i, j]

    return compute_height_gradient, render_refract, compute_loss, apply_grad, hi - lo


class WarpWaterRenderer(WarpWave):
    def __init__(self, steps: int = wr.STEPS, n_grid: int = wr.N_GRID, seed: int = 0,
                 graph: bool = False, device=None):
        super().__init__(steps=steps, n_grid=n_grid, seed=seed, graph=graph, device=device)
        (self.k_height_gradient, self.k_refract, self.k_image_loss, self.k_apply_grad,
         self.crop_size) = build_kernels(n_grid)
        n, d = n_grid, self.device
        self.height_gradient = wp.zeros((n, n), dtype=wp.vec2, device=d, requires_grad=True)
        self.bottom_image = wp.array(wr.bottom_image(n).astype(np.float32), dtype=float,
                                     device=d)
        self.refracted_image = wp.zeros((n, n, 3), dtype=float, device=d, requires_grad=True)
        # DiffTaichi's main(): initial = 1 at the centre, the first render, initial = 0 again
        drop = np.zeros((n, n), np.float32)
        drop[n // 2, n // 2] = 1
        self.initial.assign(drop)
        self.render()
        self.target_image = wp.clone(self.refracted_image, requires_grad=False)
        self.initial.zero_()

    def render(self) -> None:
        """DiffTaichi's forward(): the wave, the last step's height gradient, the render."""
        self._launch(self.k_initialize, self.initial, self.p)
        for t in range(2, self.steps):
            self._launch(self.k_fdtd, t, self.p)
        self._launch(self.k_height_gradient, self.steps - 1, self.p, self.height_gradient)
        self._launch(self.k_refract, self.height_gradient, self.bottom_image,
                     self.refracted_image)

    def forward(self) -> None:
        self.loss.zero_()
        self.render()
        wp.launch(self.k_image_loss, dim=(self.crop_size, self.crop_size),
                  inputs=[self.refracted_image, self.target_image, self.loss],
                  device=self.device)
