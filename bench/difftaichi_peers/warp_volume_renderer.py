"""DiffTaichi's volume_renderer.py in Warp 1.19, for bench/difftaichi.py.

Warp's idiom: density[iz, iy, ix], images and target_images[view, y, x] as arrays, ray_march
launched over the pixels (pixel // res is x, the rest y) with the marching loop inside it and
wp.atomic_add into field[view_id, y, x], compute_loss a 2-d launch over the pixels, a wp.Tape
around the views' ray_march and compute_loss and tape.backward(loss); on CUDA (graph=True) the
zeroing of the images and the loss, the taped forward, the backward and the update are captured
once with wp.ScopedCapture and replayed with wp.capture_launch (the gradients are zeroed by
tape.zero() before each replay, as in warp_diffmpm.py). The marching loop's trip count is a
wp.static constant past the module's max_unroll, so it stays a loop; its body declares every
local it writes, as Warp's reverse mode of a dynamic loop needs.

Constants, the target (the example's torus_density(), rendered by ray_march at construction),
initialisation (density 0), loss and update (density = max(density - rate * gradient, 0), a
kernel as DiffTaichi's apply_grad) are examples/difftaichi/volume_renderer.py's, itself
DiffTaichi's; the ray is computed once per pixel before the marching loop, as there. Call
wp.init() before constructing.
"""
from typing import Dict, Optional

import numpy as np
import warp as wp

from . import load_example
from .warp_taped import run_taped

vr = load_example("volume_renderer")


@wp.func
def in_box(p: wp.vec3):
    # The density grid is contained in the unit box [-0.5, 0.5)^3
    return (p[0] >= -0.5 and p[0] < 0.5 and p[1] >= -0.5 and p[1] < 0.5
            and p[2] >= -0.5 and p[2] < 0.5)


def build_kernels(res: int, density_res: int, marching_steps: int, learning_rate: float):
    dx, fov, radius = vr.DX, vr.FOV, vr.CAMERA_ORIGIN_RADIUS
    half_res, inv_res2 = res / 2.0, 1.0 / (res * res)

    @wp.kernel
    def ray_march(field: wp.array3d(dtype=float), angle: float, view_id: int,
                  density: wp.array3d(dtype=float)):
        pixel = wp.tid()
        x = pixel // wp.static(res)
        y = pixel - x * wp.static(res)
        s, c = wp.sin(angle), wp.cos(angle)
        camera_origin = wp.vec3(wp.static(radius) * s, 0.0, wp.static(radius) * c)
        d = wp.vec3(wp.static(fov) * (float(x) / wp.static(half_res) - 1.0),
                    wp.static(fov) * (float(y) / wp.static(half_res) - 1.0), -1.0)
        d = d / wp.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
        d = wp.vec3(d[0] * c + d[2] * s, d[1], -d[0] * s + d[2] * c)
        n = wp.static(density_res)
        for k in range(wp.static(marching_steps)):
            point = camera_origin + (float(k + 1) * wp.static(dx)) * d
            index_x = wp.clamp(int(wp.floor((point[0] + 0.5) * float(n))), 0, n - 1)
            index_y = wp.clamp(int(wp.floor((point[1] + 0.5) * float(n))), 0, n - 1)
            index_z = wp.clamp(int(wp.floor((point[2] + 0.5) * float(n))), 0, n - 1)
            flag = wp.where(in_box(point), 1.0, 0.0)
            wp.atomic_add(field, view_id, y, x, density[index_z, index_y, index_x] * flag)

    @wp.kernel
    def compute_loss(view_id: int, images: wp.array3d(dtype=float),
                     target_images: wp.array3d(dtype=float), loss: wp.array(dtype=float)):
        i, j = wp.tid()
        diff = images[view_id, i, j] - target_images[view_id, i, j]
        wp.atomic_add(loss, 0, diff * diff * wp.static(inv_res2))

    @wp.kernel
    def apply_grad(grad: wp.array3d(dtype=float), density: wp.array3d(dtype=float)):
        i, j, k = wp.tid()
        density[i, j, k] = wp.max(density[i, j, k] - wp.static(learning_rate) * grad[i, j, k],
                                  0.0)

    return ray_march, compute_loss, apply_grad


class WarpVolumeRenderer:
    PARAMS = ("density",)

    def __init__(self, res: int = vr.RES, density_res: int = vr.DENSITY_RES,
                 marching_steps: int = vr.MARCHING_STEPS, n_views: int = vr.N_VIEWS,
                 seed: int = 0, graph: bool = False, device=None,
                 learning_rate: Optional[float] = None):
        # seed: the benchmarks' common interface; DiffTaichi starts from density 0. The learning
        # rate: the example's default_learning_rate() (DiffTaichi's 15 at its size) unless given
        if learning_rate is None:
            learning_rate = vr.default_learning_rate(density_res, n_views)
        self.res, self.density_res, self.n_views = res, density_res, n_views
        self.device = wp.get_device(device)
        if graph and not self.device.is_cuda:
            raise ValueError("graph=True: CUDA graphs need a CUDA device")
        self.graph = graph
        self.k_ray_march, self.k_loss, self.k_apply_grad = build_kernels(
            res, density_res, marching_steps, learning_rate)
        self.angles = [vr.view_angle(v, n_views) for v in range(n_views)]
        shape = (n_views, res, res)
        self.density = wp.array(vr.torus_density(density_res).astype(np.float32), dtype=float,
                                device=self.device, requires_grad=True)
        self.images = wp.zeros(shape, dtype=float, device=self.device, requires_grad=True)
        self.target_images = wp.zeros(shape, dtype=float, device=self.device)
        self.loss = wp.zeros(1, dtype=float, device=self.device, requires_grad=True)
        # create_target_images() from the torus, then clear_density()
        for view, angle in enumerate(self.angles):
            self._ray_march(self.target_images, angle, view)
        self.density.zero_()
        self.tape = None
        self._graph = None

    def _ray_march(self, field, angle: float, view: int) -> None:
        wp.launch(self.k_ray_march, dim=self.res * self.res,
                  inputs=[field, angle, view, self.density], device=self.device)

    def forward(self) -> None:
        """clear_images(), the loss zeroed, then every view's ray_march and compute_loss."""
        self.images.zero_()
        self.loss.zero_()
        for view, angle in enumerate(self.angles):
            self._ray_march(self.images, angle, view)
            wp.launch(self.k_loss, dim=(self.res, self.res),
                      inputs=[view, self.images, self.target_images, self.loss],
                      device=self.device)

    def _forward_backward_update(self) -> None:
        self.tape = wp.Tape()
        with self.tape:
            self.forward()
        self.tape.backward(self.loss)
        wp.launch(self.k_apply_grad, dim=(self.density_res,) * 3,  # off the tape
                  inputs=[self.density.grad, self.density], device=self.device)

    def iteration(self) -> float:
        """Forward on the tape, backward and DiffTaichi's apply_grad (replayed from a CUDA graph
        with graph=True). Returns the forward's loss."""
        run_taped(self, self._forward_backward_update)
        return float(self.loss.numpy()[0])

    def gradients(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).grad.numpy() for p in self.PARAMS}

    def params(self) -> Dict[str, np.ndarray]:
        return {p: getattr(self, p).numpy().astype(np.float64) for p in self.PARAMS}

    def set_params(self, w: Dict[str, np.ndarray]) -> None:
        for p, value in w.items():
            getattr(self, p).assign(np.asarray(value, np.float32))
