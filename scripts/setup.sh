#!/usr/bin/env bash
# Installs what vkad needs from Debian's packages, only what is missing (idempotent),
# then configures and builds into ./build. Nothing is downloaded outside apt.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config ccache
  libvulkan-dev libvulkan-volk-dev spirv-tools spirv-headers
  libgtest-dev libgmock-dev libbenchmark-dev
  mesa-vulkan-drivers vulkan-validationlayers)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "vkad setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_dir=${VKAD_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${VKAD_BUILD_TYPE:-RelWithDebInfo} ${VKAD_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir"
