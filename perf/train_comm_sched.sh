#!/usr/bin/env bash
# meshtrain --comm-sched fifo against priority on an emulated cluster
# (scripts/cluster, root only), alternating in one run so both see the same
# load. Every rank on its own host by default (4 hosts for dp 2 x pp 2), so
# the pipeline's activations and the data-parallel buckets share each host's
# link. Prints ms/step of each run, the ranks' CPU use over the timed steps
# ((user + sys) / wall, mean and highest rank; above 1 a rank is CPU-bound) and
# the steps/s ratio priority / fifo (target >= 1.2) from the medians.
# VARIANTS="A|B" runs every round once per variant (extra meshtrain options,
# "" for none), e.g. VARIANTS="|--overlap-update" with --clip 0, and prints
# the ratio per variant, all within the same rounds.
# Usage: perf/train_comm_sched.sh CLUSTER [ROUNDS] [BUILD] [-- meshtrain options]
set -euo pipefail
cluster=$1 rounds=${2:-3} build=${3:-build}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
opts=("$@")
[ ${#opts[@]} -eq 0 ] && opts=(--dp 2 --pp 2 --layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 4
                               --grad-accum 4 --steps 8 --log-every 100 --bucket-kb 1024)
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=1
for ((i = 0; i < ${#opts[@]}; ++i)); do
  case ${opts[i]} in --dp | --pp | --tp) n=$((n * ${opts[i + 1]})) ;; esac
done
"$here/scripts/cluster" bench --name "$cluster" --time 2 | grep -E "^(link_bps|path_bps)=" || true
echo "# $(uptime)"
IFS='|' read -r -a variants <<<"${VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
for ((r = 0; r < rounds; ++r)); do
  for variant in "${variants[@]}"; do
  read -r -a extra <<<"$variant"
  label=${variant:-default}
  label=${label// /}
  for sched in fifo priority; do
    timeout 600 "$here/$build/tools/meshrun/meshrun" --tag-output --cluster "$cluster" -n "$n" \
      "$here/$build/train/meshtrain" "${opts[@]}" "${extra[@]}" --comm-sched "$sched" >"$tmp/out" 2>&1 || {
      echo "run $label $sched failed"; tail -5 "$tmp/out"; exit 1; }
    ms=$(awk '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == "ms/step,") print $(i - 1) }' "$tmp/out")
    wait_pct=$(awk '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == "wait") print $(i + 1) }' "$tmp/out")
    cpu=$(awk '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == "cpu") print "cpu", $(i + 1), "max", $(i + 8) }' \
      "$tmp/out" | tr -d ')')
    echo "$label $sched $ms $wait_pct $cpu" | tee -a "$tmp/all"
  done
  done
done
echo "# $(uptime)"
awk '{ t[$1 "/" $2] = t[$1 "/" $2] " " $3; v[$1] = 1 }
  function median(s,   a, n, i, j, x) {
    n = split(s, a, " ")
    for (i = 2; i <= n; ++i) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; --j) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { for (k in v) { f = median(t[k "/fifo"]); p = median(t[k "/priority"])
          printf "%s: median ms/step: fifo %.1f, priority %.1f; steps/s priority / fifo = %.3f (target >= 1.2)\n",
                 k, f, p, f / p } }' "$tmp/all"
