"""The DiffTaichi ports (examples/difftaichi) by name, for the benchmarks that time them."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "difftaichi"))

PROGRAMS = ("diffmpm", "mass_spring", "wave", "smoke", "billiards", "electric",
            "rigid_body", "diffmpm3d", "volume_renderer", "liquid", "rigid_body_toi",
            "mass_spring_simple", "diffmpm_simple", "gradient_explosion",
            "diffmpm_checkpointing", "rigid_body_discontinuity", "mass_spring_velocity",
            "water_renderer")


def make(session, program: str, steps=None, loop=None, **extra):
    """The port `program` built on `session` (its kernels compiled, its arrays made); `steps`
    and `loop` (its step loop through Session.loop, prepared in the constructor) None: the
    program's own. `extra`: more of the port's constructor arguments (diffmpm's debug=True).
    volume_renderer's `steps` are its marching steps; it has no step loop (its marching loop is
    inside ray_march), so `loop` is refused for it."""
    if program == "volume_renderer":
        if loop is not None:
            raise ValueError("volume_renderer has no step loop for Session.loop (its marching "
                             "loop is inside the ray_march kernel): leave `loop` out")
        from difftaichi_peers import load_example
        kw = dict(extra) if steps is None else dict(extra, marching_steps=steps)
        return load_example("volume_renderer").VolumeRenderer(session, **kw)
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
    if program == "liquid":
        from difftaichi_peers import load_example
        return load_example("liquid").Liquid(session, **kw)
    if program == "rigid_body_toi":
        from difftaichi_peers import load_example
        return load_example("rigid_body_toi").RigidBodyTOI(session, **kw)
    if program == "mass_spring_simple":
        from difftaichi_peers import load_example
        return load_example("mass_spring_simple").MassSpringSimple(session, **kw)
    if program == "diffmpm_simple":
        from difftaichi_peers import load_example
        return load_example("diffmpm_simple").DiffMPMSimple(session, **kw)
    if program == "gradient_explosion":
        from difftaichi_peers import load_example
        return load_example("gradient_explosion").GradientExplosion(session, **kw)
    if program == "diffmpm_checkpointing":
        # loop is refused (a budgeted tape records launches): leave it None
        from difftaichi_peers import load_example
        return load_example("diffmpm_checkpointing").DiffMPMCheckpointing(session, **kw)
    if program == "rigid_body_discontinuity":
        from difftaichi_peers import load_example
        return load_example("rigid_body_discontinuity").RigidBodyDiscontinuity(session, **kw)
    if program == "mass_spring_velocity":
        from difftaichi_peers import load_example
        return load_example("mass_spring_velocity").MassSpringVelocity(session, **kw)
    if program == "water_renderer":
        from difftaichi_peers import load_example
        return load_example("water_renderer").WaterRenderer(session, **kw)
    from mass_spring import MassSpring
    return MassSpring(session, **kw)
