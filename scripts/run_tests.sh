#!/usr/bin/env bash
# Quick start, step 2: the whole test suite (unit + GPU on lavapipe or a real GPU, with the
# Khronos validation layer on; a single validation message fails the test that caused it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export VKAD_VALIDATION=1
# Never the user's on-disk caches (ctest sets it per test as well; docs/caches.md).
export VKAD_CACHE=0
cd "${VKAD_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" "$@"
