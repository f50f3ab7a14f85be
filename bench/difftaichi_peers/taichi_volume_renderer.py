"""DiffTaichi's volume_renderer.py in Taichi 1.7, for bench/difftaichi.py.

DiffTaichi's idiom, as its file has it: fields density[iz, iy, ix], images and target_images
[view, y, x] and a 0-d loss (needs_grad), in_box as a ti.func, ray_march(field: ti.template(),
angle, view_id) over the pixels with the marching loop inside and the ray (the pixel, the
camera, the rotated direction) computed at every step, `field[view_id, y, x] += contribution`,
compute_loss(view_id), clear_images(), `ti.ad.Tape(loss=...)` around the views' ray_march and
compute_loss (it zeroes the loss and the gradients and seeds d loss = 1), apply_grad as a kernel.
Differences from DiffTaichi's file, none changing a result: the fields are members of a class
with the sizes as arguments; the target density is the vkad example's torus_density()
(DiffTaichi's create_torus_density, computed on the host) instead of bunny_128.bin;
compute_loss is `for i, j in ti.ndrange(res, res)` where DiffTaichi nests two range loops
(Taichi parallelises only the outer one), as the vkad example's 2-d task; angle is `float` (the
default_fp, so --f64 renders in f64; DiffTaichi's is ti.f32); no PNG files are written.

The vkad example computes the ray once per pixel, before the marching loop; here it stays
inside, as DiffTaichi has it: written before the loop (`dir[0] = rotated_x` then on a vector
the loop reads), Taichi 1.7.4 compiles ray_march's reverse-mode kernel with warnings "Loading
variable ... before anything is stored to it" and the CPU backend's backward dies with a bus
error. As DiffTaichi writes it, the same warnings are printed (on the rotation's lines) and the
gradient is right: equal to the example's to f32 rounding (CPU, res 15, 16^3 density, 80
steps).

Constants, target, initialisation (density 0 after the targets are rendered), loss and update
are the example's, itself DiffTaichi's; the learning rate is its default_learning_rate()
(DiffTaichi's 15 at its size). The caller runs ti.init (arch, default_fp = `real`) before
constructing.
"""
from typing import Dict, Optional

import numpy as np
import taichi as ti

from . import load_example

vr = load_example("volume_renderer")


@ti.func
def in_box(x, y, z):
    # The density grid is contained in a unit box [-0.5, 0.5] x [-0.5, 0.5] x [-0.5, 0.5]
    return x >= -0.5 and x < 0.5 and y >= -0.5 and y < 0.5 and z >= -0.5 and z < 0.5


@ti.data_oriented
class TaichiVolumeRenderer:
    PARAMS = ("density",)

    def __init__(self, res: int = vr.RES, density_res: int = vr.DENSITY_RES,
                 marching_steps: int = vr.MARCHING_STEPS, n_views: int = vr.N_VIEWS,
                 seed: int = 0, real=ti.f32, learning_rate: Optional[float] = None):
        # seed: the benchmarks' common interface; DiffTaichi starts from density 0. The learning
        # rate: the example's default_learning_rate() (DiffTaichi's 15 at its size) unless given
        if learning_rate is None:
            learning_rate = vr.default_learning_rate(density_res, n_views)
        self.res, self.density_res, self.marching_steps, self.n_views = \
            res, density_res, marching_steps, n_views
        self.dx, self.fov, self.radius, self.lr = vr.DX, vr.FOV, vr.CAMERA_ORIGIN_RADIUS, \
            learning_rate
        self._np_real = np.float64 if real == ti.f64 else np.float32
        self.density = ti.field(real, shape=(density_res,) * 3, needs_grad=True)
        self.images = ti.field(real, shape=(n_views, res, res), needs_grad=True)
        self.target_images = ti.field(real, shape=(n_views, res, res))
        self.loss = ti.field(real, shape=(), needs_grad=True)
        self.angles = [vr.view_angle(v, n_views) for v in range(n_views)]
        # create_target_images() from the torus, then clear_density()
        self.density.from_numpy(vr.torus_density(density_res).astype(self._np_real))
        for view, angle in enumerate(self.angles):
            self.ray_march(self.target_images, angle, view)
        self.clear_density()

    # --- kernels (DiffTaichi's) ------------------------------------------------------------

    @ti.kernel
    def ray_march(self, field: ti.template(), angle: float, view_id: ti.i32):
        res, dres = ti.static(self.res, self.density_res)
        for pixel in range(res * res):
            for k in range(self.marching_steps):
                x = pixel // res
                y = pixel - x * res
                camera_origin = ti.Vector([self.radius * ti.sin(angle), 0.0,
                                           self.radius * ti.cos(angle)])
                dir = ti.Vector([self.fov * (ti.cast(x, float) / (res / 2.0) - 1.0),
                                 self.fov * (ti.cast(y, float) / (res / 2.0) - 1.0), -1.0])
                length = ti.sqrt(dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2])
                dir /= length
                rotated_x = dir[0] * ti.cos(angle) + dir[2] * ti.sin(angle)
                rotated_z = -dir[0] * ti.sin(angle) + dir[2] * ti.cos(angle)
                dir[0] = rotated_x
                dir[2] = rotated_z
                point = camera_origin + (k + 1) * self.dx * dir
                # Convert to coordinates of the density grid box
                box_x = point[0] + 0.5
                box_y = point[1] + 0.5
                box_z = point[2] + 0.5
                # Density grid location
                index_x = ti.cast(ti.floor(box_x * dres), ti.i32)
                index_y = ti.cast(ti.floor(box_y * dres), ti.i32)
                index_z = ti.cast(ti.floor(box_z * dres), ti.i32)
                index_x = ti.max(0, ti.min(index_x, dres - 1))
                index_y = ti.max(0, ti.min(index_y, dres - 1))
                index_z = ti.max(0, ti.min(index_z, dres - 1))
                flag = 0
                if in_box(point[0], point[1], point[2]):
                    flag = 1
                contribution = self.density[index_z, index_y, index_x] * flag
                field[view_id, y, x] += contribution

    @ti.kernel
    def compute_loss(self, view_id: ti.i32):
        res = ti.static(self.res)
        for i, j in ti.ndrange(res, res):
            self.loss[None] += (self.images[view_id, i, j]
                                - self.target_images[view_id, i, j]) ** 2 * (1.0 / (res * res))

    @ti.kernel
    def clear_images(self):
        for v, i, j in self.images:
            self.images[v, i, j] = 0

    @ti.kernel
    def clear_density(self):
        for i, j, k in self.density:
            self.density[i, j, k] = 0
            self.density.grad[i, j, k] = 0

    @ti.kernel
    def apply_grad(self):
        # gradient descent
        for i, j, k in self.density:
            self.density[i, j, k] -= self.lr * self.density.grad[i, j, k]
            self.density[i, j, k] = ti.max(self.density[i, j, k], 0)

    # --- the program ---------------------------------------------------------------------------

    def forward(self) -> None:
        for view, angle in enumerate(self.angles):
            self.ray_march(self.images, angle, view)
            self.compute_loss(view)

    def iteration(self) -> float:
        """DiffTaichi's iteration: clear_images(), the views on a tape (which zeroes the loss and
        every gradient first), then apply_grad. Returns the loss the forward computed."""
        self.clear_images()
        with ti.ad.Tape(loss=self.loss):
            self.forward()
        loss = float(self.loss[None])
        self.apply_grad()
        return loss

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.to_numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).to_numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).from_numpy(np.asarray(value, self._np_real))
