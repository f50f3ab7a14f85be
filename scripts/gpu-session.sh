#!/usr/bin/env bash
# A GPU session's calls without a second build: the README's build (build/, configured with
# -DVKAD_PYTHON=ON for a cp312 interpreter) travels as stripped binaries and a site folder, and
# the suite, the Python suite and A/B races run from them. scripts/gpu-check.sh is the whole
# check from a Release tree and a wheel; this is the lighter loop for measuring a change.
#
# HERE (the development machine):
#   scripts/gpu-session.sh pack    stripped test, example, tool and benchmark binaries of build/
#                                  into build-gpu/pack/bin.tar.xz (with COMMIT)
#   scripts/gpu-session.sh site    python/vkad + the stripped cp312 extension of build/python
#                                  into build-gpu/pysite (a folder for PYTHONPATH; with COMMIT)
#   scripts/gpu-session.sh warp    Warp 1.19.0's wheel for cp312, its CPU backend, examples and
#                                  tests left out, xz-packed and split into three parts of at
#                                  most 27 MiB: build-gpu/peers/warp.part.{aa,ab,ac}
# THERE (the GPU machine; every call carries .gl and what it runs from, e.g.
#   [".gl", "build-gpu/pack", "scripts"] or [".gl", "build-gpu/pysite", "scripts"]):
#   scripts/gpu-session.sh suite           the C++ GPU suite in one process under validation,
#                                          the unit tests and the C API test: $OUT/{gpu,unit,capi}.txt
#   scripts/gpu-session.sh python 1|2      half of tests/python under validation (by file name,
#                                          below / from "test_difftaichi_m"): $OUT/py<N>.txt
#   scripts/gpu-session.sh ab VAR=VALUE P...   bench/difftaichi.py --only vkad for each program,
#                                          without and with VAR=VALUE, alternated twice, each
#                                          variant its own kernel cache: $OUT/ab.txt
#   scripts/gpu-session.sh race P...       --only vkad,warp-graph for each program: $OUT/race.txt
# A call that carries one of the Warp parts (build-gpu/peers/warp.part.xx) keeps it in /tmp/keep
# on the machine; the call that finds all three unpacks Warp into /tmp/site. The machine keeps
# them only while it stays warm (about 30 s between calls). ITERS sets the iterations (12),
# ARGS more arguments of bench/difftaichi.py (e.g. "--steps 64"), PYTHON the interpreter
# (python3).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
root=$(pwd)

