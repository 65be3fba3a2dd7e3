#!/bin/sh
# run_golden.sh SAMPLE DTYPE ARCH E: the generated CUDA of samples/SAMPLE.score
# (`flexc emit --target cuda`, run from inside samples/ so the header names
# the file, not a path) compared as text with
# tests/codegen/golden/SAMPLE.DTYPE.ARCH.eE.cu, so that every change to generated
# code is seen in review. FLEXC_UPDATE_GOLDEN=1 rewrites the golden file.
set -u
sample=$1 dtype=$2 arch=$3 e=$4
flexc=${FLEXC_BIN:?FLEXC_BIN must name the flexc binary}
here=$(cd "$(dirname "$0")" && pwd)
golden="$here/golden/$sample.$dtype.$arch.e$e.cu"
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
cd "$here/../../samples" || exit 1
if ! "$flexc" emit "$sample.score" --target cuda --arch "$arch" --dtype "$dtype" --head-dim "$e" -o "$tmp"; then
  echo "flexc emit failed"
  exit 1
fi
if [ "${FLEXC_UPDATE_GOLDEN:-0}" = 1 ]; then
  cp "$tmp" "$golden" && echo "updated $golden"
  exit 0
fi
diff -u "$golden" "$tmp"
