"""One rank of a meshccl_torch test job: python3 worker.py SCENARIO RANK WORLD INIT_METHOD.

Every scenario checks the meshccl backend against Gloo in the same processes:
where Gloo has the operation for the dtype, against Gloo's result; where it has
not (AVG, reduce_scatter, all_gather_into_tensor, all_to_all lists, bfloat16,
bool, int16), against the result computed from every rank's input as gathered
through Gloo. Inputs are small integers (and halves), so every sum and product
is exact in every dtype and results must match bit for bit.
Exits 0 when every check passed; prints each failure otherwise.
"""

import ctypes
import os
import signal
import sys
import time
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist

import meshccl_torch  # noqa: F401  (registers the backend)

R = dist.ReduceOp
SCENARIO, RANK, WORLD, INIT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
FAILURES = []
KEEP = []

DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Gloo (torch 1.13) has no bfloat16, bool or int16: move those as another dtype.
GLOO_CARRIER = {torch.bfloat16: torch.float32, torch.bool: torch.uint8, torch.int16: torch.int32,
                torch.complex64: torch.float64}
GLOO_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]


def opname(op):
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
        if op == getattr(R, name):
            return name
    return str(op)


def check(what, got, want):
    if isinstance(got, (list, tuple)):
        if len(got) != len(want):
            FAILURES.append(f"{what}: {len(got)} tensors, expected {len(want)}")
            return
        for i, (g, w) in enumerate(zip(got, want)):
            check(f"{what}[{i}]", g, w)
        return
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        FAILURES.append(f"{what}: got {got.flatten()[:8].tolist()} ({got.dtype}, {tuple(got.shape)}), "
                        f"expected {want.flatten()[:8].tolist()} ({want.dtype}, {tuple(want.shape)})")


def check_close(what, got, want, rtol):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.allclose(
            got.double(), want.double(), rtol=rtol, atol=rtol):
        FAILURES.append(f"{what}: got {got.flatten()[:8].tolist()}, expected {want.flatten()[:8].tolist()}")


def expect_error(what, fn, fragment=""):
    try:
        fn()
    except RuntimeError as e:
        if fragment and fragment not in str(e):
            FAILURES.append(f"{what}: error without '{fragment}': {e}")
        return str(e)
    FAILURES.append(f"{what}: no error")
    return ""


