// The system graph: link classes between ranks, subsets, descriptions, and
// the tuner's model of a graph (tune_model_for).
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "topo/cost_model.h"
#include "topo/topology.h"

namespace meshccl {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

}  // namespace

const char* link_class_name(LinkClass c) {
  switch (c) {
    case LinkClass::kSelf: return "self";
    case LinkClass::kSameNuma: return "same_numa";
    case LinkClass::kCrossNuma: return "cross_numa";
    case LinkClass::kNetwork: return "network";
  }
  return "?";
}

bool link_class_from_name(const std::string& name, LinkClass* out) {
  for (LinkClass c : {LinkClass::kSelf, LinkClass::kSameNuma, LinkClass::kCrossNuma, LinkClass::kNetwork}) {
    if (name == link_class_name(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

int HostTopo::cpu_count() const {
  CpuSet all;
  for (const TopoNuma& n : numa) all.add(n.cpus);
  return all.count();
}

int HostTopo::gpu_count() const {
  return static_cast<int>(
      std::count_if(pci.begin(), pci.end(), [](const TopoPci& p) { return p.kind == TopoPci::Kind::kGpu; }));
}

const TopoNuma* HostTopo::find_numa(int id) const {
  for (const TopoNuma& n : numa)
    if (n.id == id) return &n;
  return nullptr;
}

int HostTopo::numa_of(const CpuSet& cpus) const {
  if (cpus.empty()) return -1;
  for (const TopoNuma& n : numa)
    if (cpus.subset_of(n.cpus)) return n.id;
  return -1;
}

Link SystemGraph::link(int a, int b) const {
  if (a == b) return {LinkClass::kSelf, hosts[ranks[a].host].numa_gbs};
  const RankPlace& ra = ranks[a];
  const RankPlace& rb = ranks[b];
  if (ra.host != rb.host) return {LinkClass::kNetwork, std::min(ra.net_gbs, rb.net_gbs)};
  const HostTopo& h = hosts[ra.host];
  if (h.numa.size() <= 1 || (ra.numa >= 0 && ra.numa == rb.numa)) return {LinkClass::kSameNuma, h.numa_gbs};
  return {LinkClass::kCrossNuma, h.cross_numa_gbs};
}

std::vector<int> SystemGraph::ranks_on_host(int host) const {
  std::vector<int> out;
  for (int r = 0; r < nranks(); ++r)
    if (ranks[r].host == host) out.push_back(r);
  return out;
}

SystemGraph SystemGraph::subset(const std::vector<int>& members) const {
  SystemGraph g;
  std::map<int, int> host_map;  // old index -> new
  for (int m : members) {
    RankPlace p = ranks[m];
    auto [it, fresh] = host_map.emplace(p.host, static_cast<int>(g.hosts.size()));
    if (fresh) g.hosts.push_back(hosts[p.host]);
    p.host = it->second;
    g.ranks.push_back(std::move(p));
  }
  return g;
}

std::string describe_host(const HostTopo& h) {
  std::string s = "host " + h.name + " (" + h.source + "): " + std::to_string(h.packages.size()) + " package(s), " +
                  std::to_string(h.numa.size()) + " NUMA node(s), " + std::to_string(h.cores.size()) + " core(s), " +
                  std::to_string(h.cpu_count()) + " CPU(s)\n";
  for (const TopoPackage& p : h.packages)
    s += "  package " + std::to_string(p.id) + ": cpus " + p.cpus.to_list() + "\n";
  for (const TopoNuma& n : h.numa) {
    s += "  numa " + std::to_string(n.id) + ": package " + std::to_string(n.package) + ", cpus " + n.cpus.to_list();
    if (n.memory_mb) s += ", " + std::to_string(n.memory_mb) + " MiB";
    s += "\n";
  }
  // Caches summarised per level and kind: count and size.
  std::map<std::pair<int, std::string>, std::pair<int, uint64_t>> caches;
  for (const TopoCache& c : h.caches) {
    auto& e = caches[{c.level, c.kind}];
    ++e.first;
    e.second = c.size_kb;
  }
  for (const auto& [key, val] : caches)
    s += "  L" + std::to_string(key.first) + " " + key.second + " cache: " + std::to_string(val.first) + " x " +
         std::to_string(val.second) + " KiB\n";
  for (const TopoPci& p : h.pci) {
    if (p.kind == TopoPci::Kind::kGpu) {
      s += "  gpu " + std::to_string(p.gpu_dev) + " pci " + (p.busid.empty() ? "-" : p.busid) + ", numa " +
           std::to_string(p.numa) + "\n";
    } else {
      s += "  nic " + (p.name.empty() ? "-" : p.name) + " pci " + (p.busid.empty() ? "-" : p.busid) + ", numa " +
           std::to_string(p.numa) + ", " + (p.speed_gbs > 0 ? fmt("%g GB/s", p.speed_gbs) : "speed unknown") + "\n";
    }
  }
  s += "  bandwidth (" + h.bw_source + "): same NUMA " + fmt("%g", h.numa_gbs) + " GB/s, across NUMA " +
       fmt("%g", h.cross_numa_gbs) + " GB/s\n";
  return s;
}

std::string SystemGraph::describe() const {
  std::string s = std::to_string(nranks()) + " rank(s) on " + std::to_string(hosts.size()) + " host(s)\n";
  for (size_t h = 0; h < hosts.size(); ++h) {
    s += describe_host(hosts[h]);
    std::string list;
    for (int r : ranks_on_host(static_cast<int>(h))) list += (list.empty() ? "" : " ") + std::to_string(r);
    s += "  ranks: " + list + "\n";
  }
  for (int r = 0; r < nranks(); ++r) {
    const RankPlace& p = ranks[r];
    s += "rank " + std::to_string(r) + ": host " + hosts[p.host].name + ", numa " +
         (p.numa >= 0 ? std::to_string(p.numa) : std::string("unbound")) + ", cpus " + p.cpus.to_list() + ", if " +
         (p.ifname.empty() ? "-" : p.ifname) + " " + fmt("%g GB/s", p.net_gbs) + "\n";
  }
  // Pair classes: one letter per pair (S self, N same NUMA, X across NUMA, W network).
  if (nranks() <= 64) {
    s += "links (S self, N same NUMA, X across NUMA, W network):\n";
    for (int a = 0; a < nranks(); ++a) {
      std::string row = "  " + std::to_string(a) + ": ";
      for (int b = 0; b < nranks(); ++b) row += "SNXW"[static_cast<int>(link(a, b).cls)];
      s += row + "\n";
    }
  }
  return s;
}

// A graph's layout as the tuner sees it: network links as soon as two ranks
// are on different hosts.
TuneModel tune_model_for(const SystemGraph& graph, LinkCost shm, LinkCost net, double reduce_gbs) {
  bool network = false, xnuma = false;
  for (const RankPlace& r : graph.ranks) network |= r.host != graph.ranks.front().host;
  for (int a = 0; a < graph.nranks() && !xnuma && graph.nranks() <= 4096; ++a)
    for (int b = a + 1; b < graph.nranks() && !xnuma; ++b) xnuma = graph.link(a, b).cls == LinkClass::kCrossNuma;
  TuneModel t = with_hosts(make_tune_model(graph.nranks(), network, shm, net, reduce_gbs), host_numbers(graph));
  t.cross_numa_links = xnuma;
  t.rails = rails_of(graph);
  t.cpu_share = cpu_share_of(graph);
  return t;
}

double cpu_share_of(const SystemGraph& graph) {
  double share = 1;
  for (size_t h = 0; h < graph.hosts.size(); ++h) {
    const int cpus = graph.hosts[h].cpu_count();
    const size_t ranks = graph.ranks_on_host(static_cast<int>(h)).size();
    if (cpus > 0 && ranks > 0) share = std::min(share, static_cast<double>(cpus) / static_cast<double>(ranks));
  }
  return share;
}

int rails_of(const SystemGraph& graph) {
  std::map<int, std::set<std::string>> ifs;  // host -> interfaces its ranks use
  for (const RankPlace& r : graph.ranks) {
    std::set<std::string>& names = ifs[r.host];
    if (!r.ifname.empty()) names.insert(r.ifname);
  }
  size_t fewest = 0;
  for (const auto& [h, names] : ifs) fewest = fewest == 0 ? names.size() : std::min(fewest, names.size());
  return std::max(static_cast<int>(fewest), 1);
}

std::vector<int> host_numbers(const SystemGraph& graph) {
  std::vector<int> out(static_cast<size_t>(graph.nranks()), 0);
  std::map<int, int> seen;  // graph host -> number
  for (int r = 0; r < graph.nranks(); ++r) {
    auto it = seen.emplace(graph.ranks[r].host, static_cast<int>(seen.size())).first;
    out[r] = it->second;
  }
  return out;
}

}  // namespace meshccl
