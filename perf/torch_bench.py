#!/usr/bin/python3
"""torch.distributed through meshccl and through Gloo, in one run.

    PYTHONPATH=build/torch /usr/bin/python3 perf/torch_bench.py [--ranks 2 4] [--max-bytes 64M]

For each number of ranks it starts that many processes on this host; each
creates a meshccl world group and a Gloo group over the same ranks and times
every operation on both, alternating backends size by size, from 8 B to
--max-bytes per rank (float32), then the step time of a communication-bound
DistributedDataParallel model. A time is the slowest rank's mean over the
timed iterations, the median of --repeats repeats (the backends alternate
between repeats, so load from outside the run hits both alike). Prints markdown tables
(meshccl and Gloo in microseconds, and Gloo / meshccl); --json writes the raw
figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all_single", "gather", "scatter"]
# Gloo (torch 1.13, CPU) has no reduce_scatter; all_gather is timed in its list
# form for both backends (Gloo has no all_gather_into_tensor on CPU).
GLOO_LACKS = {"reduce_scatter"}


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def human(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {unit}"
    return f"{n} B"


# ----------------------------------------------------------------- one rank

def worker(args):
    import torch
    import torch.distributed as dist
    import meshccl_torch  # noqa: F401

    torch.set_num_threads(1)
    rank, world = args.rank, args.world
    dist.init_process_group("meshccl", init_method=args.init, rank=rank, world_size=world)
    groups = {"meshccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}

    def slowest(seconds):  # the slowest rank's figure, through Gloo
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
        return t.item()

    def make(op, nbytes, pg):
        n = max(1, nbytes // 4)
        n -= n % world if op in ("reduce_scatter", "all_to_all_single") and n >= world else 0
        n = max(n, world) if op in ("reduce_scatter", "all_to_all_single") else n
        x = torch.ones(n)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x, group=pg)
        if op == "broadcast":
            return lambda: dist.broadcast(x, 0, group=pg)
        if op == "reduce":
            return lambda: dist.reduce(x, 0, group=pg)
        if op == "all_gather":
            outs = [torch.empty(n) for _ in range(world)]
            return lambda: dist.all_gather(outs, x, group=pg)
        if op == "reduce_scatter":
            out = torch.empty(n // world)
            return lambda: dist.reduce_scatter_tensor(out, x, group=pg)
        if op == "all_to_all_single":
            out = torch.empty(n)
            return lambda: dist.all_to_all_single(out, x, group=pg)
        if op == "gather":
            outs = [torch.empty(n) for _ in range(world)] if rank == 0 else None
            return lambda: dist.gather(x, outs, 0, group=pg)
        if op == "scatter":
            ins = [torch.ones(n) for _ in range(world)] if rank == 0 else None
            return lambda: dist.scatter(x, ins, 0, group=pg)
        raise ValueError(op)

    def timed(fn, pg, iters):
        dist.barrier(group=pg)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return slowest((time.perf_counter() - t0) / iters)

    results = {"world": world, "ops": {}, "ddp": {}}
    sizes = [8]
    while sizes[-1] * 8 <= args.max_bytes:
        sizes.append(sizes[-1] * 8)
    if sizes[-1] != args.max_bytes:
        sizes.append(args.max_bytes)
    for op in args.ops:
        results["ops"][op] = []
        for nbytes in sizes:
            row = {"bytes": nbytes}
            fns, iters, times = {}, {}, {}
            for backend in ("meshccl", "gloo"):
                if backend == "gloo" and op in GLOO_LACKS:
                    row[backend] = None
                    continue
                pg = groups[backend]
                fns[backend] = make(op, nbytes, pg)
                fns[backend]()  # warm-up, and an estimate of the iterations that fill the budget
                est = max(timed(fns[backend], pg, 1), 1e-7)
                iters[backend] = int(min(max(args.budget / est, 3), 20000))
                times[backend] = []
            for _ in range(args.repeats):  # the backends alternate, so load from outside hits both alike
                for backend in fns:
                    times[backend].append(timed(fns[backend], groups[backend], iters[backend]))
            for backend in fns:
                row[backend] = statistics.median(times[backend]) * 1e6
            results["ops"][op].append(row)
            if rank == 0:
                print(f"  {world} ranks {op} {human(nbytes)}: " +
                      ", ".join(f"{b} {row[b]:.1f} us" for b in ("meshccl", "gloo") if row[b] is not None),
                      file=sys.stderr, flush=True)

    # DDP: a communication-bound model: an embedding table of 4M parameters
    # (16 MiB of dense gradients) and a small head, 32 lookups per step.
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps = {}
    for backend in ("meshccl", "gloo"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(32768, 128), torch.nn.Linear(128, 16))
        ddp = DDP(model, process_group=groups[backend])
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x = torch.randint(0, 32768, (32,), generator=torch.Generator().manual_seed(rank))

        def step(ddp=ddp, opt=opt, x=x):
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()

        for _ in range(3):
            step()
        steps[backend] = step
        KEEP.append(ddp)  # see tests/torch/worker.py: no DDP-over-Gloo teardown in torch 1.13
    times = {b: [] for b in steps}
    for _ in range(args.repeats):  # alternating, as above
        for backend, step in steps.items():
            dist.barrier(group=groups[backend])
            t0 = time.perf_counter()
            for _ in range(args.ddp_steps):
                step()
            times[backend].append(slowest((time.perf_counter() - t0) / args.ddp_steps))
    for backend in steps:
        results["ddp"][backend] = statistics.median(times[backend]) * 1e3
        if rank == 0:
            print(f"  {world} ranks DDP step {backend}: {results['ddp'][backend]:.2f} ms", file=sys.stderr, flush=True)

    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


KEEP = []


# ------------------------------------------------------------------- driver

def run_world(world, args):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        base = [sys.executable, os.path.abspath(__file__), "--worker", "--world", str(world),
                "--init", f"file://{d}/store", "--out", out, "--max-bytes", str(args.max_bytes),
                "--budget", str(args.budget), "--repeats", str(args.repeats), "--ddp-steps", str(args.ddp_steps),
                "--ops", *args.ops]
        env = dict(os.environ)
        env.setdefault("MESHCCL_SOCKET_IFNAME", "lo")
        procs = [subprocess.Popen(base + ["--rank", str(r)], env=env) for r in range(world)]
        try:
            for p in procs:
                p.wait(timeout=args.timeout)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode != 0 for p in procs):
            sys.exit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
        with open(out) as f:
            return json.load(f)


def table(res):
    lines = [f"### {res['world']} ranks", ""]
    for op, rows in res["ops"].items():
        lines += [f"**{op}** (time per call, us; speedup = Gloo / meshccl)", "",
                  "| bytes per rank | meshccl | Gloo | speedup |", "| ---: | ---: | ---: | ---: |"]
        for r in rows:
            g = r["gloo"]
            lines.append(f"| {human(r['bytes'])} | {r['meshccl']:.1f} | " +
                         (f"{g:.1f} | {g / r['meshccl']:.1f}x |" if g is not None else "n/a | |"))
        lines.append("")
    d = res["ddp"]
    lines += ["**DDP step** (Embedding(32768, 128) + Linear(128, 16): 16 MiB of gradients, 32 lookups; ms)", "",
              "| meshccl | Gloo | speedup |", "| ---: | ---: | ---: |",
              f"| {d['meshccl']:.2f} | {d['gloo']:.2f} | {d['gloo'] / d['meshccl']:.2f}x |", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--max-bytes", type=parse_size, default=64 << 20)
    ap.add_argument("--budget", type=float, default=0.1, help="seconds per measurement (default 0.1)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ddp-steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for one world size")
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    all_results = [run_world(w, args) for w in args.ranks]
    for res in all_results:
        print(table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1)


if __name__ == "__main__":
    main()
