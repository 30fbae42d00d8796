#!/usr/bin/env bash
# meshtrain --comm-sched fifo against priority on an emulated cluster
# (scripts/cluster, root only), alternating in one run so both see the same
# load. Every rank on its own host by default (4 hosts for dp 2 x pp 2), so
# the pipeline's activations and the data-parallel buckets share each host's
# link. Prints, for each run, ms/step, the comm wait share, the activation
# memory of the most loaded rank (MiB), the ranks' CPU use over the timed
# steps ((user + sys) / wall, mean and highest rank; above 1 a rank is
# CPU-bound) and the cores meshrun and its ranks used over the whole run;
# then the steps/s ratio priority / fifo (target >= 1.2) from the medians.
#
# VARIANTS="A|B" runs every round once per variant (extra meshtrain options,
# "" for none), e.g. VARIANTS="|--overlap-update" with --clip 0, and prints
# the ratio per variant, all within the same rounds.
# VARY=OPTION VALUES="A B ..." alternates another meshtrain option instead of
# --comm-sched (e.g. VARY=schedule VALUES="gpipe 1f1b eager-1f1b") and prints
# each value's median ms/step and activation memory.
# Usage: perf/train_comm_sched.sh CLUSTER [ROUNDS] [BUILD] [-- meshtrain options]
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
IFS='|' read -r -a variants <<<"${VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
for ((r = 0; r < rounds; ++r)); do
  for variant in "${variants[@]}"; do
    read -r -a extra <<<"$variant"
    label=${variant:-default}
    label=${label// /}
    for value in $values; do
      t0=$(date +%s.%N)
      # The subshell's children's CPU time (bash's times) is meshrun's and its ranks'.
      (timeout 600 "$here/$build/tools/meshrun/meshrun" --tag-output --cluster "$cluster" -n "$n" \
        "$here/$build/train/meshtrain" "${opts[@]}" ${extra[@]+"${extra[@]}"} "--$vary" "$value" >"$tmp/out" 2>&1 &&
        times >"$tmp/times") || {
        echo "run $label $value failed"; tail -5 "$tmp/out"; exit 1; }
      cores=$(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'NR == 2 {
        split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", (u[1] * 60 + u[2] + s[1] * 60 + s[2]) / (t1 - t0) }' \
        "$tmp/times")
      summary() { awk -v key="$1" -v off="$2" '/summary:/ { for (i = 1; i <= NF; ++i) if ($i == key) print $(i + off) }' \
        "$tmp/out" | tr -d ')'; }
      ms=$(summary ms/step, -1)
      echo "$label $value $ms wait $(summary wait 1) act $(summary activations 1) cpu $(summary cpu 1)" \
        "max $(summary cpu 8) cores $cores" | tee -a "$tmp/all"
    done
  done
done
echo "# $(uptime)"
awk -v vary="$vary" -v values="$values" '{ t[$1 "/" $2] = t[$1 "/" $2] " " $3; act[$1 "/" $2] = $7; lab[$1] = 1 }
  function median(s,   a, n, i, j, x) {
    n = split(s, a, " ")
    for (i = 2; i <= n; ++i) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; --j) a[j + 1] = a[j]; a[j + 1] = x }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { n = split(values, v, " ")
        for (k in lab) {
          if (vary == "comm-sched" && values == "fifo priority") {
            f = median(t[k "/fifo"]); p = median(t[k "/priority"])
            printf "%s: median ms/step: fifo %.1f, priority %.1f; steps/s priority / fifo = %.3f (target >= 1.2)\n",
                   k, f, p, f / p
          } else {
            for (i = 1; i <= n; ++i)
              printf "%s: --%s %s: median %.1f ms/step, activations %s MiB\n", k, vary, v[i], median(t[k "/" v[i]]),
                     act[k "/" v[i]]
          } } }' "$tmp/all"
