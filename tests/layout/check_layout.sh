#!/bin/sh
# The house rules of the source tree that a reader relies on (STYLE.md,
# docs/config.md, docs/layout.md), checked on every run:
#   1. the library reads FLEXC_* variables in base/config.c alone;
#   2. docs/config.md lists every variable of config.h's table, and no other;
#   3. one definition each of the pieces written once.
#   4. the folders of the library stand in layers: no two include or call
#      each other in a loop (calls read from the built objects with nm),
#      and the runtime's core never reaches a backend or the door (api/).
# Usage: check_layout.sh SRC_DIR [BUILD_DIR]
set -u
src=$1
build=${2:-}
fail=0
bad() { echo "layout: $*"; fail=1; }
lib="base frontend ir codegen runtime api emu cuda cpu kernels"
cd "$src" || exit 1

# 1. getenv("FLEXC_ in one file of the library
hits=$(grep -rl 'getenv("FLEXC_' $lib 2>/dev/null | sort | tr '\n' ' ')
[ "$hits" = "base/config.c " ] || bad "getenv(\"FLEXC_...\") outside base/config.c: $hits"

# 2. the documented table is the code's
code=$(grep -o '^ *X([A-Z0-9_]*' base/config.h | sed 's/.*X(/FLEXC_/' | sort)
docs=$(grep -o '^| `FLEXC_[A-Z0-9_]*`' docs/config.md | sed 's/^| `//; s/`$//' | sort)
[ "$code" = "$docs" ] || bad "docs/config.md and base/config.h list different variables:
$(printf '%s\n' "$code" > /tmp/layout.$$.c; printf '%s\n' "$docs" | diff /tmp/layout.$$.c - ; rm -f /tmp/layout.$$.c)"

# 3. written once: the thread pool, the block-list step, the host block
#    classifier (the one caller of the interval analysis per block), the
#    block-class enum
once() { # WHAT PATTERN FILES: the library has PATTERN in FILES alone
  what=$1 pat=$2
  shift 2
  got=$(grep -rlE "$pat" $lib 2>/dev/null | sort | tr '\n' ' ')
  [ "$got" = "$* " ] || bad "$what should be in $* alone, found in: $got"
}
once "threads started (the pool)" 'pthread_create' base/pool.c
once "the block-list step" 'void flex_block_side\(' kernels/blocklist.cuh
once "per-block interval analysis (the host classifier)" 'ir_interval_mask\(' \
  api/api.c ir/interval.c ir/interval.h runtime/blockmask.c
# (flex.h's flex_mask_class is its public face, the same values asserted in api/api.c)
once "the block-class enum" '(EMPTY|_EMPTY) *= *0' kernels/interval.cuh runtime/flex.h

# 4. layers: edges FOLDER -> FOLDER from includes and from calls
edges=$(mktemp)
for d in $lib; do
  grep -ho '#include "[a-z_]*/[a-z_0-9]*\.[a-z]*"' $d/*.c $d/*.h $d/*.cuh 2>/dev/null |
    sed 's/#include "\([a-z_]*\)\/.*/\1/' | sort -u | while read -r to; do
      [ "$to" != "$d" ] && echo "$d $to include"
    done
done >"$edges"
objdir=$build/CMakeFiles/flexc_lib.dir
if [ -n "$build" ] && [ -d "$objdir" ] && command -v nm >/dev/null; then
  find "$objdir" -name '*.o' | while read -r o; do
    rel=${o#"$objdir"/}
    rel=${rel%.o}
    case "$rel" in */*) [ -f "$rel" ] || continue ;; *) continue ;; esac # stale or generated
    nm "$o" | awk -v f="${rel%%/*}" '$2 ~ /^[TDBRC]$/ { print "D", $3, f } $1 == "U" { print "U", $2, f }'
  done | awk '$1 == "D" { def[$2] = $3 } $1 == "U" { use[NR] = $2 " " $3 }
    END { for (i in use) { split(use[i], u, " "); if ((u[1] in def) && def[u[1]] != u[2]) print u[2], def[u[1]], "call" } }' |
    sort -u >>"$edges"
else
  echo "layout: no built objects in '$build': calls not checked, includes only"
fi
loops=$(awk '{ e[$1, $2] = 1; n[$1] = 1; n[$2] = 1 }
  END {
    for (k in n) for (i in n) for (j in n) if ((i, k) in e && (k, j) in e) e[i, j] = 1
    for (a in n) if ((a, a) in e) printf "%s ", a
    for (a in n) if (a == "runtime") for (b in n) if ((a, b) in e && b ~ /^(api|cpu|emu|cuda)$/) printf "runtime->%s ", b
  }' "$edges")
[ -z "$loops" ] || bad "folders in a loop (or the runtime's core above a backend): $loops
$(sort -u "$edges")"
rm -f "$edges"

[ "$fail" -eq 0 ] && echo "layout: ok"
exit "$fail"
