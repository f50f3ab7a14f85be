#!/usr/bin/env bash
# The GPU machine in the loop, in two parts (see docs/benchmarks.md, "GPU check").
#
#   scripts/gpu-check.sh prepare     HERE (a Debian 12 dev machine with network):
#       downloads the Vulkan loader, the GL dispatch libraries the NVIDIA ICD needs and the
#       Khronos validation layer (Debian 12 amd64 .debs) into .gl/, builds a Release tree into
#       build-gpu/ and copies the stripped test, benchmark, example and tool binaries into
#       build-gpu/bin/, and the Python package as a wheel for the GPU machine's Python 3.12
#       (with pytest's wheels) into build-gpu/bin/wheels (what travels: .gl + build-gpu/bin,
#       well under the 64 MiB carry limit). VKAD_GPU_PYTHON names the 3.12 interpreter
#       (default: python3.12 on PATH); without one the Python suite is skipped there.
#
#   scripts/gpu-check.sh run [--quick|--programs|--benches]   THERE (the GPU machine; carry [".gl", "build-gpu/pack"]):
#       unpacks the libraries, runs the whole GPU test suite in ONE process under the validation
#       layer (one process on purpose: it is what a DSL does, and what hit NVIDIA's instance
#       limit), the unit tests, the Python suite (the wheel installed into /tmp/site, pytest
#       under validation), the examples, then every benchmark; writes $OUT/gpu-check.json
#       (machine-readable: device, driver, commit, test counts, failures, every benchmark's
#       JSON) and $OUT/gpu-check.txt (the human summary). --quick skips the benchmarks;
#       --programs runs the tests and the whole-program benchmarks; --benches those benchmarks
#       alone (for a second call, e.g. the one that brings the last part of a peer's wheel).
#       bench/peers.py (PyTorch and JAX, where installed) runs with the benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

packages="libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 vulkan-validationlayers"

