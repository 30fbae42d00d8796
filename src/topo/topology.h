// The machine as the library sees it: each host's packages, NUMA nodes,
// cores, caches and PCI devices (HostTopo), where each rank of a
// communicator runs (RankPlace), and the class and bandwidth of the link
// between any two ranks (SystemGraph::link). Plain data: built by discovery
// (topo/discover), read from a file (topo/topo_file) or merged across ranks
// at init (topo/exchange); the communicator holds one SystemGraph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topo/cpuset.h"

namespace meshccl {

// Built-in bandwidths, GB/s per direction, used where nothing better is
// known; they match the tuner's built-in shared-memory and network
// fallbacks (kBuiltinShm, kBuiltinNet in topo/cost_model.h), the cross-NUMA one is half the
// local one. Discovery replaces them with what hwloc reports (HMAT
// bandwidth, SLIT distances) and a NIC's ethtool speed; files may set them.
constexpr double kNominalNumaGbs = 5.0;
constexpr double kNominalCrossNumaGbs = 2.5;
constexpr double kNominalNetGbs = 1.25;  // 10 Gbit/s

struct TopoPackage {
  int id = 0;
  CpuSet cpus;
};

struct TopoNuma {
  int id = 0;
  int package = -1;  // -1: not known
  CpuSet cpus;
  uint64_t memory_mb = 0;  // 0: not known
};

struct TopoCore {
  CpuSet cpus;  // its hardware threads
};

struct TopoCache {
  int level = 0;
  std::string kind;  // "data", "instruction" or "unified"
  uint64_t size_kb = 0;
  CpuSet cpus;  // the CPUs that share it
};

struct TopoPci {
  enum class Kind { kGpu, kNic };
  Kind kind = Kind::kNic;
  std::string busid;  // "0000:3b:00.0"; may be empty
  uint32_t pci_class = 0;
  int numa = -1;         // -1: not attached to one NUMA node
  std::string name;      // NIC: the interface ("eth0", "mlx5_0"); GPU: ""
  double speed_gbs = 0;  // NIC link speed, GB/s; 0: not known
  int gpu_dev = -1;      // GPU: its device index
  int gpu_rank = -1;     // GPU: the rank an NCCL dump placed on it
};

struct HostTopo {
  std::string name;
  std::string source;  // where the description came from ("hwloc 2.9.0", "sysconf", "file x.xml", ...)
  std::vector<TopoPackage> packages;
  std::vector<TopoNuma> numa;
  std::vector<TopoCore> cores;
  std::vector<TopoCache> caches;
  std::vector<TopoPci> pci;
  double numa_gbs = kNominalNumaGbs;             // between two ranks of one NUMA node
  double cross_numa_gbs = kNominalCrossNumaGbs;  // between NUMA nodes
  std::string bw_source = "nominal";

  int cpu_count() const;
  int gpu_count() const;
  const TopoNuma* find_numa(int id) const;
  // The NUMA node whose CPUs include all of `cpus`; -1 when they span
  // several (an unbound rank) or none.
  int numa_of(const CpuSet& cpus) const;
};

struct RankPlace {
  int host = 0;        // index into SystemGraph::hosts
  int numa = -1;       // NUMA node id on that host; -1: not bound to one
  CpuSet cpus;         // CPUs the rank may run on
  std::string ifname;  // network interface it uses
  double net_gbs = kNominalNetGbs;
};

enum class LinkClass : uint8_t { kSelf, kSameNuma, kCrossNuma, kNetwork };
const char* link_class_name(LinkClass c);  // "self", "same_numa", "cross_numa", "network"
bool link_class_from_name(const std::string& name, LinkClass* out);

struct Link {
  LinkClass cls = LinkClass::kSelf;
  double bw_gbs = 0;  // per direction
};

// One per communicator, identical on every rank.
struct SystemGraph {
  std::vector<HostTopo> hosts;
  std::vector<RankPlace> ranks;

  int nranks() const { return static_cast<int>(ranks.size()); }
  // The link between ranks a and b: a pure function of the placements.
  // Ranks on one host are on the same NUMA node when both are bound to it or
  // the host has one NUMA node, else across NUMA nodes; ranks on different
  // hosts talk over the network at the slower of their two NICs.
  Link link(int a, int b) const;
  std::vector<int> ranks_on_host(int host) const;
  // The graph of a communicator made of `members` (ranks of this one, in
  // their new order), e.g. by ncclCommSplit; hosts without members dropped.
  SystemGraph subset(const std::vector<int>& members) const;
  // Human-readable, several lines: hosts, ranks, the pair classes.
  std::string describe() const;
};

// Human-readable description of one host (meshccl_info --topo).
std::string describe_host(const HostTopo& host);

}  // namespace meshccl
