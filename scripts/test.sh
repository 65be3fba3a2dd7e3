#!/usr/bin/env bash
# Sets everything up and runs every test: a warnings-as-errors build (with
# the Python package's tests, in build/venv), an AddressSanitizer +
# UndefinedBehaviorSanitizer build of the suite but its kernel matrices
# (label `matrix`: their host code runs under the sanitizers in the lighter
# suites; tests/CMakeLists.txt), and the libFuzzer targets (tests/fuzz)
# built with clang, each for a bounded number of inputs. The sanitizer pass
# reuses the plain pass's compiled kernels (the same store).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh build -DFLEXC_WERROR=ON
scripts/python_env.sh build/venv   # PyTorch and friends for the Python tests
(cd build && ctest --output-on-failure -j "$jobs" -LE slow)

# The sanitizer build shares the plain build's compile store (FLEXC_TEST_CACHE,
# tests/CMakeLists.txt): its suites load the modules the plain pass compiled.
scripts/setup.sh build-san -DFLEXC_WERROR=ON -DFLEXC_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DFLEXC_TEST_CACHE="$PWD/build/test-cache"
(cd build-san && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -LE 'slow|matrix')

if command -v clang >/dev/null; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DFLEXC_FUZZ=ON -DFLEXC_WERROR=ON >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_score fuzz_npy fuzz_blockmask fuzz_cli
  (cd build-fuzz && ctest --output-on-failure -j "$jobs" -L fuzz)
else
  echo "test.sh: no clang: the libFuzzer targets were not run"
fi
