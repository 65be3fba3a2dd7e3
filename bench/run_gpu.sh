#!/usr/bin/env bash
# run_gpu.sh: the whole GPU session, on the GPU machine, from a bundle that
# scripts/gpu_bundle.sh made on the development machine: no CMake, no
# compiler, no package, nothing of ../shared (docs/cuda.md, "A GPU session").
#
#   bench/run_gpu.sh --bundle DIR [--out DIR]     the run
#   bench/run_gpu.sh --bundle DIR --preflight     the pre-flight steps only
#   bench/run_gpu.sh --bundle DIR --dry-run [--out DIR]
#                    every stage's own work with each command printed instead
#                    of run (what the CTest gpu_bundle runs, besides the run)
#   bench/run_gpu.sh --bundle DIR --fill NAMES|all [--jobs N] [--python PY]
#                    fill DIR's kernel cache over the stand-in driver
#                    (scripts/gpu_bundle.sh; stage 1 too when NVRTC differs)
#
# Pre-flight (before anything needs a device; exit 3 when a step fails):
# the tools below are there and work; every file of the bundle matches its
# MANIFEST; every program and library loads with this machine's ldd and
# needs only the C runtime; the samples compile (bin/flexc check); the
# kernel cache unpacks; the Python package loads libflexc.so.0; --out is
# writable. Then the stages, each with its own time limit, each writing its
# result file at once, every line stamped with the seconds since the start:
#   1. environment (1-env.txt): GPU, driver, clocks, the bundle's commit,
#      NVRTC's version against the one the cache was filled with, the
#      cache's kernel count. No CUDA device: exit 77 here. Another NVRTC
#      version: every key misses, so the cache is filled here first, over
#      the stand-in driver on every core (slower, still working).
#   2. correctness (2-correctness.log): the stage-2 lines of
#      bench/gpu_checks.txt against the float64 reference (sm_80-style
#      bodies, then the sm_90a ones, compute-sanitizer's memcheck on one
#      small case of each, the Python package against PyTorch's
#      flex_attention), under STAGE2_S seconds (180) in all.
#   3. the table (3-table.md): the stage-3 lines, bench_attention (the
#      sm_90a rows only when every stage-2 sm90 line passed) beside PyTorch's
#      compiled flex_attention and SDPA (bench/torch_attention.py), under
#      STAGE3_S seconds (180). Then, where Nsight Compute (ncu) is, its
#      sections for one forward and one backward launch of noop and of
#      document (@ncu:KERNEL lines, in the same budget; their output under
#      "The runs", their rows kept out of the table).
#   4. the tile sweep (4-sweep.md): the lines of bench/tile_sweep.txt at
#      L=8192, E=128 then 64, until the whole run has used TOTAL_S seconds
#      (420) less a 20 s margin; the best shape per head dim at the end.
# summary.md says how every line ended (status, seconds, cache hits and
# misses) and is rewritten after each. Kernel cache: DIR/cache (unpacked
# from DIR/cache.tar.xz); FLEXC_CACHE_LOG counts what it served.
# Exit: 0 every check passed; 1 a check failed; 2 usage; 3 pre-flight
# failed; 77 no CUDA device.
set -u
here=$(cd "$(dirname "$0")" && pwd)
self=$here/$(basename "$0")
bundle="" out="" mode=run fill_names="" jobs="" py_fill="" mock_cc="" mock_sms=""
usage() {
  echo "usage: bench/run_gpu.sh --bundle DIR [--out DIR] [--preflight | --dry-run | --fill NAMES|all [--jobs N] [--python PY]]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
  --bundle) [ $# -ge 2 ] || usage; bundle=$2; shift 2 ;;
  --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
  --preflight) mode=preflight; shift ;;
  --dry-run) mode=dry; shift ;;
  --fill) [ $# -ge 2 ] || usage; mode=fill; fill_names=$2; shift 2 ;;
  --jobs) [ $# -ge 2 ] || usage; jobs=$2; shift 2 ;;
  --python) [ $# -ge 2 ] || usage; py_fill=$2; shift 2 ;;
  *) usage ;;
  esac
done
[ -n "$bundle" ] || usage
STAGE2_S=${STAGE2_S:-180} STAGE3_S=${STAGE3_S:-180} TOTAL_S=${TOTAL_S:-420}
start=$(date +%s)
now() { echo $(( $(date +%s) - start )); }

