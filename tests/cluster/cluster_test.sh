#!/bin/bash
# The emulated cluster end to end: scripts/cluster's life cycle (idempotent
# up, two clusters at once, shaping, a failed up and down leaving nothing) and
# every collective across 2 and 3 hosts under meshrun --cluster, in the
# layouts 2x1, 2x2 (round-robin and blocked), 3+1, 3x1 and 2+1+1, checking
# which transport each pair of ranks uses; the same over the ucx transport
# across 2, 3 and 4 hosts and over the ofi plugin (tcp provider), each with a
# rank killed mid-job, when they are built. Skips (exit 77) with the reason
# where network namespaces cannot be made.
#   cluster_test.sh <scripts/cluster> <meshrun> <cluster_ranks> <plugin dir>
set -u
cluster=$1
meshrun=$2
ranks=$3
plugins=${4:-}

# What automatic selection picks between hosts: the first of ucx, ofi,
# socket that is built (both ends run this build).
net=socket
for t in ucx ofi; do
  if [ -e "$plugins/libmeshccl-transport-$t.so" ]; then net=$t; break; fi
done
ofi=$plugins/libmeshccl-transport-ofi.so

if ! why=$("$cluster" check 2>&1); then
  echo "SKIP: no emulated cluster here: ${why:-scripts/cluster check failed without saying why}" | head -1
  exit 77
fi

