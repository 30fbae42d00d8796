#!/bin/bash
# Chaos on the emulated cluster: rounds of a mixed workload (chaos_ranks under
# meshrun --keep-going across 2-4 network-namespace hosts) while faults are
# injected: SIGKILL of one or two ranks (the survivors shrink and go on),
# SIGSTOP past MESHCCL_TIMEOUT then SIGCONT, a host's link down and up
# (shorter and longer than the timeout), and links saturated by iperf3.
# Every rank must end with every op correct or a clear error; a wrong answer,
# a hang (no operation completed on any rank for 60 s, or an op that failed
# later than twice MESHCCL_TIMEOUT plus the stop), a crash (a signal not injected) or anything
# left behind (a rank process, a namespace, a file in /dev/shm) fails the run.
#
#   chaos.sh <scripts/cluster> <meshrun> <chaos_ranks> [--seconds S] [--hosts H]
#            [--ops N] [--seed X] [--net socket|ucx|ofi]
#
# --net forces the transport between hosts (NCCL_NET; shm stays within a
# host; ofi uses libfabric's tcp provider); without it the automatic choice
# (the first of ucx, ofi, socket built) is used.
#
# Prints one line per round and a summary; exit 0, 1 (a failure above), or
# 77 where network namespaces cannot be made (the reason is printed).
set -u
cluster=$1
meshrun=$2
ranks=$3
shift 3
seconds=90
hosts=3
ops=2500
seed=$(( ($$ * 7919 + $(date +%s)) % 1000000 ))
net=
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --net) net=$2; shift 2 ;;
    *) echo "chaos.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case $hosts in 2|3|4) ;; *) echo "chaos.sh: --hosts must be 2, 3 or 4" >&2; exit 2 ;; esac
net_args=()
case $net in
  '') ;;
  socket) net_args=(-x NCCL_NET=Socket) ;;
  ucx) net_args=(-x NCCL_NET=ucx -x UCX_TLS=tcp) ;;
  ofi) net_args=(-x NCCL_NET=ofi -x FI_PROVIDER=tcp) ;;
  *) echo "chaos.sh: --net must be socket, ucx or ofi" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "SKIP: chaos needs root (network namespaces, tc, ip link)"
  exit 77
fi
if ! why=$("$cluster" check 2>&1); then
  echo "SKIP: no emulated cluster here: ${why:-scripts/cluster check failed without saying why}" | head -1
  exit 77
fi
command -v iperf3 >/dev/null || { echo "SKIP: iperf3 is not installed (scripts/deps.sh installs it)"; exit 77; }

