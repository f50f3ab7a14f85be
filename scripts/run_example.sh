#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, run the main example.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./"${VKAD_BUILD_DIR:-build}"/examples/vkad-example "$@"
