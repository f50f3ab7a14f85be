"""The front end's disk cache (frontend-<hash>.json beside the sessions' caches, python/vkad/
frontend.py `_Disk`) against entries that are not entries (issue 51, points 2-4): a FIFO, a
symlink to /dev/zero, a directory, an empty, truncated, garbage, deeply nested or oversized file
under the entry's name. Each is a miss: the kernel is lowered again and gives the right result,
without blocking (a FIFO) or reading without bound (/dev/zero); a bad regular file (or a FIFO or
symlink) is replaced by a good entry, which the next process then uses without parsing. Two
processes writing one folder at once never leave a torn entry.

Each run is a fresh process (the in-process memo would hide the disk), with a timeout (a hang
fails the test); the /dev/zero case runs under a data-size limit too (an unbounded read then
fails the test instead of eating the machine)."""
import glob
import json
import os
import resource
import subprocess
import sys

import pytest

PROG = (
    "import sys, numpy as np, vkad, vkad.frontend as fe\n"
    "SCALE = float(sys.argv[1])\n"
    "if sys.argv[2] == 'no-parse':\n"
    "    def refuse(*a, **k): raise AssertionError('parsed')\n"
    "    fe._Source.__init__ = refuse\n"
    "@vkad.kernel\n"
    "def k(x: vkad.array(vkad.f32)):\n"
    "    for i in range(x.shape[0]):\n"
    "        x[i] = x[i] * SCALE + 1.0\n"
    "with vkad.Session(cache_dir='') as s:\n"
    "    xs = s.ndarray(np.arange(3, dtype=np.float32))\n"
    "    k(xs, session=s)\n"
    "    print(xs.numpy().tolist())\n")

WANT = {"3": "[1.0, 4.0, 7.0]", "5": "[1.0, 6.0, 11.0]"}


def _limit_data():
    lim = 4 << 30  # far above what a run needs, far below what reading /dev/zero whole takes
    resource.setrlimit(resource.RLIMIT_DATA, (lim, lim))


class Prog:
    def __init__(self, tmp_path):
        self.path = tmp_path / "prog.py"
        self.path.write_text(PROG)
        self.cache = tmp_path / "cache"
        self.env = dict(os.environ, VKAD_CACHE_DIR=str(self.cache))
        self.env.pop("VKAD_CACHE", None)

    def run(self, scale="3", mode="parse", timeout=90, limit=False):
        r = subprocess.run([sys.executable, str(self.path), scale, mode], env=self.env,
                           capture_output=True, text=True, timeout=timeout,
                           preexec_fn=_limit_data if limit else None)
        return r.returncode, r.stdout.strip(), r.stderr

    def entries(self):
        return glob.glob(str(self.cache / "frontend-*.json"))

    def entry(self):
        """Runs once to make the entry; its path."""
        assert self.run()[:2] == (0, WANT["3"])
        (e,) = self.entries()
        return e


def _is_good_entry(path):
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        entry = json.load(f)
    return isinstance(entry, dict) and len(entry.get("lowerings", {})) == 1


def _fifo(p):
    os.mkfifo(p)


def _dev_zero(p):
    os.symlink("/dev/zero", p)


def _empty(p):
    open(p, "wb").close()


