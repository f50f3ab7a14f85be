"""The DiffTaichi ports' training loop (examples/difftaichi/*.py): `iters` iterations of a
simulation object whose iteration() runs forward, backward and the update and returns the loss,
with a tqdm bar where tqdm is installed (else a line per iteration, as DiffTaichi prints), then
the first iteration's time beside the steady one's. With `profile` (the examples' --profile
TRACE.json) the last iteration runs inside vkad.profile: its timeline goes to that file and its
per-kernel summary is printed (docs/debugging.md). `arguments` and `open_session`: the
command-line flags the ports share and the session they ask for. `Simulation`: the base of the
ports' simulation classes (bound launches, the iteration captured as a graph and replayed, the
trained arrays as numpy)."""
import argparse
import statistics
import time
from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import vkad


def train(sim, iters: int, name: str, bar_digits: int = 6, line_digits: int = 6,
          profile: Optional[str] = None, session=None) -> List[float]:
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    losses, ms = [], []
    bar = tqdm(range(iters), desc=name) if tqdm else range(iters)
    for it in bar:
        timed = profile is not None and it == iters - 1
        if timed:
            scope = vkad.profile(profile, session=session)
        else:
            scope = nullcontext()
        t0 = time.perf_counter()
        with scope:
            losses.append(sim.iteration())  # reads the loss back: the iteration has finished
        ms.append((time.perf_counter() - t0) * 1e3)
        if timed:
            print(f"timeline of iteration {it} (the last) written to {profile}:")
            print(scope.summary())
        if tqdm:
            bar.set_postfix(loss=f"{losses[-1]:.{bar_digits}f}")
        else:
            print(f"iter {it}: loss {losses[-1]:.{line_digits}f}", flush=True)
    if len(ms) > 1:
        # The first iteration compiles the kernels and captures the graph; the rest is the
        # steady state a training run pays per iteration (forward + backward + update).
        print(f"first iteration {ms[0]:.1f} ms, then {statistics.median(ms[1:]):.2f} ms per "
              f"iteration (median of {len(ms) - 1})")
    return losses


