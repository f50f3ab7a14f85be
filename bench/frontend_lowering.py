"""What `@vkad.kernel` costs: parsing and lowering DiffTaichi's kernels against compiling them.

    python bench/frontend_lowering.py [--program mass_spring|diffmpm] [--reps R] [--device D]

Per program (examples/difftaichi/<program>.py: every kernel a @vkad.kernel), the median over
reps of: reading and parsing the kernels' sources (`inspect.getsource` + `ast`), lowering them
onto KernelBuilder (from parsed sources: the in-process caches cleared, the disk cache off),
building the same kernels with KernelBuilder calls (tests/python/difftaichi_builder_kernels.py,
the reference the tests compare the ports with), and compiling them (`s.differentiate`, the
session's caches off). docs/kernels.md has figures.
"""
import argparse
import os
import pathlib
import statistics
import sys
import time

os.environ["VKAD_CACHE"] = "0"  # nothing from disk: neither lowerings nor compiled kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples" / "difftaichi"))
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

import vkad  # noqa: E402
import vkad.frontend as fe  # noqa: E402


def kernels_of(program: str, ft):
    import difftaichi_builder_kernels as ref
    if program == "mass_spring":
        import mass_spring as port
        objects, springs = port.robot(0)
        args = (ft, len(objects), len(springs), True)
        return port.build_kernels(*args)[0], lambda: ref.mass_spring_kernels(*args)[0]
    import diffmpm as port
    scene = port.robot(port.Scene(port.N_GRID))
    args = (ft, port.N_GRID, scene.n_solid_particles, False)
    return port.build_kernels(*args), lambda: ref.diffmpm_kernels(*args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--program", choices=["mass_spring", "diffmpm"], default="mass_spring")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default=None)
    a = ap.parse_args(argv)
    parse, lower, build, compile_ = [], [], [], []
    for _ in range(a.reps):
        with vkad.Session(a.device) as s:  # a new session: no compiled kernel in memory
            fe._SOURCES.clear(), fe._LOWERED.clear(), fe._NAMES.clear()
            kernels, builder_port = kernels_of(a.program, vkad.f32)
            t0 = time.perf_counter()
            for k in kernels.values():
                k.src  # noqa: B018 - reads and parses the source
            t1 = time.perf_counter()
            for k in kernels.values():
                k.ir()
            t2 = time.perf_counter()
            for kb in builder_port().values():
                kb.finish()
            t3 = time.perf_counter()
            for k in kernels.values():
                s.differentiate(k.builder())
            t4 = time.perf_counter()
            parse.append(t1 - t0), lower.append(t2 - t1), build.append(t3 - t2)
            compile_.append(t4 - t3)
            device = s.device_name
    lines = sum(k.ir().count("\n") for k in kernels.values())
    med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    print(f"{device}: {a.program}, {len(kernels)} kernels, {lines} IR lines; "
          f"median of {a.reps}: parse {med(parse):.1f} ms, lower {med(lower):.1f} ms "
          f"(KernelBuilder calls {med(build):.1f} ms), differentiate {med(compile_):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
