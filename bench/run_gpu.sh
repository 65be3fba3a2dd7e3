#!/bin/sh
# run_gpu.sh: everything to run on a machine with a CUDA GPU, from the
# repository root:
#   1. a Release build (build-gpu/)
#   2. the CUDA-vs-reference correctness checks (sample_embed, sample_embed_bf16,
#      driver_gpu, check_emu_kernels_gpu: every sample, dtype and odd shape)
#   3. bench_attention (flexc forward/backward TFLOP/s, compile time)
#   4. ../shared/tools/torch_flex_bench.py when torch is importable
#      (PyTorch FlexAttention and SDPA, measured in the same run)
#   5. one side-by-side table of the three
# Usage: sh bench/run_gpu.sh [--quick]   (--quick: L=8192, E=128 only)
# Output files go to build-gpu/bench/. Exits non-zero when a check fails.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
quick=""
[ "${1:-}" = "--quick" ] && quick="--quick"
build=build-gpu
out=$build/bench
mkdir -p "$out"

echo "== build (Release)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }

echo "== correctness: CUDA backend against the float64 reference"
(cd "$build" && ctest -R '^(sample_embed|sample_embed_bf16|driver_gpu|check_emu_kernels_gpu)$' --output-on-failure) || exit 1

echo "== bench_attention"
"$build/bench_attention" $quick >"$out/flexc.md"
rc=$?
cat "$out/flexc.md"
[ "$rc" -eq 77 ] && { echo "no CUDA device: nothing to benchmark"; exit 77; }

torch_md=$out/torch.md
: >"$torch_md"
if python3 -c 'import torch' 2>/dev/null; then
  echo "== PyTorch FlexAttention and SDPA"
  python3 ../shared/tools/torch_flex_bench.py $quick --out "$out/torch.json" | tee "$torch_md"
else
  echo "== torch is not importable: no PyTorch columns"
fi

echo "== side by side (TFLOP/s, fwd / bwd)"
# Rows are markdown: | variant | B | H | L | E | impl | fwd | bwd | ... ;
# join on (variant, B, H, L, E).
awk -F'|' '
  function trim(s) { gsub(/^ +| +$/, "", s); return s }
  NF >= 9 && $2 !~ /variant|---/ {
    key = trim($2) " | " trim($3) " | " trim($4) " | " trim($5) " | " trim($6)
    if (!(key in seen)) { seen[key] = 1; order[n++] = key }
    val[key, trim($7)] = trim($8) " / " trim($9)
  }
  END {
    print "| variant | B | H | L | E | flexc | torch flex | torch sdpa |"
    print "|---|---|---|---|---|---|---|---|"
    for (i = 0; i < n; i++) {
      k = order[i]
      printf "| %s | %s | %s | %s |\n", k, \
        ((k, "flexc") in val ? val[k, "flexc"] : "-"), \
        ((k, "flex") in val ? val[k, "flex"] : "-"), \
        ((k, "sdpa") in val ? val[k, "sdpa"] : "-")
    }
  }' "$out/flexc.md" "$torch_md" | tee "$out/side_by_side.md"
exit "$rc"