def arguments(doc: str, steps: int, iters: int = 100, seed: bool = True) -> argparse.ArgumentParser:
    """A port's parser with the flags they share (`seed`: a --seed flag); the port adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--iters", type=int, default=iters,
                    help=f"training iterations (default {iters})")
    ap.add_argument("--profile", metavar="TRACE.json", default=None,
                    help="time the last iteration on the device: a Chrome trace / Perfetto file "
                         "and a per-kernel summary (docs/debugging.md)")
    ap.add_argument("--debug", action="store_true",
                    help="check every float store for NaN / infinity, and the port's asserts "
                         "(docs/debugging.md)")
    ap.add_argument("--steps", type=int, default=steps, help=f"time steps (default {steps})")
    ap.add_argument("--f64", action="store_true", help="simulate in f64 (default f32)")
    ap.add_argument("--no-graph", action="store_true",
                    help="launch every iteration's kernels one by one instead of replaying a graph")
    if seed:
        ap.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    ap.add_argument("--device", default=None, help="device index or name substring")
    ap.add_argument("--out", default=".", help="folder for the plots (default .)")
    return ap


def open_session(a: argparse.Namespace):
    """The session the flags ask for (--device, --debug's finite checks)."""
    device = int(a.device) if a.device is not None and a.device.isdigit() else a.device
    return vkad.Session(device, check_finite=a.debug)


class Simulation:
    """What every port's simulation class (Wave, DiffMPM, ...) does the same way: its kernels
    bound to its arrays, forward and backward on its tape, one training iteration launched,
    captured as a graph or replayed, and its trained arrays read and written as numpy.

    A subclass calls Simulation.__init__(session, dtype, graph) first, then sets
      arrays:  name -> vkad.NdArray, at least "loss" (shape (1,)) and every name in PARAMS;
      kernels: name -> vkad.Differentiated, the kernels launcher() binds;
      tape:    the vkad.Tape forward_backward() records on;
    and defines forward(recorded=True): one simulation (asynchronous) that zeroes and sums
    arrays["loss"], its kernels on the tape when recorded, their forwards alone when not.
    With a step loop, the port sets `loop` (bool) too, for step_loop().
    Class attributes: PARAMS (the trained arrays), NAME (the captured graph's label, "NAME
    iteration"), LAUNCH_ARGS (the kernels' parameters given at each launch, the step `t` by
    default; launcher() binds every other parameter to the array of its name).

    The port keeps iteration() (DiffTaichi's update differs from port to port) and calls
    run_iteration() in it; a port whose parameters or launches are laid out otherwise overrides
    the method concerned (smoke's weights, volume_renderer's launcher)."""

    PARAMS: Tuple[str, ...] = ()
    NAME = "simulation"
    LAUNCH_ARGS: Tuple[str, ...] = ("t",)

    def __init__(self, session: vkad.Session, dtype: vkad.DType, graph: bool = True):
        self.s, self.dtype, self.graph = session, dtype, graph
        self._graph: Optional[vkad.Graph] = None  # the captured iteration, once the first ran
        self._launchers: Dict[tuple, vkad.BoundLaunch] = {}  # by (kernel name, recorded)

    def lazy_grad(self, names: Optional[Sequence[str]] = None) -> None:
        """DiffTaichi's ti.root.lazy_grad(): the gradient of each array in `names` (default:
        every array a kernel differentiates) allocated now, with the arrays, rather than by the
        first backward inside the first (captured) iteration."""
        if names is None:
            names = sorted({k.forward.param_names[p] for k in self.kernels.values()
                            for p, _ in k.forward.gradients})
        for name in names:
            a = self.arrays[name]
            a.grad = self.s.zeros(a.shape, a.dtype, name + "_grad")

    def launcher(self, name: str, recorded: bool = True) -> vkad.BoundLaunch:
        """Kernel `name` with its arrays bound (Session.bind), launched with LAUNCH_ARGS alone
        (`advance(t)`, as DiffTaichi calls its kernels); recorded=False: its forward, which no
        tape records. Made once per kernel and kept: a simulation launches thousands, and
        converting every array at each launch was most of its Python time."""
        bound = self._launchers.get((name, recorded))
        if bound is None:
            k = self.kernels[name]
            k = k if recorded else k.forward  # a Differentiated is recorded by a tape; .forward not
            params = k.forward.param_names if recorded else k.param_names
            bound = self.s.bind(k, **{p: self.arrays[p] for p in params
                                      if p not in self.LAUNCH_ARGS})
            self._launchers[(name, recorded)] = bound
        return bound

    def bind_update(self, kernel: vkad.Kernel) -> vkad.BoundLaunch:
        """`kernel` (compiled, not differentiated: DiffTaichi's update runs off the tape) bound
        to each trained array p and its gradient, as parameters p and p + "_grad"."""
        return self.s.bind(kernel, **{n: a for p in self.PARAMS
                                      for n, a in ((p, self.arrays[p]),
                                                   (p + "_grad", self.arrays[p].grad))})

    def step_loop(self, begin: int, end: int, step: Callable[[int], None]) -> None:
        """step(t) for t = begin .. end - 1: said as one Session.loop when the port's `loop` is
        set (the session runs it as its prepared plan or one resident kernel, the tape records
        one LoopRecord), else a Python loop of launches."""
        if self.loop:
            self.s.loop(begin, end, step)
        else:
            for t in range(begin, end):
                step(t)

    def forward_backward(self) -> None:
        """forward() on the tape, then its backward (seed d loss = 1): gradients() after it."""
        with self.tape:
            self.forward()
        self.tape.backward(seed={self.arrays["loss"]: 1.0})

    def gradients(self) -> Dict[str, np.ndarray]:
        """d loss / d (each trained array), after an iteration's backward."""
        return {p: self.tape.grad(self.arrays[p]).numpy() for p in self.PARAMS}

    def read_loss(self) -> float:
        """The loss the last forward summed (the read waits for it)."""
        return float(self.arrays["loss"].numpy()[0])

    def loss(self) -> float:
        """The loss of the current trained arrays (a forward alone, not recorded)."""
        self.forward(recorded=False)
        return self.read_loss()

    def run_iteration(self, *launches: Callable[[], None]) -> float:
        """One training iteration, `launches` called in order (forward_backward, then an update
        on the device if any): with graph=False launched from Python every time; else the first
        is captured as a graph and runs while it is captured (run=True: no replay after it) and
        every later one replays that graph. Returns the loss, read back after the iteration.

        The tape makes its gradient arrays during the capture and keeps them for the next
        backward, so the graph binds arrays that live on. The capture's rework (scheduling,
        fusion, compiles) runs in the background: the replays run the launches as captured until
        a later replay installs the reworked graph (Session.finish_rework waits for it)."""
        if not self.graph:
            for launch in launches:
                launch()
        elif self._graph is None:
            with self.s.capture(f"{self.NAME} iteration", background=True, run=True) as g:
                for launch in launches:
                    launch()
            self._graph = g
        else:
            self.s.replay(self._graph)
        return self.read_loss()

    def finish_rework(self) -> bool:
        """Waits for the captured iteration's background rework (Session.finish_rework): until a
        replay installs it, replays run the graph as captured, which a short timed run would
        measure. False where no iteration was captured yet (graph=False, or before the first)."""
        if self._graph is None:
            return False
        self.s.finish_rework(self._graph)
        return True

    def weights(self) -> Dict[str, np.ndarray]:
        """The trained arrays as float64 numpy, by name."""
        return {p: self.arrays[p].numpy().astype(np.float64) for p in self.PARAMS}

    def set_weights(self, w: Dict[str, np.ndarray]) -> None:
        """Uploads each given array (by name, any float dtype) in the simulation's dtype."""
        for p, value in w.items():
            self.arrays[p].upload(np.asarray(value, vkad.numpy_dtype(self.dtype)))
