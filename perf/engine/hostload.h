// What a timed loop cost the machine: the TCP payload a host's network
// device sent (read from the namespace the rank runs in) and the CPU time of
// the process. The tools print it per size when MESHCCL_PERF_NETDEV names the
// device (perf/cluster_allreduce.sh sets it to eth0 on scripts/cluster hosts).
#pragma once

#include <string>

namespace perf {

struct HostLoad {
  double tcp_payload = 0;  // bytes: tx_bytes less one header per packet (see hostload.cpp)
  double cpu_s = 0;        // user + system seconds of this process, all threads
};

// The device named by MESHCCL_PERF_NETDEV, or "" (then nothing is sampled).
const std::string& NetDev();

// A reading now; the device is read only when count_net (one process per host).
// False, after printing why, when the device's counters cannot be read.
bool SampleHostLoad(bool count_net, HostLoad* out);

}  // namespace perf
