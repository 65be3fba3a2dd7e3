#!/bin/sh
# The house rules of the source tree that a reader relies on (STYLE.md,
# docs/config.md, docs/layout.md), checked on every run:
#   1. the library reads FLEXC_* variables in base/config.c alone;
#   2. docs/config.md lists every variable of config.h's table, and no other;
#   3. one definition each of the pieces written once.
# Usage: check_layout.sh SRC_DIR
set -u
src=$1
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
  ir/interval.c ir/interval.h runtime/blockmask.c
once "the block-class enum" '(EMPTY|_EMPTY) *= *0' kernels/interval.cuh

[ "$fail" -eq 0 ] && echo "layout: ok"
exit "$fail"