name="ch$$"
work=$(mktemp -d /tmp/meshccl-chaos.XXXXXX)
shm_before=$(ls /dev/shm 2>/dev/null | sort)
iperf_pids=()
cleanup() {
  for p in "${iperf_pids[@]}"; do kill "$p" 2>/dev/null; done
  "$cluster" down --name "$name" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

unset MESHCCL_SOCKET_IFNAME NCCL_SOCKET_IFNAME MESHCCL_HOSTID MESHCCL_TRANSPORT NCCL_NET MESHCCL_COMM_ID NCCL_COMM_ID
timeout_s=5
export MESHCCL_TIMEOUT=$timeout_s

"$cluster" up --name "$name" --hosts "$hosts" >/dev/null || { echo "FAIL: scripts/cluster up failed"; exit 1; }

RANDOM=$seed
rounds=0 faults=0 kills=0 stops=0 links=0 saturations=0
slowest=0
ops_done=0 errors=0 shrinks=0 wrong=0 hangs=0 overtime=0 crashes=0 leftovers=0 recovered=0
t_end=$(( $(date +%s) + seconds ))

alive() { kill -0 "$1" 2>/dev/null; }
pid_of() { cat "$dir/pid.$1" 2>/dev/null; }

saturate() {  # iperf3 both ways between two hosts for $1 seconds, in the background
  local a=$(( RANDOM % hosts )) b
  b=$(( (a + 1 + RANDOM % (hosts - 1)) % hosts ))
  ip netns exec "mcc-$name-h$b" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  iperf_pids+=($!)
  sleep 0.3
  ip netns exec "mcc-$name-h$a" timeout $(( $1 + 5 )) iperf3 -c "198.18.0.$(( b + 1 ))" -p 5299 -t "$1" --bidir \
    >/dev/null 2>&1 &
  iperf_pids+=($!)
}

while [ "$(date +%s)" -lt "$t_end" ]; do
  rounds=$(( rounds + 1 ))
  n=$(( hosts + RANDOM % (2 * hosts - 1) ))        # hosts .. 3*hosts-2 ranks
  [ "$n" -gt 8 ] && n=8
  [ "$n" -lt 3 ] && n=3
  dir="$work/r$rounds"
  mkdir -p "$dir"
  : >"$dir/killed"
  rseed=$(( seed * 1000 + rounds ))
  fault_kinds=(none kill kill kill2 stop link_short link_long)
  # The first rounds go through every kind once (so a short run covers
  # them all), then kinds are drawn at random.
  first=(kill2 stop link_long kill link_short none)
  if [ "$rounds" -le ${#first[@]} ]; then
    fault=${first[$(( rounds - 1 ))]}
  else
    fault=${fault_kinds[$(( RANDOM % ${#fault_kinds[@]} ))]}
  fi
  sat=$(( RANDOM % 3 == 0 ))
  "$meshrun" --tag-output --keep-going --cluster "$name" -n "$n" --timeout 900 -x CHAOS_DIR="$dir" "${net_args[@]}" \
    "$ranks" "$ops" "$rseed" >"$dir/out" 2>&1 &
  job=$!
  # Wait (bounded) until every rank has written its pid.
  for _ in $(seq 1 200); do
    [ "$(ls "$dir" | grep -c '^pid\.')" -ge "$n" ] && break
    alive "$job" || break
    sleep 0.05
  done
  # On a loaded machine setting up 6-8 ranks takes seconds, and a fault
  # drawn from the start would nearly always hit the setup (there is then no
  # communicator to shrink). Three rounds in four wait (bounded, 30 s) until
  # every rank has its communicator and has completed operations (a rank
  # writes progress.R every 25), so that the fault hits the workload; the
  # fourth keeps it wherever it falls, setup included.
  phase=any
  if [ $(( RANDOM % 4 )) -ne 0 ]; then
    phase=work
    for _ in $(seq 1 300); do
      [ "$(ls "$dir" | grep -c '^progress\.')" -ge "$n" ] && break
      alive "$job" || break
      sleep 0.1
    done
  fi
  sleep "0.$(( RANDOM % 9 + 1 ))"
  [ "$sat" = 1 ] && { saturate 6; saturations=$(( saturations + 1 )); faults=$(( faults + 1 )); }
  sleep "$(( RANDOM % 4 )).$(( RANDOM % 10 ))"
  victims=""
  alive "$job" || fault="none (the job ended first)"
  case $fault in
    kill|kill2)
      v1=$(( RANDOM % n ))
      victims=$v1
      if [ "$fault" = kill2 ] && [ "$n" -ge 4 ]; then victims="$v1 $(( (v1 + 1 + RANDOM % (n - 1)) % n ))"; fi
      for v in $victims; do echo "$v" >>"$dir/killed"; done
      for v in $victims; do
        p=$(pid_of "$v")
        [ -n "$p" ] && kill -KILL "$p" 2>/dev/null && { kills=$(( kills + 1 )); faults=$(( faults + 1 )); }
      done ;;
    stop)
      v=$(( RANDOM % n ))
      p=$(pid_of "$v")
      if [ -n "$p" ] && kill -STOP "$p" 2>/dev/null; then
        stops=$(( stops + 1 )); faults=$(( faults + 1 ))
        sleep $(( timeout_s + 2 ))
        kill -CONT "$p" 2>/dev/null
      fi ;;
    link_short|link_long)
      h=$(( RANDOM % hosts ))
      d=$([ "$fault" = link_short ] && echo $(( 1 + RANDOM % 3 )) || echo $(( timeout_s + 2 )))
      ip -n "mcc-$name-h$h" link set eth0 down && { links=$(( links + 1 )); faults=$(( faults + 1 )); }
      sleep "$d"
      ip -n "mcc-$name-h$h" link set eth0 up ;;
  esac
  # A hang is a job in which no rank completes an operation for 60 s (each
  # rank counts its operations in progress.R); a slow job on a loaded machine
  # is not one. meshrun's --timeout is only the outer bound.
  last_sum=-1 still=0
  while kill -0 "$job" 2>/dev/null; do
    sum=$(cat "$dir"/progress.* 2>/dev/null | awk '{s += $1} END {print s + 0}')
    if [ "$sum" = "$last_sum" ]; then still=$(( still + 1 )); else still=0; last_sum=$sum; fi
    if [ "$still" -ge 60 ]; then
      echo "  no operation completed on any rank for 60 s: stopping the job"
      kill -TERM "$job" 2>/dev/null
      hung=1
      break
    fi
    sleep 1
  done
  wait "$job"
  status=$?
  stalled=${hung:-0}
  hung=0
  for p in "${iperf_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  iperf_pids=()
  # What the round left: a process of a rank still alive is a leftover.
  for f in "$dir"/pid.*; do
    [ -e "$f" ] || continue
    if alive "$(cat "$f")"; then
      leftovers=$(( leftovers + 1 ))
      echo "  LEFTOVER rank process $(cat "$f") (${f##*/})"
      kill -KILL "$(cat "$f")" 2>/dev/null
    fi
  done
  lines=$(grep -c 'chaos: rank' "$dir/out")
  r_ops=$(grep -o 'chaos: rank .*' "$dir/out" | awk '{s += $5} END {print s + 0}')
  r_err=$(grep -o 'chaos: rank .*' "$dir/out" | awk '{s += $7} END {print s + 0}')
  r_shr=$(grep -o 'chaos: rank .*' "$dir/out" | awk '{s += $9} END {print s + 0}')
  r_wrong=$(grep -o 'chaos: rank .*' "$dir/out" | awk '{s += $11} END {print s + 0}')
  r_ok=$(grep -c 'result ok' "$dir/out")
  nkilled=$(wc -w <"$dir/killed")
  ops_done=$(( ops_done + r_ops )); errors=$(( errors + r_err )); shrinks=$(( shrinks + r_shr ))
  wrong=$(( wrong + r_wrong + $(grep -c 'WRONG' "$dir/out") ))
  # The slowest failing op: an error must come within the timeout of the
  # fault (plus the stop a stopped rank itself sat through), not later.
  r_slow=$(grep -o 'failed after [0-9.]* s' "$dir/out" | awk '{if ($3 > m) m = $3} END {print m + 0}')
  slowest=$(awk -v a="$slowest" -v b="$r_slow" 'BEGIN {print (b > a) ? b : a}')
  verdict=ok
  if awk -v x="$r_slow" -v t="$timeout_s" 'BEGIN {exit !(x > 2 * t + 9)}'; then hangs=$(( hangs + 1 )); verdict=SLOW; fi
  # A stall (60 s without an operation anywhere) is a hang; a job still
  # completing operations when meshrun's --timeout ends it is not, but it
  # did not finish either: too slow, counted apart.
  if [ "$stalled" = 1 ]; then hangs=$(( hangs + 1 )); verdict=HANG
  elif [ "$status" = 124 ]; then overtime=$(( overtime + 1 )); verdict=OVERTIME; fi
  # Signals other than the injected SIGKILLs, or a missing report, are crashes.
  crashed=$(grep -E 'was killed by' "$dir/out" | grep -vc 'SIGKILL')
  if [ "$crashed" -gt 0 ] || [ $(( lines + nkilled )) -lt "$n" ] && [ "$verdict" = ok ]; then
    crashes=$(( crashes + 1 )); verdict=CRASH
  fi
  [ "$r_wrong" -gt 0 ] && verdict=WRONG
  # A fault-free round must complete everywhere; after kills, survivors that
  # shrank and finished count as recovered.
  if [ "${fault%% *}" = none ] && [ "$r_ok" -lt "$n" ] && [ "$verdict" = ok ] && [ "$sat" = 0 ]; then verdict=FAILED; fi
  case $fault in kill|kill2) [ "$r_ok" -eq $(( n - nkilled )) ] && recovered=$(( recovered + 1 )) ;; esac
  printf 'round %d: %d ranks, fault %s%s (%s), exit %d: %d ops, %d errors, %d shrinks, %d of %d ranks finished every op: %s\n' \
    "$rounds" "$n" "$fault" "$([ "$sat" = 1 ] && echo ' + iperf3')" "$([ "$phase" = work ] && echo 'in the workload' || echo 'at any time')" "$status" "$r_ops" "$r_err" "$r_shr" "$r_ok" "$n" "$verdict"
  if [ "$verdict" != ok ]; then
    [ "$verdict" = FAILED ] && crashes=$(( crashes + 1 ))
    sed 's/^/     | /' "$dir/out" | tail -30
  fi
done

"$cluster" down --name "$name" >/dev/null 2>&1
left_ns=$(ip netns list | awk '{print $1}' | grep -c "^mcc-$name-")
[ "$left_ns" -gt 0 ] && { echo "LEFTOVER: $left_ns namespaces of mcc-$name"; leftovers=$(( leftovers + left_ns )); }
shm_after=$(ls /dev/shm 2>/dev/null | sort)
new_shm=$(comm -13 <(echo "$shm_before") <(echo "$shm_after") | grep -ci 'meshccl\|mcc')
[ "$new_shm" -gt 0 ] && { echo "LEFTOVER: $new_shm files in /dev/shm"; leftovers=$(( leftovers + new_shm )); }

echo "chaos summary: seed $seed, $hosts hosts, net ${net:-automatic}, $rounds rounds, faults $faults (SIGKILL $kills, SIGSTOP $stops, link down $links, iperf3 $saturations), ops completed $ops_done, errors $errors, shrinks $shrinks, kill rounds recovered $recovered, slowest failing op ${slowest} s, wrong answers $wrong, hangs $hangs, rounds over meshrun's --timeout while progressing $overtime, crashes $crashes, leftovers $leftovers"
[ $(( wrong + hangs + overtime + crashes + leftovers )) -eq 0 ]
