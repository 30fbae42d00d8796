#!/usr/bin/env python3
"""PyTorch's NCCL backend on meshccl: N processes on one GPU (several ranks
per GPU, which NVIDIA's NCCL refuses). Run by scripts/gpu-check with
LD_PRELOAD=<meshccl>/libnccl.so.2; checks that meshccl is the NCCL in use,
then every collective the issue lists, new_group, and a DDP training whose
parameters must match the same training in one process.

Usage: torch_check.py --nproc N
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def batches(steps, n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8 * n, 32, generator=g), torch.randn(8 * n, 8, generator=g)) for _ in range(steps)]


def train_single(n, steps):
    m = model().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for x, y in batches(steps, n):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x.cuda()), y.cuda()).backward()
        opt.step()
    return [p.detach().cpu() for p in m.parameters()]


def worker(rank, n, port, steps, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)  # every rank on the one GPU
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=dev)
    try:
        lib = os.environ.get("MESHCCL_LIB", "")
        maps = open("/proc/self/maps").read()
        check(lib and lib.split("/")[-1] in maps and os.path.dirname(lib) in maps, "meshccl's libnccl.so.2 is not mapped")
        ver = torch.cuda.nccl.version()
        check(tuple(ver[:3]) == (2, 28, 9), "NCCL version %s is not meshccl's 2.28.9" % (ver,))
        r = rank
        # all_reduce (sum, avg, max), several dtypes
        for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float64):
            t = torch.full((1031,), r + 1, dtype=dt, device=dev)
            dist.all_reduce(t)
            check(torch.all(t == n * (n + 1) // 2).item(), "all_reduce sum %s" % dt)
        t = torch.full((17,), float(r), device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        check(torch.all(t == n - 1).item(), "all_reduce max")
        t = torch.full((17,), float(r), device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        check(torch.allclose(t, torch.full_like(t, (n - 1) / 2)), "all_reduce avg")
        # all_gather (list and into tensor)
        t = torch.arange(5, device=dev, dtype=torch.float32) + 10 * r
        out = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(out, t)
        check(all(torch.equal(out[k], torch.arange(5, device=dev, dtype=torch.float32) + 10 * k) for k in range(n)), "all_gather")
        big = torch.empty(5 * n, device=dev)
        dist.all_gather_into_tensor(big, t)
        check(torch.equal(big.view(n, 5)[n - 1], torch.arange(5, device=dev, dtype=torch.float32) + 10 * (n - 1)), "all_gather_into_tensor")
        # reduce_scatter
        inp = torch.arange(4 * n, device=dev, dtype=torch.float32) * (r + 1)
        o = torch.empty(4, device=dev)
        dist.reduce_scatter_tensor(o, inp)
        check(torch.equal(o, torch.arange(4 * r, 4 * r + 4, device=dev, dtype=torch.float32) * (n * (n + 1) // 2)), "reduce_scatter")
        # broadcast, reduce
        t = torch.full((1000,), float(r), device=dev)
        dist.broadcast(t, src=n - 1)
        check(torch.all(t == n - 1).item(), "broadcast")
        t = torch.full((1000,), float(r + 1), device=dev)
        dist.reduce(t, dst=0)
        if r == 0:
            check(torch.all(t == n * (n + 1) // 2).item(), "reduce")
        # all_to_all
        inp = torch.tensor([r * n + k for k in range(n)], device=dev, dtype=torch.float32)
        o = torch.empty(n, device=dev)
        dist.all_to_all_single(o, inp)
        check(torch.equal(o, torch.tensor([k * n + r for k in range(n)], device=dev, dtype=torch.float32)), "all_to_all")
        # send/recv around the ring
        s = torch.full((333,), float(r), device=dev)
        rr = torch.empty(333, device=dev)
        reqs = [dist.isend(s, (r + 1) % n), dist.irecv(rr, (r - 1) % n)]
        for q_ in reqs:
            q_.wait()
        check(torch.all(rr == (r - 1) % n).item(), "send/recv")
        dist.barrier()
        # new_group: the even ranks
        evens = list(range(0, n, 2))
        g = dist.new_group(evens)
        if r in evens:
            t = torch.ones(8, device=dev)
            dist.all_reduce(t, group=g)
            check(torch.all(t == len(evens)).item(), "new_group all_reduce")
        dist.barrier()
        # DDP: each rank its slice of every batch; gradients averaged.
        m = torch.nn.parallel.DistributedDataParallel(model().to(dev), device_ids=[0])
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for x, y in batches(steps, n):
            xs, ys = x[8 * r:8 * (r + 1)].to(dev), y[8 * r:8 * (r + 1)].to(dev)
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xs), ys).backward()
            opt.step()
        torch.cuda.synchronize()
        if r == 0:
            q.put([p.detach().cpu() for p in m.module.parameters()])
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a.nproc, port, a.steps, q), nprocs=a.nproc, join=True)
    ddp = q.get(timeout=60)
    single = train_single(a.nproc, a.steps)
    worst = max((p - s).abs().max().item() for p, s in zip(ddp, single))
    check(worst < 1e-5, "DDP parameters differ from the single-process run by %g" % worst)
    print("torch %s, %d processes on one GPU: all checks passed, DDP max |diff| %.2e" % (torch.__version__, a.nproc, worst))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL:", e)
        sys.exit(1)
