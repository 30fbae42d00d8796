// Clusters for meshccl_sim: presets and topology files as system graphs, and
// the cost model's constants for them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "sim.h"
#include "topo/topo_file.h"
#include "util/log.h"

namespace meshccl::sim {

namespace {

CpuSet cpu_range(int first, int last) {
  CpuSet s;
  for (int c = first; c <= last; ++c) s.set(c);
  return s;
}

struct Preset {
  const char* name;
  const char* what;
  int ranks_per_host;
  HostTopo (*host)();
  LinkCost shm, net;
  double reduce_gbs;
};

// An H100 SXM node: 2 sockets, 8 GPUs (4 per socket) on NVLink 4 through
// NVSwitch (900 GB/s both directions together, 450 GB/s each way), a
// 400 Gbit/s NIC next to each GPU (a rail-optimized fabric gives each GPU
// its own 50 GB/s into the network).
HostTopo dgx_h100_host() {
  HostTopo h;
  h.source = "preset dgx-h100";
  h.bw_source = "preset";
  h.numa_gbs = h.cross_numa_gbs = 450;  // GPU to GPU goes over NVLink whatever the socket
  for (int s = 0; s < 2; ++s) {
    TopoNuma n;
    n.id = s;
    n.package = s;
    n.cpus = cpu_range(56 * s, 56 * s + 55);
    h.numa.push_back(n);
    h.packages.push_back({s, n.cpus});
  }
  for (int g = 0; g < 8; ++g) {
    TopoPci gpu;
    gpu.kind = TopoPci::Kind::kGpu;
    gpu.numa = g / 4;
    gpu.gpu_dev = g;
    TopoPci nic;
    nic.kind = TopoPci::Kind::kNic;
    nic.numa = g / 4;
    nic.name = "mlx5_" + std::to_string(g);
    nic.speed_gbs = 50;
    h.pci.push_back(gpu);
    h.pci.push_back(nic);
  }
  return h;
}

// This machine's kind of host: 2 cores, one NUMA node, a 10 Gbit/s NIC; the
// tuner's built-in constants.
HostTopo cpu_host() {
  HostTopo h;
  h.source = "preset cpu";
  TopoNuma n;
  n.cpus = cpu_range(0, 1);
  h.numa.push_back(n);
  h.packages.push_back({0, n.cpus});
  TopoPci nic;
  nic.name = "eth0";
  nic.speed_gbs = kNominalNetGbs;
  h.pci.push_back(nic);
  return h;
}

// Latencies: a dependent step on NVLink about 1 us, across the network
// about 5 us (NCCL's tuning tables give 0.6-3.4 us per NVLink hop and
// 2.7-14 us per network hop, by protocol). Reduction on the GPU: about a
// third of HBM3's 3.35 TB/s (two reads, one write per output byte).
const Preset kPresets[] = {
    {"dgx-h100",
     "nodes of 8 H100 on NVLink, 8 x 400 Gbit/s NICs each, rail-optimized fat tree",
     8,
     dgx_h100_host,
     {1.0, 450},
     {5.0, 50},
     1100},
    {"cpu", "hosts of 2 cores on shared memory, 10 Gbit/s network (the built-in constants)", 2, cpu_host, kBuiltinShm,
     kBuiltinNet, kBuiltinReduceGbs},
};

const Preset* find_preset(const std::string& spec) {
  const std::string name = spec.substr(0, spec.find(':'));
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

// A positive count no larger than `most`.
bool parse_count(const std::string& s, int most, int* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 9) return false;
  const long v = std::strtol(s.c_str(), nullptr, 10);
  if (v < 1 || v > most) return false;
  *out = static_cast<int>(v);
  return true;
}

// Hosts host_of(0..hosts-1), each with the ranks `place` gives it.
bool add_hosts(int hosts, const std::vector<std::pair<HostTopo, std::vector<RankPlace>>>& kinds, Cluster* c,
               std::string* err) {
  size_t total = 0;
  for (int h = 0; h < hosts; ++h) total += kinds[h % kinds.size()].second.size();
  if (total > static_cast<size_t>(kMaxRanks)) {
    *err = std::to_string(total) + " ranks: at most " + std::to_string(kMaxRanks);
    return false;
  }
  c->graph.hosts.reserve(hosts);
  c->graph.ranks.reserve(total);
  for (int h = 0; h < hosts; ++h) {
    const auto& kind = kinds[h % kinds.size()];
    c->graph.hosts.push_back(kind.first);
    c->graph.hosts.back().name =
        kind.first.name.empty() || hosts > static_cast<int>(kinds.size()) ? "h" + std::to_string(h) : kind.first.name;
    for (RankPlace r : kind.second) {
      r.host = h;
      c->graph.ranks.push_back(r);
    }
  }
  if (total == 0) {
    *err = "no ranks";
    return false;
  }
  return true;
}

// `n` ranks on host: one per GPU (bound to its NUMA node, on its NIC) while
// there are GPUs, else unbound on the fastest NIC.
std::vector<RankPlace> ranks_on(const HostTopo& host, int n) {
  std::vector<const TopoPci*> gpus, nics;
  for (const TopoPci& p : host.pci) (p.kind == TopoPci::Kind::kGpu ? gpus : nics).push_back(&p);
  const TopoPci* fastest_nic = nullptr;
  for (const TopoPci* nic : nics)
    if (fastest_nic == nullptr || nic->speed_gbs > fastest_nic->speed_gbs) fastest_nic = nic;
  const double fastest = fastest_nic != nullptr ? fastest_nic->speed_gbs : 0;
  std::vector<RankPlace> out(n);
  for (int i = 0; i < n; ++i) {
    RankPlace& r = out[i];
    r.net_gbs = fastest > 0 ? fastest : kNominalNetGbs;
    if (fastest_nic != nullptr) r.ifname = fastest_nic->name;  // ranks beyond the NICs share the fastest one
    if (i < static_cast<int>(gpus.size())) r.numa = gpus[i]->numa;
    if (i < static_cast<int>(nics.size())) {
      r.ifname = nics[i]->name;
      if (nics[i]->speed_gbs > 0) r.net_gbs = nics[i]->speed_gbs;
    }
    if (const TopoNuma* numa = host.find_numa(r.numa)) r.cpus = numa->cpus;
  }
  return out;
}

// The constants a graph implies: the slowest link between two ranks of one
// host, the slowest rank's NIC; latencies built in.
void constants_from_graph(Cluster* c) {
  double shm = std::numeric_limits<double>::infinity(), net = shm;
  for (int h = 0; h < c->nhosts(); ++h) {
    const std::vector<int> on = c->graph.ranks_on_host(h);
    for (size_t i = 1; i < on.size(); ++i) shm = std::min(shm, c->graph.link(on[0], on[i]).bw_gbs);
  }
  for (const RankPlace& r : c->graph.ranks) net = std::min(net, r.net_gbs);
  c->shm = {kBuiltinShm.alpha_us, std::isfinite(shm) && shm > 0 ? shm : kBuiltinShm.bw_gbs};
  c->net = {kBuiltinNet.alpha_us, std::isfinite(net) && net > 0 ? net : kBuiltinNet.bw_gbs};
  c->reduce_gbs = kBuiltinReduceGbs;
}

}  // namespace

std::string preset_names() {
  std::string s;
  for (const Preset& p : kPresets) s += std::string(s.empty() ? "" : "\n") + "  " + p.name + "[:HOSTS]  " + p.what;
  return s;
}

bool preset_sweeps(const std::string& spec) {
  return find_preset(spec) != nullptr && spec.find(':') == std::string::npos;
}

int preset_ranks_per_host(const std::string& spec) {
  const Preset* p = find_preset(spec);
  return p != nullptr ? p->ranks_per_host : 0;
}

bool preset_cluster(const std::string& spec, int hosts, Cluster* out, std::string* err) {
  const Preset* p = find_preset(spec);
  if (p == nullptr) {
    *err = "unknown preset \"" + spec + "\"; the presets are:\n" + preset_names();
    return false;
  }
  const size_t colon = spec.find(':');
  if (hosts <= 0 && colon != std::string::npos && !parse_count(spec.substr(colon + 1), kMaxRanks, &hosts)) {
    *err = "preset \"" + spec + "\": the host count after ':' must be a number from 1 to " + std::to_string(kMaxRanks);
    return false;
  }
  hosts = std::max(hosts, 1);
  Cluster c;
  c.name = std::string(p->name) + ":" + std::to_string(hosts);
  const HostTopo host = p->host();
  if (!add_hosts(hosts, {{host, ranks_on(host, p->ranks_per_host)}}, &c, err)) return false;
  c.shm = p->shm;
  c.net = p->net;
  c.reduce_gbs = p->reduce_gbs;
  *out = std::move(c);
  return true;
}

bool file_cluster(const std::string& path, int hosts, int ranks_per_host, Cluster* out, std::string* err) {
  TopoFile file;
  if (!topo_read_file(path, &file).ok()) {
    *err = last_error();
    return false;
  }
  // Each host of the file with its ranks: the file's placements, else
  // ranks_per_host (or one per GPU) of them.
  std::vector<std::pair<HostTopo, std::vector<RankPlace>>> kinds;
  for (const HostTopo& h : file.hosts) kinds.push_back({h, {}});
  for (const RankPlace& r : file.ranks) kinds[r.host].second.push_back(r);
  for (auto& [host, ranks] : kinds) {
    if (!ranks.empty() && ranks_per_host == 0) continue;
    const int n = ranks_per_host > 0 ? ranks_per_host : host.gpu_count();
    if (n == 0) {
      *err = path + ": host \"" + host.name + "\" has no ranks placed and no GPU; give --ranks-per-host";
      return false;
    }
    ranks = ranks_on(host, n);
  }
  Cluster c;
  c.name = "file " + path;
  if (!add_hosts(hosts > 0 ? hosts : static_cast<int>(kinds.size()), kinds, &c, err)) return false;
  constants_from_graph(&c);
  *out = std::move(c);
  return true;
}

void apply(const Overrides& o, Cluster* c) {
  if (o.shm_alpha_us > 0) c->shm.alpha_us = o.shm_alpha_us;
  if (o.shm_gbs > 0) c->shm.bw_gbs = o.shm_gbs;
  if (o.net_alpha_us > 0) c->net.alpha_us = o.net_alpha_us;
  if (o.net_gbs > 0) c->net.bw_gbs = o.net_gbs;
  if (o.reduce_gbs > 0) c->reduce_gbs = o.reduce_gbs;
}

}  // namespace meshccl::sim
