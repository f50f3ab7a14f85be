"""What every Warp transcription's iteration() does with its tape (bench/difftaichi.py's
`warp` and `warp-graph`), written once."""
import warp as wp


def run_taped(sim, body) -> None:
    """Zeroes `sim.tape`'s gradients (backward accumulates into .grad: the last iteration's
    would stay), then runs `body` -- which makes sim.tape and records the forward, backward and
    whatever update runs on the device -- directly, or with `sim.graph` captured once with
    wp.ScopedCapture on `sim.device` into `sim._graph` and replayed with wp.capture_launch."""
    if sim.tape is not None:
        sim.tape.zero()
    if not sim.graph:
        body()
        return
    if sim._graph is None:
        with wp.ScopedCapture(device=sim.device) as capture:
            body()
        sim._graph = capture.graph
    wp.capture_launch(sim._graph)
