"""DiffTaichi's diffmpm_checkpointing.py on vkad: diffmpm_simple's block, one grid, a memory budget.

    python examples/difftaichi/diffmpm_checkpointing.py --iters 30   # 6400 particles, 1024 steps

DiffTaichi's examples/diffmpm_checkpointing.py (github.com/taichi-dev/difftaichi) is its
diffmpm_simple.py program -- MLS-MPM on a 120^2 grid, dt = 3e-4, 1024 steps, E = mu = lambda =
100, gravity 9.8, init_v trained by gradient descent (rate 10, 30 iterations) to bring the
block's mean position at the last step to (0.3, 0.6) -- with a larger block (N = 80: 6400
particles, particle i * N + j at dx (0.5 i + 10, 0.5 j + 25)) and hand-written checkpointing.
So the port is examples/difftaichi/diffmpm_simple.py's DiffMPMSimple (its kernels, constants,
set_v, loss and update on the device) with that block and a memory budget.

DiffTaichi's manual scheme and vkad's:
- DiffTaichi keeps the particle state of every step (x, v, C, F with a max_steps axis: its
  checkpoints, 1024 x 6400 x 48 bytes = 315 MB in f32) and one grid, cleared by clear_grid at
  the start of every substep. Its substep is `ti.ad.grad_replaced`; the gradient it registers
  (`ti.ad.grad_for`) runs clear_grid, p2g and grid_op again to rebuild that step's grid, then
  g2p.grad, grid_op.grad, p2g.grad: the forward runs twice, one substep at a time.
- vkad writes the layout a simulation needs to run, not to be differentiated: the particles in
  rings of two rows (step f reads row f % 2, writes row (f + 1) % 2; reverse mode proves the rows
  apart) and one grid, zeroed before every step inside the recording (`s.zero_many`, recorded
  fills). The tape gets `memory_budget` = the bytes DiffTaichi gives its checkpoints (steps x
  the particle state, in the simulation's dtype; at least 16 MiB, which reduced scenes need;
  --memory-budget MIB to change it) and decides
  itself what to copy and where: it cuts the recording into segments, copies each segment's start
  state, and in backward runs each segment's launches again from its copy before their adjoints
  (docs/tape.md, "A memory budget"). At DiffTaichi's budget it picks two levels: the forward runs
  twice, as in DiffTaichi, in segments a few steps long; `t.checkpoint_plan()` says which (printed
  at the start). The gradients are the time-axis program's (tests/python/
  test_difftaichi_diffmpm_checkpointing.py compares them with DiffMPMSimple's at the same block).
- DiffTaichi's clear_grid also zeroes the grid's gradients before every substep; a checkpointed
  vkad tape zeroes an array's gradient where the recording filled the array, in reverse.

What else vkad does instead of Taichi's behaviour is diffmpm_simple.py's (the grid's clears and
x_avg zeroed inside the recording, g2p reusing the velocity it stores, the update a kernel in
the simulation's dtype). The rings are reset from the start state at the beginning of every
simulation (DiffTaichi writes x[0] and F[0] once; its later steps write other rows). The first
iteration runs as launched, so that the tape plans its cut for this length; the second is
captured as a graph and the later ones replay it (--no-graph: launches every time). With
matplotlib, diffmpm_checkpointing_loss.png (DiffTaichi's plot) and diffmpm_checkpointing_final.png
(the block at the last step and the target) go into --out; DiffTaichi shows every 64th step with
OpenCV, which needs every step's particles.
"""
import os
import sys
from typing import List, Optional, Sequence

import numpy as np

import vkad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffmpm_simple as simple  # noqa: E402  (the program this one checkpoints)
from training import arguments, open_session, train  # noqa: E402

# DiffTaichi's diffmpm_checkpointing.py: its constants are diffmpm_simple's but for the block
N = 80            # particles per side: 6400
SPACING = 0.5     # cells between neighbouring particles
STEPS, N_GRID, ITERS = simple.STEPS, simple.N_GRID, simple.ITERS
PARTICLE_STATE = 2 + 2 + 4 + 4  # x, v, C, F: components per particle and step


MIN_BUDGET = 16 << 20


def difftaichi_checkpoint_bytes(steps: int, particles: int, dtype: vkad.DType) -> int:
    """What DiffTaichi's checkpoints hold: x, v, C and F of every particle at every step."""
    return steps * particles * PARTICLE_STATE * np.dtype(vkad.numpy_dtype(dtype)).itemsize


def default_budget(steps: int, particles: int, dtype: vkad.DType) -> int:
    """DiffTaichi's checkpoint bytes (315 MB in f32 at its size), at least MIN_BUDGET: the
    tape needs about 2 log2(launches) copies of what a step writes (the rings and the grid), more
    than DiffTaichi's bytes where a reduced scene's grid outweighs its particles (e.g. 1.7 MiB
    against 0.7 for 256 particles on 64^2 over 60 steps)."""
    return max(difftaichi_checkpoint_bytes(steps, particles, dtype), MIN_BUDGET)


