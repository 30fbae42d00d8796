#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs two small
# programs against it, as another project would: with pkg-config, with CMake
# (find_package(meshccl)) and with meson (dependency('meshccl'/'nccl')). Also
# imports the installed meshccl_torch with /usr/bin/python3 when it was built.
# Usage: check_install.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d /tmp/meshccl-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
# meson test points LD_LIBRARY_PATH at the build tree: the check must not use it.
unset LD_LIBRARY_PATH
export MESHCCL_SOCKET_IFNAME=${MESHCCL_SOCKET_IFNAME:-lo}

meson install -C "$build" --no-rebuild --quiet --destdir "$work/stage" >/dev/null
pc=$(find "$work/stage" -name meshccl.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { echo "FAIL: meson install put no meshccl.pc"; exit 1; }
[ -f "$(dirname "$pc")/nccl.pc" ] || { echo "FAIL: meson install put no nccl.pc"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
# The .pc files and the CMake package are relocatable: the staged tree is a prefix.
prefix=$(realpath "$(dirname "$pc")/../../..")
[ -f "$libdir/cmake/meshccl/meshcclConfig.cmake" ] || { echo "FAIL: no CMake package in $libdir/cmake/meshccl"; exit 1; }
echo "prefix: $prefix"

run() {  # name, program: runs it and checks its "ok" line
  local out
  out=$("$2")
  case "$out" in *" ok "*) echo "$1: $out" ;; *) echo "FAIL: $1 printed '$out'"; exit 1 ;; esac
}

# 1. pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
mkdir "$work/pc"
cc -std=c11 -Wall -Wextra -Werror "$here/consumer/hello_meshccl.c" $(pkg-config --cflags --libs meshccl) -o "$work/pc/hello_meshccl"
cc -std=c11 -Wall -Wextra -Werror "$here/consumer/hello_nccl.c" $(pkg-config --cflags --libs nccl) -o "$work/pc/hello_nccl"
LD_LIBRARY_PATH="$libdir" run "pkg-config meshccl" "$work/pc/hello_meshccl"
LD_LIBRARY_PATH="$libdir" run "pkg-config nccl" "$work/pc/hello_nccl"

# 2. CMake (imported targets carry the library's path: no LD_LIBRARY_PATH)
cmake -S "$here/consumer" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
run "cmake meshccl::meshccl" "$work/cmake/hello_meshccl"
run "cmake meshccl::nccl" "$work/cmake/hello_nccl"

# 3. meson (pkg-config dependencies)
meson setup "$work/meson" "$here/consumer" >/dev/null
ninja -C "$work/meson" >/dev/null
LD_LIBRARY_PATH="$libdir" run "meson dependency('meshccl')" "$work/meson/hello_meshccl"
LD_LIBRARY_PATH="$libdir" run "meson dependency('nccl')" "$work/meson/hello_nccl"

# 4. the torch module, found under the prefix by Debian's /usr/bin/python3
mod=$(find "$prefix" -type d -name meshccl_torch -path '*/dist-packages/*' | head -n 1)
if [ -n "$mod" ]; then
  PYTHONPATH=$(dirname "$mod") /usr/bin/python3 - "$work/store" "$prefix" <<'PY'
import sys, torch, torch.distributed as dist
import meshccl_torch
assert meshccl_torch.__file__.startswith(sys.argv[2]), meshccl_torch.__file__
dist.init_process_group("meshccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
t = torch.arange(4.0)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
print("meshccl_torch ok from", meshccl_torch.__file__)
PY
else
  echo "meshccl_torch was not built: not checked"
fi
echo "install check passed"