def make_input(rank, dtype, n, seed, kind="sum"):
    g = torch.Generator().manual_seed(seed * 1009 + rank * 7919 + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if kind == "prod":  # products of up to 4 values stay exact and in range
        v = torch.randint(1, 3, (n,), generator=g)
        if dtype not in (torch.uint8,):
            v = v * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
        return v.to(dtype)
    lo = 0 if dtype == torch.uint8 else -8
    v = torch.randint(lo, 9, (n,), generator=g).to(torch.float64)
    if dtype in FLOATS:
        v = v / 2
    return v.to(dtype)


def gloo_gather_all(t, gloo):
    """Every rank's tensor, gathered through Gloo."""
    carrier = GLOO_CARRIER.get(t.dtype, t.dtype)
    if t.dtype == torch.complex64:
        src = torch.view_as_real(t).to(carrier).contiguous()
    else:
        src = t.to(carrier).contiguous()
    out = [torch.empty_like(src) for _ in range(dist.get_world_size(gloo))]
    dist.all_gather(out, src, group=gloo)
    if t.dtype == torch.complex64:
        return [torch.view_as_complex(o.float().contiguous()) for o in out]
    return [o.to(t.dtype) for o in out]


def local_reduce(parts, op):
    dtype = parts[0].dtype
    if dtype == torch.bool:
        s = torch.stack(parts)
        return (s.any(0) if op in (R.SUM, R.MAX) else s.all(0))
    wide = torch.float64 if dtype in FLOATS else torch.int64
    s = torch.stack([p.to(wide) for p in parts])
    if op == R.SUM:
        r = s.sum(0)
    elif op == R.PRODUCT:
        r = s.prod(0)
    elif op == R.MIN:
        r = s.min(0).values
    elif op == R.MAX:
        r = s.max(0).values
    elif op == R.AVG:
        r = s.sum(0) / len(parts)
    return r.to(dtype)


# ------------------------------------------------------------------ collectives

def run_collectives(pg, gloo, tag, async_op):
    """Every operation and dtype on group pg, checked against gloo (same ranks)."""
    rank, n = dist.get_rank(pg), dist.get_world_size(pg)
    pending = []  # (work, check) pairs: checks run after wait

    def issue(work, checker):
        if async_op:
            pending.append((work, checker))
        else:
            if work is not None:
                FAILURES.append(f"{tag}: a synchronous call returned a work object")
            checker()

    for dt in DTYPES:
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX] + ([R.AVG] if dt in FLOATS else [])
        for count in (1, 7, 1031):
            for op in ops:
                kind = "prod" if op == R.PRODUCT else "sum"
                x = make_input(rank, dt, count, zlib.crc32(f'{tag} {opname(op)} {count}'.encode()) % 1000, kind)
                want_parts = gloo_gather_all(x, gloo)
                want = local_reduce(want_parts, op)
                t = x.clone()
                w = dist.all_reduce(t, op=op, group=pg, async_op=async_op)
                name = f"{tag} all_reduce {dt} {opname(op)} n={count}"
                if op == R.AVG:
                    rtol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dt, 1e-6)
                    issue(w, lambda t=t, want=want, name=name, rtol=rtol: check_close(name, t, want, rtol))
                else:
                    issue(w, lambda t=t, want=want, name=name: check(name, t, want))
                if dt in GLOO_DTYPES and op != R.AVG:  # and straight against Gloo's own all_reduce
                    g = x.clone()
                    dist.all_reduce(g, op=op, group=gloo)
                    check(f"{name} (vs gloo all_reduce)", want, g)
        # PREMUL_SUM (floating point): each rank's input times the factor, summed.
        if dt in FLOATS:
            x = make_input(rank, dt, 33, 5)
            factor = 0.5
            want = local_reduce([p * factor for p in gloo_gather_all(x, gloo)], R.SUM)
            t = x.clone()
            w = dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor), group=pg, async_op=async_op)
            issue(w, lambda t=t, want=want, dt=dt: check(f"{tag} all_reduce {dt} PREMUL_SUM", t, want))
        # reduce to a root that is not 0 when possible
        root = (n - 1) if n > 1 else 0
        for op in (R.SUM, R.MAX):
            x = make_input(rank, dt, 17, 11)
            want = local_reduce(gloo_gather_all(x, gloo), op)
            t = x.clone()
            w = dist.reduce(t, dist.get_global_rank(pg, root) if pg is not None else root, op=op, group=pg,
                            async_op=async_op)
            if rank == root:
                issue(w, lambda t=t, want=want, op=op, dt=dt: check(f"{tag} reduce {dt} {opname(op)}", t, want))
            else:
                issue(w, lambda: None)
        # broadcast from the last rank
        x = make_input(rank, dt, 29, 13)
        want = gloo_gather_all(x, gloo)[root]
        t = x.clone()
        w = dist.broadcast(t, _global(pg, root), group=pg, async_op=async_op)
        issue(w, lambda t=t, want=want, dt=dt: check(f"{tag} broadcast {dt}", t, want))
        # all_gather (list) and all_gather_into_tensor
        x = make_input(rank, dt, 9, 17)
        parts = gloo_gather_all(x, gloo)
        outs = [torch.empty_like(x) for _ in range(n)]
        w = dist.all_gather(outs, x, group=pg, async_op=async_op)
        issue(w, lambda outs=outs, parts=parts, dt=dt: check(f"{tag} all_gather {dt}", outs, parts))
        chunks = list(torch.empty(n * 9, dtype=dt).chunk(n))  # back to back: gathered in place
        w = dist.all_gather(chunks, x, group=pg, async_op=async_op)
        issue(w, lambda chunks=chunks, parts=parts, dt=dt: check(f"{tag} all_gather into chunks {dt}", chunks, parts))
        if rank == root:
            gchunks = list(torch.empty(n * 9, dtype=dt).chunk(n))
            w = dist.gather(x, gchunks, dst=_global(pg, root), group=pg, async_op=async_op)
            issue(w, lambda g=gchunks, parts=parts, dt=dt: check(f"{tag} gather into chunks {dt}", g, parts))
        else:
            w = dist.gather(x, None, dst=_global(pg, root), group=pg, async_op=async_op)
            issue(w, lambda: None)
        flat = torch.empty(n * 9, dtype=dt)
        w = dist.all_gather_into_tensor(flat, x, group=pg, async_op=async_op)
        issue(w, lambda flat=flat, parts=parts, dt=dt: check(f"{tag} all_gather_into_tensor {dt}", flat,
                                                             torch.cat(parts)))
        # reduce_scatter (list) and reduce_scatter_tensor
        for op in (R.SUM, R.MIN):
            x = make_input(rank, dt, 5 * n, 19)
            full = local_reduce(gloo_gather_all(x, gloo), op)
            want = full[rank * 5:(rank + 1) * 5]
            out = torch.empty(5, dtype=dt)
            w = dist.reduce_scatter(out, list(x.chunk(n)), op=op, group=pg, async_op=async_op)
            issue(w, lambda out=out, want=want, op=op, dt=dt: check(f"{tag} reduce_scatter {dt} {opname(op)}", out, want))
            out2 = torch.empty(5, dtype=dt)
            w = dist.reduce_scatter_tensor(out2, x, op=op, group=pg, async_op=async_op)
            issue(w, lambda out2=out2, want=want, op=op, dt=dt: check(f"{tag} reduce_scatter_tensor {dt} {opname(op)}",
                                                                       out2, want))
        # gather and scatter, rooted at the last rank
        x = make_input(rank, dt, 6, 23)
        parts = gloo_gather_all(x, gloo)
        glist = [torch.empty_like(x) for _ in range(n)] if rank == root else None
        w = dist.gather(x, glist, dst=_global(pg, root), group=pg, async_op=async_op)
        if rank == root:
            issue(w, lambda glist=glist, parts=parts, dt=dt: check(f"{tag} gather {dt}", glist, parts))
        else:
            issue(w, lambda: None)
        src_parts = [make_input(root, dt, 6, 29 + i) for i in range(n)]
        out = torch.empty(6, dtype=dt)
        w = dist.scatter(out, src_parts if rank == root else None, src=_global(pg, root), group=pg,
                         async_op=async_op)
        issue(w, lambda out=out, want=src_parts[rank], dt=dt: check(f"{tag} scatter {dt}", out, want))
        # all_to_all_single: even, then uneven splits (rank r sends r+p+1 rows to p)
        x = make_input(rank, dt, 3 * n, 31)
        out = torch.empty(3 * n, dtype=dt)
        w = dist.all_to_all_single(out, x, group=pg, async_op=async_op)
        want = torch.cat([p[rank * 3:(rank + 1) * 3] for p in gloo_gather_all(x, gloo)])
        issue(w, lambda out=out, want=want, dt=dt: check(f"{tag} all_to_all_single {dt}", out, want))
        in_splits = [rank + p + 1 for p in range(n)]
        out_splits = [p + rank + 1 for p in range(n)]
        x = make_input(rank, dt, sum(in_splits) * 2, 37).reshape(-1, 2)
        # sizes differ by rank: each rank makes every rank's input itself
        parts = [make_input(p, dt, sum(p + q + 1 for q in range(n)) * 2, 37).reshape(-1, 2) for p in range(n)]
        want = torch.cat([parts[p][sum(p + q + 1 for q in range(rank)):][:p + rank + 1] for p in range(n)])
        out = torch.empty(sum(out_splits), 2, dtype=dt)
        w = dist.all_to_all_single(out, x, out_splits, in_splits, group=pg, async_op=async_op)
        issue(w, lambda out=out, want=want, dt=dt: check(f"{tag} all_to_all_single uneven {dt}", out, want))
        # all_to_all (lists, uneven sizes: rank r sends p+1 elements to p)
        ins = [make_input(rank, dt, p + 1, 41 + p) for p in range(n)]
        outs = [torch.empty(rank + 1, dtype=dt) for _ in range(n)]
        w = dist.all_to_all(outs, ins, group=pg, async_op=async_op)
        want = [make_input(p, dt, rank + 1, 41 + rank) for p in range(n)]
        issue(w, lambda outs=outs, want=want, dt=dt: check(f"{tag} all_to_all {dt}", outs, want))

    # point to point: a ring with batch_isend_irecv, then ordered send/recv
    if n > 1:
        for dt in (torch.float32, torch.int64, torch.bfloat16):
            x = make_input(rank, dt, 1000, 43)
            got = torch.empty_like(x)
            right, left = _global(pg, (rank + 1) % n), _global(pg, (rank - 1) % n)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, right, pg), dist.P2POp(dist.irecv, got, left, pg)])
            for r in reqs:
                r.wait()
            check(f"{tag} batch_isend_irecv {dt}", got, make_input((rank - 1) % n, dt, 1000, 43))
        x = make_input(rank, torch.float64, 77, 47)
        if rank == 0:
            for p in range(1, n):
                got = torch.empty(77, dtype=torch.float64)
                if async_op:
                    dist.irecv(got, _global(pg, p), group=pg).wait()
                else:
                    dist.recv(got, _global(pg, p), group=pg)
                check(f"{tag} recv from {p}", got, make_input(p, torch.float64, 77, 47))
        else:
            if async_op:
                dist.isend(x, _global(pg, 0), group=pg).wait()
            else:
                dist.send(x, _global(pg, 0), group=pg)

    w = dist.barrier(group=pg, async_op=async_op)
    if async_op:
        pending.append((w, lambda: None))
        for i, (w, checker) in enumerate(pending):
            if w is None:
                FAILURES.append(f"{tag}: async_op=True returned no work object")
                continue
            w.wait()
            if not w.is_completed():
                FAILURES.append(f"{tag}: work {i} not completed after wait")
            checker()


