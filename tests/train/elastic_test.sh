#!/bin/bash
# meshtrain --elastic: a 4-rank job (dp 2 x pp 2) under meshrun --keep-going
# loses a rank (SIGKILL) mid-run, after a checkpoint; the survivors drop its
# data-parallel replica, shrink, resume from the checkpoint with dp 1 and
# finish, and the loss goes on from where the checkpoint left it. Run once on
# one host and, where network namespaces can be made, across 2 emulated hosts
# (scripts/cluster) once per network transport between them: socket, and ucx
# and ofi where their plugins are built (each checked to be the one used).
#   elastic_test.sh <meshrun> <meshtrain> <scripts/cluster> [<plugin dir>]
set -u
meshrun=$1
meshtrain=$2
cluster=$3
plugins=${4:-}
work=$(mktemp -d /tmp/meshtrain-elastic.XXXXXX)
name="el$$"
job=
cleanup() {
  [ -n "$job" ] && kill -KILL "$job" 2>/dev/null
  "$cluster" down --name "$name" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
export MESHCCL_TIMEOUT=10 OPENBLAS_NUM_THREADS=1
fail=0

# run_case <label> <victim job rank> <transport between hosts or -> [meshrun options...]
# ($steps training steps; the kill comes after the checkpoint at step 80.)
steps=1500
run_case() {
  local label=$1 victim=$2 via=$3
  shift 3
  local dir="$work/$label" log="$work/$label.log"
  "$meshrun" --tag-output --keep-going --timeout 240 "$@" -n 4 "$meshtrain" --dp 2 --pp 2 --layers 2 --d-model 32 --heads 2 \
    --seq 32 --micro-batch 2 --steps "$steps" --lr 1e-3 --ckpt-dir "$dir" --ckpt-every 40 --elastic --log-every 10 \
    >"$log" 2>&1 &
  job=$!
  # Kill once a checkpoint exists and training has gone past it (bounded).
  local ok=0
  for _ in $(seq 1 600); do
    if [ -f "$dir/latest" ] && [ "$(grep -c '^\[0\] step' "$log")" -ge 8 ] && [ -f "$dir/elastic/rank_$victim.pid" ]; then
      ok=1
      break
    fi
    kill -0 "$job" 2>/dev/null || break
    sleep 0.05
  done
  if [ "$ok" = 1 ]; then kill -KILL "$(awk '{print $2}' "$dir/elastic/rank_$victim.pid")"; fi
  wait "$job"
  local status=$?
  job=
  local why=""
  [ "$ok" = 1 ] || why="the job ended or never checkpointed before the kill"
  [ -z "$why" ] && [ "$status" != 137 ] && why="meshrun exited $status, not 137 (the killed rank's status)"
  [ -z "$why" ] && ! grep -q "elastic: job rank(s) $victim died" "$log" && why="no elastic report naming rank $victim"
  [ -z "$why" ] && ! grep -q "dp 2 -> 1, 2 rank(s)" "$log" && why="the layout did not shrink to dp 1"
  [ -z "$why" ] && ! grep -qE "step +$steps/$steps" "$log" && why="training did not finish"
  [ -z "$why" ] && ! grep -qE "^\[[0-9]+\] summary:" "$log" && why="no summary"
  [ -z "$why" ] && [ "$via" != - ] && ! grep -qE "rank [0-9]+ <-> rank [0-9]+ via $via\$" "$log" && why="no pair of ranks used $via"
  [ -z "$why" ] && [ "$via" != - ] && grep -qE "rank [0-9]+ <-> rank [0-9]+ via (socket|ucx|ofi)\$" "$log" &&
    grep -E "rank [0-9]+ <-> rank [0-9]+ via (socket|ucx|ofi)\$" "$log" | grep -vq "via $via\$" && why="a pair of ranks used another network transport than $via"
  if [ -z "$why" ]; then
    # The losses go on from the checkpoint: the first logged loss after the
    # resume is near the last one logged before the failure and far below
    # the untrained loss (ln 256 = 5.55).
    local resumed before after
    resumed=$(sed -n 's/.*resumed from the checkpoint after step \([0-9]*\).*/\1/p' "$log")
    before=$(awk -v s="$resumed" '/^\[[0-9]+\] step/ {split($3, a, "/"); if (a[1] + 0 <= s) l = $6} END {print l}' "$log")
    after=$(awk '/elastic: job rank/ {seen = 1; next} seen && /^\[[0-9]+\] step/ {print $6; exit}' "$log")
    if [ -z "$before" ] || [ -z "$after" ] || ! awk -v b="$before" -v a="$after" 'BEGIN {exit !(a < 5.0 && a - b < 0.5 && b - a < 0.8)}'; then
      why="loss before the failure '$before' (step <= $resumed), after the resume '$after': not continuing"
    else
      echo "     loss at the checkpoint (step $resumed) $before, first after the resume $after"
    fi
  fi
  if [ -z "$why" ]; then
    echo "ok   $label: $(grep -o 'elastic: .*' "$log")"
  else
    echo "FAIL $label: $why"
    grep -v '^\[0\] step' "$log" | tail -20 | sed 's/^/     | /'
    fail=1
  fi
}

run_case one-host 3 -
if [ "$(id -u)" = 0 ] && "$cluster" check >/dev/null 2>&1; then
  unset MESHCCL_SOCKET_IFNAME NCCL_SOCKET_IFNAME MESHCCL_HOSTID MESHCCL_TRANSPORT NCCL_NET MESHCCL_NET
  if "$cluster" up --name "$name" --hosts 2 >/dev/null; then
    # Ranks 0,2 on h0 and 1,3 on h1: shm within a host, the transport
    # between (the pairs it makes are logged at INFO, subsystem INIT).
    dbg=(-x MESHCCL_DEBUG=INFO -x MESHCCL_DEBUG_SUBSYS=INIT)
    steps=400  # the resume and its loss are what is checked; shorter runs per transport
    run_case two-hosts-socket 1 socket --cluster "$name" "${dbg[@]}" -x NCCL_NET=Socket
    if [ -e "$plugins/libmeshccl-transport-ucx.so" ]; then
      # UCX kept on its tcp transport, as between real hosts.
      run_case two-hosts-ucx 2 ucx --cluster "$name" "${dbg[@]}" -x NCCL_NET=ucx -x UCX_TLS=tcp
    else
      echo "skip two-hosts-ucx: the ucx plugin is not built"
    fi
    if [ -e "$plugins/libmeshccl-transport-ofi.so" ]; then
      run_case two-hosts-ofi 3 ofi --cluster "$name" "${dbg[@]}" -x NCCL_NET=ofi -x FI_PROVIDER=tcp
    else
      echo "skip two-hosts-ofi: the ofi plugin is not built"
    fi
  else
    echo "FAIL: scripts/cluster up"; fail=1
  fi
else
  echo "skip two-hosts: no emulated cluster here (needs root and network namespaces)"
fi
exit $fail
