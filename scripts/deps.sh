#!/usr/bin/env bash
# Installs the Debian packages the build and tests need, only those missing.
# Sourced by scripts/demo and scripts/test.
set -euo pipefail

MESHCCL_PACKAGES=(
  meson ninja-build pkgconf g++ libgtest-dev libgmock-dev libbenchmark-dev
  libhwloc-dev libucx-dev ucx-utils libfabric-dev libfabric-bin libopenblas-dev zlib1g-dev
  libopenmpi-dev openmpi-bin mpich libmpich-dev libgloo-dev
  bible-kjv bible-kjv-text iproute2 iperf3 python3 python3-matplotlib
  python3-torch libtorch-dev pybind11-dev python3-pytest cmake
  clang libclang-rt-14-dev clang-format
)

meshccl_install_deps() {
  local missing=()
  for p in "${MESHCCL_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  echo "Installing: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configures (once) and builds into $1 with the given meson options.
meshccl_build() {
  local dir="$1"; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@"
  fi
  ninja -C "$dir" -j"$(nproc)"
}
