#!/usr/bin/env python3
"""meshccl_sim on presets and topology files: the tables' structure, picks
that are the predicted minima, monotone times, bandwidths within what the
links allow, the 16384-rank tables, and clear errors for bad input.

Usage: sim_test.py MESHCCL_SIM TOPO_DATA_DIR
"""
import csv
import math
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

SIM, DATA = sys.argv[1], sys.argv[2]
FLAT = {"ring", "tree", "halving_doubling", "chain", "pairwise", "direct", "p2p"}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, env=None, expect=0):
    e = dict(os.environ)
    e.pop("MESHCCL_ALGO", None)
    e.pop("NCCL_ALGO", None)
    e.update(env or {})
    p = subprocess.run([SIM] + args, capture_output=True, text=True, timeout=300, env=e)
    check(p.returncode == expect, f"{args}: exit {p.returncode}, wanted {expect}: {p.stderr.strip()}")
    return p


def table(args, tmp, name, env=None):
    path = os.path.join(tmp, name + ".csv")
    run(args + ["--quiet", "--csv", path], env)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("nranks", "nhosts", "allowed", "picked"):
            r[k] = int(r[k])
        for k in ("bytes", "time_us", "algbw_gbs", "busbw_gbs"):
            r[k] = float(r[k])
    check(rows, f"{args}: no rows")
    return rows


# Across hosts, estimates within this share of the cheapest count as equal
# (collectives/algorithms.h, kNearTie), and one with one flow per link wins.
NEAR_TIE = 0.02


