"""meshccl as a torch.distributed backend.

    import meshccl_torch
    torch.distributed.init_process_group("meshccl", ...)

Importing this module registers the backend "meshccl" (CPU tensors). Groups made
with torch.distributed.new_group from a meshccl world are split off the world's
communicator with ncclCommSplit: this module wraps new_group for that, and the
wrapper passes every other call through unchanged.

Under meshrun, mpirun, mpiexec or srun (not torchrun, which sets them itself),
importing it also sets RANK, WORLD_SIZE and LOCAL_RANK from the launcher's
variables where they are unset, so that init_method="env://" (the default)
needs only MASTER_ADDR and MASTER_PORT.
"""

import atexit
import os
import sys

try:
    import torch
except ImportError as _e:  # pragma: no cover - depends on the interpreter
    raise ImportError(
        "meshccl_torch needs PyTorch, and %s cannot import torch (%s). On Debian, python3-torch belongs to "
        "/usr/bin/python3: run that interpreter, or a virtual environment made with "
        "'/usr/bin/python3 -m venv --system-site-packages'." % (sys.executable, _e)) from _e
import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d

from . import _C

__all__ = ["BACKEND", "NCCL_VERSION_CODE", "MESHCCL_VERSION_CODE", "launch_info", "__version__"]

BACKEND = "meshccl"
NCCL_VERSION_CODE = _C.NCCL_VERSION_CODE
MESHCCL_VERSION_CODE = _C.MESHCCL_VERSION_CODE
__version__ = "%d.%d.%d" % (MESHCCL_VERSION_CODE // 10000, MESHCCL_VERSION_CODE // 100 % 100, MESHCCL_VERSION_CODE % 100)


def launch_info():
    """(rank, world_size, local_rank) as the launcher set them, or None."""
    return _C.launch_info()


def _fill_launch_env():
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    info = _C.launch_info()
    if info is None:
        return
    rank, size, local = info
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(size))
    os.environ.setdefault("LOCAL_RANK", str(local))


def _create_process_group(store, rank, size, timeout):
    return _C.create_process_group(store, rank, size, timeout)


def _is_meshccl(name):
    return name is not None and str(name).lower() == BACKEND


def _wrap_new_group(original):
    def new_group(ranks=None, timeout=_c10d.default_pg_timeout, backend=None, pg_options=None):
        split = False
        if dist.is_initialized():
            world = _c10d._get_default_group()
            if _is_meshccl(dist.get_backend(world)) and (backend is None or _is_meshccl(backend)):
                me = dist.get_rank()
                members = range(dist.get_world_size()) if ranks is None else ranks
                # Collective over the world group: every rank calls new_group.
                split = _C.split_for_next_group(world, me in members, me, timeout)
        try:
            return original(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options)
        finally:
            if split:
                _C.clear_pending_split()

    new_group.__doc__ = original.__doc__
    new_group.__wrapped__ = original
    return new_group


_fill_launch_env()
# Work still queued at exit (or after an uncaught exception) is settled before
# the interpreter frees the tensors it reads and writes.
atexit.register(_C.shutdown_all)

if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create_process_group)
    _c10d.new_group = _wrap_new_group(_c10d.new_group)
    dist.new_group = _c10d.new_group
