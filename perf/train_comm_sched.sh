#!/usr/bin/env bash
# meshtrain --comm-sched fifo against priority on an emulated cluster
# (scripts/cluster, root only), alternating in one run so both see the same
# load. Every rank on its own host by default (4 hosts for dp 2 x pp 2), so
# the pipeline's activations and the data-parallel buckets share each host's
# link. Prints ms/step of each run (with its comm wait share, activation MiB
# and the cores meshrun and its ranks used over the run's wall time) and the
# steps/s ratio priority / fifo (target >= 1.2) from the medians.
# Usage: perf/train_comm_sched.sh CLUSTER [ROUNDS] [BUILD] [-- meshtrain options]
#
# VARY=OPTION VALUES="A B ..." compares the values of another meshtrain option
# the same way (e.g. VARY=schedule VALUES="gpipe 1f1b eager-1f1b"), printing
# each value's median ms/step and the activation memory its runs reported.
set -euo pipefail
vary=${VARY:-comm-sched}
values=${VALUES:-fifo priority}
cluster=$1 rounds=${2:-3} build=${3:-build}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
opts=("$@")
[ ${#opts[@]} -eq 0 ] && opts=(--dp 2 --pp 2 --layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 4
                               --grad-accum 4 --steps 8 --log-every 100 --bucket-kb 1024)
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Ranks: dp x pp x tp, or dp x (A + B + ...) with one tp per stage (--tp A,B,...).
dp=1 pp=1 tp=1
for ((i = 0; i < ${#opts[@]}; ++i)); do
  case ${opts[i]} in --dp) dp=${opts[i + 1]} ;; --pp) pp=${opts[i + 1]} ;; --tp) tp=${opts[i + 1]} ;; esac
done
if [[ $tp == *,* ]]; then n=$((dp * (${tp//,/+}))); else n=$((dp * pp * tp)); fi
"$here/scripts/cluster" bench --name "$cluster" --time 2 | grep -E "^(link_bps|path_bps)=" || true
echo "# $(uptime)"
for ((r = 0; r < rounds; ++r)); do
  for value in $values; do
    t0=$(date +%s.%N)
    # The subshell's children's CPU time (bash's times) is meshrun's and its ranks'.
    (timeout 600 "$here/$build/tools/meshrun/meshrun" --tag-output --cluster "$cluster" -n "$n" \
      "$here/$build/train/meshtrain" "${opts[@]}" "--$vary" "$value" >"$tmp/out" 2>&1 && times >"$tmp/times") || {
      echo "run $value failed"; tail -5 "$tmp/out"; exit 1; }
    cores=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'NR == 2 {
      split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", (u[1] * 60 + u[2] + s[1] * 60 + s[2]) / (t1 - t0) }' \
      "$tmp/times")
    ms=$(awk '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == "ms/step,") print $(i - 1) }' "$tmp/out")
    wait_pct=$(awk '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == "wait") print $(i + 1) }' "$tmp/out")
    act=$(awk '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == "activations") print $(i + 1) }' "$tmp/out")
    echo "$value $ms $wait_pct $act cores $cores" | tee -a "$tmp/all"
  done
done
echo "# $(uptime)"
awk -v vary="$vary" -v values="$values" '{ t[$1] = t[$1] " " $2; act[$1] = $4 }
  function median(s,   a, n, i, j, x) {
    n = split(s, a, " ")
    for (i = 2; i <= n; ++i) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; --j) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { if (vary == "comm-sched" && values == "fifo priority") {
          f = median(t["fifo"]); p = median(t["priority"])
          printf "median ms/step: fifo %.1f, priority %.1f; steps/s priority / fifo = %.3f (target >= 1.2)\n", f, p, f / p
        } else {
          n = split(values, v, " ")
          for (i = 1; i <= n; ++i) printf "--%s %s: median %.1f ms/step, activations %s MiB\n", vary, v[i], median(t[v[i]]), act[v[i]]
        } }' "$tmp/all"
