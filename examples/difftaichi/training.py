"""The DiffTaichi ports' training loop (examples/difftaichi/*.py): `iters` iterations of a
simulation object whose iteration() runs forward, backward and the update and returns the loss,
with a tqdm bar where tqdm is installed (else a line per iteration, as DiffTaichi prints), then
the first iteration's time beside the steady one's. With `profile` (the examples' --profile
TRACE.json) the last iteration runs inside vkad.profile: its timeline goes to that file and its
per-kernel summary is printed (docs/debugging.md). `arguments` and `open_session`: the
command-line flags the ports share and the session they ask for."""
import argparse
import statistics
import time
from contextlib import nullcontext
from typing import List, Optional


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
            import vkad
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
    import vkad
    device = int(a.device) if a.device is not None and a.device.isdigit() else a.device
    return vkad.Session(device, check_finite=a.debug)
