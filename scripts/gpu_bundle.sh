#!/usr/bin/env bash
# gpu_bundle.sh: makes build-gpu/, everything a GPU machine needs to run
# bench/run_gpu.sh with no CMake, no compiler and no package (docs/cuda.md,
# "A GPU session"). Run on the development machine, from anywhere:
#
#   scripts/gpu_bundle.sh [--out DIR] [--tree DIR] [--no-fill | --fill-only NAMES]
#                         [--python PY] [--jobs N]
#
#   --out DIR          the bundle (default build-gpu, in the checkout)
#   --tree DIR         the CMake build tree (default build-gpu-tree)
#   --no-fill          no kernel cache (a bundle that runs, compiling there)
#   --fill-only NAMES  fill only for these lines of bench/gpu_checks.txt
#                      (comma-separated; the CTest gpu_bundle uses one)
#   --python PY        a Python with PyTorch (CPU is enough) for the Python
#                      check's kernels (default: build/venv/bin/python, then
#                      python3; without torch those few compile on the GPU)
#   --jobs N           parallel builds and fills (default: nproc)
#
# 1. A Release build (-DFLEXC_CPU=OFF -DFLEXC_PORTABLE=ON): no LLVM, Check
#    and subunit linked statically, no path of this machine in a binary.
# 2. The bundle: bin/ (flexc, bench_attention, gpu_env and the GPU checks),
#    lib/libflexc.so.0 and lib/mockcuda.so (tests/cuda/mockcuda.c, the
#    stand-in driver), python/flexc, samples/, the bench/ files the run
#    reads, BUNDLE (commit, versions, counts) and MANIFEST (sha256 of
#    every file, checked before a run).
# 3. The kernel cache (bench/run_gpu.sh --fill): every line of
#    bench/gpu_checks.txt run from the bundle's root over the stand-in
#    driver made to look like an H100 (compute capability 9.0, 132 SMs):
#    the real code generation and NVRTC compile, for sm_90a, exactly the
#    kernels those lines will ask for on the GPU (no kernel runs; the
#    checks' numbers are meaningless and ignored, but a call that fails
#    would compile less: any failed call fails the fill). Then every line
#    again, which must find every kernel in the cache (counted from
#    $FLEXC_CACHE_LOG). Stored as cache.tar.xz (cubins compress about
#    10x); run_gpu.sh unpacks it.
# 4. Checks: no file (cubins included) names this checkout's path,
#    run_gpu.sh's pre-flight passes on the bundle (every ELF file's ldd
#    closure is the C runtime alone, ...), the size is under 64 MiB.
#    Prints the size and the kernel count.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build-gpu tree=$root/build-gpu-tree fill=all py="" jobs=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
  --out) out=$2; shift 2 ;;
  --tree) tree=$2; shift 2 ;;
  --no-fill) fill=none; shift ;;
  --fill-only) fill=$2; shift 2 ;;
  --python) py=$2; shift 2 ;;
  --jobs) jobs=$2; shift 2 ;;
  *) echo "usage: scripts/gpu_bundle.sh [--out DIR] [--tree DIR] [--no-fill | --fill-only NAMES] [--python PY] [--jobs N]" >&2
     exit 2 ;;
  esac
done
mkdir -p "$out" "$tree"
out=$(cd "$out" && pwd) tree=$(cd "$tree" && pwd)
limit=$((64 * 1024 * 1024))
start=$(date +%s)
say() { echo "gpu_bundle: $* ($(( $(date +%s) - start )) s)"; }

# ---- 1. build -------------------------------------------------------------------
programs="flexc bench_attention gpu_env"
checks="check_emu_kernels check_emu_dropout check_determ check_varlen check_paged check_splitkv check_emu_sm90_fwd"
gen=""
command -v ninja >/dev/null && [ ! -f "$tree/Makefile" ] && gen="-G Ninja"
say "configuring $tree"
# shellcheck disable=SC2086
cmake -S "$root" -B "$tree" $gen -DCMAKE_BUILD_TYPE=Release -DFLEXC_CPU=OFF -DFLEXC_PORTABLE=ON \
  -DFLEXC_WERROR=ON >"$tree/configure.log" 2>&1 || { tail -20 "$tree/configure.log"; exit 1; }
say "building"
# shellcheck disable=SC2086
cmake --build "$tree" -j "$jobs" --target $programs $checks flexc_shared >"$tree/build.log" 2>&1 ||
  { grep -E 'error|Error' "$tree/build.log" | head -20; exit 1; }

