#!/usr/bin/env bash
# Installs what flexc needs on Debian 12 (when missing), then configures and
# builds. Usage: scripts/setup.sh [BUILD_DIR [extra cmake args...]]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in cmake make gcc g++ flex bison pkg-config check libsubunit-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# NVRTC is loaded at run time (dlopen); without it the CUDA and compile
# tests skip. Debian ships it in non-free as nvidia-cuda-toolkit.
if ! ldconfig -p | grep -q libnvrtc && ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
  if apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "setup: installing nvidia-cuda-toolkit (NVRTC)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nvidia-cuda-toolkit >/dev/null || true
  else
    echo "setup: no NVRTC found and none installable; CUDA compile tests will skip"
  fi
fi

build=${1:-build}
shift || true
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
