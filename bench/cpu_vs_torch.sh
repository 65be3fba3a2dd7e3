#!/usr/bin/env bash
# The CPU backend beside PyTorch on the same machine, in one run:
# bench_cpu (build-rel), then bench/torch_cpu.py in a venv with PyTorch
# from PyPI (created on first use at $VENV, default .venv-torch; the PyPI
# wheel brings CUDA libraries too, several GB, unused here). Threads:
# FLEXC_THREADS for both (default every core).
# Usage: bench/cpu_vs_torch.sh [--L 2048,4096] [--E 64,128] [--reps N]
#        bench/cpu_vs_torch.sh --forward [--L ..] [--E ..] [--reps N]
# --forward is for a shared machine: fp32 forwards only, medians of --reps
# on both sides, ours before and after torch's (bench_cpu --ratios), so
# that a change of load in between shows as a difference of the two.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-torch}
forward=0
if [ "${1:-}" = "--forward" ]; then
  forward=1
  shift
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch numpy
fi
cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-rel -j "$(nproc)" --target bench_cpu >/dev/null
threads=${FLEXC_THREADS:-$(nproc)}
echo "== $(date -u +%Y-%m-%dT%H:%MZ) commit $(git rev-parse --short HEAD), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ $forward = 1 ]; then
  FLEXC_THREADS=$threads build-rel/bench_cpu --ratios --dtypes fp32 "$@"
  echo
  "$VENV/bin/python" bench/torch_cpu.py --threads "$threads" --no-bwd --median "$@"
  echo
  echo "== again, load $(cut -d' ' -f1-3 /proc/loadavg)"
  FLEXC_THREADS=$threads build-rel/bench_cpu --ratios --dtypes fp32 "$@"
  exit 0
fi
FLEXC_THREADS=$threads build-rel/bench_cpu "$@"
echo
"$VENV/bin/python" bench/torch_cpu.py --threads "$threads" "$@"
