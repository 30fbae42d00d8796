#!/bin/sh
# Our libnccl.so.2 must be a drop-in for NVIDIA's: the same SONAME, the same
# exported symbol names, each with the same binding (T strong, W weak, so an
# interposing profiler can override ncclX and call pncclX).
# Usage: check_symbols.sh OUR_LIBNCCL [NVIDIA_LIBNCCL]
# Exits 77 (skipped) when NVIDIA's library is absent.
set -u

ours=${1:?usage: check_symbols.sh OUR_LIBNCCL [NVIDIA_LIBNCCL]}
theirs=${2:-/usr/local/cuda/lib64/libnccl.so.2}

for tool in nm readelf; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check_symbols: $tool not found" >&2; exit 77; }
done
[ -r "$ours" ] || { echo "check_symbols: cannot read $ours" >&2; exit 1; }

soname=$(readelf -d "$ours" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
if [ "$soname" != "libnccl.so.2" ]; then
  echo "check_symbols: SONAME of $ours is '$soname', expected libnccl.so.2" >&2
  exit 1
fi
echo "SONAME libnccl.so.2 OK"

if [ ! -r "$theirs" ]; then
  echo "check_symbols: $theirs not present; symbol comparison skipped"
  exit 77
fi
their_soname=$(readelf -d "$theirs" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$their_soname" = "libnccl.so.2" ] || echo "check_symbols: note: NVIDIA's SONAME is '$their_soname'"

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# "BINDING NAME" per exported definition; version suffixes (name@@VER) and
# absolute version-node symbols are not part of the comparison.
list() {
  nm -D --defined-only "$1" | awk 'NF >= 3 && $2 != "A" { sub(/@.*/, "", $3); print $2, $3 }' | sort -u
}
list "$ours" > "$tmp/ours" || exit 1
list "$theirs" > "$tmp/theirs" || exit 1

if [ ! -s "$tmp/theirs" ]; then
  echo "check_symbols: no symbols read from $theirs" >&2
  exit 1
fi

if diff -u "$tmp/theirs" "$tmp/ours" > "$tmp/diff"; then
  echo "symbols OK: $(wc -l < "$tmp/ours") exported definitions match $theirs"
  exit 0
fi
echo "check_symbols: exported symbols differ ('-' only NVIDIA's, '+' only ours):" >&2
grep '^[-+][^-+]' "$tmp/diff" >&2
exit 1
