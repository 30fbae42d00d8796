#!/usr/bin/env python3
"""The planner against an exhaustive sweep on an emulated cluster.

Runs `meshtrain --plan auto` once under `meshrun --cluster` (the profile is
measured, the links on the job's own ranks, and every feasible plan printed
with its prediction), then trains with every one of those plans in turn and
compares: each plan's predicted and measured ms/step, the ranks' CPU use, and
the plan the planner chose against the sweep's fastest.

  perf/plan_sweep.py --cluster NAME -n RANKS --ranks-per-host K [--build build]
      [--steps 6] [--repeat 1] [--top N] [-- meshtrain model options]

The cluster must be up (scripts/cluster up). A plan measured more than once
(--repeat) counts with its fastest run, since other load only slows a step
down. Exits non-zero when a run fails.
"""
import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

PLAN_LINE = re.compile(
    r"^[* ] dp (\d+) x pp (\d+) x tp (\d+) \((1d|3d)\)(?: stages ([\d,]+?))?, micro-batch (\d+) x (\d+)\s+([\d.]+)")
SUMMARY = re.compile(r"summary: \d+ step\(s\) timed, ([\d.]+) ms/step")
PLAN_CHECK = re.compile(r"plan: predicted ([\d.]+) ms/step, measured ([\d.]+) ms/step")


def run(cmd, timeout):
    """Runs cmd; returns (output, wall seconds, CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        sys.stdout.write(p.stdout[-3000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout, wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--ranks-per-host", type=int, required=True)
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--top", type=int, default=1000, help="sweep only the planner's N best plans")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--profile", help="keep the measured profile here (for `meshtrain plan --profile`)")
    ap.add_argument("model", nargs="*", help="meshtrain options after --")
    a = ap.parse_args()
    meshrun = [os.path.join(a.build, "tools/meshrun/meshrun"), "--cluster", a.cluster, "-n", str(a.n),
               "--ranks-per-host", str(a.ranks_per_host), os.path.join(a.build, "train/meshtrain")]
    common = a.model + ["--steps", str(a.steps), "--sample", "0", "--log-every", "1000"]
    cores = os.cpu_count()
    print(f"# {a.n} ranks, {a.ranks_per_host} per host, cluster {a.cluster}; model: {' '.join(a.model)}")
    print(f"# load average before: {os.getloadavg()[0]:.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        prof = a.profile or os.path.join(tmp, "profile.txt")
        if os.path.exists(prof):
            raise SystemExit(f"{prof} exists: the sweep measures a new profile")
        out, _, _ = run(meshrun + common + ["--plan", "auto", "--plan-top", "1000", "--profile", prof], a.timeout)
        plans = []
        for line in out.splitlines():
            m = PLAN_LINE.match(line)
            if m:
                plans.append(m.groups())
                if line.startswith("*") and len(plans) != 1:
                    raise SystemExit("the chosen plan is not the first one listed")
        check = PLAN_CHECK.search(out)
        if not plans or not check:
            sys.stdout.write(out[-3000:])
            raise SystemExit("no plan table or plan check in the --plan auto run")
        with open(prof) as f:
            print("# links measured on the job's ranks (seconds, seconds per byte sent by a rank):")
            for line in f:
                if line.startswith(("collective", "p2p")):
                    print("#   " + line.strip())

    rows = []
    for dp, pp, tp, mode, stages, mb, ga, predicted in plans[:a.top]:
        args = ["--dp", dp, "--pp", pp, "--tp", tp, "--tp-mode", mode, "--micro-batch", mb, "--grad-accum", ga]
        if stages:
            args += ["--stages", stages]
        best = None
        for _ in range(a.repeat):
            out, wall, cpu = run(meshrun + common + args, a.timeout)
            m = SUMMARY.search(out)
            if not m:
                sys.stdout.write(out[-3000:])
                raise SystemExit("no summary line")
            ms = float(m.group(1))
            if best is None or ms < best[0]:
                best = (ms, cpu / wall)
        name = f"dp {dp} x pp {pp} x tp {tp} ({mode}){' stages ' + stages if stages else ''}, mb {mb} x {ga}"
        rows.append((name, float(predicted), best[0], best[1]))
        print(f"{name:<48} predicted {float(predicted):8.1f}  measured {best[0]:8.1f} ms/step  "
              f"({100 * (float(predicted) / best[0] - 1):+5.0f}%)  cores {best[1]:.2f}", flush=True)

    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    chosen = rows[0]  # the planner's choice is its first plan
    fastest = min(rows, key=lambda r: r[2])
    within = sum(1 for r in rows if abs(r[1] / r[2] - 1) <= 0.15)
    cpu_bound = sum(1 for r in rows if r[3] > cores / 2)
    print(f"plans: {len(rows)}; predicted within 15%: {within}; "
          f"mean abs. error {100 * sum(abs(r[1] / r[2] - 1) for r in rows) / len(rows):.1f}%; "
          f"CPU-bound (ranks > {cores / 2:g} cores): {cpu_bound}")
    print(f"choice: {chosen[0]}: {chosen[2]:.1f} ms; best: {fastest[0]}: {fastest[2]:.1f} ms; "
          f"choice / best = {chosen[2] / fastest[2]:.3f}")
    print(f"--plan auto run: predicted {check.group(1)} ms/step, measured {check.group(2)} ms/step")


if __name__ == "__main__":
    main()
