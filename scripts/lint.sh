#!/usr/bin/env bash
# Lint: clang-tidy (.clang-tidy: naming and bugprone-*) over the library sources, function size
# (lizard: no function of the library over 80 lines of code or cyclomatic complexity 25), and
# clang-format (.clang-format) over the lines changed relative to a base revision.
#   scripts/lint.sh [BASE]      BASE defaults to origin/main, else main, else HEAD~1
# VKAD_BUILD_DIR (default build) holds compile_commands.json; it is configured there (cmake
# only, no build) when missing. VKAD_LINT_SKIP="tidy throws size format" skips a part. Installs
# clang-tidy / clang-format from Debian's packages when missing, like setup.sh, and lizard
# (PyPI, pinned) into a venv under the build directory when it is not on PATH.
# Exit status: non-zero when either part reports anything.
set -euo pipefail
cd "$(dirname "$0")/.."
skip=" ${VKAD_LINT_SKIP:-} "
build_dir=${VKAD_BUILD_DIR:-build}

missing=()
command -v clang-tidy >/dev/null || missing+=(clang-tidy)
command -v clang-format >/dev/null || missing+=(clang-format)
if [ ${#missing[@]} -gt 0 ]; then
  echo "vkad lint: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

base=${1:-}
if [ -z "$base" ]; then
  for b in origin/main main HEAD~1; do
    if git rev-parse -q --verify "$b^{commit}" >/dev/null; then base=$b; break; fi
  done
fi

status=0

if [[ "$skip" != *" tidy "* ]]; then
  if [ ! -f "$build_dir/compile_commands.json" ]; then
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
  fi
  mapfile -t sources < <(git ls-files 'base/*.cpp' 'abi/*.cpp' 'rhi/*.cpp' 'runtime/*.cpp' 'ir/*.cpp' 'autodiff/*.cpp' 'spirv/*.cpp' 'reference/*.cpp' 'graph/*.cpp' 'adstack/*.cpp' 'api/*.cpp')
  echo "=== clang-tidy: ${#sources[@]} library sources"
  # One clang-tidy per core; a finding in a header shows once per source including it, so the
  # lines are de-duplicated. Its exit status is not used: the findings are the result.
  log=$(mktemp)
  printf '%s\n' "${sources[@]}" |
    (xargs -P "$(nproc)" -n 4 clang-tidy -p "$build_dir" --quiet 2>/dev/null || true) |
    grep -E "(warning|error):" | sort -u >"$log" || true
  if [ -s "$log" ]; then
    cat "$log"
    echo "clang-tidy: $(wc -l <"$log") finding(s)"
    status=1
  else
    echo "clang-tidy: clean"
  fi
  rm -f "$log"
fi

if [[ "$skip" != *" throws "* ]]; then
  # Calls that throw on input they cannot parse or read (std::stoi/stoul/stod..., iostream
  # files), where a user's text, file or environment can reach them: the library and the
  # binding use std::from_chars / strtoll with clamps and POSIX reads (base/cache_file.cpp)
  # instead, so nothing crashes through extern "C" (docs/architecture.md, "Checks").
  echo "=== throwing parses and stream reads in the library and the binding"
  hits=$(git grep -n -E 'std::sto(i|l|ul|ll|ull|f|d|ld)\(|std::(i|o)?fstream' -- \
    'base/*' 'abi/*' 'rhi/*' 'runtime/*' 'ir/*' 'autodiff/*' 'spirv/*' 'reference/*' 'graph/*' \
    'adstack/*' 'api/*' 'python/src/*' || true)
  if [ -n "$hits" ]; then
    echo "$hits"
    echo "throwing calls: use std::from_chars / strtoll with a clamp, or base/cache_file.h"
    status=1
  else
    echo "throwing calls: none"
  fi
fi

if [[ "$skip" != *" size "* ]]; then
  echo "=== lizard: library functions over 80 lines of code or cyclomatic complexity 25"
  lizard_cmd=$(command -v lizard || true)
  if [ -z "$lizard_cmd" ]; then
    mkdir -p "$build_dir"
    venv="$build_dir/lint-venv"
    if [ ! -x "$venv/bin/lizard" ]; then
      python3 -m venv "$venv" >/dev/null 2>&1 || {
        sudo_cmd=""
        [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends python3-venv
        rm -rf "$venv"
        python3 -m venv "$venv"
      }
      "$venv/bin/pip" install -q lizard==1.24.3
    fi
    lizard_cmd="$venv/bin/lizard"
  fi
  # -w prints only the functions over a limit (as warnings); the exit status counts them.
  if "$lizard_cmd" -L 80 -C 25 -w base abi rhi runtime ir autodiff spirv reference graph adstack api python/src; then
    echo "lizard: clean"
  else
    echo "lizard: functions over the limits (split them: docs/architecture.md, \"Function size\")"
    status=1
  fi
fi

if [[ "$skip" != *" format "* ]]; then
  echo "=== clang-format: lines changed since $base"
  mapfile -t changed < <(git diff --name-only --diff-filter=AMR "$base" -- '*.cpp' '*.h' '*.c')
  for f in "${changed[@]}"; do
    [ -f "$f" ] || continue
    # The changed line ranges of f (new side of a zero-context diff): --lines=a:b each.
    mapfile -t ranges < <(git diff -U0 "$base" -- "$f" |
      sed -n 's/^@@ -[0-9,]* +\([0-9]*\)\(,\([0-9]*\)\)\? @@.*/\1 \3/p' |
      awk '{ n = ($2 == "") ? 1 : $2; if (n > 0) print "--lines=" $1 ":" $1 + n - 1 }')
    [ ${#ranges[@]} -gt 0 ] || continue
    clang-format --dry-run --Werror "${ranges[@]}" "$f" || status=1
  done
fi
exit $status
