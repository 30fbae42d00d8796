"""PyTorch's own distributed suite (tests/torch/pytorch_suite.py) against meshccl, 2 ranks.

CI runs the subset below (each test spawns its processes, about 5 s a test on
2 cores); the full list and the tests left out are in docs/pytorch.md.
"""

import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "pytorch_suite.py")
CI_TESTS = [
    "all_gather_coalesced", "sparse_all_reduce_sum", "test_isend", "test_send_recv_with_tag",
    "test_send_recv_any_source", "test_send_recv_nccl", "test_all_reduce_sum", "test_broadcast", "test_barrier",
    "test_all_gather", "test_reduce_sum",
]
SUITE_TIMEOUT = 600  # seconds for the whole subset; the suite bounds each test itself


def test_pytorch_distributed_suite(tmp_path):
    env = dict(os.environ, WORLD_SIZE="2", TEMP_DIR=str(tmp_path))
    path = env.pop("MESHCCL_TORCH_PATH", None)  # the harness's, not a library setting
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, SUITE, "-v"]
    for name in CI_TESTS:
        args += ["-k", name]
    # A session of its own, so that every process the suite spawns goes on timeout.
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=SUITE_TIMEOUT)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of the suite's spawned ranks
        except ProcessLookupError:
            pass
        p.wait()
    assert p.returncode == 0, out[-20000:]
    assert "\nOK" in out, out[-20000:]