def _global(pg, group_rank):
    return group_rank if pg is None else dist.get_global_rank(pg, group_rank)


def scenario_collectives():
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    assert dist.get_backend() == "meshccl"
    gloo = dist.new_group(backend="gloo")
    run_collectives(None, gloo, "world sync", False)
    run_collectives(None, gloo, "world async", True)

    # Subgroups (split off the world communicator): the first WORLD-1 ranks
    # (or both of two), and the odd ranks.
    firsts = list(range(max(2, WORLD - 1)))
    odds = list(range(1, WORLD, 2))
    for ranks in (firsts, odds):
        sub = dist.new_group(ranks)
        sub_gloo = dist.new_group(ranks, backend="gloo")
        if RANK in ranks:
            assert dist.get_world_size(sub) == len(ranks)
            run_collectives(sub, sub_gloo, f"group {ranks}", ranks == odds)
        elif sub != dist.GroupMember.NON_GROUP_MEMBER:
            FAILURES.append(f"rank {RANK} outside {ranks} got a group")
    # Every rank in one of two groups (halves, or the evens and the odds).
    halves = [list(range(0, WORLD, 2)), list(range(1, WORLD, 2))]
    mine = None
    for ranks in halves:
        g = dist.new_group(ranks)
        if RANK in ranks:
            mine = (g, ranks)
    t = torch.tensor([RANK], dtype=torch.int64)
    dist.all_reduce(t, group=mine[0])
    check("disjoint groups all_reduce", t, torch.tensor([sum(mine[1])]))

    # What the backend refuses, as torch's own backends do.
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    expect_error("non-contiguous all_reduce", lambda: dist.all_reduce(x.t()), "contiguous")
    expect_error("non-contiguous all_gather_into_tensor",
                 lambda: dist.all_gather_into_tensor(torch.empty(WORLD * 12), x.t()), "contiguous")
    expect_error("int16 all_reduce", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), "cannot reduce")
    expect_error("BOR all_reduce", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=R.BOR),
                 "not supported")
    expect_error("sparse all_reduce other than SUM", lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=R.MAX),
                 "sums")
    expect_error("all_gather_into_tensor of the wrong size",
                 lambda: dist.all_gather_into_tensor(torch.empty(WORLD * 12 + 1), x), "elements")
    # Byte-moving operations take any dtype (int16, complex64), as Gloo does.
    c = (torch.arange(4, dtype=torch.float32) + RANK).to(torch.complex64) * (1 + 1j)
    t = c.clone()
    dist.broadcast(t, 0)
    check("broadcast complex64", t, gloo_gather_all(c, gloo)[0])
    s = torch.arange(5, dtype=torch.int16) * (RANK + 1)
    outs = [torch.empty_like(s) for _ in range(WORLD)]
    dist.all_gather(outs, s)
    check("all_gather int16", outs, gloo_gather_all(s, gloo))
    # Complex sums: torch views them as real pairs.
    t = c.clone()
    dist.all_reduce(t)
    check("all_reduce complex64", t, sum(gloo_gather_all(c, gloo)))
    # PREMUL_SUM with the factor as a tensor
    x = make_input(RANK, torch.float32, 21, 3)
    t = x.clone()
    dist.all_reduce(t, op=dist._make_nccl_premul_sum([torch.tensor([0.25])]))
    check("all_reduce PREMUL_SUM (tensor factor)", t, local_reduce([p * 0.25 for p in gloo_gather_all(x, gloo)], R.SUM))
    expect_error("PREMUL_SUM on int32",
                 lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)),
                 "floating-point")
    # An empty tensor
    e = torch.empty(0)
    dist.all_reduce(e)
    check("all_reduce of 0 elements", e, torch.empty(0))
    # Channels-last tensors reduce elementwise (dense, the same layout on every rank)
    cl = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last)
    t = cl.clone(memory_format=torch.channels_last)
    dist.all_reduce(t)
    check("all_reduce channels_last", t, cl * WORLD)
    # Every work's future completes with its tensors.
    t = torch.ones(8)
    fut = dist.all_reduce(t, async_op=True).get_future()
    check("future value", fut.wait()[0], torch.full((8,), float(WORLD)))
    dist.destroy_process_group()