class DiffMPMCheckpointing(simple.DiffMPMSimple):
    """DiffMPMSimple with DiffTaichi's checkpointing block (N = 80 at spacing 0.5), particle
    rings, one grid and a tape with a memory budget (bytes; default: default_budget).
    `loop` must stay False: a budgeted tape records launches, not a Session.loop."""

    NAME = "diffmpm_checkpointing"
    SPACING = SPACING
    RING = True

    def __init__(self, session: vkad.Session, steps: int = STEPS, n_grid: int = N_GRID,
                 n: int = N, dtype: vkad.DType = vkad.f32, seed: int = 0, graph: bool = True,
                 loop: bool = False, memory_budget: Optional[int] = None):
        if loop:
            raise ValueError("loop=True: a tape with a memory budget records launches, not a "
                             "Session.loop; the steps are launched from Python")
        super().__init__(session, steps, n_grid, n, dtype, seed, graph, loop=False)
        self.budget = (default_budget(steps, self.n, dtype) if memory_budget is None
                       else memory_budget)
        self.tape.memory_budget = self.budget
        npt = vkad.numpy_dtype(dtype)
        # the rings' start (x[0] = the block, F[0] = I), copied in at every simulation's start
        self._start = {name: session.ndarray(self.arrays[name].numpy(), npt, name + "_start")
                       for name in ("x", "F")}
        self._planned = False  # the tape's first recording ran and planned its cut

    def forward(self, recorded: bool = True) -> None:
        """DiffTaichi's taped block: set_v, steps - 1 substeps each after clear_grid, then
        compute_x_avg and compute_loss; the rings reset first. Asynchronous."""
        a = self.arrays
        for name, start in self._start.items():
            self.s.copy(start, a[name])
        self.s.zero_many([a["C"], a["x_avg"]])
        self.launcher("set_v", recorded)()
        substep = self._step(recorded)
        for f in range(self.steps - 1):
            self.s.zero_many([a["grid_v_in"], a["grid_m_in"]])  # DiffTaichi's clear_grid
            substep(f)
        self.launcher("compute_x_avg", recorded)(self.steps - 1)
        self.launcher("compute_loss", recorded)()

    def iteration(self) -> float:
        """Forward, backward and DiffTaichi's update; the first launched (the tape plans its
        cut), the next captured and the later ones replayed. Returns the forward's loss."""
        if not self._planned:
            self.forward_backward()
            self._apply_grad()
            self._planned = True
            return self.read_loss()
        return super().iteration()

    def checkpoint_plan(self) -> dict:
        """The tape's plan for its last recording (levels, segments, peak bytes)."""
        return self.tape.checkpoint_plan()

    def positions(self) -> np.ndarray:
        """The particles' positions at the last step, (n, 2)."""
        return self.arrays["x"].numpy()[(self.steps - 1) % 2]


def plot(sim: DiffMPMCheckpointing, losses: Sequence[float], out: str) -> List[str]:
    """DiffTaichi's loss plot, and the block at the last step with the target; [] without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(losses)
    ax.set_title("Optimization of Initial Velocity")
    ax.set_ylabel("Loss"), ax.set_xlabel("Gradient Descent Iterations")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm_checkpointing_loss.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    x, start = sim.positions(), simple.block(int(round(sim.n ** 0.5)), sim.n_grid, SPACING)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.set_facecolor("#4D4D4D")  # DiffTaichi's image: 0.3 grey
    ax.scatter(start[:, 0], start[:, 1], s=0.3, color="#999999")
    ax.scatter(x[:, 0], x[:, 1], s=0.3, color="white")
    ax.add_patch(plt.Circle(x.mean(0), 0.01, color="black"))
    ax.add_patch(plt.Circle(simple.TARGET, 0.01, color="white"))
    ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal")
    ax.set_title(f"the start (grey) and step {sim.steps - 1}; the target white")
    fig.tight_layout()
    written.append(os.path.join(out, "diffmpm_checkpointing_final.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = arguments(__doc__, STEPS, iters=ITERS, seed=False)
    ap.add_argument("--grid", type=int, default=N_GRID,
                    help=f"grid cells per side (default {N_GRID})")
    ap.add_argument("--n", type=int, default=N,
                    help=f"particles per side of the block (default {N})")
    ap.add_argument("--memory-budget", type=float, default=None, metavar="MIB",
                    help="the tape's checkpoints within this many MiB (default: DiffTaichi's, "
                         "every step's particle state, at least 16)")
    a = ap.parse_args(argv)
    dtype = vkad.f64 if a.f64 else vkad.f32
    budget = None if a.memory_budget is None else int(a.memory_budget * (1 << 20))
    with open_session(a) as s:
        sim = DiffMPMCheckpointing(s, a.steps, a.grid, a.n, dtype, graph=not a.no_graph,
                                   memory_budget=budget)
        print(f"{s.device_name}: {sim.n} particles, {a.grid}^2 grid, {a.steps} steps, "
              f"{a.iters} iterations, memory budget {sim.budget / (1 << 20):.1f} MiB")
        losses = train(sim, a.iters, "diffmpm_checkpointing", profile=a.profile, session=s)
        if losses:
            print(f"checkpoints: {sim.checkpoint_plan()['text']}")
        final = sim.loss()
        init_v = sim.weights()["init_v"]
        print(f"loss {losses[0] if losses else final:.6f} -> {final:.6f}; init_v "
              f"({init_v[0]:.4f}, {init_v[1]:.4f})")
        for path in plot(sim, losses + [final], a.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
