#!/bin/bash
# Resharding across an emulated cluster (scripts/cluster): reshard_perf at a
# small scale on 3 hosts of 2 ranks, every strategy and balancing mode on the
# cases that fit (one-to-many up to (2,2), case 7/8), every destination tile
# checked (reshard_perf exits 1 on a wrong tile). Skips (77) with the reason
# where network namespaces cannot be made.
#   reshard_cluster_test.sh <scripts/cluster> <meshrun> <reshard_perf>
set -u
cluster=$1
meshrun=$2
perf=$3
if ! why=$("$cluster" check 2>&1); then
  echo "SKIP: no emulated cluster here: ${why:-scripts/cluster check failed without saying why}" | head -1
  exit 77
fi
name="rs$$"
trap '"$cluster" down --name "$name" >/dev/null 2>&1' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
unset MESHCCL_SOCKET_IFNAME NCCL_SOCKET_IFNAME MESHCCL_HOSTID MESHCCL_TRANSPORT NCCL_NET MESHCCL_COMM_ID NCCL_COMM_ID
export MESHCCL_TIMEOUT=60
"$cluster" up --name "$name" --hosts 3 --rate 10gbit || exit 1
out=$(timeout 150 "$meshrun" --tag-output --cluster "$name" -n 6 --ranks-per-host 2 --timeout 120 \
      "$perf" --per-host 2 --scale 1024 --iters 1 --warmup 0 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: reshard_perf exited $status"; exit 1; }
n_ok=$(echo "$out" | grep -c ' ok$')
# one2many (1,1)->(1,1), (1,2), (2,2) and case 7/8: 4 cases x 6 configurations.
[ "$n_ok" -eq 24 ] || { echo "FAIL: $n_ok checked rows, want 24"; exit 1; }
echo "ok: 24 plans, every tile checked, across 3 emulated hosts"
