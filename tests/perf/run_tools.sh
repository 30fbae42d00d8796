#!/bin/bash
# Runs the nccl-tests-compatible tools on tiny sizes against the real library:
# table layout, checking, exit statuses, threads and meshrun processes.
#   run_tools.sh <build>/perf <meshrun binary>
set -u
dir=$1
meshrun=${2:-}
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

check() {  # check <description> <condition...>
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; sed 's/^/     | /' "$out" | tail -20; fi
}

rows() { grep -v '^#' "$out" | grep -c '[0-9]'; }
no_wrong() {  # every #wrong column is 0 or N/A
  grep -v "^#" "$out" | grep "[0-9]" | awk '{ if ($NF != "0" && $NF != "N/A") bad = 1; if ($(NF-4) != "0" && $(NF-4) != "N/A") bad = 1 } END { exit bad }'
}

timeout 120 "$dir/all_reduce_perf" -t 2 -b 8 -e 32K -f 4 -n 2 -w 1 > "$out" 2>&1
st=$?
check "all_reduce_perf -t 2 exits 0" test $st -eq 0
check "all_reduce_perf prints 7 rows" test "$(rows)" -eq 7
check "all_reduce_perf finds no wrong elements" no_wrong
check "header line" grep -qxF '#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ' "$out"
check "parameter line" grep -qxF '# nThread 2 nGpus 1 minBytes 8 maxBytes 32768 step: 4(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0 unalign: 0' "$out"
check "first row" grep -qE '^           8             2     float     sum      -1 ' "$out"
check "footer" grep -qxF '# Out of bounds values : 0 OK' "$out"
check "conclusion" grep -qxF '# Collective test concluded: all_reduce_perf' "$out"

for t in all_gather broadcast reduce reduce_scatter alltoall gather scatter sendrecv; do
  timeout 120 "$dir/${t}_perf" -t 3 -b 1K -e 16K -f 4 -n 2 -w 1 -r 1 > "$out" 2>&1
  st=$?
  check "${t}_perf -t 3 exits 0" test $st -eq 0
  check "${t}_perf prints 3 rows" test "$(rows)" -eq 3
  check "${t}_perf finds no wrong elements" no_wrong
done

timeout 120 "$dir/reduce_perf" -t 2 -b 64 -e 64 -n 1 -r -1 -o all -d all > "$out" 2>&1
st=$?
check "reduce_perf every root, op and type exits 0" test $st -eq 0
check "reduce_perf every root, op and type: 2 x 6 x 12 rows" test "$(rows)" -eq 144
check "reduce_perf every root, op and type finds no wrong elements" no_wrong

timeout 60 "$dir/hypercube_perf" -t 3 -b 1K -e 1K > "$out" 2>&1
check "hypercube_perf with 3 ranks skips" grep -qxF 'nRanks 3 is not a power of 2, skipping' "$out"
timeout 60 "$dir/hypercube_perf" -t 4 -b 1K -e 4K -f 2 -n 2 > "$out" 2>&1
st=$?
check "hypercube_perf -t 4 exits 0 with no wrong elements" test $st -eq 0 -a "$(rows)" -eq 3
check "hypercube_perf finds no wrong elements" no_wrong

NCCL_TESTS_MIN_BW=1000000 timeout 60 "$dir/all_reduce_perf" -t 2 -b 1K -e 1K -n 1 > "$out" 2>&1
st=$?
check "NCCL_TESTS_MIN_BW above the result exits 7" test $st -eq 7
check "NCCL_TESTS_MIN_BW above the result says FAILED" grep -q '^# Avg bus bandwidth    : .* FAILED$' "$out"

timeout 10 "$dir/all_reduce_perf" -h > "$out" 2>&1
check "-h exits 0 with usage" test $? -eq 0
timeout 10 "$dir/all_reduce_perf" -Q > "$out" 2>&1
st=$?
check "unknown option exits 0 and names it" test $st -eq 0 -a "$(head -1 "$out")" = "invalid option 'Q'"
timeout 10 "$dir/all_reduce_perf" -b 1M -e 1K > "$out" 2>&1
check "-b above -e exits 255" test $? -eq 255

json=$(mktemp -u).json
MESHCCL_COMM_SECRET=hush-1 API_TOKEN=hush-2 timeout 60 "$dir/all_reduce_perf" -t 2 -b 1K -e 4K -f 2 -n 2 -M 1 \
  -J "$json" > "$out" 2>&1
check "-J writes a JSON document with one result per row" python3 -c "
import json, sys
d = json.load(open('$json'))
sys.exit(0 if d['version'] == 3 and len(d['results']) == 3 and len(d['config']['devices']) == 2 else 1)"
check "-J records the environment without secrets' values" python3 -c "
import json, sys
env = json.load(open('$json'))['env']
sys.exit(0 if 'MESHCCL_COMM_SECRET=<redacted>' in env and 'API_TOKEN=<redacted>' in env
         and not any('hush-' in e for e in env) and any(e.startswith('PATH=') for e in env) else 1)"
check "-M prints the memory line" grep -q '^# GPU memory usage     : Initialization .* | Total  ' "$out"
rm -f "$json"

if [ -x "$dir/all_reduce_perf_mpi" ] && command -v mpirun > /dev/null; then
  NCCL_TESTS_SPLIT="MOD 2" timeout 120 mpirun --oversubscribe --allow-run-as-root -np 4 \
    "$dir/all_reduce_perf_mpi" -b 8 -e 8K -f 8 -n 2 > "$out" 2>&1
  st=$?
  check "all_reduce_perf_mpi, 4 processes split in 2 groups, exits 0" test $st -eq 0
  check "split groups print one table of 4 rows" test "$(rows)" -eq 4
  check "split groups find no wrong elements" no_wrong
  check "device lines show groups 0 and 1" test "$(grep -c '^#  Rank  [01] Group  [01] ' "$out")" -eq 4
fi

if [ -n "$meshrun" ] && [ -x "$meshrun" ]; then
  timeout 120 "$meshrun" --no-prefix -n 2 "$dir/all_reduce_perf" -b 8 -e 8K -f 8 -n 2 > "$out" 2>&1
  st=$?
  check "all_reduce_perf under meshrun -n 2 exits 0" test $st -eq 0
  check "all_reduce_perf under meshrun prints one table of 4 rows" test "$(rows)" -eq 4
  check "all_reduce_perf under meshrun finds no wrong elements" no_wrong
  check "two processes" test "$(grep -c '^#  Rank ' "$out")" -eq 2
fi
exit $fail