# Names unique to this run, so that clusters of other runs are left alone.
a="ta$$"
b="tb$$"
c="tc$$"
d="td$$"
cleanup() {
  "$cluster" down --name "$a" >/dev/null 2>&1
  "$cluster" down --name "$b" >/dev/null 2>&1
  "$cluster" down --name "$c" >/dev/null 2>&1
  "$cluster" down --name "$d" >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The interfaces are the namespaces' own: scripts/test pins single-host jobs
# to lo, which cannot reach another namespace; the transport must find eth0.
unset MESHCCL_SOCKET_IFNAME NCCL_SOCKET_IFNAME MESHCCL_HOSTID MESHCCL_TRANSPORT NCCL_NET MESHCCL_NET MESHCCL_COMM_ID NCCL_COMM_ID
# UCX's and libfabric's settings are the plugins' own choice, as a user who
# sets none gets them (docs/transports.md); the ucx and ofi jobs check what
# was chosen and that UCX carries the data between hosts on eth0.
unset UCX_NET_DEVICES UCX_TLS UCX_RNDV_THRESH UCX_LOG_LEVEL FI_OFI_RXM_EAGER_LIMIT
export MESHCCL_TIMEOUT=60

fail=0
out=$(mktemp)
trap 'rm -f "$out"; cleanup' EXIT
check() {  # check <description> <command...>: the command's status decides
  local what=$1
  shift
  if "$@"; then
    echo "ok   $what"
  else
    echo "FAIL $what"
    fail=1
    sed 's/^/     | /' "$out" | tail -25
  fi
}
run() { "$@" >"$out" 2>&1; }
has() { grep -qE -- "$1" "$out"; }
hasnt() { ! grep -qE -- "$1" "$out"; }
namespaces_of() { ip netns list | awk '{print $1}' | grep -cE "^mcc-$1-(sw|h[0-9]+)\$"; }

# ---- life cycle -----------------------------------------------------------
check "up 2 hosts" run "$cluster" up --name "$a" --hosts 2
check "  3 namespaces (switch + 2 hosts)" test "$(namespaces_of "$a")" -eq 3
check "  up again with the same settings is a no-op" run "$cluster" up --name "$a" --hosts 2
check "  says so" has "already up"
check "  up with other settings fails" eval '! run "$cluster" up --name "$a" --hosts 3'
check "  and names the way out" has "down --name $a"
check "  status lists both hosts up" run "$cluster" status --name "$a"
check "  h0 is 198.18.0.1" has "mcc-$a-h0 +eth0 198.18.0.1/24 +UP"
check "  h1 is 198.18.0.2" has "mcc-$a-h1 +eth0 198.18.0.2/24 +UP"
check "  the addresses exist only inside the namespaces" eval '! ip -o addr | grep -q " 198\.18\."'
check "  no link of the cluster in this namespace" eval '! ip -o link | grep -qE "mcc-|: p[0-9]+[@:]"'

check "a second cluster, 3 hosts shaped at 1gbit, at the same time" run "$cluster" up --name "$b" --hosts 3 --rate 1gbit
check "  4 namespaces" test "$(namespaces_of "$b")" -eq 4
check "  the first one is still up" test "$(namespaces_of "$a")" -eq 3
run tc -n "mcc-$b-h2" qdisc show dev eth0
check "  host side shaped by tbf at 1Gbit" has "tbf .* rate 1Gbit"
run tc -n "mcc-$b-sw" qdisc show dev p2
check "  switch side shaped by tbf at 1Gbit" has "tbf .* rate 1Gbit"
run tc -n "mcc-$a-h0" qdisc show dev eth0
check "  the unshaped cluster has no tbf" hasnt "tbf"

check "a failing up reports the failure" eval '! MESHCCL_CLUSTER_FAIL_AFTER_HOSTS=1 run "$cluster" up --name "$c" --hosts 3'
check "  and leaves no namespace behind" test "$(namespaces_of "$c")" -eq 0
check "  nor any state" eval '! "$cluster" status --name "$c" >/dev/null 2>&1'

# ---- jobs -----------------------------------------------------------------
# job <cluster> <ranks> <meshrun options...>: every collective; one "ok" line
# per rank naming its host.
job() {
  local name=$1 n=$2
  shift 2
  local where=(--cluster "$name")
  [[ "$*" == *"--hosts mcc-"* ]] && where=()
  CLUSTER_NAME=$name timeout 150 "$meshrun" --tag-output "${where[@]}" -n "$n" --timeout 120 "$@" "$ranks" >"$out" 2>&1
  local st=$?
  [ $st -eq 0 ] && [ "$(grep -cE '^\[[0-9]+\] rank [0-9]+ host mcc-.* ok [0-9]+ checks$' "$out")" -eq "$n" ]
}
on() { grep -qE "^\[$1\] rank $1 host mcc-[a-z0-9]+-$2 local $3 ok" "$out"; }  # on <rank> <host> <local>/<size>

check "2x1: every collective across 2 hosts" job "$a" 2
check "  rank 0 on h0, rank 1 on h1" eval 'on 0 h0 0/1 && on 1 h1 0/1'

export MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,NET
check "2x2 round-robin: every collective, 2 ranks per host (NCCL_NET=Socket)" job "$a" 4 -x NCCL_NET=Socket
unset MESHCCL_DEBUG MESHCCL_DEBUG_SUBSYS
check "  ranks 0,2 on h0 and 1,3 on h1" eval 'on 0 h0 0/2 && on 2 h0 1/2 && on 1 h1 0/2 && on 3 h1 1/2'
check "  same host: shm" eval 'has "\[0\] .*rank 0 <-> rank 2 via shm" && has "\[3\] .*rank 3 <-> rank 1 via shm"'
check "  other host: socket" eval 'has "\[0\] .*rank 0 <-> rank 1 via socket" && has "\[2\] .*rank 2 <-> rank 3 via socket"'
check "  no shm between hosts" hasnt "rank (0|2) <-> rank (1|3) via shm"
check "  bootstrap on the namespace's eth0, not lo" has "\[0\] .*root listening on eth0:198\.18\.0\.1:"
check "  socket transport on eth0 of each host" eval 'has "\[0\] .*socket: using eth0 198\.18\.0\.1$" && has "\[1\] .*socket: using eth0 198\.18\.0\.2$"'
check "  never on lo" hasnt "socket: using lo"
check "  host identity names the namespace" has "\[1\] .*host [^ ]*:mcc-$a-h1 commId"

MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=INIT check "2x2 automatic: every collective" job "$a" 4
check "  same host: shm" eval 'has "\[0\] .*rank 0 <-> rank 2 via shm"'
check "  other host: $net (the first of ucx, ofi, socket built)" eval 'has "\[0\] .*rank 0 <-> rank 1 via $net" && has "\[3\] .*rank 3 <-> rank 2 via $net"'
check "a transport that is not there fails init on every rank" eval '! job "$a" 2 -x MESHCCL_TRANSPORT=nosuch'
check "  naming it and what is available" eval 'has "MESHCCL_TRANSPORT=nosuch is not available on rank 0 .*available there: shm, .*socket" && has "MESHCCL_TRANSPORT=nosuch is not available on rank [01] "'

check "2x2 blocked (--ranks-per-host 2)" job "$a" 4 --ranks-per-host 2
check "  ranks 0,1 on h0 and 2,3 on h1" eval 'on 0 h0 0/2 && on 1 h0 1/2 && on 2 h1 0/2 && on 3 h1 1/2'
check "3+1 uneven (--ranks-per-host 3)" job "$a" 4 --ranks-per-host 3
check "  ranks 0-2 on h0, rank 3 alone on h1" eval 'on 2 h0 2/3 && on 3 h1 0/1'
check "3x1 across 3 shaped hosts" job "$b" 3
check "  one rank per host" eval 'on 0 h0 0/1 && on 1 h1 0/1 && on 2 h2 0/1'
check "2+1+1: 4 ranks round-robin on 3 shaped hosts" job "$b" 4
check "  ranks 0 and 3 share h0" eval 'on 0 h0 0/2 && on 3 h0 1/2 && on 2 h2 0/1'
check "--hosts h2,h0 picks and orders hosts" job "$b" 2 --hosts h2,h0
check "  rank 0 on h2, rank 1 on h0" eval 'on 0 h2 0/1 && on 1 h0 0/1'
check "--hosts with namespace names, no --cluster" job "$b" 2 --hosts "mcc-$b-h1,mcc-$b-h2"
check "  rank 0 on h1, rank 1 on h2" eval 'on 0 h1 0/1 && on 1 h2 0/1'

# The hierarchical algorithms forced, across real hosts: even, uneven, wide.
export MESHCCL_ALGO="allreduce:hier;allgather:hier;reducescatter:hier;broadcast:hier;reduce:hier"
check "hier 2x2: hierarchical collectives, 2 ranks per host" job "$a" 4 --ranks-per-host 2
check "hier 3+1: uneven hosts" job "$a" 4 --ranks-per-host 3
check "hier 2+1+1: 3 shaped hosts" job "$b" 4
check "hier 2x4: 4 ranks per host" job "$a" 8 --ranks-per-host 4
unset MESHCCL_ALGO
export MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=TUNE
check "2x2 tuned: every candidate's prediction is logged" job "$a" 4 --ranks-per-host 2
unset MESHCCL_DEBUG MESHCCL_DEBUG_SUBSYS
check "  hier among the AllReduce candidates" has "AllReduce: .* -> algorithm [a-z_]+, estimated .*\(ring [0-9.]+, tree [0-9.]+, halving_doubling [0-9.]+, recursive_doubling [0-9.]+, hier [0-9.]+"
check "  the cost model knows the 2 hosts" has "cost model on 4 ranks, 2 host\(s\), network links"

check "ranks see their namespace's devices in /sys" run "$meshrun" --tag-output --cluster "$a" -n 2 sh -c 'echo net: $(ls /sys/class/net)'
check "  eth0 and lo only" eval 'has "^\[0\] net: eth0 lo$" && has "^\[1\] net: eth0 lo$"'
check "--bind core with --cluster" job "$a" 2 --bind core --report-bindings
check "  reports host and core" has "^meshrun: rank 1 on mcc-$a-h1 bound to (core|cpu) [0-9]+ \\(cpus "

MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=INIT job "$a" 2 -x MESHCCL_HOSTID=one >/dev/null
check "MESHCCL_HOSTID still overrides the namespace: one host, shm" has "rank 0 <-> rank 1 via shm"

check "meshrun on a cluster that is not up fails" eval '! run "$meshrun" --cluster "$c" -n 2 true'
check "  saying so" has "cluster '$c' is not up"
check "--ranks-per-host too small for -n fails" eval '! run "$meshrun" --cluster "$a" -n 5 --ranks-per-host 2 true'
check "  saying so" has "does not fit on 2 host"

# ---- ucx --------------------------------------------------------------------
if [ -e "$plugins/libmeshccl-transport-ucx.so" ]; then
  export MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=INIT,NET
  check "ucx 2x1: every collective (MESHCCL_TRANSPORT=ucx)" job "$a" 2 -x MESHCCL_TRANSPORT=ucx -x UCX_LOG_LEVEL=info
  check "  via ucx, control socket on eth0" eval 'has "rank 0 <-> rank 1 via ucx" && has "\[1\] .*ucx: UCX .* control socket on eth0 198\.18\.0\.2"'
  check "  UCX's settings for TCP chosen by the plugin" has "\[0\] .*ucx: no RDMA device, so TCP between hosts: chose UCX_TLS=tcp,sm,self UCX_RNDV_THRESH=inf$"
  check "  UCX's lanes between the hosts: TCP on eth0" eval 'has "\[1\] .*ep_cfg\[[0-9]+\]: tag\(tcp/eth0\)" && hasnt "ep_cfg\[[0-9]+\]: tag\([^)]*(posix|sysv|cma|tcp/lo)"'
  check "ucx 2x2: shm within a host, ucx between (NCCL_NET=ucx)" job "$a" 4 -x NCCL_NET=ucx
  check "  pairs" eval 'has "\[0\] .*rank 0 <-> rank 2 via shm" && has "\[0\] .*rank 0 <-> rank 1 via ucx"'
  check "ucx 3x1 across 3 shaped hosts" job "$b" 3 -x MESHCCL_TRANSPORT=ucx
  check "ucx 2+1+1: 4 ranks on 3 shaped hosts" job "$b" 4 -x NCCL_NET=ucx
  unset MESHCCL_DEBUG MESHCCL_DEBUG_SUBSYS
  check "up 4 hosts" run "$cluster" up --name "$d" --hosts 4
  check "ucx 4x1: every collective across 4 hosts" job "$d" 4 -x MESHCCL_TRANSPORT=ucx
  check "  one rank per host" eval 'on 0 h0 0/1 && on 3 h3 0/1'
  check "ucx 4x2: 8 ranks, 2 per host" job "$d" 8 -x NCCL_NET=ucx
  # A rank killed mid-job: the others fail within MESHCCL_TIMEOUT, saying why.
  # dead_ucx <cluster> <ranks> <victim>: every survivor's call fails within
  # MESHCCL_TIMEOUT=10 (+5 s), saying why.
  dead_ucx() {
    CLUSTER_NAME=$1 MESHCCL_TIMEOUT=10 timeout 100 "$meshrun" --tag-output --cluster "$1" -n "$2" --timeout 90 --keep-going \
      -x MESHCCL_TRANSPORT=ucx "$ranks" --die "$3" >"$out" 2>&1
    [ "$(grep -cE '^\[[0-9]+\] rank [0-9]+ saw the dead peer after ' "$out")" -eq $(($2 - 1)) ] &&
      ! sed -n 's/^\[[0-9]*\] rank [0-9]* saw the dead peer after \([0-9.]*\) s: .*/\1/p' "$out" |
        awk '$1 > 15 { bad = 1 } END { exit !bad }'
  }
  check "ucx: rank 1 of 3 killed, the 2 others fail within MESHCCL_TIMEOUT" dead_ucx "$b" 3 1
  check "  with a remote error naming the lost peer" eval 'has "saw the dead peer .*remote process exited or there was a network error" && has "saw the dead peer .*(rank 1|ucx)"'
  check "  meshrun reports the kill" has "rank 1 \(pid [0-9]+\) was killed by SIGKILL"
  check "ucx: rank 3 of 4 (4 hosts) killed" dead_ucx "$d" 4 3
  check "down 4 hosts" run "$cluster" down --name "$d"
else
  echo "skip ucx: $plugins/libmeshccl-transport-ucx.so is not built (UCX was not found at configure time)"
fi

# ---- ofi ------------------------------------------------------------------
# Every collective with every pair of ranks on the libfabric plugin (tcp
# provider, also between ranks of one host), then a rank SIGKILLed mid-job:
# each survivor's next collective fails within MESHCCL_TIMEOUT, saying why.
if [ "$ofi" != none ] && [ -e "$ofi" ]; then
  export MESHCCL_TRANSPORT=ofi FI_PROVIDER=tcp
  export MESHCCL_DEBUG=INFO MESHCCL_DEBUG_SUBSYS=INIT,NET
  check "ofi 2x1: every collective across 2 hosts" job "$a" 2
  unset MESHCCL_DEBUG MESHCCL_DEBUG_SUBSYS
  check "  rank 0 <-> rank 1 via ofi" has "\[0\] .*rank 0 <-> rank 1 via ofi"
  check "  the tcp provider on eth0" has "\[0\] .*ofi: ofi:tcp;ofi_rxm:eth0"
  check "  payload messages sent eagerly" has "\[1\] .*ofi: ofi:tcp;ofi_rxm:eth0, messages of up to 131072 bytes, sent eagerly \(FI_OFI_RXM_EAGER_LIMIT=131072 chosen"
  check "ofi 2x2 round-robin: 2 ranks per host" job "$a" 4
  check "ofi 2+1+1: 4 ranks on 3 shaped hosts" job "$b" 4
  dead() {
    MESHCCL_TIMEOUT=15 timeout 120 "$meshrun" --tag-output --keep-going --cluster "$b" -n 3 --timeout 100 "$ranks" --die 1 >"$out" 2>&1
    local s0 s2
    s0=$(sed -n 's/^\[0\] rank 0 saw the dead peer after \([0-9.]*\) s: .*/\1/p' "$out")
    s2=$(sed -n 's/^\[2\] rank 2 saw the dead peer after \([0-9.]*\) s: .*/\1/p' "$out")
    [ -n "$s0" ] && [ -n "$s2" ] && awk -v a="$s0" -v b="$s2" 'BEGIN { exit !(a <= 20 && b <= 20) }'
  }
  check "ofi: rank 1 killed, ranks 0 and 2 fail within MESHCCL_TIMEOUT=15 s (+5)" dead
  check "  with a remote error" has "saw the dead peer .*remote process exited or there was a network error"
  unset MESHCCL_TRANSPORT FI_PROVIDER
else
  echo "skip ofi: the ofi plugin is not built (libfabric was not found at configure time)"
fi

# ---- bench ----------------------------------------------------------------
# Behaviour only: every figure is there and the 1 Gbit/s shaping holds (tbf
# cannot pass more than its rate plus one 2 ms bucket); how fast is not tested.
check "bench measures every link of the shaped cluster" run "$cluster" bench --name "$b" --time 1
check "  three links, both directions, and the h0-h1 path" eval 'has "link h2 +up [0-9.]+ Gbit/s  down [0-9.]+ Gbit/s" && has "path h0 -> h1 [0-9.]+ Gbit/s" && has "both ways at once"'
bps=$(sed -n 's/^link_bps=//p' "${MESHCCL_CLUSTER_STATE:-/run/meshccl-cluster}/$b/bench" 2>/dev/null)
check "  writes link_bps, above 0 and at most 1.1 Gbit/s" test "${bps:-0}" -gt 0 -a "${bps:-0}" -le 1100000000
check "  status shows it" eval 'run "$cluster" status --name "$b" && has "measured: link"'

# ---- down -----------------------------------------------------------------
check "down" run "$cluster" down --name "$a"
check "  removes every namespace" test "$(namespaces_of "$a")" -eq 0
check "  and the state" eval '! "$cluster" status --name "$a" >/dev/null 2>&1'
check "  leaves the other cluster up" test "$(namespaces_of "$b")" -eq 4
check "down again is a no-op" run "$cluster" down --name "$a"
check "  says so" has "is not up"
check "down of the second cluster" run "$cluster" down --name "$b"
check "  removes every namespace" test "$(namespaces_of "$b")" -eq 0

exit $fail
