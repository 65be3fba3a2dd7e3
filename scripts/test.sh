#!/usr/bin/env bash
# Sets everything up and runs every test: a warnings-as-errors build (with
# the Python package's tests, in build/venv) and an AddressSanitizer +
# UndefinedBehaviorSanitizer build of the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/setup.sh build -DFLEXC_WERROR=ON
scripts/python_env.sh build/venv   # PyTorch and friends for the Python tests
(cd build && ctest --output-on-failure -j "$jobs" -LE slow)

scripts/setup.sh build-san -DFLEXC_WERROR=ON -DFLEXC_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
(cd build-san && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" -LE slow)
