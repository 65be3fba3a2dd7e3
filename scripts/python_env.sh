#!/usr/bin/env bash
# Makes the virtual environment the Python tests run in: VENV (default
# build/venv) with torch, numpy, pytest and scikit-build-core from PyPI
# (PyTorch's wheel is large: a few minutes the first time, nothing after).
# Never fails its caller: what cannot be had is said here and in VENV.log,
# and the Python tests then skip (exit 77) naming it.
# Usage: scripts/python_env.sh [VENV]
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/venv}
log=$venv.log
py=${PYTHON:-python3}
mkdir -p "$(dirname "$venv")"
: >"$log"

if [ ! -x "$venv/bin/python" ]; then
  if ! "$py" -m venv "$venv" >>"$log" 2>&1; then
    # Debian's python3 makes virtual environments only with python3-venv.
    rm -rf "$venv"
    echo "python_env: installing python3-venv"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        $SUDO apt-get install -y -qq python3-venv; } >>"$log" 2>&1
    if ! "$py" -m venv "$venv" >>"$log" 2>&1; then
      rm -rf "$venv"
      echo "python_env: cannot make a virtual environment with $py (see $log); the Python tests will skip"
      exit 0
    fi
  fi
fi
if "$venv/bin/python" -c "import torch, numpy, pytest, scikit_build_core" 2>/dev/null; then
  exit 0
fi
echo "python_env: installing torch numpy pytest scikit-build-core into $venv"
if ! "$venv/bin/python" -m pip install -q torch numpy pytest scikit-build-core >>"$log" 2>&1; then
  echo "python_env: pip could not install them (see $log); the Python tests will skip:"
  tail -3 "$log"
fi
exit 0
