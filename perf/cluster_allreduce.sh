#!/usr/bin/env bash
# AllReduce across an emulated cluster (scripts/cluster, root only): the link
# limit from iperf3 in the same run, then all_reduce_perf with the
# hierarchical algorithm, the flat ring and the tuner's own pick, each with
# the cost model's prediction for the sizes it ran. Prints one table per run:
#   size  algo  pick  measured_us  predicted_us  algbw_GBs  payload_per_host  hosts  cores
# (payload_per_host: TCP bytes each host's eth0 sent per op, mean over the
# hosts; cores: the ranks' CPU time over the timed loop's wall time; both
# from the out-of-place loop, MESHCCL_PERF_NETDEV in perf/engine/hostload.h)
# and before each table one line with the cost model's constants the run
# agreed on (rank 0's log, the benchmark's communicator: the last created),
#   #model  algo  shm_alpha_us  shm_gbs  net_alpha_us  net_gbs  reduce_gbs
# which perf/sim_check --from gives meshccl_sim to predict the same plans.
# Usage: perf/cluster_allreduce.sh CLUSTER RANKS RANKS_PER_HOST [BUILD] [MIN] [MAX] [ITERS]
# CLUSTER_BENCH=0 leaves out the iperf3 measurement (perf/compare --cluster
# takes it once per cluster); CLUSTER_ALGOS picks the runs (default
# "hier ring default"), CLUSTER_TIMEOUT bounds each run (seconds, default 600).
set -euo pipefail
cluster=$1 n=$2 per=$3 build=${4:-build} lo=${5:-64K} hi=${6:-256M} iters=${7:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
case $build in /*) ;; *) build=$here/$build ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bench() {
  [ "${CLUSTER_BENCH:-1}" = 0 ] ||
    "$here/scripts/cluster" bench --name "$cluster" --time 2 | grep -E "^(link_bps|path_bps|path_bidir_bps)="
}
bench
for algo in ${CLUSTER_ALGOS:-hier ring default}; do
  spec="allreduce:$algo"
  [ "$algo" = default ] && spec=""
  MESHCCL_ALGO=$spec MESHCCL_PERF_NETDEV=eth0 MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=TUNE timeout "${CLUSTER_TIMEOUT:-600}" \
    "$build/tools/meshrun/meshrun" --tag-output --cluster "$cluster" -n "$n" --ranks-per-host "$per" \
    "$build/perf/all_reduce_perf" -b "$lo" -e "$hi" -f 4 -n "$iters" -w 1 -c 0 >"$tmp/out" 2>&1 || {
    echo "run $algo failed"; tail -5 "$tmp/out"; continue; }
  grep -E '^\[0\].*cost model on' "$tmp/out" | tail -1 |
    sed -nE 's/.*shm alpha ([0-9.e+]+) us.*shm bandwidth ([0-9.e+]+) GB\/s.*net alpha ([0-9.e+]+) us.*net bandwidth ([0-9.e+]+) GB\/s.*reduce ([0-9.e+]+) GB\/s.*/#model '"$algo"' \1 \2 \3 \4 \5/p' || true
  # Predictions: rank 0's log line per plan, by element count.
  awk -v algo="$algo" '
    /^\[0\].*AllReduce: [0-9]+ elements of float -> algorithm/ {
      for (i = 1; i <= NF; ++i) { if ($i == "AllReduce:") c = $(i+1); if ($i == "algorithm") a = $(i+1); if ($i == "estimated") e = $(i+1) }
      sub(",", "", a); pred[c * 4] = e; pick[c * 4] = a }
    /^\[0\] #netload / { net[$3] = $7; hosts[$3] = $5; cores[$3] = $10 }
    /^\[0\] +[0-9]+ +[0-9]+ +float +sum/ { order[++rows] = $2; t[$2] = $7; bw[$2] = $8 }
    END {
      for (i = 1; i <= rows; ++i) {
        size = order[i]
        if (!(size in pick)) { pick[size] = "-"; pred[size] = 0 }
        if (!(size in net)) { net[size] = 0; hosts[size] = 0; cores[size] = 0 }
        printf "%10d %-8s %-16s %12.1f %12.1f %8.3f %12.0f %3d %6.3f\n", size, algo, pick[size], t[size], pred[size],
          bw[size], net[size], hosts[size], cores[size]
      }
    }
  ' "$tmp/out"
done
bench
