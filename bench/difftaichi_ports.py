"""The DiffTaichi ports (examples/difftaichi) by name, for the benchmarks that time them."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "difftaichi"))

PROGRAMS = ("diffmpm", "mass_spring")


def make(session, program: str, steps=None):
    """The port `program` built on `session` (its kernels compiled, its arrays made); `steps`
    None: the program's own."""
    kw = {} if steps is None else {"steps": steps}
    if program == "diffmpm":
        from diffmpm import DiffMPM
        return DiffMPM(session, **kw)
    from mass_spring import MassSpring
    return MassSpring(session, **kw)
