#!/bin/sh
# Extracts the King James Bible as plain text (one verse per line, verse
# references stripped) from the bible-kjv packages, for meshtrain's byte-level
# language modelling. Install them first:
#   apt-get install -y --no-install-recommends bible-kjv bible-kjv-text
# Usage: scripts/get_corpus.sh [OUTPUT]   (default data/kjv.txt)
set -eu
out="${1:-data/kjv.txt}"
if ! command -v bible >/dev/null 2>&1; then
  echo "get_corpus.sh: the 'bible' program is missing;" \
       "run: apt-get install -y --no-install-recommends bible-kjv bible-kjv-text" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# -f: no pretty-printing, one verse per line, each prefixed by its reference.
bible -f 'gen1:1-rev22:21' </dev/null | sed 's/^[^ ]* //' >"$tmp"
size=$(wc -c <"$tmp")
if [ "$size" -lt 4000000 ]; then
  echo "get_corpus.sh: extracted only $size bytes (expected about 4.1 MB)" >&2
  exit 1
fi
mv "$tmp" "$out"
trap - EXIT
