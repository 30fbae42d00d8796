#include "topo/exchange.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "topo/discover.h"
#include "util/log.h"
#include "util/param.h"
#include "util/wait.h"

namespace meshccl {

namespace {

// Fixed-size part of a rank's description, allgathered first.
struct RankWire {
  uint64_t host_key;
  double net_gbs;
  int32_t numa;
  int32_t from_file;
  uint32_t cpus_len;
  uint32_t host_len;
  char ifname[32];
};

// The GPU a rank drives, as NCCL places ranks: the one an NCCL dump marked
// with this rank, else the rank's CUDA device, else (one rank per GPU) the
// local rank's index.
int gpu_numa(const HostTopo& h, int rank, int cuda_dev, int local_index, bool nccl_file) {
  for (const TopoPci& p : h.pci)
    if (p.kind == TopoPci::Kind::kGpu && p.gpu_rank == rank) return p.numa;
  const int dev = cuda_dev >= 0 ? cuda_dev : nccl_file ? local_index : -1;
  if (dev < 0) return -2;
  for (const TopoPci& p : h.pci)
    if (p.kind == TopoPci::Kind::kGpu && p.gpu_dev == dev) return p.numa;
  return -2;
}

}  // namespace

Status topo_local(int rank, const std::vector<PeerInfo>& peers, int cuda_dev, const TopoFile* file,
                  const std::string& file_name, const HostTopo& discovered, const CpuSet& binding,
                  const std::string& ifname, double net_gbs, LocalTopo* out) {
  const int nranks = static_cast<int>(peers.size());
  // Real hosts in order of their first rank; this rank's host and index on it.
  std::vector<uint64_t> real_hosts;
  int local_index = 0;
  for (int r = 0; r < nranks; ++r) {
    if (std::find(real_hosts.begin(), real_hosts.end(), peers[r].host_hash) == real_hosts.end())
      real_hosts.push_back(peers[r].host_hash);
    if (r < rank && peers[r].host_hash == peers[rank].host_hash) ++local_index;
  }
  const int my_host =
      static_cast<int>(std::find(real_hosts.begin(), real_hosts.end(), peers[rank].host_hash) - real_hosts.begin());
  LocalTopo t;
  t.place.cpus = binding;
  t.place.ifname = ifname;
  t.place.net_gbs = net_gbs > 0 ? net_gbs : kNominalNetGbs;
  if (file == nullptr) {
    t.host = discovered;
    t.host.name = peers[rank].host_id;  // emulated hosts (MESHCCL_HOSTID) have their own names
    t.host_key = peers[rank].host_hash;
  } else if (!file->ranks.empty()) {
    if (static_cast<int>(file->ranks.size()) != nranks)
      return MC_ERROR(ncclInvalidArgument,
                      "MESHCCL_TOPO_FILE %s places %zu rank(s) but this communicator has %d (remove the <rank> "
                      "elements to place ranks by their CPU binding)",
                      file_name.c_str(), file->ranks.size(), nranks);
    t.place = file->ranks[rank];
    t.host = file->hosts[t.place.host];
    t.host_key = hash64(t.host.name.data(), t.host.name.size(), 0x70b0 + static_cast<uint64_t>(t.place.host));
    t.from_file = true;
  } else {
    const int described = static_cast<int>(file->hosts.size());
    if (described != 1 && described < static_cast<int>(real_hosts.size()))
      return MC_ERROR(ncclInvalidArgument,
                      "MESHCCL_TOPO_FILE %s describes %d hosts but this communicator spans %zu (give one host for "
                      "all, or at least one per host)",
                      file_name.c_str(), described, real_hosts.size());
    t.host = file->hosts[described == 1 ? 0 : my_host];
    if (described == 1 && real_hosts.size() > 1) t.host.name += "." + std::to_string(my_host);
    t.host_key = hash64(&my_host, sizeof(my_host), 0x70b1);
    t.from_file = true;
  }
  if (file == nullptr || file->ranks.empty()) {
    const int g = gpu_numa(t.host, rank, cuda_dev, local_index, file && file->format == TopoFile::Format::kNccl);
    t.place.numa = g != -2 ? g : t.host.numa_of(binding);
  }
  *out = std::move(t);
  return kOk;
}

Status topo_init(int rank, Bootstrap& bootstrap, const std::vector<PeerInfo>& peers, int cuda_dev, SystemGraph* out) {
  const double t0 = now_us();
  const int nranks = static_cast<int>(peers.size());
  const std::string file_name = param_str(Param::TopoFile);
  TopoFile file;
  if (!file_name.empty()) MC_TRY(topo_read_file(file_name, &file));
  const HostTopo empty;
  const HostTopo& discovered = file_name.empty() ? local_host_topo() : empty;
  const std::string ifname = interface_of(peers[rank].bootstrap_addr);
  LocalTopo mine;
  MC_TRY(topo_local(rank, peers, cuda_dev, file_name.empty() ? nullptr : &file, file_name, discovered,
                    current_binding(), ifname, nic_speed_gbs(ifname), &mine));

  const std::string cpus = mine.place.cpus.to_list();
  const std::string host_xml = host_to_xml(mine.host);
  std::vector<RankWire> wires(nranks);
  RankWire& w = wires[rank];
  std::memset(&w, 0, sizeof(w));
  w.host_key = mine.host_key;
  w.net_gbs = mine.place.net_gbs;
  w.numa = mine.place.numa;
  w.from_file = mine.from_file;
  w.cpus_len = static_cast<uint32_t>(cpus.size());
  w.host_len = static_cast<uint32_t>(host_xml.size());
  std::strncpy(w.ifname, mine.place.ifname.c_str(), sizeof(w.ifname) - 1);
  MC_TRY(bootstrap.allgather(wires.data(), sizeof(RankWire)));

  // The lowest rank of each host sends its description; all send their CPUs.
  std::map<uint64_t, int> leader;
  size_t block = 0;
  for (int r = 0; r < nranks; ++r) {
    if (wires[r].from_file != w.from_file)
      return MC_ERROR(ncclInvalidUsage, "rank %d %s MESHCCL_TOPO_FILE but rank %d %s: set it on every rank or none", r,
                      wires[r].from_file ? "reads" : "does not read", rank, w.from_file ? "does" : "does not");
    const bool lead = leader.emplace(wires[r].host_key, r).second;
    block = std::max<size_t>(block, wires[r].cpus_len + 1 + (lead ? wires[r].host_len : 0));
  }
  std::vector<char> texts(block * nranks, '\0');
  std::string my_text = cpus + "\n" + (leader[mine.host_key] == rank ? host_xml : "");
  std::memcpy(texts.data() + block * rank, my_text.data(), my_text.size());
  MC_TRY(bootstrap.allgather(texts.data(), block));

  SystemGraph g;
  std::map<uint64_t, int> host_index;
  for (int r = 0; r < nranks; ++r) {
    const char* t = texts.data() + block * r;
    const std::string text(t, strnlen(t, block));
    const size_t nl = text.find('\n');
    if (nl == std::string::npos) return MC_ERROR(ncclInternalError, "topology exchange: rank %d sent no CPU list", r);
    RankPlace p;
    std::string why;
    if (!CpuSet::parse_list(text.substr(0, nl), &p.cpus, &why))
      return MC_ERROR(ncclInternalError, "topology exchange: rank %d: %s", r, why.c_str());
    auto [it, fresh] = host_index.emplace(wires[r].host_key, static_cast<int>(g.hosts.size()));
    if (fresh) {
      TopoFile f;
      const std::string name = "topology of rank " + std::to_string(r);
      if (!topo_parse(name, text.data() + nl + 1, text.size() - nl - 1, &f, &why))
        return MC_ERROR(ncclInternalError, "topology exchange: %s", why.c_str());
      g.hosts.push_back(std::move(f.hosts[0]));
    }
    p.host = it->second;
    p.numa = wires[r].numa;
    p.net_gbs = wires[r].net_gbs;
    p.ifname.assign(wires[r].ifname, strnlen(wires[r].ifname, sizeof(wires[r].ifname)));
    g.ranks.push_back(std::move(p));
  }
  MC_INFO(kGraph, "Topology: rank %d agreed on %d rank(s) on %zu host(s) in %.2f ms (%s)", rank, nranks, g.hosts.size(),
          (now_us() - t0) / 1000, file_name.empty() ? "discovered" : file_name.c_str());
  *out = std::move(g);
  return kOk;
}

std::string topo_dump_name(const std::string& setting, uint64_t comm_hash, bool from_split) {
  const size_t at = setting.find("%c");
  if (at == std::string::npos) return from_split ? "" : setting;
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(comm_hash));
  std::string name = setting;
  for (size_t p = at; p != std::string::npos; p = name.find("%c", p + 16)) name.replace(p, 2, hex);
  return name;
}

Status topo_publish(int rank, const SystemGraph& g, uint64_t comm_hash, bool from_split) {
  if (log_enabled(LogLevel::Info, kGraph)) {
    if (rank == 0) {
      const std::string text = g.describe();
      size_t start = 0;
      while (start < text.size()) {
        const size_t end = text.find('\n', start);
        const std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
        log_msg(LogLevel::Info, kGraph, __FILE__, __LINE__, "Topology %s", line.c_str());
        if (end == std::string::npos) break;
        start = end + 1;
      }
    } else {
      const RankPlace& p = g.ranks[rank];
      MC_INFO(kGraph, "Topology rank %d: host %s, numa %d, cpus %s, if %s", rank, g.hosts[p.host].name.c_str(), p.numa,
              p.cpus.to_list().c_str(), p.ifname.c_str());
    }
  }
  if (rank != 0) return kOk;
  const std::string dump = topo_dump_name(param_str(Param::TopoDumpFile), comm_hash, from_split);
  if (!dump.empty()) MC_TRY(topo_write_file(dump, g));
  return kOk;
}

}  // namespace meshccl
