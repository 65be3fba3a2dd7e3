#!/bin/sh
# language_doc.sh: docs/language.md documents every word the language
# knows. The words are read from the sources, so a keyword, builtin, dtype
# or predefined name added there without a line in the reference fails
# here: the scanner's keywords and Python spellings (frontend/lex.l), the
# parser's keyword tokens (frontend/parse.y), the builtin table and the
# dtypes (frontend/ast.c), the predefined sizes (ast.c's size_name) and
# inf and pi (frontend/sema.c). A word counts as documented where the
# reference spells it as code: `word`, or `word(...)` for a function.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
doc=$root/docs/language.md
fe=$root/frontend
[ -f "$doc" ] || { echo "language_doc: $doc is missing"; exit 1; }
words=$(
  sed -n 's/^"\([A-Za-z_][A-Za-z0-9_]*\)"[[:space:]]*{[[:space:]]*return.*/\1/p' "$fe/lex.l"
  grep -o "\"'[A-Za-z_][A-Za-z0-9_]*'\"" "$fe/parse.y" | tr -d "\"'"
  sed -n '/builtin_names\[BI_COUNT\]/,/};/p' "$fe/ast.c" | grep -o '= "[A-Za-z0-9_]*"' | sed 's/= "\(.*\)"/\1/'
  grep 'dtype_names\[\] =' "$fe/ast.c" | grep -o '"[A-Za-z0-9_]*"' | tr -d '"'
  sed -n '/^const char \*size_name/,/^}/p' "$fe/ast.c" | grep -o '"[A-Za-z_]*"' | tr -d '"'
  grep -o 'strcmp(id, "[A-Za-z_]*")' "$fe/sema.c" | grep -o '"[A-Za-z_]*"' | tr -d '"'
)
words=$(printf '%s\n' $words | sort -u)
n=$(printf '%s\n' $words | grep -c .)
if [ "$n" -lt 60 ]; then
  echo "language_doc: found only $n words in the sources (the patterns no longer match them?):"
  echo $words
  exit 1
fi
missing=""
for w in $words; do
  grep -Eq "\`$w([^A-Za-z0-9_\`][^\`]*)?\`" "$doc" || missing="$missing $w"
done
if [ -n "$missing" ]; then
  echo "language_doc: docs/language.md does not document:$missing"
  exit 1
fi
echo "language_doc: all $n words documented"

# The examples: every plain code block of docs/language.md and
# docs/from-pytorch.md that is a whole .score file (it starts with a
# declaration or a comment and has no NAME or BODY placeholders) checks.
flexc=${1:-}
[ -n "$flexc" ] || exit 0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
for md in "$doc" "$root/docs/from-pytorch.md"; do
  awk -v dir="$tmp" -v base="$(basename "$md" .md)" '
    /^```/ {
      if (open) { if (f != "") close(f); open = 0; f = "" }
      else { open = 1; if ($0 == "```") { n++; f = dir "/" base "_" n ".score"; printf "" > f } }
      next
    }
    open && f != "" { print > f }' "$md"
done
for f in "$tmp"/*.score; do
  [ -e "$f" ] || continue
  first=$(grep -m1 -o '^[^ ]*' "$f")
  case $first in score|mask|param|buffer|"#") ;; *) continue ;; esac
  if grep -q 'NAME\|BODY' "$f"; then continue; fi
  if ! "$flexc" check "$f" >"$tmp/out" 2>&1; then
    echo "language_doc: an example does not check ($(basename "$f")):"
    cat "$f" "$tmp/out"
    fail=1
  fi
  checked=$((${checked:-0} + 1))
done
[ "${checked:-0}" -ge 10 ] || { echo "language_doc: only ${checked:-0} examples found"; exit 1; }
[ $fail -eq 0 ] && echo "language_doc: ${checked} examples check"
exit $fail
