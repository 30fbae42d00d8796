#!/usr/bin/env bash
# Stages the build with `meson install --destdir`, moves the staged tree
# elsewhere, then builds and runs two small programs against it, as another
# project would: with pkg-config, with CMake (find_package(meshccl)) and with
# meson (dependency('meshccl'/'nccl')). Runs a job with the tree's meshrun over
# each of shm, socket, ucx and ofi (the last two between emulated hosts, when
# built), checking that the transport plugins come from the moved tree, and
# lists them with the build tree's tools/meshccl_info run from the build
# folder. Also imports the installed meshccl_torch with /usr/bin/python3 when
# it was built.
# Usage: check_install.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d /tmp/meshccl-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
# meson test points LD_LIBRARY_PATH at the build tree: the check must not use it.
unset LD_LIBRARY_PATH
export MESHCCL_SOCKET_IFNAME=${MESHCCL_SOCKET_IFNAME:-lo}

nets=""
for t in ucx ofi; do
  if [ -e "$build/plugins/libmeshccl-transport-$t.so" ]; then nets="$nets $t"; else echo "$t was not built: not checked"; fi
done

# 0. the build tree's own tools find the build's plugins, also run from the build folder
# (whole outputs are kept: grep -q would end the pipe early, and pipefail the script)
listed=$(cd "$build" && tools/meshccl_info)
for t in $nets; do
  grep -q "^  $t .*$build/plugins/libmeshccl-transport-$t.so" <<<"$listed" ||
    { echo "FAIL: (cd $build && tools/meshccl_info) does not list $t from $build/plugins"; exit 1; }
done

# A staged tree, then moved: nothing may point into where it was staged.
meson install -C "$build" --no-rebuild --quiet --destdir "$work/stage" >/dev/null
mv "$work/stage" "$work/moved"
pc=$(find "$work/moved" -name meshccl.pc -path '*/pkgconfig/*' | head -n 1)
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
# The .pc files carry an rpath: no LD_LIBRARY_PATH, and the tree's libnccl.so.2
# is the one loaded (not another on the loader's path, e.g. the CUDA toolkit's).
run "pkg-config meshccl" "$work/pc/hello_meshccl"
run "pkg-config nccl" "$work/pc/hello_nccl"
loaded=$(ldd "$work/pc/hello_nccl" | awk '/libnccl.so.2/ {print $3}')
[ "$(realpath "$loaded")" = "$(realpath "$libdir")/$(basename "$(realpath "$loaded")")" ] ||
  { echo "FAIL: a pkg-config build loads $loaded, not the tree's libnccl.so.2 in $libdir"; exit 1; }
echo "pkg-config nccl loads $loaded"

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

