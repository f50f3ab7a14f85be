"""The DiffTaichi ports (examples/difftaichi) by name, for the benchmarks that time them."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "difftaichi"))

PROGRAMS = ("diffmpm", "mass_spring", "wave", "smoke", "billiards", "electric",
            "rigid_body", "diffmpm3d")


def make(session, program: str, steps=None, loop=None, **extra):
    """The port `program` built on `session` (its kernels compiled, its arrays made); `steps`
    and `loop` (its step loop through Session.loop, prepared in the constructor) None: the
    program's own. `extra`: more of the port's constructor arguments (diffmpm's debug=True)."""
    kw = dict(extra) if steps is None else dict(extra, steps=steps)
    if loop is not None:
        kw["loop"] = loop
    if program == "diffmpm":
        from diffmpm import DiffMPM
        return DiffMPM(session, **kw)
    if program == "wave":
        # by its path: `import wave` may find the standard library's module of that name
        from difftaichi_peers import load_example
        return load_example("wave").Wave(session, **kw)
    if program == "smoke":
        from difftaichi_peers import load_example
        return load_example("smoke").Smoke(session, **kw)
    if program == "billiards":
        from difftaichi_peers import load_example
        return load_example("billiards").Billiards(session, **kw)
    if program == "electric":
        from difftaichi_peers import load_example
        return load_example("electric").Electric(session, **kw)
    if program == "diffmpm3d":
        from difftaichi_peers import load_example
        return load_example("diffmpm3d").DiffMPM3D(session, **kw)
    if program == "rigid_body":
        from difftaichi_peers import load_example
        return load_example("rigid_body").RigidBody(session, **kw)
    from mass_spring import MassSpring
    return MassSpring(session, **kw)