# ------------------------------------------------------------------------ DDP

def scenario_ddp():
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    gloo = dist.new_group(backend="gloo")
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(1234)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                   torch.nn.ReLU(), torch.nn.Linear(64, 4))

    models = {}
    for name, pg in (("meshccl", None), ("gloo", gloo)):
        torch.manual_seed(99 + RANK)  # DDP must broadcast rank 0's parameters
        m = model()
        if RANK != 0:
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(torch.randn_like(p))
        models[name] = DDP(m, process_group=pg, bucket_cap_mb=0.01)  # several buckets
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
    g = torch.Generator().manual_seed(7 + RANK)
    for step in range(8):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 4, generator=g)
        for k, m in models.items():
            opts[k].zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opts[k].step()
    for (n1, p1), (_, p2) in zip(models["meshccl"].module.named_parameters(),
                                 models["gloo"].module.named_parameters()):
        if WORLD == 2:
            check(f"DDP parameter {n1} equals Gloo's", p1.detach(), p2.detach())
        else:  # sums of more than two gradients may round in another order
            check_close(f"DDP parameter {n1} vs Gloo's", p1.detach(), p2.detach(), 1e-5)
    # and every rank holds the same parameters
    for name, p in models["meshccl"].module.named_parameters():
        check(f"DDP parameter {name} same on every rank", p.detach(), gloo_gather_all(p.detach(), gloo)[0])
    # Kept alive until os._exit: in torch 1.13, destroying a DDP model whose
    # Gloo group has already left torch.distributed deadlocks (the group's
    # destructor joins a worker thread that waits for the GIL).
    KEEP.append(models)