# 4. a job over every transport with the tree's meshrun; the log names the
# file each network transport was loaded from
cc -std=c11 -Wall -Wextra -Werror "$here/consumer/job_meshccl.c" $(pkg-config --cflags --libs meshccl) -o "$work/pc/job_meshccl"
meshrun=$(find "$prefix" -name meshrun -type f | head -n 1)
[ -n "$meshrun" ] || { echo "FAIL: no meshrun in the installed tree"; exit 1; }
plugins="$(realpath "$libdir")/meshccl"
job() {  # transport, ranks per emulated host (0: one host), settings (VAR=value ...)
  local t=$1 per_host=$2 out
  shift 2
  local opts=()
  [ "$per_host" = 0 ] || opts=(--hostid-per-rank "$per_host")
  out=$(env LD_LIBRARY_PATH="$libdir" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" \
        "$meshrun" -n 2 "${opts[@]}" "$work/pc/job_meshccl" 2>&1) || { echo "FAIL: job over $t:"; echo "$out"; exit 1; }
  [ "$(grep -c 'meshccl job ok' <<<"$out")" = 2 ] || { echo "FAIL: job over $t:"; echo "$out"; exit 1; }
  grep -q "rank 0 <-> rank 1 via $t" <<<"$out" || { echo "FAIL: the job did not run over $t:"; echo "$out"; exit 1; }
  if [ "$t" = ucx ] || [ "$t" = ofi ]; then
    grep -q "transport $t: loaded $plugins/libmeshccl-transport-$t.so" <<<"$out" ||
      { echo "FAIL: $t was not loaded from the moved tree ($plugins):"; echo "$out"; exit 1; }
  elif grep -q "transport .*: loaded" <<<"$out"; then
    echo "FAIL: a job over $t loaded a network plugin:"; echo "$out"; exit 1
  fi
  echo "job over $t: ok"
}
info=$(find "$prefix" -name meshccl_info -type f | head -n 1)
listed=$([ -z "$info" ] || "$info")
for t in $nets; do
  [ -z "$info" ] || grep -q "^  $t .*$plugins/libmeshccl-transport-$t.so" <<<"$listed" ||
    { echo "FAIL: the tree's meshccl_info does not list $t from $plugins"; exit 1; }
done
job shm 0
job socket 0 MESHCCL_TRANSPORT=socket
for t in $nets; do
  job "$t" 1 NCCL_NET="$t" FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
done

# 5. installed programs run from the moved tree without LD_LIBRARY_PATH; the
# nccl-tests-named tools are under <libexecdir>/meshccl, never on PATH's bin
if [ -n "$(find "$prefix" -path '*/bin/*_perf*' | head -n 1)" ]; then
  echo "FAIL: perf tools installed into bin, where they would shadow nccl-tests:"; find "$prefix" -path '*/bin/*_perf*'; exit 1
fi
perf=$(find "$prefix" -path '*/libexec/meshccl/all_reduce_perf' -type f | head -n 1)
if [ -n "$perf" ]; then
  out=$("$perf" -t 2 -b 8 -e 8 -n 1 -w 0 2>&1) || { echo "FAIL: $perf:"; echo "$out"; exit 1; }
  grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "FAIL: $perf:"; echo "$out"; exit 1; }
  echo "installed all_reduce_perf: ok ($perf)"
fi
train=$(find "$prefix" -path '*/bin/meshtrain' -type f | head -n 1)
if [ -n "$train" ]; then
  "$train" --version | grep -q "^meshtrain (meshccl) " || { echo "FAIL: $train --version"; exit 1; }
  echo "installed meshtrain: ok"
fi
for tool in meshrun meshccl_info meshccl_sim; do
  exe=$(find "$prefix" -path "*/bin/$tool" -type f | head -n 1)
  "$exe" --version | grep -q "^$tool (meshccl) " || { echo "FAIL: $exe --version"; exit 1; }
done

# 6. install tags: runtime alone runs programs and the torch module; devel
# alone is what a build needs (headers, .pc files, the CMake package)
meson install -C "$build" --no-rebuild --quiet --tags runtime --destdir "$work/runtime" >/dev/null
meson install -C "$build" --no-rebuild --quiet --tags devel --destdir "$work/devel" >/dev/null
for want in libmeshccl.so.0 libnccl.so.2 meshrun; do
  [ -n "$(find "$work/runtime" -name "$want" | head -n 1)" ] || { echo "FAIL: --tags runtime installs no $want"; exit 1; }
done
[ -z "$(find "$work/runtime" -name nccl.h | head -n 1)" ] || { echo "FAIL: --tags runtime installs headers"; exit 1; }
for want in nccl.h meshccl.h nccl.pc meshccl.pc meshcclConfig.cmake meshcclConfigVersion.cmake; do
  [ -n "$(find "$work/devel" -name "$want" | head -n 1)" ] || { echo "FAIL: --tags devel installs no $want"; exit 1; }
done
if [ -n "$(find "$build/torch" -name '_C*.so' 2>/dev/null | head -n 1)" ]; then
  for want in __init__.py '_C*.so'; do
    [ -n "$(find "$work/runtime" -path '*meshccl_torch*' -name "$want" | head -n 1)" ] ||
      { echo "FAIL: --tags runtime installs no meshccl_torch/$want"; exit 1; }
  done
fi
echo "install tags: runtime and devel complete"

# 7. the torch module, found under the prefix by Debian's /usr/bin/python3
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
