#!/usr/bin/env bash
# Installs what flexc needs on Debian 12 (when missing), then configures and
# builds. Usage: scripts/setup.sh [BUILD_DIR [extra cmake args...]]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# clang: the libFuzzer targets (tests/fuzz, scripts/test.sh's third build).
for pkg in cmake make gcc g++ flex bison pkg-config check libsubunit-dev llvm-14-dev clang; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# NVRTC (CUDA 12 or newer) is loaded at run time (dlopen) from the CUDA
# toolkit (/usr/local/cuda) or the library path. Without it the compile
# tests skip; the emulator needs only the host C++ compiler. Debian 12's own
# nvidia-cuda-toolkit is CUDA 11.8, too old for sm_90a, so it is not
# installed here: install a CUDA 12+ toolkit from NVIDIA for those tests.
if ! ldconfig -p | grep -q libnvrtc && ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
  echo "setup: no NVRTC found; the CUDA compile tests will skip"
fi

build=${1:-build}
shift || true
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