# -------------------------------------------- point to point, coalesced, sparse

def scenario_p2p():
    """Crossing isend/irecv (NCCL's eager sizes), a ring, sends to this rank itself with tags, tags between ranks,
    receives from any source."""
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for nbytes in (8, 64 << 10, 128 << 10, 1 << 20, 4 << 20):
        n = nbytes // 4
        out = torch.arange(n, dtype=torch.int32) + RANK * 1000
        got = torch.full((n,), -1, dtype=torch.int32)
        reqs = [dist.isend(out, nxt), dist.irecv(got, prv)]
        for q in reqs:
            q.wait()
        check(f"crossing isend/irecv of {nbytes} bytes", got, torch.arange(n, dtype=torch.int32) + prv * 1000)
    # To this rank itself, above the eager size, blocking calls in a row.
    big = torch.arange(6 << 20, dtype=torch.int32)
    back = torch.empty_like(big)
    dist.send(big, RANK)
    dist.recv(back, RANK)
    check("send to self then recv from self (24 MiB)", back, big)
    # Tags to this rank itself: matched by tag, not by order.
    a, b = torch.zeros(4), torch.zeros(4)
    wa, wb = dist.irecv(a, RANK, tag=7), dist.irecv(b, RANK, tag=3)
    dist.send(torch.full((4,), 3.0), RANK, tag=3)
    dist.send(torch.full((4,), 7.0), RANK, tag=7)
    wa.wait()
    wb.wait()
    check("self receive tag 7", a, torch.full((4,), 7.0))
    check("self receive tag 3", b, torch.full((4,), 3.0))
    # Tags between ranks, as Gloo: the receiver posts tag 5 before tag 9,
    # the sender sent 9 first; tag 0 keeps its own order beside them.
    sends = [(9, torch.full((3,), 9.0 + RANK)), (0, torch.full((2,), 0.5 + RANK)), (5, torch.full((6,), 5.0 + RANK))]
    outs = [dist.isend(t, nxt, tag=tg) for tg, t in sends]
    got5, got0, got9 = torch.zeros(6), torch.zeros(2), torch.zeros(3)
    ins = [dist.irecv(got5, prv, tag=5), dist.irecv(got0, prv, tag=0), dist.irecv(got9, prv, tag=9)]
    for q in outs + ins:
        q.wait()
    check("tagged receive 5", got5, torch.full((6,), 5.0 + prv))
    check("tagged receive 9", got9, torch.full((3,), 9.0 + prv))
    check("untagged receive", got0, torch.full((2,), 0.5 + prv))
    # From any source (recvAnysource): rank 0 takes one message of tag 4 and
    # one of tag 0 from every other rank, tag 4 first though sent second.
    if RANK == 0:
        tagged = []
        for _ in range(WORLD - 1):
            t = torch.zeros(5)
            w = dist.irecv(t, tag=4)
            w.wait()
            tagged.append(w._source_rank())
            check("any source, tag 4", t, torch.full((5,), 40.0 + tagged[-1]))
        untagged = []
        for _ in range(WORLD - 1):
            t = torch.zeros(5)
            untagged.append(dist.recv(t))
            check("any source, tag 0", t, torch.full((5,), float(untagged[-1])))
        assert sorted(tagged) == sorted(untagged) == list(range(1, WORLD)), (tagged, untagged)
    else:
        dist.send(torch.full((5,), float(RANK)), 0)
        dist.send(torch.full((5,), 40.0 + RANK), 0, tag=4)
    dist.barrier()