def _truncated(p, good):
    with open(p, "wb") as f:
        f.write(good[:len(good) // 2])


def _garbage(p):
    with open(p, "wb") as f:
        f.write(b"\x00\xff garbage \x80" * 100)


def _nested(p):  # valid-looking JSON nested past the decoder's recursion limit
    with open(p, "wb") as f:
        f.write(b"[" * 200000)


def _not_an_object(p):
    with open(p, "w") as f:
        json.dump([1, 2, 3], f)


def _wrong_shapes(p, good):  # an object whose fields have the wrong types
    entry = json.loads(good)
    entry["names"] = [[5, 6]]
    entry["lowerings"] = {h: {"ir": 7, "elements": 3, "lines": [1]}
                          for h in entry["lowerings"]}
    with open(p, "w") as f:
        json.dump(entry, f)


def _oversized(p):  # sparse: over the 64 MiB cap without taking the disk
    with open(p, "wb") as f:
        f.write(b"{")
        f.truncate((64 << 20) + 1)


HEALED = {
    "fifo": _fifo, "dev_zero_symlink": _dev_zero, "empty": _empty, "truncated": _truncated,
    "garbage": _garbage, "nested": _nested, "not_an_object": _not_an_object,
    "wrong_shapes": _wrong_shapes, "oversized": _oversized,
}


@pytest.mark.parametrize("kind", sorted(HEALED))
def test_a_bad_entry_is_a_miss_and_is_replaced(tmp_path, kind):
    p = Prog(tmp_path)
    e = p.entry()
    with open(e, "rb") as f:
        good = f.read()
    os.unlink(e)
    make = HEALED[kind]
    make(e, good) if make in (_truncated, _wrong_shapes) else make(e)
    limit = kind == "dev_zero_symlink"
    assert p.run(limit=limit)[:2] == (0, WANT["3"])          # compiled again, right, no hang
    assert _is_good_entry(e), kind                            # the bad entry was replaced
    assert p.run(mode="no-parse")[:2] == (0, WANT["3"])       # and is used
    assert not glob.glob(str(p.cache / ".frontend-*"))        # no temporary file left


def test_a_directory_entry_is_a_miss(tmp_path):
    p = Prog(tmp_path)
    e = p.entry()
    os.unlink(e)
    os.mkdir(e)
    with open(os.path.join(e, "inside"), "w") as f:
        f.write("{}")
    for scale in ("3", "5", "3"):                             # a miss every time, never a crash
        assert p.run(scale)[:2] == (0, WANT[scale])
    assert os.path.isdir(e)                                   # not the cache's to delete
    code, out, err = p.run(mode="no-parse")
    assert code != 0 and "parsed" in err
    assert not glob.glob(str(p.cache / ".frontend-*"))


def test_a_symlink_to_a_good_entry_is_read(tmp_path):
    # Symlinks are followed (a user may link the folder's files); only what they lead to is judged.
    p = Prog(tmp_path)
    e = p.entry()
    kept = str(tmp_path / "kept.json")
    os.replace(e, kept)
    os.symlink(kept, e)
    assert p.run(mode="no-parse")[:2] == (0, WANT["3"])


def test_a_stale_entry_is_not_removed_by_a_reader(tmp_path):
    # An entry of another key (another version of the front end under the same hash) is a miss
    # but not corrupt: the next store replaces it, a mere read leaves it.
    p = Prog(tmp_path)
    e = p.entry()
    with open(e, encoding="utf-8") as f:
        entry = json.load(f)
    entry["key"] = "another"
    with open(e, "w", encoding="utf-8") as f:
        json.dump(entry, f)
    assert p.run()[:2] == (0, WANT["3"])
    assert _is_good_entry(e)
    assert p.run(mode="no-parse")[:2] == (0, WANT["3"])


def test_two_processes_write_one_folder(tmp_path):
    # Writers race on one entry (each with its own captured value, so each rewrites the file
    # with its lowering added): every read sees a whole entry, the results are right, and at
    # the end the entry is whole JSON holding lowerings the last writer kept.
    p = Prog(tmp_path)
    p.entry()
    loop = (
        "import subprocess, sys\n"
        "for _ in range(int(sys.argv[3])):\n"
        "    r = subprocess.run([sys.executable, sys.argv[1], sys.argv[2], 'parse'],\n"
        "                       capture_output=True, text=True)\n"
        "    print(r.returncode, r.stdout.strip())\n")
    procs = [subprocess.Popen([sys.executable, "-c", loop, str(p.path), scale, "3"],
                              env=p.env, stdout=subprocess.PIPE, text=True)
             for scale in ("3", "5")]
    for scale, proc in zip(("3", "5"), procs):
        out, _ = proc.communicate(timeout=300)
        assert out.strip().split("\n") == [f"0 {WANT[scale]}"] * 3, out
    (e,) = p.entries()
    with open(e, encoding="utf-8") as f:
        assert len(json.load(f)["lowerings"]) >= 1
    assert not glob.glob(str(p.cache / ".frontend-*"))
