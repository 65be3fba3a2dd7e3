#!/bin/sh
# run_case.sh CASE: run flexc ($FLEXC_BIN) on tests/frontend/cases/CASE.score from
# inside tests/frontend/cases and compare with the golden files:
#   CASE.err  expected stderr of `flexc check` (exit status 1)
#   CASE.ir   expected stdout of `flexc ir` (exit status 0); flags come from an
#             optional first line `# flexc-ir-flags: ...`
#   neither   `flexc check` must succeed silently
# Prints a unified diff on mismatch.
set -u
case_name=$1
dir=$(cd "$(dirname "$0")/cases" && pwd)
flexc=${FLEXC_BIN:?FLEXC_BIN must name the flexc binary}
cd "$dir" || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0

if [ -f "$case_name.err" ]; then
  timeout 20 "$flexc" check "$case_name.score" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "expected exit status 1, got $rc"
    fail=1
  fi
  if ! diff -u "$case_name.err" "$tmp/err"; then fail=1; fi
fi

if [ -f "$case_name.ir" ]; then
  flags=$(sed -n '1s/^# flexc-ir-flags://p' "$case_name.score")
  # shellcheck disable=SC2086
  timeout 20 "$flexc" ir "$case_name.score" $flags >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "expected exit status 0, got $rc"
    cat "$tmp/err"
    fail=1
  fi
  if ! diff -u "$case_name.ir" "$tmp/out"; then fail=1; fi
fi

if [ ! -f "$case_name.err" ] && [ ! -f "$case_name.ir" ]; then
  timeout 20 "$flexc" check "$case_name.score" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" -ne 0 ] || [ -s "$tmp/err" ]; then
    echo "expected 'flexc check' to succeed silently, got exit status $rc:"
    cat "$tmp/err"
    fail=1
  fi
fi
exit $fail
