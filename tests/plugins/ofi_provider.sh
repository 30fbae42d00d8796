#!/bin/bash
# The transport contract suite over the ofi plugin with one libfabric
# provider: ofi_provider.sh <provider> <transport_test> [gtest args...].
# Skips (exit 77) with the reason when the plugin was not built or the
# provider offers no reliable tagged endpoint here.
set -u
prov=$1
exe=$2
shift 2
plugin="${MESHCCL_TEST_PLUGIN_DIR:-.}/libmeshccl-transport-ofi.so"
if [ ! -e "$plugin" ]; then
  echo "SKIP: $plugin is not built (libfabric was not found at configure time)"
  exit 77
fi
if command -v fi_info >/dev/null && ! FI_PROVIDER=$prov fi_info -t FI_EP_RDM -c FI_TAGGED >/dev/null 2>&1; then
  echo "SKIP: libfabric provider $prov offers no FI_EP_RDM endpoint with FI_TAGGED here (fi_info)"
  exit 77
fi
export FI_PROVIDER=$prov
exec "$exe" --gtest_filter='All/TransportTest.*/ofi' "$@"