prepare() {
  set -e
  mkdir -p .gl /tmp/vkad-amd64/partial
  if ! ls .gl/libglvnd0_*.deb >/dev/null 2>&1 || ! ls .gl/vulkan-validationlayers_*.deb >/dev/null 2>&1; then
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/vkad-amd64'
    apt-get $o update -qq
    # The libvulkan1 deb alone is not enough: without libglvnd0/libglx0/libegl1 the NVIDIA ICD
    # returns no vkCreateInstance (VK_ERROR_INCOMPATIBLE_DRIVER).
    (cd .gl && apt-get $o download $packages 2>&1 | grep -v unsandboxed || true)
  fi
  cp scripts/gpu-env.sh .gl/gpu-env.sh
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-gpu
  rm -rf build-gpu/bin && mkdir -p build-gpu/bin
  for f in tests/vkad_gpu_tests tests/vkad_unit_tests examples/vkad-example examples/vkad-embedding \
           vkad-info vkad-cold-start bench/vkad-bench-dispatch bench/vkad-bench-retirement bench/vkad-bench-codegen \
           bench/vkad-bench-adjoint bench/vkad-bench-adjoint-floor bench/vkad-bench-launch \
           bench/vkad-bench-counted bench/vkad-bench-substep; do
    [ -f "build-gpu/$f" ] && cp "build-gpu/$f" build-gpu/bin/
  done
  strip build-gpu/bin/*
  # The Python package for the GPU machine's interpreter (3.12), and pytest, as wheels.
  local py=${VKAD_GPU_PYTHON:-python3.12}
  if "$py" -c pass 2>/dev/null; then
    mkdir -p build-gpu/bin/wheels
    "$py" -m pip wheel -q --no-deps -w build-gpu/bin/wheels .
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      -d build-gpu/bin/wheels pytest pluggy iniconfig packaging pygments
  else
    echo "gpu-check prepare: no python3.12 (VKAD_GPU_PYTHON): the Python suite will be skipped there"
  fi
  git rev-parse --short HEAD > build-gpu/bin/COMMIT
  git status --porcelain | grep -q . && echo "+uncommitted" >> build-gpu/bin/COMMIT
  # The statically linked binaries are ~6 MB each, 70 MB in all: what travels is one xz archive
  # (carry [".gl", "build-gpu/pack"]); run unpacks it into build-gpu/bin.
  rm -rf build-gpu/pack && mkdir -p build-gpu/pack
  tar c -C build-gpu bin | xz -T2 -6 > build-gpu/pack/bin.tar.xz
  du -sh .gl build-gpu/pack
}

run() {
  local quick=0 programs=0
  [ "${1:-}" = "--quick" ] && quick=1
  # --programs: the quick check, then the whole-program benchmarks (substep program in C++ and
  # Python beside Warp / JAX / torch, launch cost, retirement, codegen, counted) -- what fits
  # one 10-minute call.
  [ "${1:-}" = "--programs" ] && quick=1 && programs=1
  # --benches: the whole-program benchmarks alone (the tests ran in an earlier call).
  local tests=1
  [ "${1:-}" = "--benches" ] && quick=1 && programs=1 && tests=0
  out=${OUT:-/tmp/gpu-check-out}
  mkdir -p "$out"
  bin=build-gpu/bin
  [ -f build-gpu/pack/bin.tar.xz ] && xz -dc build-gpu/pack/bin.tar.xz | tar x -C build-gpu
  . .gl/gpu-env.sh > "$out/env.txt" 2>&1
  local txt="$out/gpu-check.txt"
  {
    echo "vkad GPU check  $(date -u +%Y-%m-%dT%H:%MZ)  commit $(tr '\n' ' ' < $bin/COMMIT)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
  } > "$txt"
  "$bin/vkad-info" > "$out/vkad-info.txt" 2>&1
  if [ $? -ne 0 ]; then
    echo "vkad-info failed; loader log follows" >> "$txt"
    VK_LOADER_DEBUG=error,warn,driver "$bin/vkad-info" 2>&1 | tail -30 >> "$txt"
  fi
  head -3 "$out/vkad-info.txt" >> "$txt"

  # The Python package into its own folder (/tmp/site may hold peers carried separately: Warp).
  if ls $bin/wheels/vkad-*.whl >/dev/null 2>&1; then
    rm -rf /tmp/vkad-site && python3 -m pip install -q --no-index --no-deps --target /tmp/vkad-site \
      $bin/wheels/*.whl > "$out/python-install.log" 2>&1
  fi
  if [ $tests -eq 1 ]; then
    # The GPU suite in one process, validation on (any validation message fails the test that
    # caused it); then the unit tests; then the two examples as the README runs them.
    VKAD_VALIDATION=1 timeout 420 "$bin/vkad_gpu_tests" --gtest_output=json:"$out/gpu-tests.json" \
      > "$out/gpu-tests.log" 2>&1
    rc=$?
    echo "gpu tests (one process, validation on): exit $rc" >> "$txt"
    [ $rc -ne 0 ] && { echo "--- last lines of the GPU test log"; tail -25 "$out/gpu-tests.log"; echo "---"; } >> "$txt"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED TEST" "$out/gpu-tests.log" | sort | uniq -c | head -40 >> "$txt"
    grep -c "\[vkad validation\]" "$out/gpu-tests.log" | sed 's/^/validation messages: /' >> "$txt"
    # The unit tests that read README/corpus files find them in this working copy.
    VKAD_SOURCE_DIR=$PWD timeout 120 "$bin/vkad_unit_tests" > "$out/unit-tests.log" 2>&1
    echo "unit tests: exit $? ($(grep -E '^\[  PASSED' "$out/unit-tests.log"))" >> "$txt"
    VKAD_VALIDATION=1 timeout 60 "$bin/vkad-embedding" > "$out/embedding.log" 2>&1
    echo "example.embedding (validation on): exit $?" >> "$txt"
    # The Python suite on the GPU, validation on, from the wheel built by prepare.
    if [ -d /tmp/vkad-site/vkad ]; then
      (cd tests/python && PYTHONPATH=/tmp/vkad-site VKAD_VALIDATION=1 timeout 300 python3 -m pytest -q \
         -p no:cacheprovider --junitxml="$out/python-tests.xml" . > "$out/python-tests.log" 2>&1)
      echo "python tests (validation on): exit $?: $(tail -1 "$out/python-tests.log")" >> "$txt"
    else
      echo "python tests: skipped (no wheel in $bin/wheels)" >> "$txt"
    fi
  fi

  if [ $quick -eq 0 ]; then
    timeout 120 "$bin/vkad-example" --svg "$out/training.svg" > "$out/example.log" 2>&1
    echo "vkad-example: exit $?: $(grep -E 'iterations/s|it/s' "$out/example.log" | tail -1)" >> "$txt"
    timeout 120 "$bin/vkad-bench-dispatch" --json "$out/bench-dispatch.json" > "$out/bench-dispatch.txt" 2>&1
    echo "bench dispatch: exit $?" >> "$txt"
    timeout 240 "$bin/vkad-bench-retirement" --flushes 100000 --json "$out/bench-retirement.json" \
      > "$out/bench-retirement.txt" 2>&1
    echo "bench retirement: exit $?" >> "$txt"
    timeout 120 "$bin/vkad-bench-codegen" --json "$out/bench-codegen.json" > "$out/bench-codegen.txt" 2>&1
    echo "bench codegen: exit $?" >> "$txt"
    timeout 60 "$bin/vkad-bench-launch" --json "$out/bench-launch.json" > "$out/bench-launch.txt" 2>&1
    echo "bench launch: exit $?" >> "$txt"
    timeout 60 "$bin/vkad-bench-counted" --json "$out/bench-counted.json" > "$out/bench-counted.txt" 2>&1
    echo "bench counted: exit $?" >> "$txt"
    timeout 120 "$bin/vkad-bench-substep" --json "$out/bench-substep.json" > "$out/bench-substep.txt" 2>&1
    echo "bench substep (C++): exit $?" >> "$txt"
    # The same program from Python and in the peers installed there (Warp when carried into
    # /tmp/site: ../shared/DEVICE.md), bench/substep.py.
    if [ -d /tmp/vkad-site/vkad ]; then
      PYTHONPATH=/tmp/vkad-site:/tmp/site timeout 300 python3 bench/substep.py --json "$out/bench-substep-py.json" \
        > "$out/bench-substep-py.txt" 2>&1
      echo "bench substep (Python, peers): exit $?" >> "$txt"
    fi
    timeout 240 "$bin/vkad-bench-adjoint" --json "$out/bench-adjoint.json" > "$out/bench-adjoint.txt" 2>&1
    echo "bench adjoint: exit $?" >> "$txt"
    # The generated adjoint against the hand-written slot-major heap tape, in both layouts.
    for l in slot thread; do
      timeout 300 "$bin/vkad-bench-adjoint-floor" --layout $l --json "$out/bench-floor-$l.json" \
        > "$out/bench-floor-$l.txt" 2>&1
      echo "bench adjoint floor ($l-major): exit $?" >> "$txt"
    done
    # The same kernels in PyTorch and JAX where they are installed (bench/peers.py).
    timeout 300 python3 bench/peers.py --json "$out/bench-peers.json" > "$out/bench-peers.txt" 2>&1
    echo "bench peers (pytorch, jax): exit $?" >> "$txt"
    for f in dispatch retirement codegen launch counted substep substep-py adjoint floor-slot floor-thread peers; do
      echo "--- $f" >> "$txt"
      cat "$out/bench-$f.txt" >> "$txt"
    done
  fi
  if [ $programs -eq 1 ]; then
    local pp=/tmp/vkad-site:/tmp/site
    for b in "substep:120:$bin/vkad-bench-substep" "launch:60:$bin/vkad-bench-launch" \
             "counted:60:$bin/vkad-bench-counted" "codegen:90:$bin/vkad-bench-codegen" \
             "retirement:120:$bin/vkad-bench-retirement --flushes 30000"; do
      IFS=: read -r name limit cmd <<< "$b"
      timeout "$limit" $cmd --json "$out/bench-$name.json" > "$out/bench-$name.txt" 2>&1
      echo "bench $name: exit $?" >> "$txt"
    done
    PYTHONPATH=$pp timeout 240 python3 bench/substep.py --json "$out/bench-substep-py.json" \
      > "$out/bench-substep-py.txt" 2>&1
    echo "bench substep (Python, peers): exit $?" >> "$txt"
    PYTHONPATH=$pp timeout 60 python3 bench/python_launch.py --json "$out/bench-launch-py.json" \
      > "$out/bench-launch-py.txt" 2>&1
    echo "bench launch (Python): exit $?" >> "$txt"
    for f in substep substep-py launch launch-py counted codegen retirement; do
      echo "--- $f" >> "$txt"
      cat "$out/bench-$f.txt" >> "$txt"
    done
  fi
  # One JSON with everything machine-readable.
  python3 - "$out" "$(tr -d '\n' < $bin/COMMIT)" <<'EOF'
import json, os, sys
out, commit = sys.argv[1], sys.argv[2]
doc = {"commit": commit}
try:
    doc["device"] = open(os.path.join(out, "vkad-info.txt")).read().splitlines()[:2]
except OSError:
    pass
try:
    t = json.load(open(os.path.join(out, "gpu-tests.json")))
    doc["gpu_tests"] = {"tests": t.get("tests"), "failures": t.get("failures"),
                        "disabled": t.get("disabled"), "errors": t.get("errors")}
    doc["gpu_test_failures"] = [f"{s['name']}.{c['name']}" for s in t.get("testsuites", [])
                                for c in s.get("testsuite", []) if c.get("failures")]
except (OSError, ValueError) as e:
    doc["gpu_tests"] = f"no result: {e}"
try:
    import xml.etree.ElementTree as ET
    suite = ET.parse(os.path.join(out, "python-tests.xml")).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    doc["python_tests"] = {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")}
    doc["python_test_failures"] = [c.get("classname", "") + "." + c.get("name", "")
                                   for c in suite.iter("testcase")
                                   if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError, AttributeError) as e:
    doc["python_tests"] = f"no result: {e}"
for b in ("dispatch", "retirement", "codegen", "launch", "launch-py", "counted", "substep", "substep-py", "adjoint", "floor-slot",
          "floor-thread", "peers"):
    p = os.path.join(out, f"bench-{b}.json")
    if os.path.exists(p):
        try:
            doc[f"bench_{b}"] = json.load(open(p))
        except ValueError as e:
            doc[f"bench_{b}"] = f"unreadable: {e}"
json.dump(doc, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)
EOF
  # At most 8 files come back from the GPU machine: the summary, the JSON, and one archive.
  tmp_tar=$(mktemp /tmp/vkad-logs.XXXXXX.tar.gz)
  (cd "$out" && tar czf "$tmp_tar" --exclude=gpu-check.txt --exclude=gpu-check.json . ;
   find . -type f ! -name gpu-check.txt ! -name gpu-check.json -delete)
  mv "$tmp_tar" "$out/logs.tar.gz"
  cat "$txt"
}

case "$mode" in
  prepare) prepare ;;
  run) run "$@" ;;
  *) echo "usage: scripts/gpu-check.sh prepare | run [--quick | --programs]   (see the header of this script)"; exit 2 ;;
esac
