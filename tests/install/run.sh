#!/usr/bin/env bash
# Installs a built flexc into a fresh prefix, checks the installed layout
# (SONAME, headers, pkg-config, CMake package, the flexc command), builds a
# program that knows flexc only through <flexc/flex.h> four ways
# (pkg-config shared and static, find_package(flexc) shared and static)
# and runs each.
# Usage: run.sh BUILD_DIR WORK_DIR [PROGRAM.c [ARGS...]]
# (default: samples/embed.c on the emulator, checked against the reference)
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ $# -ge 3 ]; then
  src=$3
  shift 3
  args=("$@")
else
  src=$root/samples/embed.c
  args=(--backend emu "$root/samples/gemma2.score")
fi
cc=${CC:-cc}
# Extra compiler and linker flags (the sanitizer build passes its own).
read -r -a cflags <<<"${CONSUMER_CFLAGS:-}"

rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log"

# The layout.
libdir=$(find "$prefix" -name 'libflexc.so.0' -printf '%h\n' | head -1)
test -n "$libdir" || { echo "install: no libflexc.so.0 under $prefix"; exit 1; }
soname=$(readelf -d "$libdir/libflexc.so.0" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libflexc.so.0 ] || { echo "install: SONAME is '$soname', expected libflexc.so.0"; exit 1; }
for f in "$libdir/libflexc.so" "$libdir/libflexc.a" "$prefix/include/flexc/flex.h" \
         "$prefix/include/flexc/flex_mirror.h" "$prefix/include/flexc/dlpack.h" \
         "$libdir/pkgconfig/flexc.pc" "$libdir/cmake/flexc/flexcConfig.cmake" "$prefix/bin/flexc"; do
  test -e "$f" || { echo "install: missing $f"; exit 1; }
done
if nm -D --defined-only "$libdir/libflexc.so.0" | awk '{print $3}' | grep -v '^flex_'; then
  echo "install: libflexc.so exports symbols outside the flex_ API (above)"; exit 1
fi
"$prefix/bin/flexc" check "$root/samples/gemma2.score"

# pkg-config. The headers alone compile as strict C11 and as C++.
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion flexc)" = 0.1.0 ] || { echo "pkg-config: wrong version"; exit 1; }
printf '#include <flexc/flex.h>\n#include <flexc/flex_mirror.h>\nint main(void) { return flex_last_error() == 0; }\n' >"$work/headers.c"
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $(pkg-config --cflags flexc) "$work/headers.c"
# shellcheck disable=SC2046
${CXX:-c++} -x c++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only $(pkg-config --cflags flexc) "$work/headers.c"
# shellcheck disable=SC2046
$cc "${cflags[@]}" -Wall -Werror -o "$work/pc_shared" "$src" \
  $(pkg-config --cflags --libs flexc) -lm -Wl,-rpath,"$(pkg-config --variable=libdir flexc)"
# shellcheck disable=SC2046
$cc "${cflags[@]}" -Wall -Werror -o "$work/pc_static" "$src" $(pkg-config --cflags flexc) \
  "$(pkg-config --variable=libdir flexc)/libflexc.a" $(pkg-config --libs-only-other --static flexc) \
  -lm -ldl
readelf -d "$work/pc_shared" | grep -q 'NEEDED.*libflexc.so.0' \
  || { echo "pkg-config: pc_shared does not link libflexc.so.0"; exit 1; }
if readelf -d "$work/pc_static" | grep -q 'NEEDED.*libflexc'; then
  echo "pkg-config: pc_static links libflexc dynamically"; exit 1
fi

# CMake.
cmake -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DPROGRAM="$src" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="${CONSUMER_CFLAGS:-}" >"$work/cmake.log"
cmake --build "$work/cmake" >>"$work/cmake.log"

for exe in pc_shared pc_static cmake/prog_shared cmake/prog_static; do
  echo "== $exe"
  (cd "$root" && "$work/$exe" "${args[@]}")
done
