"""What the tests of the DiffTaichi ports (test_difftaichi*.py) check the same way for every port:
the port loaded as a module, a replayed (graph) iteration against a launched one, and the
program's main() -- its loss line the same with its graph as with its launches, its plots
written where matplotlib is installed. Each test keeps its own sizes, tolerances and the checks
only its port has (launch counts, step-loop plans, the update's formula)."""
import importlib.util
import pathlib
from typing import Callable, Dict, List, Sequence

import numpy as np

import vkad
from conftest import f64_ok

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "difftaichi"


def load_example(name: str):
    """examples/difftaichi/<name>.py as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dtypes(session) -> List[vkad.DType]:
    """f32, and f64 where the device has it."""
    return [vkad.f32] + ([vkad.f64] if f64_ok(session) else [])


def replayed_and_launched(session, sims: Sequence, iters: int = 3) -> List[List[float]]:
    """sims = (graphed, launched): one port's simulation twice, alike but for graph= (and the
    step loop). Runs the first iteration of each (the graphed one captures it), waits for the
    capture's rework (Session.finish_rework), then iters - 1 more of each, so that the reworked
    graph's replays are compared too. Returns [graphed losses, launched losses]."""
    losses = [[sim.iteration()] for sim in sims]
    session.finish_rework(sims[0]._graph)
    for sim, ls in zip(sims, losses):
        ls += [sim.iteration() for _ in range(iters - 1)]
    return losses


def assert_graph_and_step_loop_in_the_first(sims: Sequence) -> None:
    """Of (graphed, launched): only the first captured a graph, and only its tape recorded the
    step loop as one Session.loop (a LoopRecord); the other's tape holds every step's launches."""
    assert sims[0]._graph is not None and sims[1]._graph is None
    assert any(isinstance(r, vkad.LoopRecord) for r in sims[0].tape.launches)
    assert not any(isinstance(r, vkad.LoopRecord) for r in sims[1].tape.launches)


def assert_close_by_name(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray],
                         rtol: float = 0.0, atol: float = 0.0,
                         atol_of_max: float = 0.0) -> None:
    """Every array of `want` (weights or gradients by name) against `got`'s of that name, within
    rtol |want| + atol + atol_of_max max|want| (the last a bound relative to the array's scale)."""
    for name, w in want.items():
        bound = atol + atol_of_max * float(np.abs(w).max())
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=bound, err_msg=name)


def loss_line(out: str) -> str:
    """The program's closing 'loss A -> B ...' line."""
    return next(line for line in out.splitlines() if line.startswith("loss "))


def run_main(main: Callable, args: Sequence[str], capsys) -> str:
    """main(args), which must return 0; its stdout."""
    assert main(list(args)) == 0
    return capsys.readouterr().out


def assert_main_graph_equals_launches(main: Callable, args: Sequence[str], capsys,
                                      launched: Sequence[str] = ("--no-graph", "--no-loop")
                                      ) -> str:
    """The program by default (the iteration captured and replayed, the step loop through
    Session.loop) and with `launched` (every launch from Python) prints the same loss line: the
    same losses to the digits printed. Returns the default run's stdout."""
    graphed = run_main(main, args, capsys)
    assert loss_line(run_main(main, list(args) + list(launched), capsys)) == loss_line(graphed)
    return graphed


def assert_plots(out_dir: pathlib.Path, name: str) -> None:
    """With matplotlib, the program wrote <name>_loss.png and <name>_final.png into out_dir;
    without it, nothing (the plots are skipped quietly)."""
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        assert not list(out_dir.iterdir())
        return
    assert (out_dir / f"{name}_loss.png").stat().st_size > 0
    assert (out_dir / f"{name}_final.png").stat().st_size > 0