here_pack() {
  set -e
  local b=build p=build-gpu/pack tmp
  tmp=$(mktemp -d)
  for f in tests/vkad_gpu_tests tests/vkad_unit_tests tests/vkad_c_api_test vkad-info; do
    [ -f "$b/$f" ] && cp "$b/$f" "$tmp/"
  done
  for f in "$b"/examples/* "$b"/bench/vkad-bench-*; do
    [ -f "$f" ] && [ -x "$f" ] && cp "$f" "$tmp/"
  done
  strip "$tmp"/* 2>/dev/null || true
  rm -rf "$p" && mkdir -p "$p"
  tar cJf "$p/bin.tar.xz" -C "$tmp" .
  rm -rf "$tmp"
  git rev-parse --short HEAD >"$p/COMMIT"
  du -sh "$p"
}

here_site() {
  set -e
  local d=build-gpu/pysite so
  so=$(find build/python -maxdepth 1 -name "_vkad*.so" 2>/dev/null | head -1)
  if [ -z "$so" ]; then
    echo "gpu-session site: no build/python/_vkad*.so; configure build/ with -DVKAD_PYTHON=ON" \
         "-DPython_EXECUTABLE=<a python3.12> and build it" >&2
    exit 2
  fi
  rm -rf "$d" && mkdir -p "$d/vkad"
  cp -r python/vkad/. "$d/vkad/"
  find "$d" -name __pycache__ -prune -exec rm -rf {} +
  cp "$so" "$d/vkad/" && strip "$d/vkad/$(basename "$so")"
  cp build/python/*.pyi "$d/vkad/" 2>/dev/null || true
  touch "$d/vkad/py.typed"
  git rev-parse --short HEAD >"$d/COMMIT"
  du -sh "$d"
}

here_warp() {
  set -e
  local tmp py=${VKAD_GPU_PYTHON:-python3}
  tmp=$(mktemp -d)
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" warp-lang==1.19.0
  (cd "$tmp" && mkdir w && cd w && unzip -q ../warp_lang-*.whl &&
    rm -rf warp/bin/warp-clang.so warp/examples warp/tests)
  mkdir -p build-gpu/peers && rm -f build-gpu/peers/warp.part.*
  tar c -C "$tmp/w" . | xz -9 -T0 | split -b 27M -a 2 - build-gpu/peers/warp.part.
  rm -rf "$tmp"
  ls -l build-gpu/peers
}

# THERE: the GPU machine's Vulkan (the loader and GL libraries .gl carries) and the Warp parts.
there_env() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    # shellcheck source=/dev/null
    . .gl/gpu-env.sh >/dev/null
  fi
  mkdir -p /tmp/keep /tmp/site
  cp build-gpu/peers/warp.part.* /tmp/keep/ 2>/dev/null || true
  if [ "$(find /tmp/keep -name "warp.part.*" | wc -l)" = 3 ] && [ ! -d /tmp/site/warp ]; then
    cat /tmp/keep/warp.part.* | tar xJ -C /tmp/site && echo "warp unpacked"
  fi
  export PYTHONPATH=$root/build-gpu/pysite:/tmp/site
  py=${PYTHON:-python3}
  read -ra extra <<<"${ARGS:-}"
  out=${OUT:-/tmp/out}
  mkdir -p "$out"
}

there_suite() {
  mkdir -p /tmp/bin && tar xJf build-gpu/pack/bin.tar.xz -C /tmp/bin
  echo "commit $(cat build-gpu/pack/COMMIT)"
  (time VKAD_VALIDATION=1 VKAD_CACHE_DIR=/tmp/vkcache /tmp/bin/vkad_gpu_tests) >"$out/gpu.txt" 2>&1
  # The last summary lines: death tests' child processes print their own before them.
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$out/gpu.txt" | tail -3
  echo "validation messages: $(grep -c -E 'VUID-|Validation Error' "$out/gpu.txt")"
  VKAD_SOURCE_DIR=$root /tmp/bin/vkad_unit_tests >"$out/unit.txt" 2>&1
  grep -E "^\[  (PASSED|FAILED) +\] [0-9]+ tests?" "$out/unit.txt" | tail -2
  VKAD_VALIDATION=1 /tmp/bin/vkad_c_api_test >"$out/capi.txt" 2>&1
  echo "c api: rc $?, $(tail -1 "$out/capi.txt")"
}

there_python() {
  local half=${1:-1} files
  echo "commit $(cat build-gpu/pysite/COMMIT)"
  cd tests/python || exit 2
  if [ "$half" = 1 ]; then
    files=$(printf '%s\n' test_*.py | awk '$0 < "test_difftaichi_m"')
  else
    files=$(printf '%s\n' test_*.py | awk '$0 >= "test_difftaichi_m"')
  fi
  # shellcheck disable=SC2086
  (time VKAD_VALIDATION=1 VKAD_CACHE_DIR=/tmp/vkcache "$py" -m pytest -q -p no:cacheprovider \
    $files) >"$out/py$half.txt" 2>&1
  tail -4 "$out/py$half.txt"
}

there_ab() {
  local var=$1 p
  shift
  echo "commit $(cat build-gpu/pysite/COMMIT); off / on: $var"
  for p in "$@"; do
    for _ in 1 2; do
      VKAD_CACHE_DIR=/tmp/c_off "$py" bench/difftaichi.py --program "$p" --iters "${ITERS:-12}" \
        --only vkad "${extra[@]}" 2>&1 | grep -Ei "^vkad|fail|error" | sed "s/^/off $p: /" >>"$out/ab.txt"
      env "$var" VKAD_CACHE_DIR=/tmp/c_on "$py" bench/difftaichi.py --program "$p" \
        --iters "${ITERS:-12}" --only vkad "${extra[@]}" 2>&1 | grep -Ei "^vkad|fail|error" |
        sed "s/^/on  $p: /" >>"$out/ab.txt"
    done
  done
  cat "$out/ab.txt"
}

there_race() {
  local p
  echo "commit $(cat build-gpu/pysite/COMMIT)"
  for p in "$@"; do
    VKAD_CACHE_DIR=/tmp/c_race timeout 300 "$py" bench/difftaichi.py --program "$p" \
      --iters "${ITERS:-12}" --only vkad,warp-graph "${extra[@]}" 2>&1 | tail -6 >>"$out/race.txt"
  done
  cat "$out/race.txt"
}

case "$mode" in
  pack) here_pack ;;
  site) here_site ;;
  warp) here_warp ;;
  suite) there_env && there_suite ;;
  python) there_env && there_python "$@" ;;
  ab)
    [ $# -ge 2 ] || { echo "usage: $0 ab VAR=VALUE PROGRAM..." >&2; exit 2; }
    there_env && there_ab "$@" ;;
  race)
    [ $# -ge 1 ] || { echo "usage: $0 race PROGRAM..." >&2; exit 2; }
    there_env && there_race "$@" ;;
  *)
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    [ "$mode" = "-h" ] || [ "$mode" = "--help" ] || exit 2 ;;
esac