# Every external command the run uses (pre-flight checks each one), and
# those it uses only when present. Nothing here is built or installed.
tools="bash env true date timeout dirname basename mktemp touch sha256sum cat cut sort uniq head tail wc tr tee mkdir rm ls find xargs nproc grep sed awk ldd python3"
optional_tools="nvidia-smi compute-sanitizer cuda-gdb ncu pkill"
# compute-sanitizer and cuda-gdb: on PATH, else in the CUDA toolkit (which
# may not be on PATH); the PATH itself is left as given.
sanitizer=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; })
cudagdb=$(command -v cuda-gdb || { [ -x /usr/local/cuda/bin/cuda-gdb ] && echo /usr/local/cuda/bin/cuda-gdb; })
ncu=$(command -v ncu || { [ -x /usr/local/cuda/bin/ncu ] && echo /usr/local/cuda/bin/ncu; })
# Nsight Compute's view of one launch (stage 3's @ncu:KERNEL lines): the
# fourth launch of KERNEL in the line's command (three warm-ups before it).
ncu_sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
PROBE_S=${PROBE_S:-30}

fail_preflight() {
  echo "preflight: FAILED: $*" >&2
  exit 3
}

# ---- pre-flight -------------------------------------------------------------------
preflight() {
  local t missing="" bad=""
  for t in $tools; do command -v "$t" >/dev/null 2>&1 || missing="$missing $t"; done
  [ -z "$missing" ] || fail_preflight "tools missing on this machine:$missing"
  # each works (some images ship stubs)
  timeout 5 true && [ "$(echo a,b | cut -d, -f2 | tr b c | sed 's/c/d/' | awk '{ print $1 }')" = d ] &&
    echo x | sha256sum >/dev/null && python3 -c 'import ctypes, tarfile, lzma' ||
    fail_preflight "a basic tool does not work (timeout, cut, tr, sed, awk, sha256sum, python3 with tarfile and lzma)"
  echo "preflight: ok: tools ($tools)"
  [ -d "$bundle" ] && [ -f "$bundle/BUNDLE" ] && [ -f "$bundle/MANIFEST" ] ||
    fail_preflight "$bundle is not a bundle (no BUNDLE or MANIFEST: make one with scripts/gpu_bundle.sh)"
  bundle=$(cd "$bundle" && pwd)
  (cd "$bundle" && sha256sum -c --quiet MANIFEST) >/dev/null 2>&1 ||
    fail_preflight "files of $bundle differ from its MANIFEST: $(cd "$bundle" && sha256sum -c --quiet MANIFEST 2>&1 | head -5 | tr '\n' ' ')"
  echo "preflight: ok: $(wc -l <"$bundle/MANIFEST") files match the MANIFEST ($(grep '^commit=' "$bundle/BUNDLE"))"
  local want got
  want=$(sed -n 's/^run_gpu_sha256=//p' "$bundle/BUNDLE")
  got=$(sha256sum "$self" | cut -d' ' -f1)
  [ "$want" = "$got" ] || echo "preflight: warning: this run_gpu.sh is not the one the bundle was made with (a stale bundle? scripts/gpu_bundle.sh remakes it)"
  for t in "$bundle"/bin/* "$bundle"/lib/*; do
    local deps
    deps=$(ldd "$t" 2>&1)
    if echo "$deps" | grep -q 'not found\|not a dynamic'; then
      bad="$bad ${t#"$bundle"/}: $(echo "$deps" | grep 'not found\|not a dynamic' | head -2 | tr '\n' ' ')"
    elif echo "$deps" | grep -v -E '^\s*(linux-vdso\.so|/lib64/ld-linux|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so\.[0-9]+ =>)' | grep -q .; then
      bad="$bad ${t#"$bundle"/}: needs $(echo "$deps" | grep -v -E 'vdso|ld-linux|lib(c|m|dl|pthread|rt|stdc\+\+|gcc_s)\.so' | tr '\n' ' ')"
    fi
  done
  [ -z "$bad" ] || fail_preflight "libraries:$bad"
  echo "preflight: ok: every program and library loads and needs only the C runtime"
  (cd "$bundle" && bin/flexc --version >/dev/null && bin/flexc check samples/*.score >/dev/null) ||
    fail_preflight "bin/flexc cannot check the bundle's samples"
  echo "preflight: ok: bin/flexc checks $(ls "$bundle"/samples/*.score | wc -l) samples"
  if [ ! -d "$bundle/cache" ] && [ -f "$bundle/cache.tar.xz" ]; then
    (cd "$bundle" && python3 -c '
import sys, tarfile
with tarfile.open("cache.tar.xz") as t:
    try:
        t.extractall(".", filter="data")
    except TypeError:  # Python before 3.12 (and some 3.8-3.11 releases)
        t.extractall(".")') || fail_preflight "cache.tar.xz does not unpack"
  fi
  mkdir -p "$bundle/cache" || fail_preflight "cannot make $bundle/cache"
  echo "preflight: ok: kernel cache $bundle/cache, $(find "$bundle/cache" -name '*.cubin' | wc -l) kernels"
  (cd "$bundle" && PYTHONPATH=python FLEXC_LIBRARY=lib/libflexc.so.0 PYTHONDONTWRITEBYTECODE=1 \
    python3 -c 'import flexc; flexc.compile("samples/causal.score")') >/dev/null 2>&1 ||
    fail_preflight "the Python package does not load lib/libflexc.so.0 or compile a sample"
  echo "preflight: ok: the Python package loads lib/libflexc.so.0"
  local cmds
  cmds=$(grep -v '^#' "$bundle/bench/gpu_checks.txt" | awk 'NF >= 4 { print $4 ~ /^@/ ? $5 : $4 }')
  [ -n "$cmds" ] || fail_preflight "bench/gpu_checks.txt lists nothing"
  for t in $cmds; do [ -f "$bundle/$t" ] || fail_preflight "bench/gpu_checks.txt runs $t, not in the bundle"; done
  echo "preflight: ok: bench/gpu_checks.txt's $(echo "$cmds" | wc -l) lines name files of the bundle"
  if [ $mode != preflight ] && [ $mode != fill ]; then
    mkdir -p "$out" && touch "$out/.w" && rm -f "$out/.w" || fail_preflight "cannot write to $out"
    echo "preflight: ok: results go to $out"
  fi
}

# ---- running the lines of gpu_checks.txt -------------------------------------------
# The lines of stage $1 (or every stage with a kernel for "fill"), as
# "STAGE NAME BODIES COMMAND...".
lines_of() {
  grep -v '^#' "$bundle/bench/gpu_checks.txt" | awk -v s="$1" 'NF >= 4 && (s == "fill" ? $3 != "-" : $1 == s)'
}

# env for a line: the cache, its log, the inputs' seed (the bundle's, so
# that the random lengths some kernels depend on are the ones the cache was
# filled for; $FLEXC_SEED overrides it), the bodies.
line_env() { # BODIES LOG
  echo "FLEXC_CACHE_DIR=$bundle/cache FLEXC_CACHE_LOG=$2 PYTHONPATH=$bundle/python FLEXC_LIBRARY=$bundle/lib/libflexc.so.0 PYTHONDONTWRITEBYTECODE=1"
  local seed=${FLEXC_SEED:-$(sed -n 's/^seed=//p' "$bundle/BUNDLE")}
  [ -n "$seed" ] && echo "FLEXC_SEED=$seed"
  [ "$1" = sm90 ] && echo "FLEXC_CUDA_SM90_FWD=1 FLEXC_CUDA_SM90_BWD=1"
}

# The command of a line, its prefixes expanded for the GPU run.
gpu_command() { # COMMAND...
  case $1 in
  @memcheck) shift; echo "${sanitizer:-compute-sanitizer} --tool memcheck --error-exitcode 1 --print-limit 20 $*" ;;
  @python) shift; echo "python3 $*" ;;
  @probe) shift; echo "$*" ;;
  @ncu:*) local k=${1#@ncu:}; shift; echo "${ncu:-ncu} --kernel-name $k --launch-skip 3 --launch-count 1 $ncu_sections $*" ;;
  *) echo "$*" ;;
  esac
}

# One line over the stand-in driver (fill mode): output to $logs/NAME.PASS.log.
fill_line() { # PASS STAGE NAME BODIES COMMAND...
  local pass=$1 name=$3 bodies=$4
  shift 4
  local cmd="$*" py=${py_fill:-python3} variants=("") v
  case $1 in
  @memcheck | @ncu:*) shift; cmd="$*" ;;
  @probe) # and its watchdog build (hang_report; the forward alone is the fwd90 line's kernels)
    shift; cmd="$*" variants=("" FLEXC_CUDA_WATCHDOG=1) ;;
  @python)
    shift
    "$py" -c 'import torch' 2>/dev/null || { echo "no Python with torch: $name not filled" >"$logs/$name.$pass.log"; return 0; }
    cmd="$py $* --fill" ;;
  esac
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2046,SC2086
    (cd "$bundle" && env $(line_env "$bodies" "$logs/cache.$pass.log") $v FLEXC_LIBCUDA="$bundle/lib/mockcuda.so" \
      MOCKCUDA_CC="${mock_cc:-9.0}" MOCKCUDA_SMS="${mock_sms:-132}" CK_DEFAULT_TIMEOUT=1200 $cmd) \
      >"$logs/$name${v:+-watchdog}.$pass.log" 2>&1
  done
  return 0
}

# Fill the cache for the lines named in $1 ("all": every line with a kernel),
# then run them again: every lookup must hit. Prints the counts.
fill() { # NAMES
  local names=$1 lines
  lines=$(lines_of fill)
  [ "$names" = all ] || lines=$(echo "$lines" | awk -v want=",$names," 'index(want, "," $2 ",")')
  [ -n "$lines" ] || { echo "fill: no line of gpu_checks.txt is named $names" >&2; return 1; }
  logs=$(mktemp -d)
  export -f fill_line line_env
  export bundle logs py_fill mock_cc mock_sms
  local pass
  for pass in 1 2; do
    echo "fill: pass $pass: $(echo "$lines" | wc -l) lines over the stand-in driver as a ${mock_cc:-9.0} device with ${mock_sms:-132} SMs, ${jobs:-$(nproc)} at a time ($(now) s)"
    echo "$lines" | xargs -P "${jobs:-$(nproc)}" -I{} bash -c "fill_line $pass {}"
  done
  local failed compiled hits misses entries
  failed=$(cat "$logs"/*.log | grep 'tl_cuda_call: .* failed\|^bench_attention: \|^fill .*Error' | sort | uniq -c | head -20)
  compiled=$(grep '^miss ' "$logs/cache.1.log" 2>/dev/null | awk '{ print $2 }' | sort -u | wc -l)
  hits=$(grep -c '^disk-hit ' "$logs/cache.2.log" 2>/dev/null)
  misses=$(grep -c '^miss ' "$logs/cache.2.log" 2>/dev/null)
  entries=$(find "$bundle/cache" -name '*.cubin' | wc -l)
  echo "fill: pass 1 compiled $compiled kernels; pass 2: ${hits:-0} cache hits, ${misses:-0} misses; $entries kernels in the cache ($(now) s)"
  local rc=0
  if [ -n "$failed" ]; then
    echo "fill: calls failed (they compile less than the GPU run will ask for):" >&2
    echo "$failed" >&2
    rc=1
  fi
  if [ "${misses:-0}" -ne 0 ]; then
    echo "fill: the second pass missed:" >&2
    grep '^miss ' "$logs/cache.2.log" | head >&2
    rc=1
  fi
  [ $rc -eq 0 ] && rm -rf "$logs" || echo "fill: logs in $logs" >&2
  return $rc
}

# ---- the run ------------------------------------------------------------------------------
status_lines=""
summary() { # rewrite summary.md
  {
    echo "# GPU run, $(sed -n 's/^commit=//p' "$bundle/BUNDLE")"
    echo
    echo "| at s | stage | line | bodies | result | s | cache hits | misses |"
    echo "|---|---|---|---|---|---|---|---|"
    printf "%b" "$status_lines"
  } >"$out/summary.md"
}
record() { # STAGE NAME BODIES RESULT SECONDS HITS MISSES
  status_lines="$status_lines| $(now) | $1 | $2 | $3 | $4 | $5 | $6 | $7 |\n"
  summary
}

# COMMAND... from the bundle's root with the environment of BODIES' lines.
in_bundle() { # BODIES COMMAND...
  local bodies=$1
  shift
  # shellcheck disable=SC2046
  (cd "$bundle" && env $(line_env "$bodies" "$work/cache.log") "$@")
}

# Run one line with a time limit; its output appended to FILE. Sets
# line_rc (the command's exit status, 124 when the clock stopped it).
run_line() { # FILE LIMIT STAGE NAME BODIES COMMAND...
  local file=$1 limit=$2 stage=$3 name=$4 bodies=$5
  shift 5
  local cmd t0 h0 m0 h1 m1 log=$work/cache.log
  cmd=$(gpu_command "$@")
  t0=$(date +%s)
  h0=$(grep -c '^disk-hit ' "$log" 2>/dev/null) m0=$(grep -c '^miss ' "$log" 2>/dev/null)
  echo "==== [$(now) s] stage $stage, $name ($bodies): $cmd (limit ${limit} s)" >>"$file"
  if [ $mode = dry ]; then
    # shellcheck disable=SC2046
    echo "dry run: (cd $bundle && env $(line_env "$bodies" "$log" | tr '\n' ' ') timeout $limit $cmd)" >>"$file"
    line_rc=0
  elif [ "$1" = @probe ]; then
    shift
    in_bundle "$bodies" timeout "$limit" "$@" >>"$file" 2>&1
    line_rc=$?
    [ $line_rc -eq 124 ] && hang_report "$limit" "$@" >>"$file" 2>&1
  elif [ "$1" = @memcheck ] && [ -z "$sanitizer" ]; then
    echo "not run: no compute-sanitizer on this machine" >>"$file"
    line_rc=127
  elif [ "${1%%:*}" = @ncu ] && [ -z "$ncu" ]; then
    echo "not run: no ncu (Nsight Compute) on this machine" >>"$file"
    line_rc=127
  else
    # shellcheck disable=SC2086
    in_bundle "$bodies" timeout "$limit" $cmd >>"$file" 2>&1
    line_rc=$?
  fi
  h1=$(grep -c '^disk-hit ' "$log" 2>/dev/null) m1=$(grep -c '^miss ' "$log" 2>/dev/null)
  local result=passed
  [ $mode = dry ] && result="dry run"
  case $line_rc in
  0) ;;
  77) result="skipped (77)" ;;
  124) result="stopped by the clock" ;;
  127) result="not run" ;;
  *) result="FAILED ($line_rc)" ;;
  esac
  echo "==== [$(now) s] $name: $result, $(( $(date +%s) - t0 )) s; cache: $(( ${h1:-0} - ${h0:-0} )) hits, $(( ${m1:-0} - ${m0:-0} )) misses" >>"$file"
  record "$stage" "$name" "$bodies" "$result" "$(( $(date +%s) - t0 ))" "$(( ${h1:-0} - ${h0:-0} ))" "$(( ${m1:-0} - ${m0:-0} ))"
}

# The sm_90a probe hung (the bodies' first launch): which kernel hangs, and
# where, into 5-hang.txt. First the probe again with its kernels' watchdog
# (FLEXC_CUDA_WATCHDOG=1, cached by the fill: an mbarrier wait of 2^33
# cycles prints its block, thread, barrier and parity and traps). Then the
# forward alone (check_emu_sm90_fwd --cuda: forward-only kernels, under
# $1 / 2 s; a kernel with a backward takes both sm_90a bodies or neither,
# cuda.c's tensor_maps), then, with
# cuda-gdb, the probe's own command stopped by SIGINT after 15 s: the
# running kernels (their names say forward or backward), every warp's PC,
# and for warps 0-11 the source line and instructions there (the cubins
# carry line info). Sets sm90_hung.
hang_report() { # LIMIT COMMAND...
  local limit=$1 f=$out/5-hang.txt rc
  shift
  sm90_hung=yes
  echo "# The sm_90a probe hung: $* (FLEXC_CUDA_SM90_FWD=1 FLEXC_CUDA_SM90_BWD=1)" >"$f"
  in_bundle sm90 env FLEXC_CUDA_WATCHDOG=1 timeout "$limit" "$@" >"$work/probe-watchdog.log" 2>&1
  rc=$?
  echo "[$(now) s] with the watchdog (FLEXC_CUDA_WATCHDOG=1): $([ $rc -eq 124 ] && echo "HUNG still (not at an mbarrier wait)" || echo "exit $rc")" >>"$f"
  { grep -m 20 'flexc watchdog' "$work/probe-watchdog.log"; tail -6 "$work/probe-watchdog.log"; } | sed 's/^/    /' >>"$f"
  in_bundle sm90 timeout $((limit / 2)) bin/check_emu_sm90_fwd --cuda >"$work/probe-fwd.log" 2>&1
  rc=$?
  echo "[$(now) s] the forward alone (bin/check_emu_sm90_fwd --cuda): $([ $rc -eq 124 ] && echo HUNG || echo "exit $rc")" >>"$f"
  tail -4 "$work/probe-fwd.log" | sed 's/^/    /' >>"$f"
  if [ -z "$cudagdb" ] || ! command -v pkill >/dev/null; then
    echo "[$(now) s] no cuda-gdb or pkill here: no PCs" >>"$f"
  else
    echo "[$(now) s] cuda-gdb on the probe, interrupted after 15 s:" >>"$f"
    local w ex=()
    for w in 0 1 2 3 4 5 6 7 8 9 10 11; do ex+=(-ex "cuda warp $w" -ex 'info line *$pc' -ex 'x/3i $pc'); done
    (sleep 15; pkill -INT -f "^[^ ]*$1 $2") &
    in_bundle sm90 timeout -s KILL 45 "$cudagdb" -q -batch \
      -ex 'set pagination off' -ex 'set confirm off' -ex 'handle SIGINT stop print nopass' -ex run \
      -ex 'info cuda kernels' -ex 'cuda kernel 0 block (0,0,0) thread (0,0,0)' -ex 'info cuda warps' \
      "${ex[@]}" -ex kill --args "$@" >>"$f" 2>&1
    wait
  fi
  echo "[$(now) s] hang report in 5-hang.txt"
  cat "$f"
}

# Seconds left of a stage that began at $1 with budget $2 (at least 1).
left() { local l=$(( $2 - ($(date +%s) - $1) )); [ $l -lt 1 ] && l=1; echo $l; }

stage1() {
  local f=$out/1-env.txt rc
  {
    echo "[$(now) s] stage 1: environment"
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    sed 's/^/bundle_/' "$bundle/BUNDLE"
    [ -z "${FLEXC_SEED:-}" ] || echo "FLEXC_SEED=$FLEXC_SEED (not the bundle's: kernels that depend on random lengths may miss)"
  } >"$f"
  if [ $mode = dry ]; then
    echo "dry run: (cd $bundle && FLEXC_CACHE_DIR=$bundle/cache bin/gpu_env)" >>"$f"
    record 1 environment - "dry run" 0 0 0
    return 0
  fi
  (cd "$bundle" && FLEXC_CACHE_DIR="$bundle/cache" bin/gpu_env) >>"$f" 2>&1
  rc=$?
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit,compute_cap \
      --format=csv 2>&1 | sed 's/^/nvidia-smi: /' >>"$f"
  else
    echo "nvidia-smi: not on this machine" >>"$f"
  fi
  if [ -n "$sanitizer" ]; then
    echo "compute-sanitizer: $("$sanitizer" --version 2>&1 | tail -1)" >>"$f"
  else
    echo "compute-sanitizer: not on this machine (the memcheck lines will not run)" >>"$f"
  fi
  if [ $rc -eq 77 ]; then
    echo "[$(now) s] no CUDA device: nothing to run" >>"$f"
    record 1 environment - "no CUDA device" "$(now)" 0 0
    cat "$f"
    return 77
  fi
  [ $rc -eq 0 ] || { record 1 environment - "FAILED ($rc)" "$(now)" 0 0; cat "$f"; return 1; }
  local have want cc sms
  have=$(sed -n 's/^nvrtc=//p' "$f") want=$(sed -n 's/^nvrtc=//p' "$bundle/BUNDLE")
  cc=$(sed -n 's/^compute_capability=//p' "$f") sms=$(sed -n 's/^sms=//p' "$f")
  if [ "$have" != "$want" ] || [ "$cc" != 9.0 ]; then
    # Every key would miss: fill the cache here first, as on the development
    # machine but for this device, on every core.
    echo "[$(now) s] NVRTC $have and compute capability $cc here; the cache was filled by NVRTC $want for 9.0: every key would miss; filling it here over the stand-in driver (slower, still working)" >>"$f"
    mock_cc=$cc mock_sms=$sms fill all >>"$f" 2>&1 ||
      echo "[$(now) s] the fill here reported problems (above); the checks compile what they miss" >>"$f"
  else
    echo "[$(now) s] NVRTC $have is the cache's: its $(find "$bundle/cache" -name '*.cubin' | wc -l) kernels serve stages 2 and 3" >>"$f"
    [ "$sms" = 132 ] || echo "[$(now) s] $sms SMs, the cache was filled for 132: calls whose split-KV choice depends on it may miss (compiled here)" >>"$f"
  fi
  record 1 environment - passed "$(now)" 0 0
  cat "$f"
}

stage2() {
  local f=$out/2-correctness.log t0 line n later limit
  t0=$(date +%s)
  : >"$f"
  sm90_ok=yes checks_ok=yes sm90_hung=no
  n=$(lines_of 2 | wc -l) later=$n
  while read -r line; do
    # shellcheck disable=SC2086
    set -- $line
    later=$((later - 1))
    # the stage's time left, less 5 s for each line after this one
    limit=$(( $(left "$t0" "$STAGE2_S") - 5 * later ))
    if [ "$3" = sm90 ] && [ $sm90_hung = yes ]; then
      echo "==== [$(now) s] $2 not run: the sm_90a probe hung (5-hang.txt)" >>"$f"
      record 2 "$2" "$3" "not run: the sm_90a probe hung" 0 0 0
      continue
    fi
    if [ $limit -lt 5 ]; then
      echo "==== [$(now) s] stage 2 time spent: $2 not run" >>"$f"
      record 2 "$2" "$3" "not run: stage 2's ${STAGE2_S} s spent" 0 0 0
      [ "$3" = sm90 ] && sm90_ok=no
      checks_ok=no
      continue
    fi
    [ "$4" = @probe ] && [ $limit -gt "$PROBE_S" ] && limit=$PROBE_S
    run_line "$f" "$limit" "$@"
    if [ $line_rc -ne 0 ]; then
      [ "$3" = sm90 ] && sm90_ok=no
      [ $line_rc -eq 127 ] || checks_ok=no # a missing sanitizer is reported, not failed
    fi
  done < <(lines_of 2)
  echo "[$(now) s] stage 2: checks $([ $checks_ok = yes ] && echo passed || echo FAILED); sm_90a bodies $([ $sm90_ok = yes ] && echo passed || echo failed or not run)" | tee -a "$f"
}

stage3() {
  local f=$out/3-table.md raw=$work/3-raw.md t0 line
  t0=$(date +%s)
  : >"$raw"
  while read -r line; do
    # shellcheck disable=SC2086
    set -- $line
    if [ "$3" = sm90 ] && [ $sm90_ok != yes ]; then
      record 3 "$2" "$3" "not run: the sm_90a bodies did not pass stage 2" 0 0 0
      continue
    fi
    local budget
    budget=$(left "$t0" "$STAGE3_S")
    if [ "$budget" -le 1 ]; then
      record 3 "$2" "$3" "not run: stage 3's ${STAGE3_S} s spent" 0 0 0
      continue
    fi
    if [ "$4" = @python ]; then # the torch columns stop starting rows 15 s before the limit
      run_line "$raw.$2" "$budget" "$@" --time-limit $(( budget > 30 ? budget - 15 : 15 ))
    else
      run_line "$raw.$2" "$budget" "$@"
    fi
    # a profiled run's rows are not the table's (Nsight Compute slows every launch)
    [ "${4%%:*}" = @ncu ] && continue
    # tag our rows with the bodies: "flexc" and "flexc sm_90a"
    sed "s/| flexc |/| flexc$([ "$3" = sm90 ] && echo ' sm_90a') |/" "$raw.$2" >>"$raw"
  done < <(lines_of 3)
  # Side by side, joined on (variant, B, H, L, E): fwd / bwd TF/s per impl.
  {
    echo "# Stage 3: $(sed -n 's/^device=//p' "$out/1-env.txt"), bf16, kernel time from CUDA events (TFLOP/s, forward / backward)"
    echo
    awk -F'|' '
      function trim(s) { gsub(/^ +| +$/, "", s); return s }
      NF >= 9 && $2 !~ /variant|---/ && trim($8) != "" {
        key = trim($2) " | " trim($3) " | " trim($4) " | " trim($5) " | " trim($6)
        if (!(key in seen)) { seen[key] = 1; order[n++] = key }
        val[key, trim($7)] = trim($8) " / " trim($9)
      }
      END {
        split("flexc|flexc sm_90a|flex|sdpa", impls, "|")
        print "| variant | B | H | L | E | flexc | flexc sm_90a | torch flex (compiled) | torch sdpa |"
        print "|---|---|---|---|---|---|---|---|---|"
        for (i = 0; i < n; i++) {
          k = order[i]; row = "| " k
          for (j = 1; j <= 4; j++) row = row " | " ((k, impls[j]) in val ? val[k, impls[j]] : "-")
          print row " |"
        }
      }' "$raw"
    echo
    echo "## The runs (bench_attention: kernel and call times, compile or cache-hit ms; torch_attention.py)"
    echo
    cat "$raw".*
  } >"$f"
  cat "$f"
}

stage4() {
  local f=$out/4-sweep.md rows=$work/sweep-rows E spec
  : >"$rows"
  echo "# Stage 4: tile sweep (bench/tile_sweep.txt via FLEXC_TILES), L=8192, noop and causal, bf16" >"$f"
  for E in 128 64; do
    while read -r spec; do
      local budget=$(( TOTAL_S - 20 - $(now) ))
      if [ $budget -lt 30 ]; then
        echo "[$(now) s] the run's ${TOTAL_S} s are spent: $spec at E=$E not run" >>"$f"
        continue
      fi
      echo "==== [$(now) s] $spec, E=$E" >>"$f"
      if [ $mode = dry ]; then
        echo "dry run: (cd $bundle && FLEXC_TILES=$spec timeout $budget bin/bench_attention --cached --L 8192 --E $E)" >>"$f"
        continue
      fi
      (cd "$bundle" && FLEXC_CACHE_DIR="$bundle/cache" FLEXC_CACHE_LOG="$work/cache.log" FLEXC_TILES=$spec \
        timeout "$budget" bin/bench_attention --cached --L 8192 --E "$E") >"$work/sweep-one" 2>&1
      # tag each row with its shape: | spec | variant | ... | fwd | bwd | ...
      awk -F'|' -v spec="$spec" 'NF >= 9 && $2 !~ /variant|---/ { print "|" spec $0 }' "$work/sweep-one" | tee -a "$rows" >>"$f"
      grep -v '^|' "$work/sweep-one" >>"$f"
    done < <(grep -v '^#' "$bundle/bench/tile_sweep.txt" | grep -v '^$')
  done
  # Best shape per head dim and direction: the highest mean TFLOP/s over
  # its rows (noop and causal; a shape of one direction appears beside
  # several of the other, so a sum would favour the shape listed most),
  # in the tile table's override format.
  {
    echo
    echo "## Best shapes (FLEXC_TILES format)"
    echo
    awk -F'|' '
      function trim(s) { gsub(/^ +| +$/, "", s); return s }
      NF >= 10 && trim($9) + 0 > 0 {
        spec = trim($2); E = trim($7); f = trim($9) + 0; b = trim($10) + 0
        split(spec, parts, ",")
        fs[E, parts[1]] += f; fn[E, parts[1]]++; bs[E, parts[2]] += b; bn[E, parts[2]]++; es[E] = 1
      }
      END {
        for (E in es) {
          bf = -1; bb = -1
          for (k in fs) { split(k, kk, SUBSEP); if (kk[1] == E && fs[k] / fn[k] > bf) { bf = fs[k] / fn[k]; fsp = kk[2] } }
          for (k in bs) { split(k, kk, SUBSEP); if (kk[1] == E && bs[k] / bn[k] > bb) { bb = bs[k] / bn[k]; bsp = kk[2] } }
          printf "E=%s %s,%s\n", E, fsp, bsp
        }
      }' "$rows" | sort
  } >>"$f"
  record 4 sweep sm80 "done" "$(now)" 0 0
  tail -5 "$f"
}

# ---- main -------------------------------------------------------------------------------
[ -z "$out" ] && out=$bundle/results-$(date -u +%Y%m%d-%H%M%S)
preflight
[ $mode = preflight ] && exit 0
if [ $mode = fill ]; then
  fill "$fill_names"
  exit $?
fi
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/cache.log"
echo "== [$(now) s] 1. environment -> $out"
stage1
rc=$?
[ $rc -eq 0 ] || exit $rc
echo "== [$(now) s] 2. correctness (under ${STAGE2_S} s)"
stage2
echo "== [$(now) s] 3. the table (under ${STAGE3_S} s)"
stage3
echo "== [$(now) s] 4. tile sweep (until ${TOTAL_S} s)"
stage4
{
  echo
  echo "Done in $(now) s. Cache over the whole run: $(grep -c '^disk-hit ' "$work/cache.log") hits, $(grep -c '^miss ' "$work/cache.log") misses (stage 4's new tiles miss by design)."
  if grep -q '^miss ' "$work/cache.log"; then
    echo
    echo "Kernels the cache missed:"
    echo
    grep '^miss ' "$work/cache.log" | cut -d' ' -f3- | sort | uniq -c | sort -rn | head -40 | sed 's/^/    /'
  fi
} >>"$out/summary.md"
[ $mode = dry ] && cat "$out/summary.md"
echo "== [$(now) s] done; results in $out (summary.md first)"
[ $checks_ok = yes ] || exit 1
exit 0