def scenario_coalesced_sparse():
    """all_gather_coalesced and sparse COO all_reduce, against Gloo's results."""
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    gloo = dist.new_group(backend="gloo")
    for dtype in (torch.float32, torch.int64, torch.complex64):
        ins = [torch.full((3,), RANK + 1, dtype=dtype), torch.full((2, 2), 2 * RANK, dtype=dtype),
               torch.empty(0, dtype=dtype)]
        want = [[torch.empty_like(t) for t in ins] for _ in range(WORLD)]
        got = [[torch.empty_like(t) for t in ins] for _ in range(WORLD)]
        dist.all_gather_coalesced(want, ins, group=gloo)
        dist.all_gather_coalesced(got, ins)
        for r in range(WORLD):
            for k in range(len(ins)):
                check(f"all_gather_coalesced {dtype} rank {r} tensor {k}", got[r][k], want[r][k])
    for shape, dense in (((6,), ()), ((5, 3), (2,))):
        idx = torch.tensor([[RANK % shape[0], (RANK + 2) % shape[0], 1]])
        if len(shape) == 2:
            idx = torch.cat([idx, torch.tensor([[RANK % 3, 0, 2]])])
        vals = torch.arange(3 * (dense[0] if dense else 1), dtype=torch.float32).reshape((3,) + dense) + RANK
        full = shape + dense if len(shape) == 1 else shape
        x = torch.sparse_coo_tensor(idx, vals if len(shape) == 1 else vals[:, 0], full)
        y = x.clone()
        dist.all_reduce(x)
        dist.all_reduce(y, group=gloo)
        check(f"sparse all_reduce {tuple(full)}", x.to_dense(), y.to_dense())


def scenario_exit_pending():
    """Exits (normally, or by an uncaught exception) with async work pending."""
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    t = torch.ones(1 << 22)
    works = [dist.all_reduce(t, async_op=True) for _ in range(4)]  # noqa: F841
    if os.environ.get("RAISE") == "1":
        raise RuntimeError("uncaught on purpose")
    sys.exit(0)  # through interpreter teardown, unlike the other scenarios


def scenario_lib_timeout():
    """MESHCCL_TIMEOUT ends a receive whose peer lives: the error names a timeout."""
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    flag = INIT[len("file://"):] + ".done"
    if RANK == 1:
        for _ in range(300):  # bounded: at most 30 s
            if os.path.exists(flag):
                break
            time.sleep(0.1)
        os._exit(0)
    msg = expect_error("recv from a live peer that never sends", lambda: dist.recv(torch.zeros(4), 1))
    print("error:", msg.splitlines()[0] if msg else "")
    for part in ("meshccl: operation timed out: rank 0: Recv made no progress for 2 s", "waiting for rank 1"):
        if part not in (msg or ""):
            FAILURES.append(f"the error does not say {part!r}: {msg!r}")
    if "exited" in (msg or ""):
        FAILURES.append(f"a timeout is reported as a lost peer: {msg!r}")
    open(flag, "w").close()
    os._exit(1 if FAILURES else 0)


