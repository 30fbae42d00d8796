// Discovery of this host: hwloc where the build has it (packages, NUMA nodes,
// cores, caches, GPUs and NICs with their NUMA locality), else a single-NUMA
// description from sysconf and sched_getaffinity. Also what belongs to the
// calling thread: its CPU binding and the network interface of an address.
#pragma once

#include <sys/socket.h>

#include <string>

#include "topo/topology.h"

namespace meshccl {

// This host, discovered once per process (later calls return the same
// description). Logs at INFO/GRAPH how it was found.
const HostTopo& local_host_topo();

// The description without hwloc: one package and one NUMA node holding the
// online CPUs, each CPU a core, no caches or PCI devices.
HostTopo discover_fallback();

// The hwloc description; false with the reason when hwloc is not built in or
// fails.
bool discover_hwloc(HostTopo* out, std::string* why);

// The CPUs the calling thread may run on.
CpuSet current_binding();

// The interface that holds `addr` ("lo", "eth0"); "" when none does.
std::string interface_of(const sockaddr_storage& addr);

// Link speed of an interface in GB/s (ethtool), 0 when not known.
double nic_speed_gbs(const std::string& ifname);

}  // namespace meshccl
