#!/usr/bin/env bash
# Runs one file of the Python tests (CTest's python_* tests) in the virtual
# environment scripts/python_env.sh makes, against the built libflexc.so.
# Exits 77 (skipped), saying why, where that environment or a module the
# file needs is missing; never passes without running tests.
# Usage: run.sh VENV LIBFLEXC TEST_FILE [MODULE...]
set -u
venv=$1 lib=$2 file=$3
shift 3
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$venv/bin/python
why() {
  echo "python tests skipped: $1"
  [ -f "$venv.log" ] && { echo "--- the end of $venv.log:"; tail -5 "$venv.log"; }
  exit 77
}
[ -x "$py" ] || why "no virtual environment at $venv (scripts/python_env.sh makes it; scripts/test.sh runs that)"
for m in torch numpy pytest "$@"; do
  "$py" -c "import $m" 2>/dev/null || why "module $m is not installed in $venv (scripts/python_env.sh installs it)"
done

# A fresh compile cache per run: torch.compile's caches do not key on a
# custom op's fake implementation.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TORCHINDUCTOR_CACHE_DIR=$tmp/inductor TRITON_CACHE_DIR=$tmp/triton
export PYTHONPATH=$root/python FLEXC_LIBRARY=$lib PYTHONDONTWRITEBYTECODE=1
cd "$root"
"$py" -m pytest -q -p no:cacheprovider -rs \
  -W "ignore:flex_attention called without torch.compile:UserWarning" "$file"
rc=$?
if [ $rc -eq 5 ]; then
  echo "python tests: no test ran in $file"
  exit 1
fi
exit $rc
