#!/usr/bin/env bash
# Runs one fuzzer for a while (tests/fuzz): scripts/fuzz.sh TARGET MINUTES
#
#   call-reference, call-cpu, call-emu, call-cuda
#       the call fuzzer (check_call_fuzz) on that backend (cuda: over the
#       stand-in driver), in build/ (made by scripts/setup.sh if missing);
#       FLEXC_SEED=N repeats a run, FLEXC_CALL_FUZZ_ONLY=I one call of it;
#       FLEXC_CALL_FUZZ_MODULES=N shares N kernel modules among a run's
#       calls, in runs of FLEXC_CALL_FUZZ_RUN calls (10000) with fresh seeds.
#   score, npy, blockmask, cli
#       a libFuzzer target under ASan and UBSan, built with clang in
#       build-fuzz/ (-DFLEXC_FUZZ=ON); the corpus grows in
#       build-fuzz/fuzz-corpus/TARGET (seeded from samples/, the front end's
#       cases and tests/fuzz/corpus/), what fails lands in
#       build-fuzz/fuzz-crashes/ (replay: build-fuzz/tests/fuzz_TARGET FILE).
#       FUZZ_JOBS=N runs N processes at once (default 1); extra arguments
#       go to libFuzzer (-runs=N to stop after N inputs).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 2 ] || usage
target=$1 minutes=$2
shift 2
case $minutes in '' | *[!0-9]*) usage ;; esac
seconds=$((minutes * 60))

case $target in
call-reference | call-cpu | call-emu | call-cuda)
  [ -x build/tests/check_call_fuzz ] || scripts/setup.sh build
  cmake --build build --target check_call_fuzz >/dev/null
  export FLEXC_CACHE_DIR=${FLEXC_CACHE_DIR:-$PWD/build/test-cache}
  if [ -n "${FLEXC_SEED:-}" ] || [ -z "${FLEXC_CALL_FUZZ_MODULES:-}" ]; then
    FLEXC_CALL_FUZZ_SECONDS=$seconds exec build/tests/check_call_fuzz --backend "${target#call-}"
  fi
  # pooled modules: runs of FLEXC_CALL_FUZZ_RUN calls (default 10000), each
  # with a fresh seed (so a fresh pool), until the time is up
  end=$((SECONDS + seconds))
  while left=$((end - SECONDS)) && [ "$left" -gt 0 ]; do
    FLEXC_CALL_FUZZ_SECONDS=$left FLEXC_CALL_FUZZ_CALLS=${FLEXC_CALL_FUZZ_RUN:-10000} \
      build/tests/check_call_fuzz --backend "${target#call-}"
  done
  ;;
score | npy | blockmask | cli)
  if ! command -v clang >/dev/null; then
    echo "fuzz.sh: $target needs clang (apt-get install clang, or scripts/setup.sh installs it)" >&2
    exit 1
  fi
  # configured as scripts/test.sh configures it (warnings are errors there)
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DFLEXC_FUZZ=ON -DFLEXC_WERROR=ON >/dev/null
  cmake --build build-fuzz --target "fuzz_$target" -j "$(nproc)"
  # absolute paths: fuzz_cli runs in a scratch directory of its own
  corpus=$PWD/build-fuzz/fuzz-corpus/$target
  mkdir -p "$corpus" build-fuzz/fuzz-crashes
  seeds=("$PWD/tests/fuzz/corpus/$target")
  [ "$target" = score ] && seeds+=("$PWD/samples" "$PWD/tests/frontend/cases")
  parallel=()
  [ "${FUZZ_JOBS:-1}" -gt 1 ] && parallel=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
  exec "build-fuzz/tests/fuzz_$target" -max_total_time="$seconds" -timeout=60 -close_fd_mask=3 \
    -print_final_stats=1 "${parallel[@]}" -artifact_prefix="$PWD/build-fuzz/fuzz-crashes/$target-" "$@" \
    "$corpus" "${seeds[@]}"
  ;;
*) usage ;;
esac
