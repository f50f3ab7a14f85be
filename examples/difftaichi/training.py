"""The DiffTaichi ports' training loop (examples/difftaichi/*.py): `iters` iterations of a
simulation object whose iteration() runs forward, backward and the update and returns the loss,
with a tqdm bar where tqdm is installed (else a line per iteration, as DiffTaichi prints), then
the first iteration's time beside the steady one's."""
import statistics
import time
from typing import List


def train(sim, iters: int, name: str, bar_digits: int = 6, line_digits: int = 6) -> List[float]:
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    losses, ms = [], []
    bar = tqdm(range(iters), desc=name) if tqdm else range(iters)
    for it in bar:
        t0 = time.perf_counter()
        losses.append(sim.iteration())  # reads the loss back: the iteration has finished
        ms.append((time.perf_counter() - t0) * 1e3)
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
