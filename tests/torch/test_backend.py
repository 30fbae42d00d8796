"""The meshccl torch.distributed backend, 2-4 processes per case, against Gloo.

Run by `meson test --suite torch` (which sets MESHCCL_TORCH_PATH to the build's
module folder), or by hand:
    PYTHONPATH=build/torch /usr/bin/python3 -m pytest tests/torch
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
JOB_TIMEOUT = 240  # seconds for one job of 2-4 processes on 2 loaded cores


def _env(extra=None):
    env = dict(os.environ)
    path = env.pop("MESHCCL_TORCH_PATH", None)  # the harness's, not a library setting
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MESHCCL_SOCKET_IFNAME", "lo")
    env.update(extra or {})
    return env


def run_job(scenario, world, init, extra_env=None, per_rank_env=None):
    """Starts `world` ranks of worker.py; returns their (returncode, output)."""
    procs = []
    try:
        for rank in range(world):
            env = _env(extra_env)
            if per_rank_env:
                env.update(per_rank_env(rank))
            procs.append(subprocess.Popen([sys.executable, WORKER, scenario, str(rank), str(world), init],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=JOB_TIMEOUT)
            results.append((p.returncode, out))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def assert_ok(results, ranks=None):
    report = "\n".join(f"--- rank {r} (exit {rc})\n{out}" for r, (rc, out) in enumerate(results))
    for r, (rc, _) in enumerate(results):
        if ranks is None or r in ranks:
            assert rc == 0, report


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_module_imports():
    out = subprocess.run([sys.executable, "-c",
                          "import torch.distributed as d, meshccl_torch; print(d.Backend('meshccl'))"],
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "meshccl"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives(world, tmp_path):
    """Every operation and dtype, sync and async, in the world and in split subgroups."""
    assert_ok(run_job("collectives", world, f"file://{tmp_path}/store"))


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_matches_gloo(world, tmp_path):
    assert_ok(run_job("ddp", world, f"file://{tmp_path}/store"))


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(method, tmp_path):
    port = free_port()
    if method == "env":  # what torchrun sets
        results = run_job("init", 2, "env://", extra_env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                                           "WORLD_SIZE": "2"},
                          per_rank_env=lambda r: {"RANK": str(r)})
    elif method == "tcp":
        results = run_job("init", 2, f"tcp://127.0.0.1:{port}")
    else:
        results = run_job("init", 2, f"file://{tmp_path}/store")
    assert_ok(results)


@pytest.mark.skipif(not os.environ.get("MESHRUN"), reason="MESHRUN (the meshrun launcher) not given")
def test_meshrun_env_init():
    """Under meshrun, importing meshccl_torch fills RANK and WORLD_SIZE for env://."""
    port = free_port()
    out = subprocess.run([os.environ["MESHRUN"], "--tag-output", "-n", "3", "--timeout", "120", "-x", "MASTER_ADDR=127.0.0.1",
                          "-x", f"MASTER_PORT={port}", sys.executable, WORKER, "init", "-1", "3", "env://"],
                         env=_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_mpirun_env_init():
    """Under Open MPI's mpirun, importing meshccl_torch fills RANK and WORLD_SIZE."""
    port = free_port()
    env = _env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    out = subprocess.run(["mpirun", "-n", "2", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONPATH",
                          "-x", "MESHCCL_SOCKET_IFNAME", sys.executable, WORKER, "init", "-1", "2", "env://"],
                         env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dead_peer_raises(tmp_path):
    """A killed peer becomes a RuntimeError on the survivor, within the group timeout."""
    results = run_job("dead_peer", 2, f"file://{tmp_path}/store")
    assert results[1][0] == -9, results[1][1]  # killed itself
    assert_ok(results, ranks=[0])
    assert "raised after" in results[0][1]


def test_group_timeout_raises(tmp_path):
    """A peer that never joins: wait() raises once the group's timeout has passed."""
    results = run_job("timeout", 2, f"file://{tmp_path}/store")
    assert_ok(results)
    assert "timeout" in results[0][1]


@pytest.mark.parametrize("transport", ["shm", "socket", "ucx", "ofi"])
@pytest.mark.parametrize("when", ["idle", "collective", "exiting"])
def test_sigterm_ends_rank(when, transport, tmp_path):
    """A rank sent SIGTERM, as torchrun and Slurm do, dies of it at once: idle, inside a
    collective, or inside exit() with libtorch loaded (no handler of a dependency intervenes)."""
    plugins = os.environ.get("MESHCCL_PLUGIN_PATH", "")
    if transport in ("ucx", "ofi") and not os.path.exists(f"{plugins}/libmeshccl-transport-{transport}.so"):
        pytest.skip(f"the {transport} plugin was not built")
    init = f"file://{tmp_path}/store"
    procs, logs = [], []
    try:
        for rank in range(2):
            env = _env({"MESHCCL_TEST_SIGTERM_AT": when, "UCX_NET_DEVICES": "lo", "FI_TCP_IFACE": "lo"})
            if transport == "socket":
                env["MESHCCL_TRANSPORT"] = "socket"
            elif transport != "shm":
                env.update({"NCCL_NET": transport, "MESHCCL_HOSTID": f"host{rank}"})
            logs.append(open(tmp_path / f"rank{rank}.log", "w+"))
            procs.append(subprocess.Popen([sys.executable, WORKER, "sigterm", str(rank), "2", init],
                                          env=env, stdout=logs[-1], stderr=subprocess.STDOUT))
        deadline = time.monotonic() + JOB_TIMEOUT
        while "READY" not in (tmp_path / "rank0.log").read_text() and time.monotonic() < deadline:
            assert procs[0].poll() is None, (tmp_path / "rank0.log").read_text()
            time.sleep(0.05)
        time.sleep(1.0)  # inside the collective, or through the interpreter's teardown into exit()
        start = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        try:
            rc = procs[0].wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - start
        (tmp_path / "store.done").touch()
        procs[1].wait(timeout=JOB_TIMEOUT)
        assert rc == -signal.SIGTERM, f"rank 0: exit {rc} after {took:.1f} s\n" + (tmp_path / "rank0.log").read_text()
        assert took < 5, f"rank 0 took {took:.1f} s to die of SIGTERM"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


@pytest.mark.parametrize("world", [2, 3])
def test_p2p_eager_and_self(world, tmp_path):
    """Crossing isend/irecv up to 4 MiB, sends to this rank itself (tags honoured), receives from any source."""
    assert_ok(run_job("p2p", world, f"file://{tmp_path}/store"))


def test_all_gather_coalesced_and_sparse_all_reduce(tmp_path):
    assert_ok(run_job("coalesced_sparse", 2, f"file://{tmp_path}/store"))


@pytest.mark.parametrize("uncaught", [False, True])
def test_exit_with_async_work_pending(uncaught, tmp_path):
    """No crash at interpreter exit with work in flight (it crashed in 4 of 6 runs)."""
    for run in range(3):
        results = run_job("exit_pending", 2, f"file://{tmp_path}/store{run}",
                          extra_env={"RAISE": "1" if uncaught else "0"})
        for rank, (rc, out) in enumerate(results):
            assert rc == (1 if uncaught else 0), f"run {run} rank {rank} exit {rc}\n{out}"
            assert "signal" not in out, out


def test_library_timeout_is_named(tmp_path):
    """A wait that ran out of MESHCCL_TIMEOUT raises a timeout, not a lost peer."""
    results = run_job("lib_timeout", 2, f"file://{tmp_path}/store", extra_env={"MESHCCL_TIMEOUT": "2"})
    assert_ok(results)
    assert "timed out" in results[0][1]
