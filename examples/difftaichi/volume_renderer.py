"""DiffTaichi's volume_renderer.py on vkad: a density grid learns to match 7 views of a target.

    python examples/difftaichi/volume_renderer.py --iters 20   # 512^2 pixels, 128^3 density

The renderer, parameters and optimisation loop are those of DiffTaichi's
examples/volume_renderer.py (github.com/taichi-dev/difftaichi), its kernels `@vkad.kernel`
functions written as DiffTaichi writes them:

- a density grid density[iz, iy, ix] (density_res^3 = 128^3) filling the unit box [-0.5, 0.5)^3,
  seen by n_views = 7 cameras on a circle of radius 1 around the y axis, camera v at angle
  pi / n_views * v - pi / 2, each an image of res^2 = 512^2 pixels, field of view fov = 1;
- ray_march(field, angle, view_id): a parallel loop over the pixels (pixel // res is x, the rest
  y), each marching its ray marching_steps = 1000 steps of dx = 0.02 from the camera; at step k
  the point camera + (k + 1) dx dir reads the voxel it is in (floor, clamped into the grid), times
  a flag that is 1 inside the box and 0 outside, and adds it into field[view_id, y, x] (`+=`, an
  atomic add);
- compute_loss(view_id) adds (images - target_images)^2 / res^2 over the view's pixels into a
  rank-0 loss (an atomic add);
- an iteration: clear the images, then for every view ray_march into images and compute_loss, on
  a tape; backward; apply_grad, gradient descent with learning rate 15 and the density clamped
  at 0 (density = max(density - 15 d loss / d density, 0)).

**The target is the torus.** DiffTaichi reads its target density from bunny_128.bin (the Stanford
bunny, downloaded from Taichi's assets), renders the target images from it with ray_march, then
clears the density (clear_density) and trains from 0. This port uses the alternative the script
itself carries (create_torus_density, commented out in its main()): a torus of radii r1 = 0.4 and
r2 = 0.1 around the x axis (in_torus(y, x, z)), density 1 / density_res in the voxels whose
corner (k, j, i) / density_res - 0.5 lies inside it, else 0. The target images are ray-marched
from it and training starts from density 0, as DiffTaichi's main() does after creating its
targets.

What vkad does instead of Taichi's behaviour:
- Taichi's fields are globals and ray_march takes the image field as a ti.template(); here the
  arrays are parameters and ray_march is launched with images (recorded by the tape) or with
  target_images (its forward alone, at construction), as DiffTaichi calls it with either field.
- DiffTaichi computes the ray (the pixel's x and y, the camera, the rotated, normalised
  direction) inside the marching loop, at every step; here it is computed once per pixel before
  the loop: the same values, without recomputing them at each of the 1000 steps (and in the
  adjoint's reverse pass). DiffTaichi's form compiles in vkad too and gives the same gradient
  (to the bit, at the tests' size); on lavapipe (7 views of 64^2 pixels, 32^3, 1000 steps) it
  takes 157 ms forward and 226 ms backward, against 137 and 187 ms hoisted.
- create_torus_density is computed once on the host in float64 (torus_density()) and uploaded,
  so that the race's Taichi and Warp transcriptions start from the same target density.
  DiffTaichi's kernel makes the same test in f32; in f32 (numpy's) it selects the same voxels
  at every size tried (8^3 to 128^3), including those exactly on the surface (distance 0.5 -
  0.4 - 0.1, inside after rounding in both).
- compute_loss's `for i in range(res): for j in range(res)` parallelises the outer loop only in
  Taichi (res threads, j serial in each); here it is a 2-d task over the pixels. The loss's
  atomic sum may add in another order.
- clear_images is s.zero(images) and the loss is zeroed with the forward (ti.ad.Tape(loss)
  zeroes it, and every gradient, and seeds d loss = 1); a vkad.Tape records the views' ray_march
  and compute_loss, and backward() (seed 1) zeroes the gradients and runs the adjoints.
  DiffTaichi's clear_density also zeroes density.grad; the tape's backward zeroes it here.
- DiffTaichi writes every view's target and every iteration's images as PNG files (1 - img /
  max); here, with matplotlib, volume_renderer_loss.png and volume_renderer_final.png (the
  targets and the last images of every view, shown the same way, and the learned density summed
  along x) are written into --out.
- The learning rate is DiffTaichi's 15 at its size, where the loss's largest curvature (the
  Hessian's top eigenvalue, measured by power iteration on a float64 transcription with res 128)
  is 0.0149: lr x curvature = 0.22, where gradient descent is stable below 2. The curvature
  grows on a coarser grid (each voxel gathers more rays): 0.065 at 64^3, 0.50 at 32^3, 3.4 at
  16^3 (7 views), 7.4 at 8^3 (2 views, res 15), so 15 would diverge there. The default,
  default_learning_rate(), is 15 (density_res / 128)^3 (7 / n_views): DiffTaichi's 15 at its
  size, and lr x curvature 0.095 to 0.12 at the others (steps about half DiffTaichi's); --lr
  (the class's `learning_rate`) sets another.

Every iteration is 2 n_views launches forward, as many adjoints, the zeroing and apply_grad; it
is captured once as a graph and replayed (--no-graph launches the kernels one by one; the results
are the same). The views are a Python loop (each passes its angle, a float, as DiffTaichi does;
Session.loop's index is an integer for the kernels to take, not an angle). The VolumeRenderer
class is what tests/python/test_difftaichi_volume_renderer.py and bench/difftaichi_ports.py
import.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import Simulation, arguments, open_session, train  # noqa: E402  (shared)
from vkad import Vector  # noqa: E402

# DiffTaichi's constants (examples/volume_renderer.py)
NUM_ITERATIONS = 100
RES = 512
DENSITY_RES = 128
DX = 0.02
N_VIEWS = 7
TORUS_R1 = 0.4
TORUS_R2 = 0.1
FOV = 1.0
CAMERA_ORIGIN_RADIUS = 1.0
MARCHING_STEPS = 1000
LEARNING_RATE = 15.0


def default_learning_rate(density_res: int = DENSITY_RES, n_views: int = N_VIEWS) -> float:
    """DiffTaichi's 15 at its 128^3 grid and 7 views, scaled to others as the loss's curvature
    grows there (the module's docstring)."""
    return LEARNING_RATE * (density_res / DENSITY_RES) ** 3 * (N_VIEWS / n_views)


def view_angle(view: int, n_views: int = N_VIEWS) -> float:
    """Camera `view`'s angle around the y axis, as DiffTaichi passes it to ray_march."""
    return math.pi / n_views * view - math.pi / 2.0


def torus_density(density_res: int = DENSITY_RES) -> np.ndarray:
    """DiffTaichi's create_torus_density(): density[i, j, k] (z, y, x) = 1 / density_res where the
    voxel's corner (k, j, i) / density_res - 0.5 is inside the torus of radii r1 = 0.4, r2 = 0.1
    around the x axis (DiffTaichi swaps x and y: in_torus(y, x, z)), else 0. Float64."""
    c = np.arange(density_res) * (1.0 / density_res) - 0.5
    z, y, x = np.meshgrid(c, c, c, indexing="ij")
    # in_torus(y, x, z): its x is our y, its y our x
    qx = np.sqrt(y * y + z * z) - TORUS_R1
    inside = np.sqrt(qx * qx + x * x) - TORUS_R2 < 0
    return np.where(inside, 1.0 / density_res, 0.0)


# --- kernels -------------------------------------------------------------------------------------

@vkad.func
def in_box(x, y, z):
    # The density grid is contained in the unit box [-0.5, 0.5)^3 (DiffTaichi's comment)
    return x >= -0.5 and x < 0.5 and y >= -0.5 and y < 0.5 and z >= -0.5 and z < 0.5


def build_kernels(ft: vkad.DType, res: int, density_res: int, marching_steps: int,
                  learning_rate: float):
    """DiffTaichi's kernels as @vkad.kernel functions: ray_march(field, angle, view_id, density),
    compute_loss(view_id, ...), apply_grad (not differentiated). The sizes are constants of the
    kernels, as DiffTaichi's globals are of its."""
    images_t = vkad.array(ft, ndim=3, grad=True)    # images[view, y, x], target_images
    grid_t = vkad.array(ft, ndim=3, grad=True)      # density[iz, iy, ix]
    res_f = float(res)

    @vkad.kernel
    def ray_march(field: images_t, angle: ft, view_id: vkad.i32, density: grid_t):
        for pixel in range(res * res):
            x = pixel // res
            y = pixel - x * res
            camera_origin = Vector([CAMERA_ORIGIN_RADIUS * vkad.sin(angle), 0.0,
                                    CAMERA_ORIGIN_RADIUS * vkad.cos(angle)])
            dir = Vector([FOV * (float(x) / (res_f / 2.0) - 1.0),
                          FOV * (float(y) / (res_f / 2.0) - 1.0), -1.0])
            dir = dir / dir.norm()
            rotated_x = dir[0] * vkad.cos(angle) + dir[2] * vkad.sin(angle)
            rotated_z = -dir[0] * vkad.sin(angle) + dir[2] * vkad.cos(angle)
            dir[0] = rotated_x
            dir[2] = rotated_z
            for k in range(marching_steps):
                point = camera_origin + (k + 1) * DX * dir
                # Convert to coordinates of the density grid box
                box_x = point[0] + 0.5
                box_y = point[1] + 0.5
                box_z = point[2] + 0.5
                # Density grid location
                index_x = int(vkad.floor(box_x * density_res))
                index_y = int(vkad.floor(box_y * density_res))
                index_z = int(vkad.floor(box_z * density_res))
                index_x = max(0, min(index_x, density_res - 1))
                index_y = max(0, min(index_y, density_res - 1))
                index_z = max(0, min(index_z, density_res - 1))
                flag = 0
                if in_box(point[0], point[1], point[2]):
                    flag = 1
                contribution = density[index_z, index_y, index_x] * flag
                field[view_id, y, x] += contribution

    @vkad.kernel
    def compute_loss(view_id: vkad.i32, images: images_t,
                     target_images: vkad.array(ft, ndim=3, readonly=True),
                     loss: vkad.array(ft, ndim=0, grad=True)):
        for i, j in vkad.ndrange(res, res):
            loss[None] += (images[view_id, i, j] - target_images[view_id, i, j]) ** 2 \
                * (1.0 / (res * res))

    @vkad.kernel
    def apply_grad(density: vkad.array(ft, ndim=3),
                   density_grad: vkad.array(ft, ndim=3, readonly=True)):
        # gradient descent
        for i, j, k in vkad.ndrange(density_res, density_res, density_res):
            d = density[i, j, k] - learning_rate * density_grad[i, j, k]
            density[i, j, k] = max(d, 0.0)

    return {"ray_march": ray_march, "compute_loss": compute_loss}, apply_grad


class VolumeRenderer(Simulation):
    """The density grid, the target images and the differentiated renderer on one session.

    forward() renders every view and adds up the loss (on the tape when recording); iteration()
    runs one training iteration (forward, backward, DiffTaichi's apply_grad) and returns its loss
    (before the update); loss() the current loss; weights() / set_weights() the density as
    numpy; images() the last rendered images. `seed` is accepted for the benchmarks' common
    interface and unused: DiffTaichi starts from density 0. `target_density` (float64,
    (density_res,) * 3) replaces the torus; `learning_rate` is default_learning_rate() unless
    given (DiffTaichi's 15 at its size)."""

    PARAMS = ("density",)
    NAME = "volume_renderer"

    def __init__(self, session: vkad.Session, res: int = RES, density_res: int = DENSITY_RES,
                 marching_steps: int = MARCHING_STEPS, n_views: int = N_VIEWS,
                 dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 learning_rate: Optional[float] = None,
                 target_density: Optional[np.ndarray] = None):
        if res < 1 or density_res < 1 or marching_steps < 1 or n_views < 1:
            raise ValueError(f"res={res}, density_res={density_res}, marching_steps="
                             f"{marching_steps}, n_views={n_views}: each must be at least 1")
        super().__init__(session, dtype, graph)
        self.res, self.density_res = res, density_res
        if learning_rate is None:
            learning_rate = default_learning_rate(density_res, n_views)
        self.marching_steps, self.n_views, self.learning_rate = marching_steps, n_views, \
            learning_rate
        self.angles = [view_angle(v, n_views) for v in range(n_views)]
        kernels, apply_grad = build_kernels(dtype, res, density_res, marching_steps,
                                            learning_rate)
        self.kernels = {name: session.differentiate(k) for name, k in kernels.items()}
        npt = vkad.numpy_dtype(dtype)
        if target_density is None:
            target_density = torus_density(density_res)
        self.target_density = np.asarray(target_density, np.float64)
        s = session
        self.arrays: Dict[str, vkad.NdArray] = {
            "density": s.ndarray(self.target_density, npt, "density"),
            "images": s.zeros((n_views, res, res), dtype, "images"),
            "target_images": s.zeros((n_views, res, res), dtype, "target_images"),
            "loss": s.zeros(1, dtype, "loss"),
        }
        # DiffTaichi's ti.root.lazy_grad(), named: ray_march's `field` is images on the tape
        self.lazy_grad(("density", "images", "loss"))
        self.tape = s.tape()
        self._apply_grad = self.bind_update(s.compile(apply_grad))
        # create_target_images(): ray_march(target_images, angle, view) from the target density,
        # then clear_density() (the gradient is zeroed by every backward)
        march = s.bind(self.kernels["ray_march"].forward, field=self.arrays["target_images"],
                       density=self.arrays["density"])
        for view, angle in enumerate(self.angles):
            march(angle, view)
        s.zero(self.arrays["density"])

    # launches
    def launcher(self, name: str, recorded: bool = True) -> vkad.BoundLaunch:
        """Kernel `name` with its arrays bound (Session.bind), launched with what DiffTaichi passes:
        `ray_march(angle, view)`, `compute_loss(view)`. Simulation.launcher's, but ray_march's
        `field` is bound to images (and to target_images at construction)."""
        bound = self._launchers.get((name, recorded))
        if bound is None:
            k = self.kernels[name]
            k = k if recorded else k.forward  # a Differentiated is recorded by a tape; .forward not
            params = k.forward.param_names if recorded else k.param_names
            arrays = {"field": self.arrays["images"], **self.arrays}
            bound = self.s.bind(k, **{p: arrays[p] for p in params
                                      if p not in ("angle", "view_id")})
            self._launchers[(name, recorded)] = bound
        return bound

    def forward(self, recorded: bool = True) -> None:
        """clear_images(), then every view rendered and its loss added (DiffTaichi's loop inside
        ti.ad.Tape(loss)). Asynchronous."""
        self.s.zero(self.arrays["images"])  # clear_images()
        self.s.zero(self.arrays["loss"])  # ti.ad.Tape(loss) zeroes the loss
        ray_march = self.launcher("ray_march", recorded)
        compute_loss = self.launcher("compute_loss", recorded)
        for view, angle in enumerate(self.angles):
            ray_march(angle, view)
            compute_loss(view)

    def iteration(self) -> float:
        """Forward and backward, then DiffTaichi's apply_grad: density = max(density -
        learning_rate dL/d density, 0), on the device. Returns the loss the forward computed."""
        return self.run_iteration(self.forward_backward, self._apply_grad)  # update off the tape

    def images(self) -> np.ndarray:
        """images[view, y, x] of the last forward."""
        return self.arrays["images"].numpy()

    def target_images(self) -> np.ndarray:
        """target_images[view, y, x], rendered from the target density at construction."""
        return self.arrays["target_images"].numpy()


# --- the program ---------------------------------------------------------------------------------

def shown(img: np.ndarray) -> np.ndarray:
    """An image as DiffTaichi writes it: 1 - img / max(img) (left as 1 - img where it is all 0)."""
    m = img.max()
    return 1 - (img / m if m > 0 else img)


def plot(sim: VolumeRenderer, losses: Sequence[float], out: str) -> List[str]:
    """The loss curve, and per view the target and the last rendered image, with the learned
    and the target density summed along x; [] without matplotlib."""
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
    ax.set_yscale("log")
    ax.set_title("volume_renderer on vkad")
    fig.tight_layout()
    written.append(os.path.join(out, "volume_renderer_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    targets, images = sim.target_images(), sim.images()
    n = sim.n_views + 1
    fig, axes = plt.subplots(2, n, figsize=(2.2 * n, 4.6), squeeze=False)
    columns = [(f"view {v}", targets[v], images[v]) for v in range(sim.n_views)]
    columns.append(("density, sum over x", sim.target_density.sum(axis=2),
                    sim.weights()["density"].sum(axis=2)))
    for col, (title, top, bottom) in enumerate(columns):
        for row, (img, what) in enumerate(((top, "target"), (bottom, "learned"))):
            ax = axes[row, col]
            ax.imshow(shown(img), cmap="gray", vmin=0, vmax=1, origin="lower")
            ax.set_title(f"{title}\n{what}", fontsize=8)
            ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    written.append(os.path.join(out, "volume_renderer_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, MARCHING_STEPS, iters=NUM_ITERATIONS, seed=False)
    ap.add_argument("--res", type=int, default=RES,
                    help=f"pixels per side of every view (default {RES})")
    ap.add_argument("--density-res", type=int, default=DENSITY_RES,
                    help=f"voxels per side of the density grid (default {DENSITY_RES})")
    ap.add_argument("--views", type=int, default=N_VIEWS, help=f"views (default {N_VIEWS})")
    ap.add_argument("--lr", type=float, default=None,
                    help=f"learning rate (default DiffTaichi's {LEARNING_RATE:g} at its "
                         f"{DENSITY_RES}^3 grid and {N_VIEWS} views, times (density-res / "
                         f"{DENSITY_RES})^3 ({N_VIEWS} / views) at other sizes: see the docstring)")
    a = ap.parse_args(argv)
    lr = a.lr if a.lr is not None else default_learning_rate(a.density_res, a.views)
    with open_session(a) as s:
        sim = VolumeRenderer(s, a.res, a.density_res, a.steps, a.views,
                             vkad.f64 if a.f64 else vkad.f32, graph=not a.no_graph,
                             learning_rate=lr)
        print(f"{s.device_name}: {a.views} views of {a.res}^2 pixels, {a.density_res}^3 "
              f"density, {a.steps} marching steps, {a.iters} iterations, lr {lr:g}")
        losses = train(sim, a.iters, "volume_renderer", profile=a.profile, session=s)
        final = sim.loss()
        print(f"loss {losses[0] if losses else final:.6g} -> {final:.6g}")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
