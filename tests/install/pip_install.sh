#!/usr/bin/env bash
# pip install . into a virtual environment that sees Debian's python3-torch
# (--system-site-packages), as docs/pytorch.md says, packaging the given build
# (MESHCCL_BUILD_DIR, so nothing is compiled again). Then, from the installed
# package only: __version__ and pip show agree with meson.build, the library
# and transport plugins inside the package are the ones loaded, a 2-rank
# all_reduce over ucx (forced between two emulated hosts) gives the sum; and an
# interpreter without torch gets an ImportError that says what to do.
# Usage: pip_install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(realpath "$1")
build=$(realpath "$2")
work=$(mktemp -d /tmp/meshccl-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
unset LD_LIBRARY_PATH PYTHONPATH
export MESHCCL_SOCKET_IFNAME=${MESHCCL_SOCKET_IFNAME:-lo} PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
fail() { echo "FAIL: $*"; exit 1; }

/usr/bin/python3 -m venv --system-site-packages "$work/env"
# A copy of the source, as pip would see a fresh clone (no build/ inside).
mkdir -p "$work/src"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src")
(cd "$work/src" && MESHCCL_BUILD_DIR="$build" "$work/env/bin/pip" install --no-build-isolation --no-deps -q .) \
  || fail "pip install . failed"
want=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" "$src/meson.build" | head -n 1)
shown=$("$work/env/bin/pip" show meshccl-torch | sed -n 's/^Version: //p')
[ "$shown" = "$want" ] || fail "pip show says version '$shown', meson.build '$want'"
echo "pip show meshccl-torch: $shown"

cd "$work"
"$work/env/bin/python" - "$work" "$want" <<'PY' || fail "the installed package did not run"
import os, subprocess, sys
work, want = sys.argv[1], sys.argv[2]
import meshccl_torch
assert meshccl_torch.__version__ == want, (meshccl_torch.__version__, want)
pkg = os.path.dirname(meshccl_torch.__file__)
assert pkg.startswith(os.path.join(work, "env")), pkg
maps = open("/proc/self/maps").read()
assert os.path.join(pkg, "lib", "libmeshccl.so.0") in maps, "libmeshccl was not loaded from the package"
rank_code = r'''
import os, sys, torch, torch.distributed as dist
import meshccl_torch
rank = int(sys.argv[1])
os.environ["MESHCCL_HOSTID"] = "pip-host-%d" % rank
dist.init_process_group("meshccl", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.all(t == 3.0), t[:4]
maps = open("/proc/self/maps").read()
plugin = os.path.join(os.path.dirname(meshccl_torch.__file__), "lib", "meshccl", "libmeshccl-transport-ucx.so")
assert plugin in maps, "the ucx plugin was not loaded from the package"
print("rank", rank, "ok")
'''
env = dict(os.environ, MESHCCL_NET="ucx", MESHCCL_TIMEOUT="60")
store = os.path.join(work, "store")
procs = [subprocess.Popen([sys.executable, "-c", rank_code, str(r), store], env=env) for r in range(2)]
codes = [p.wait(timeout=120) for p in procs]
assert codes == [0, 0], codes
print("meshccl_torch", meshccl_torch.__version__, "from", pkg, ": all_reduce over ucx ok")
PY

# An interpreter without torch: the import says which interpreter to use.
/usr/bin/python3 -m venv "$work/bare"
site=$("$work/bare/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$(dirname "$("$work/env/bin/python" -c 'import meshccl_torch; print(meshccl_torch.__file__)')")" "$site/"
msg=$("$work/bare/bin/python" -c 'import meshccl_torch' 2>&1) && fail "meshccl_torch imported without torch"
case "$msg" in
  *"cannot import torch"*"/usr/bin/python3"*) echo "without torch: clear ImportError" ;;
  *) fail "without torch the import said: $msg" ;;
esac
echo "pip install check passed"