# ------------------------------------------------------------- failure cases

def scenario_dead_peer():
    """Rank 1 dies; rank 0's next collective raises within the group's timeout."""
    timeout = 20.0
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=timeout))
    t = torch.ones(1024)
    dist.all_reduce(t)
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    for mode in ("sync", "async"):
        start = time.monotonic()
        msg = expect_error(f"all_reduce ({mode}) with a dead peer",
                           lambda: (dist.all_reduce(t) if mode == "sync" else dist.all_reduce(t, async_op=True).wait()))
        took = time.monotonic() - start
        print(f"{mode}: raised after {took:.2f} s: {msg.splitlines()[0] if msg else ''}")
        if took > timeout:
            FAILURES.append(f"{mode}: the error came after {took:.1f} s, beyond the group timeout {timeout} s")
    os._exit(1 if FAILURES else 0)  # skip teardown: the peer is gone


def scenario_timeout():
    """Rank 1 stays alive but never joins; rank 0's collective raises at the group timeout."""
    timeout = 3.0
    flag = INIT[len("file://"):] + ".done"
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=timeout))
    dist.barrier()
    if RANK == 1:
        for _ in range(600):  # bounded: at most 60 s
            if os.path.exists(flag):
                break
            time.sleep(0.1)
        os._exit(0)
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(4), async_op=True)
    msg = expect_error("all_reduce with a silent peer", work.wait)
    took = time.monotonic() - start
    print(f"raised after {took:.2f} s: {msg.splitlines()[0] if msg else ''}")
    if took > 30:
        FAILURES.append(f"the error came after {took:.1f} s (group timeout {timeout} s)")
    expect_error("the next call on the failed group", lambda: dist.all_reduce(torch.ones(4)))
    open(flag, "w").close()
    os._exit(1 if FAILURES else 0)


def scenario_sigterm():
    """Rank 0 waits for SIGTERM (test_backend.test_sigterm_ends_rank): idle, inside a
    collective rank 1 never joins, or inside exit(). Rank 1 waits for the test's flag."""
    when = os.environ["MESHCCL_TEST_SIGTERM_AT"]
    flag = INIT[len("file://"):] + ".done"
    dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    dist.all_reduce(torch.ones(4))
    if RANK == 1:
        for _ in range(600):  # bounded: at most 60 s
            if os.path.exists(flag):
                break
            time.sleep(0.1)
        os._exit(0)
    print("READY", flush=True)
    if when == "collective":
        dist.all_reduce(torch.ones(4))
    elif when == "exiting":
        # A C exit handler that waits for a signal: the process is then inside
        # exit(), past the interpreter's teardown, with libtorch loaded.
        libc = ctypes.CDLL(None)
        libc.__cxa_atexit(libc.pause, None, None)
        sys.exit(0)
    time.sleep(60)
    os._exit(3)


def scenario_init():
    """init_process_group("meshccl") with INIT (env://, tcp:// or file://)."""
    if INIT == "env://":
        dist.init_process_group("meshccl")
    else:
        dist.init_process_group("meshccl", init_method=INIT, rank=RANK, world_size=WORLD)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != WORLD:
        FAILURES.append(f"{INIT}: world size {world}, expected {WORLD}")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    check(f"{INIT} all_reduce", t, torch.full((3,), float(world * (world + 1) // 2)))
    ranks = torch.zeros(world, dtype=torch.int64)
    dist.all_gather_into_tensor(ranks, torch.tensor([rank]))
    check(f"{INIT} every rank once", ranks, torch.arange(world))
    dist.destroy_process_group()


if __name__ == "__main__":
    globals()["scenario_" + SCENARIO]()
    for f in FAILURES[:50]:
        print("FAIL rank", RANK, f)
    if FAILURES:
        print(f"rank {RANK}: {len(FAILURES)} failures")
    sys.stdout.flush()
    # Without interpreter teardown, for the same reason as KEEP.
    os._exit(1 if FAILURES else 0)
