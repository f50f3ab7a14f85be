#!/usr/bin/env bash
# The Python package's test suite, the way a user installs it: a fresh venv, `pip install .`
# (docs/python.md), pytest and numpy (Debian's torch beside them), then tests/python with
# the Khronos validation layer on. The build folder build/python/<wheel tag> persists, so a
# second run recompiles nothing.
# VKAD_PYTHON (default /usr/bin/python3 when present: Debian's, as docs/python.md assumes) picks
# the interpreter; VKAD_VENV (default build/python-venv) the venv, recreated on every run.
set -euo pipefail
cd "$(dirname "$0")/.."
# What docs/python.md has a user install beyond scripts/setup.sh's packages.
missing=()
# python3-torch (Debian's PyTorch 1.13, CPU, with gloo): the interop and multi-process tests
# (vkad.torch, torch.distributed) run against it; PyPI's torch wheel pulls gigabytes of CUDA.
for p in python3-venv python3-dev python3-torch; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  echo "vkad python tests: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
python=${VKAD_PYTHON:-$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3 )}
venv=${VKAD_VENV:-build/python-venv}
rm -rf "$venv"
# --system-site-packages: Debian's torch (and the numpy it was built against) stay visible.
"$python" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q .
"$venv/bin/python" -m pip install -q pytest numpy
export VKAD_VALIDATION=1
export VKAD_CACHE=0  # never the user's on-disk caches (conftest.py sets it too)
# From outside the checkout, so `import vkad` is the installed package, not python/vkad.
cd tests/python
"../../$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
