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

[ "$fail" -eq 0 ] && echo "layout: ok"
exit "$fail"
