#!/bin/sh
# run_gpu.sh: everything to run on a machine with a CUDA GPU, from the
# repository root, in this order (each step's output is a file under the
# results directory, so a run cut short still leaves what it measured):
#   1. a Release build (build-gpu/)
#   2. correctness: the CUDA backend against the float64 reference
#      (sample_embed, sample_embed_bf16, driver_gpu, check_emu_kernels_gpu:
#      every sample, dtype and odd shape); a failure stops the run
#   3. the table: bench_attention (B=4, H=16, L=S=4096 and 8192, E=64 and
#      128, bf16, no mask and causal; kernel time from CUDA events and whole
#      call time) beside PyTorch's compiled flex_attention and SDPA
#      (../shared/tools/torch_flex_bench.py, when torch imports), joined
#      into one side-by-side table
#   3b. on a compute capability 9.0 device (H100, H200): the sm_90a kernels
#      (TMA + wgmma, opt-in on the CUDA backend until they have run here:
#      FLEXC_CUDA_SM90_FWD=1 FLEXC_CUDA_SM90_BWD=1): check_emu_sm90_fwd_gpu
#      and check_emu_kernels_gpu against the reference (a failure is
#      reported and skips their table, the rest goes on), then the same
#      table (flexc_sm90.md)
#   4. the tile sweep: every line of bench/tile_sweep.txt (FLEXC_TILES) at
#      L=8192, E=128 and E=64, noop and causal; the best forward and
#      backward shape per head dim written in the table's format
#      (tiles_best.txt: "E=128 fwd=BMxBNxW,bwd=BMxBNxW")
# Budget: under 25 minutes on one H100/H200 (the sweep stops starting new
# shapes after SWEEP_BUDGET seconds, default 600).
# Usage: sh bench/run_gpu.sh [--quick] [RESULTS_DIR]
#   --quick: the table at L=8192, E=128 only, and the sweep at E=128 only.
#   RESULTS_DIR defaults to build-gpu/results-YYYYmmdd-HHMMSS.
# Exits non-zero when a check fails, 77 when there is no CUDA device.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
quick=""
[ "${1:-}" = "--quick" ] && { quick="--quick"; shift; }
build=build-gpu
out=${1:-$build/results-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null
} >"$out/env.txt"

echo "== 1. build (Release) -> $out"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }

echo "== 2. correctness: CUDA backend against the float64 reference ($(elapsed) s)"
(cd "$build" && ctest -R '^(sample_embed|sample_embed_bf16|driver_gpu|check_emu_kernels_gpu)$' \
  --output-on-failure) >"$out/correctness.log" 2>&1
rc=$?
tail -5 "$out/correctness.log"
[ "$rc" -eq 0 ] || { echo "correctness failed: see $out/correctness.log"; exit 1; }

echo "== 3. table: flexc ($(elapsed) s)"
"$build/bench_attention" $quick >"$out/flexc.md"
rc=$?
cat "$out/flexc.md"
[ "$rc" -eq 77 ] && { echo "no CUDA device: nothing to benchmark"; exit 77; }

torch_md=$out/torch.md
: >"$torch_md"
if python3 -c 'import torch' 2>/dev/null; then
  echo "== 3. table: PyTorch FlexAttention and SDPA ($(elapsed) s)"
  python3 ../shared/tools/torch_flex_bench.py $quick --out "$out/torch.json" | tee "$torch_md"
else
  echo "== torch is not importable: no PyTorch columns"
fi

echo "== 3. side by side (TFLOP/s, fwd / bwd)"
# Rows are markdown: | variant | B | H | L | E | impl | fwd | bwd | ... ;
# join on (variant, B, H, L, E). torch counts causal FLOPs by the exact
# density (1/2 + 1/(2L)), flexc by 1/2: the same within 0.01%.
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

sm90_rc=0
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
if [ "$cc" = "9.0" ]; then
  echo "== 3b. sm_90a kernels: correctness ($(elapsed) s)"
  (cd "$build" && FLEXC_CUDA_SM90_FWD=1 FLEXC_CUDA_SM90_BWD=1 \
    ctest -R '^(check_emu_sm90_fwd_gpu|check_emu_kernels_gpu)$' --output-on-failure) \
    >"$out/correctness_sm90.log" 2>&1
  sm90_rc=$?
  tail -5 "$out/correctness_sm90.log"
  if [ "$sm90_rc" -eq 0 ]; then
    echo "== 3b. sm_90a kernels: table ($(elapsed) s)"
    FLEXC_CUDA_SM90_FWD=1 FLEXC_CUDA_SM90_BWD=1 "$build/bench_attention" $quick >"$out/flexc_sm90.md"
    cat "$out/flexc_sm90.md"
  else
    echo "sm_90a kernels failed on this GPU: see $out/correctness_sm90.log (no sm_90a table)"
  fi
fi

echo "== 4. tile sweep ($(elapsed) s)"
budget=${SWEEP_BUDGET:-600}
sweep_start=$(date +%s)
: >"$out/sweep.md"
dims="128 64"
[ -n "$quick" ] && dims="128"
for E in $dims; do
  grep -v '^#' bench/tile_sweep.txt | grep -v '^$' | while read -r spec; do
    if [ $(( $(date +%s) - sweep_start )) -gt "$budget" ]; then
      echo "sweep budget of $budget s spent: $spec at E=$E not run" | tee -a "$out/sweep.log"
      continue
    fi
    echo "-- $spec, E=$E"
    FLEXC_TILES=$spec "$build/bench_attention" --L 8192 --E "$E" >"$out/sweep_tmp.md" 2>>"$out/sweep.log"
    # Tag each row with its shape: | spec | variant | ... | fwd | bwd | ...
    awk -F'|' -v spec="$spec" 'NF >= 9 && $2 !~ /variant|---/ { print "|" spec $0 }' \
      "$out/sweep_tmp.md" | tee -a "$out/sweep.md"
  done
done
rm -f "$out/sweep_tmp.md"
# Best shape per head dim and direction: the highest TFLOP/s summed over the
# variants (noop and causal), written as the table's override format.
awk -F'|' '
  function trim(s) { gsub(/^ +| +$/, "", s); return s }
  NF >= 10 {
    spec = trim($2); E = trim($7); f = trim($9) + 0; b = trim($10) + 0
    split(spec, parts, ",")
    fs[E, parts[1]] += f; bs[E, parts[2]] += b; es[E] = 1
  }
  END {
    for (E in es) {
      bf = -1; bb = -1
      for (k in fs) { split(k, kk, SUBSEP); if (kk[1] == E && fs[k] > bf) { bf = fs[k]; fsp = kk[2] } }
      for (k in bs) { split(k, kk, SUBSEP); if (kk[1] == E && bs[k] > bb) { bb = bs[k]; bsp = kk[2] } }
      printf "E=%s %s,%s\n", E, fsp, bsp
    }
  }' "$out/sweep.md" | sort | tee "$out/tiles_best.txt"
echo "== done in $(elapsed) s; results in $out"
[ "$sm90_rc" -eq 0 ] || exit 1
