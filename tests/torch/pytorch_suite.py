"""PyTorch's own distributed test suite, run against the meshccl backend.

    PYTHONPATH=build/torch /usr/bin/python3 tests/torch/pytorch_suite.py [unittest args, e.g. -k all_gather]

It imports `torch/testing/_internal/distributed/distributed_test.py` from the
installed torch (class DistributedTest, as torch's test_distributed_spawn.py
does; nothing is copied) and runs its tests in spawned processes, WORLD_SIZE
ranks (default 2), each test in processes of its own.

One gate is opened, at run time: the suite decides which tests apply, and how,
from BACKEND when it is imported (decorators such as
`sandcastle_skip_if(BACKEND != "gloo", ...)` and the tables of
DistTestCases). It is imported with BACKEND=gloo, so it selects and shapes the
tests it runs on Gloo: meshccl is a CPU backend like Gloo, and the goal is
that every test that passes on Gloo passes on meshccl. Then BACKEND is set to
"meshccl" (the module's global and the environment), so every process group
the tests create is a meshccl group. Nothing else of the suite is changed.

CI is unset for the suite: with it set, torch's runner writes XML reports
through `xmlrunner`, a pip package Debian does not ship. torch's test helpers
import `expecttest` (another pip package Debian does not ship);
where it is missing, a stand-in whose TestCase is unittest's is installed
first: the distributed tests use none of its expect-file checks.
"""

import os
import sys
import tempfile
import types
import unittest

os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("MESHCCL_SOCKET_IFNAME", "lo")
_OWN_TEMP = "TEMP_DIR" not in os.environ
if _OWN_TEMP:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="meshccl-torch-suite-")
os.environ["BACKEND"] = "gloo"  # the import-time gates: as for Gloo (see above)
# With CI set, torch's runner writes XML reports through xmlrunner, a pip
# package Debian does not ship: the suite runs as it does outside CI.
os.environ.pop("CI", None)

try:
    import expecttest  # noqa: F401
except ImportError:
    _stand_in = types.ModuleType("expecttest")
    _stand_in.TestCase = unittest.TestCase
    _stand_in.ACCEPT = False
    sys.modules["expecttest"] = _stand_in

import torch  # noqa: E402
import meshccl_torch  # noqa: E402,F401  (registers "meshccl")
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402

# SUITE_BACKEND=gloo runs the same selection on Gloo, the reference the
# results are judged against (docs/pytorch.md).
_UNDER_TEST = os.environ.get("SUITE_BACKEND", "meshccl")
dt.BACKEND = _UNDER_TEST
os.environ["BACKEND"] = _UNDER_TEST


class TestMeshcclWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    try:
        run_tests()
    finally:
        if _OWN_TEMP:
            import shutil
            shutil.rmtree(os.environ["TEMP_DIR"], ignore_errors=True)