def check_picks(rows, label):
    """One pick per (collective, ranks, size), the cheapest allowed candidate
    (across hosts: within NEAR_TIE of it)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["collective"], r["nranks"], r["bytes"])].append(r)
    for key, g in groups.items():
        picked = [r for r in g if r["picked"]]
        check(len(picked) == 1, f"{label} {key}: {len(picked)} picks")
        allowed = [r["time_us"] for r in g if r["allowed"]]
        if picked and allowed:
            slack = 1 + NEAR_TIE if picked[0]["nhosts"] > 1 else 1
            check(picked[0]["time_us"] <= min(allowed) * slack,
                  f"{label} {key}: pick {picked[0]['algorithm']} is not the minimum")
    return groups


def check_monotone(rows, label):
    """Each candidate's time, and the pick's, grow with size."""
    series = defaultdict(list)
    for r in rows:
        series[(r["collective"], r["nranks"], r["algorithm"])].append((r["bytes"], r["time_us"]))
        if r["picked"]:
            series[(r["collective"], r["nranks"], "<pick>")].append((r["bytes"], r["time_us"]))
    for key, pts in series.items():
        pts.sort()
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if math.isfinite(t0) and math.isfinite(t1):
                check(t1 >= t0 * (1 - 1e-12), f"{label} {key}: {t1} us at {b1} B < {t0} us at {b0} B")


def check_bounds(rows, shm, net, label):
    """A flat algorithm's busbw is at most its bottleneck link's bandwidth:
    on one host every one's, across hosts the ring's (every step crosses the
    network; halving-doubling, the trees and AlltoAll keep some steps inside a
    host and may use several rails, so only the next bound holds for them);
    no algorithm's algbw beats what the hosts' network links could carry if
    every rank had its own."""
    for r in rows:
        hosts, n, busbw, algbw = r["nhosts"], r["nranks"], r["busbw_gbs"], r["algbw_gbs"]
        if not math.isfinite(r["time_us"]):
            continue
        bottleneck = net if hosts > 1 else shm
        if r["algorithm"] in FLAT and (hosts == 1 or r["algorithm"] == "ring"):
            check(busbw <= bottleneck * (1 + 1e-9), f"{label} {r['collective']} {n} ranks {r['bytes']} B "
                  f"{r['algorithm']}: busbw {busbw} > {bottleneck}")
        if hosts > 1:
            g = n / hosts
            need = {"AllReduce": 2 * (hosts - 1) / hosts, "AllGather": (hosts - 1) / hosts,
                    "ReduceScatter": (hosts - 1) / hosts, "Broadcast": 1, "Reduce": 1,
                    "AlltoAll": g * (hosts - 1) / hosts}.get(r["collective"])
            if need:
                check(algbw <= g * net / need * (1 + 1e-9),
                      f"{label} {r['collective']} {n} ranks {r['algorithm']}: algbw {algbw} above the hosts' links")


def dgx(tmp):
    rows = table(["--preset", "dgx-h100"], tmp, "dgx")
    ranks = sorted({r["nranks"] for r in rows})
    check(ranks == [8 << i for i in range(12)], f"dgx sweep ranks {ranks}")
    colls = {r["collective"] for r in rows}
    check(colls == {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AlltoAll"}, f"collectives {colls}")
    for c in colls:
        check(any(r["collective"] == c and r["nranks"] == 16384 for r in rows), f"no 16384-rank {c} table")
    check_picks(rows, "dgx")
    check_monotone(rows, "dgx")
    check_bounds(rows, 450, 50, "dgx")
    # The ring's busbw tends to its link: NVLink within a node, the per-GPU
    # NIC (400 Gbit/s = 50 GB/s) across nodes, as NCCL's flat rings.
    def ring_busbw(n):
        return max(r["busbw_gbs"] for r in rows
                   if r["collective"] == "AllReduce" and r["nranks"] == n and r["algorithm"] == "ring")
    # (The model adds the reduction to the transfers: about 375 GB/s.)
    check(0.75 * 450 <= ring_busbw(8) <= 450, f"8-GPU ring busbw {ring_busbw(8)}")
    check(45 <= ring_busbw(16) <= 50, f"2-node ring busbw {ring_busbw(16)}")
    # The pick's time at a fixed size grows with the rank count.
    for size in (8.0, float(1 << 21), float(1 << 29)):
        t = [min(r["time_us"] for r in rows if r["collective"] == "AllReduce" and r["nranks"] == n
                 and r["bytes"] == size and r["picked"]) for n in ranks]
        check(all(b >= a for a, b in zip(t, t[1:])), f"AllReduce {size} B pick time by ranks {t}")


def cpu_and_files(tmp):
    rows = table(["--preset", "cpu:4", "--hosts", "1,4,8192", "-b", "64K", "-e", "64M", "-f", "2"], tmp, "cpu")
    check(sorted({r["nranks"] for r in rows}) == [2, 8, 16384], "cpu --hosts")
    check(sorted({r["bytes"] for r in rows if r["collective"] == "AllReduce"}) == [float(65536 << i) for i in range(11)],
          "cpu sizes")
    check_picks(rows, "cpu")
    check_monotone(rows, "cpu")
    check_bounds(rows, 5, 1.25, "cpu")
    f = table(["--topo", os.path.join(DATA, "two_hosts_2numa.xml"), "--ranks-per-host", "2", "--coll", "allreduce"],
              tmp, "file")
    check({(r["nranks"], r["nhosts"]) for r in f} == {(4, 2)}, "two_hosts_2numa.xml: 4 ranks on 2 hosts")
    x = table(["--topo", os.path.join(DATA, "nccl_2socket_8gpu.xml"), "--hosts", "2,32", "--coll", "allgather",
               "--net-gbs", "50", "--shm-gbs", "450"], tmp, "nccl")
    check(sorted({r["nranks"] for r in x}) == [16, 256], "NCCL XML: one rank per GPU")
    check_picks(x, "nccl")
    check_bounds(x, 450, 50, "nccl")
    forced = table(["--preset", "cpu:8", "--coll", "allreduce"], tmp, "forced", {"MESHCCL_ALGO": "allreduce:ring"})
    check(all(r["algorithm"] == "ring" for r in forced if r["picked"]), "MESHCCL_ALGO=allreduce:ring not followed")
    check(any(not r["allowed"] for r in forced), "forcing shows no excluded candidate")


def errors(tmp):
    bad = os.path.join(tmp, "bad.xml")
    with open(bad, "w") as f:
        f.write('<meshccl_topology version="1">\n  <host name="a">\n</meshccl_topology>\n')
    cases = [
        (["--preset", "nope:2"], "unknown preset"),
        (["--preset", "dgx-h100:0"], "host count"),
        (["--preset", "dgx-h100:x"], "host count"),
        (["--preset", "cpu:2000000"], "host count"),
        (["--topo", bad], "bad.xml:"),
        (["--topo", os.path.join(tmp, "missing.xml")], "missing.xml"),
        (["--topo", os.path.join(DATA, "nccl_cpu_only.xml")], "--ranks-per-host"),
        (["--preset", "cpu:2", "--coll", "allsum"], "unknown collective"),
        (["--preset", "cpu:2", "-b", "-4"], "not a positive number"),
        (["--preset", "cpu:2", "--hosts", "0"], "--hosts"),
        (["--preset", "cpu:2", "-e", "1e300"], "at most"),
        (["--preset", "cpu:2", "-f", "1.0000001"], "-f"),
        (["--preset", "cpu:2", "--topo", bad], "one of --preset and --topo"),
        ([], "one of --preset and --topo"),
    ]
    for args, msg in cases:
        p = run(args, expect=2)
        check(msg in p.stderr, f"{args}: stderr {p.stderr.strip()!r} lacks {msg!r}")
    p = run(["--preset", "cpu:2"], {"MESHCCL_ALGO": "allreduce:nosuch"}, expect=2)
    check("nosuch" in p.stderr, f"bad MESHCCL_ALGO: {p.stderr.strip()!r}")


def plot(tmp):
    """The PNG, where some python3 has matplotlib (scripts/deps.sh installs it)."""
    have = any(subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0
               for py in ("python3", "/usr/bin/python3") if os.path.exists(py) or py == "python3")
    if not have:
        print("note: no matplotlib, the plot is not checked")
        return
    png = os.path.join(tmp, "sim.png")
    run(["--preset", "dgx-h100", "--hosts", "1,2,16", "--quiet", "--png", png])
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", "--png wrote no PNG")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        p = run(["--preset", "dgx-h100:2", "--coll", "allreduce", "-b", "1M", "-e", "1M"])
        check("# AllReduce on 16 ranks, 2 hosts" in p.stdout and "pick" in p.stdout, f"table header: {p.stdout[:300]}")
        dgx(tmp)
        cpu_and_files(tmp)
        errors(tmp)
        plot(tmp)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
