#!/usr/bin/env bash
# readme_link.sh BUILD_DIR WORK_DIR: the README's lines that link a program
# against the build tree (`cc -Ibuild/include prog.c ...`, continuation
# lines joined) build samples/embed.c, and each program runs (embed's
# automatic backend: the GPU, else cpu, else the emulator) and matches the
# reference. A line that stops linking (LLVM's symbols, a missing library)
# or running (the shared library not found) fails here.
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
lines=$(awk '/^```/ { inblock = !inblock; next }
  inblock && (cont || /^cc -Ibuild\/include prog\.c/) {
    line = line $0; cont = /\\$/; if (cont) sub(/\\$/, "", line); else { print line; line = "" } }' \
  "$root/README.md")
n=$(printf '%s\n' "$lines" | grep -c .)
[ "$n" -ge 2 ] || { echo "readme_link: found $n link lines in README.md"; exit 1; }
i=0
while IFS= read -r line; do
  i=$((i + 1))
  cmd=${line//prog.c/$root/samples/embed.c}
  cmd=${cmd//-Ibuild\//-I$build/}
  cmd=${cmd// build\// $build/}
  cmd=${cmd//-Lbuild/-L$build}
  cmd=${cmd//--with-path=build/--with-path=$build}
  cmd=${cmd//\$PWD\/build/$build}
  echo "== $line"
  (cd "$work" && eval "$cmd -o prog$i")
  # embed's automatic choice: the GPU, else the cpu backend, else the emulator.
  (cd "$root" && "$work/prog$i" --backend auto --dtype fp32 samples/softcap.score) | tail -2
done <<<"$lines"
echo "readme_link: $i link lines build and run"