# ---- 2. assemble ------------------------------------------------------------------
say "assembling $out"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python" "$out/bench"
for p in $programs; do cp "$tree/$p" "$out/bin/"; done
for p in $checks; do cp "$tree/tests/$p" "$out/bin/"; done
cp -L "$tree/libflexc.so.0" "$out/lib/libflexc.so.0"
cc -shared -fPIC -pthread -O1 -static-libgcc -o "$out/lib/mockcuda.so" "$root/tests/cuda/mockcuda.c"
strip --strip-unneeded "$out"/bin/* "$out"/lib/*.so* 2>/dev/null || true
cp -r "$root/python/flexc" "$out/python/"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
cp -r "$root/samples" "$out/samples"
rm -f "$out"/samples/*.c "$out"/samples/*.cmake
cp "$root/bench/gpu_checks.txt" "$root/bench/gpu_python_check.py" "$root/bench/torch_attention.py" \
  "$root/bench/tile_sweep.txt" "$out/bench/"

# ---- 3. the kernel cache ----------------------------------------------------------
nvrtc=$( (cd "$out" && FLEXC_LIBCUDA=/nonexistent bin/gpu_env || true) | sed -n 's/^nvrtc=//p')
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted"
stamp() { # the BUNDLE file and the MANIFEST
  {
    echo "commit=$commit"
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "flexc=$("$out/bin/flexc" --version | head -1)"
    echo "nvrtc=$nvrtc"
    echo "arch=sm_90a"
    echo "kernels=$kernels"
    echo "fill=$fill"
    echo "seed=$seed"
    echo "run_gpu_sha256=$(sha256sum "$root/bench/run_gpu.sh" | cut -d' ' -f1)"
  } >"$out/BUNDLE"
  (cd "$out" && find . -path ./cache -prune -o -type f ! -name MANIFEST -print | sed 's|^\./||' | sort |
    xargs sha256sum >MANIFEST)
}
# The inputs' seed of the GPU run (FLEXC_SEED), fresh for each bundle: the
# fill draws the same random lengths as the run will, and some kernels
# depend on them (a long packed sequence splits its keys, a short one packs
# grouped heads). run_gpu.sh prints it; FLEXC_SEED=N overrides it there
# (what it then compiles anew is counted as misses).
seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
kernels=0
mkdir -p "$out/cache"
stamp
if [ "$fill" != none ]; then
  case $nvrtc in [0-9]*) ;; *) echo "gpu_bundle: cannot fill the cache: NVRTC: $nvrtc" >&2; exit 1 ;; esac
  if [ -z "$py" ]; then
    for c in "$root/build/venv/bin/python" python3; do
      if "$c" -c 'import torch' 2>/dev/null; then py=$c; break; fi
    done
  fi
  [ -n "$py" ] || echo "gpu_bundle: no Python with torch here: the Python check's few kernels will compile on the GPU"
  # The fill runs in a copy under /tmp: NVRTC writes the directory it ran in
  # into each cubin's line table, and that should not be this checkout.
  filldir=$(mktemp -d /tmp/flexc-gpu-fill.XXXXXX)
  cp -r "$out/." "$filldir"
  say "filling the kernel cache (bench/run_gpu.sh --fill $fill, in $filldir)"
  "$root/bench/run_gpu.sh" --bundle "$filldir" --fill "$fill" --jobs "$jobs" ${py:+--python "$py"} ||
    { echo "gpu_bundle: the cache fill failed (the copy is $filldir)" >&2; exit 1; }
  rm -rf "$out/cache"
  mv "$filldir/cache" "$out/cache"
  rm -rf "$filldir"
  kernels=$(find "$out/cache" -name '*.cubin' | wc -l)
fi
rm -f "$out"/cache/.tmp-*
# Nothing in the bundle, cubins included, may name this checkout.
if grep -rlF "$root" "$out" >/dev/null 2>&1; then
  echo "gpu_bundle: files name this checkout ($root):" >&2
  grep -rlF "$root" "$out" | head >&2
  exit 1
fi
# xz where there is one, else Python's tarfile (the same format; run_gpu.sh
# unpacks with Python, which every GPU machine has)
if command -v xz >/dev/null; then
  (cd "$out" && tar cf - cache | xz -6 -T "$jobs" >cache.tar.xz)
else
  (cd "$out" && python3 -c 'import tarfile
with tarfile.open("cache.tar.xz", "w:xz", preset=6) as t:
    t.add("cache")')
fi || { echo "gpu_bundle: cannot pack the cache" >&2; exit 1; }
rm -rf "$out/cache"
stamp

# ---- 4. checks ------------------------------------------------------------------
# The pre-flight checks every program's and library's ldd closure, the
# MANIFEST, the samples, the cache and the Python package, as on the GPU.
"$root/bench/run_gpu.sh" --bundle "$out" --preflight >"$tree/preflight.log" 2>&1 ||
  { cat "$tree/preflight.log" >&2; echo "gpu_bundle: run_gpu.sh's pre-flight failed" >&2; exit 1; }
rm -rf "$out/cache" # the pre-flight unpacked it; the bundle carries cache.tar.xz only
size=$(du -sb "$out" | cut -f1)
if [ "$size" -ge "$limit" ]; then
  echo "gpu_bundle: $size bytes, over the 64 MiB a carry may hold" >&2
  exit 1
fi
say "done: $out, $size bytes ($(( size / 1024 / 1024 )) MiB of 64), $kernels kernels (cubins) for sm_90a, NVRTC $nvrtc, commit $commit"
