#include "topo/discover.h"

#include <ifaddrs.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "meshccl_config.h"
#include "util/log.h"

#if MESHCCL_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace meshccl {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

CpuSet current_binding() {
  CpuSet out;
  cpu_set_t* set = CPU_ALLOC(CpuSet::kMaxCpus);
  const size_t size = CPU_ALLOC_SIZE(CpuSet::kMaxCpus);
  if (set != nullptr && sched_getaffinity(0, size, set) == 0) {
    for (int c = 0; c < CpuSet::kMaxCpus; ++c)
      if (CPU_ISSET_S(c, size, set)) out.set(c);
  }
  if (set != nullptr) CPU_FREE(set);
  return out;
}

HostTopo discover_fallback() {
  HostTopo h;
  h.name = host_name();
  h.source = "sysconf";
  // The online CPUs, numbered from 0, and any this thread may run on beyond
  // them (sparse numbering): the host, not just the discovering thread.
  CpuSet cpus = current_binding();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  for (long c = 0; c < online && c < CpuSet::kMaxCpus; ++c) cpus.set(static_cast<int>(c));
  h.packages.push_back({0, cpus});
  h.numa.push_back({0, 0, cpus, 0});
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) h.numa[0].memory_mb = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) >> 20;
  int left = cpus.count();
  for (int c = 0; left > 0 && c < CpuSet::kMaxCpus; ++c) {
    if (!cpus.test(c)) continue;
    TopoCore core;
    core.cpus.set(c);
    h.cores.push_back(std::move(core));
    --left;
  }
  return h;
}

#if MESHCCL_HAVE_HWLOC

namespace {

CpuSet from_bitmap(hwloc_const_bitmap_t b) {
  CpuSet out;
  if (b == nullptr) return out;
  for (int i = hwloc_bitmap_first(b); i >= 0 && i < CpuSet::kMaxCpus; i = hwloc_bitmap_next(b, i)) out.set(i);
  return out;
}

// The NUMA node an I/O object hangs off, -1 when its first non-I/O ancestor
// covers several.
int io_numa(hwloc_topology_t topo, hwloc_obj_t obj) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);
  if (anc == nullptr || anc->nodeset == nullptr || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

std::string busid_of(hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

// Bandwidths from hwloc: the HMAT bandwidth of the first NUMA node seen from
// its own CPUs, and the SLIT distances (local / remote) for the cross-NUMA
// share. Either may be missing; the nominal values stay then.
void hwloc_bandwidths(hwloc_topology_t topo, HostTopo* h) {
  std::string source;
  hwloc_obj_t n0 = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, 0);
  if (n0 != nullptr && n0->cpuset != nullptr) {
    hwloc_location loc{};
    loc.type = HWLOC_LOCATION_TYPE_CPUSET;
    loc.location.cpuset = n0->cpuset;
    hwloc_uint64_t mibs = 0;
    if (hwloc_memattr_get_value(topo, HWLOC_MEMATTR_ID_BANDWIDTH, n0, &loc, 0, &mibs) == 0 && mibs > 0) {
      h->numa_gbs = static_cast<double>(mibs) * 1048576.0 / 1e9;
      h->cross_numa_gbs = h->numa_gbs / 2;
      source = "hwloc HMAT";
    }
  }
  unsigned nr = 1;
  hwloc_distances_s* dist = nullptr;
  if (h->numa.size() > 1 &&
      hwloc_distances_get_by_type(topo, HWLOC_OBJ_NUMANODE, &nr, &dist, HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) == 0 &&
      nr >= 1 && dist != nullptr) {
    const unsigned n = dist->nbobjs;
    double local = 0, remote = 0;
    for (unsigned i = 0; i < n; ++i) {
      for (unsigned j = 0; j < n; ++j) {
        const double d = static_cast<double>(dist->values[i * n + j]);
        if (i == j) local = std::max(local, d);
        else remote = std::max(remote, d);
      }
    }
    if (local > 0 && remote > local) {
      h->cross_numa_gbs = h->numa_gbs * local / remote;
      source += source.empty() ? "hwloc distances" : " + distances";
    }
    hwloc_distances_release(topo, dist);
  }
  if (!source.empty()) h->bw_source = source;
}

}  // namespace

bool discover_hwloc(HostTopo* out, std::string* why) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    *why = "hwloc_topology_init failed";
    return false;
  }
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    *why = std::string("hwloc_topology_load failed: ") + std::strerror(errno);
    hwloc_topology_destroy(topo);
    return false;
  }
  HostTopo h;
  h.name = host_name();
  h.source = "hwloc";
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PACKAGE, o)) != nullptr;)
    h.packages.push_back({static_cast<int>(o->os_index), from_bitmap(o->cpuset)});
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, o)) != nullptr;) {
    TopoNuma n;
    n.id = static_cast<int>(o->os_index);
    n.cpus = from_bitmap(o->cpuset);
    n.memory_mb = o->attr->numanode.local_memory >> 20;
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, o);
    if (pkg == nullptr && o->cpuset != nullptr) {
      hwloc_obj_t first_pu = hwloc_get_obj_inside_cpuset_by_type(topo, o->cpuset, HWLOC_OBJ_PU, 0);
      if (first_pu != nullptr) pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, first_pu);
    }
    n.package = pkg != nullptr ? static_cast<int>(pkg->os_index) : -1;
    h.numa.push_back(std::move(n));
  }
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_CORE, o)) != nullptr;)
    h.cores.push_back({from_bitmap(o->cpuset)});
  for (hwloc_obj_type_t t : {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L4CACHE,
                             HWLOC_OBJ_L5CACHE, HWLOC_OBJ_L1ICACHE, HWLOC_OBJ_L2ICACHE, HWLOC_OBJ_L3ICACHE}) {
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo, t, o)) != nullptr;) {
      TopoCache c;
      c.level = static_cast<int>(o->attr->cache.depth);
      c.kind = o->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION ? "instruction"
               : o->attr->cache.type == HWLOC_OBJ_CACHE_DATA      ? "data"
                                                                  : "unified";
      c.size_kb = o->attr->cache.size >> 10;
      c.cpus = from_bitmap(o->cpuset);
      h.caches.push_back(std::move(c));
    }
  }
  // PCI devices that matter to communication: GPUs (display/3D controllers)
  // and NICs (network controllers, InfiniBand), named after their OS devices.
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_pcidev(topo, o)) != nullptr;) {
    const unsigned base = o->attr->pcidev.class_id >> 8;
    const bool gpu = base == 0x03 || o->attr->pcidev.class_id == 0x1200;  // display, processing accelerator
    const bool nic = base == 0x02 || o->attr->pcidev.class_id == 0x0c06;  // network, InfiniBand
    if (!gpu && !nic) continue;
    TopoPci p;
    p.kind = gpu ? TopoPci::Kind::kGpu : TopoPci::Kind::kNic;
    p.busid = busid_of(o);
    p.pci_class = static_cast<uint32_t>(o->attr->pcidev.class_id) << 8;
    p.numa = io_numa(topo, o);
    for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || c->name == nullptr) continue;
      const auto t = c->attr->osdev.type;
      if (nic && (t == HWLOC_OBJ_OSDEV_NETWORK || (p.name.empty() && t == HWLOC_OBJ_OSDEV_OPENFABRICS))) {
        p.name = c->name;
        if (t == HWLOC_OBJ_OSDEV_NETWORK) break;
      }
    }
    if (nic && !p.name.empty()) p.speed_gbs = nic_speed_gbs(p.name);
    if (gpu) p.gpu_dev = h.gpu_count();
    h.pci.push_back(std::move(p));
  }
  hwloc_bandwidths(topo, &h);
  hwloc_topology_destroy(topo);
  if (h.numa.empty()) {
    *why = "hwloc found no NUMA node";
    return false;
  }
  *out = std::move(h);
  return true;
}

#else

bool discover_hwloc(HostTopo*, std::string* why) {
  *why = "this build has no hwloc (meson -Dhwloc=enabled needs libhwloc-dev)";
  return false;
}

#endif

const HostTopo& local_host_topo() {
  static std::once_flag once;
  static HostTopo host;
  std::call_once(once, [] {
    std::string why;
    if (discover_hwloc(&host, &why)) {
      MC_INFO(kGraph, "topology of %s from %s: %zu package(s), %zu NUMA node(s), %zu core(s), %zu PCI device(s)",
              host.name.c_str(), host.source.c_str(), host.packages.size(), host.numa.size(), host.cores.size(),
              host.pci.size());
    } else {
      host = discover_fallback();
      MC_INFO(kGraph | kInit,
              "topology of %s without hwloc (%s): one NUMA node, %zu CPU(s) from sysconf/sched_getaffinity",
              host.name.c_str(), why.c_str(), host.cores.size());
    }
  });
  return host;
}

std::string interface_of(const sockaddr_storage& addr) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != addr.ss_family || i->ifa_name == nullptr) continue;
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      const auto* b = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (a->sin_addr.s_addr == b->sin_addr.s_addr) name = i->ifa_name;
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      const auto* b = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(in6_addr)) == 0) name = i->ifa_name;
    }
  }
  freeifaddrs(list);
  return name;
}

double nic_speed_gbs(const std::string& ifname) {
  if (ifname.empty() || ifname.size() >= IFNAMSIZ) return 0;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  ethtool_cmd cmd{};
  cmd.cmd = ETHTOOL_GSET;
  ifreq req{};
  std::memcpy(req.ifr_name, ifname.c_str(), ifname.size());
  req.ifr_data = reinterpret_cast<char*>(&cmd);
  double gbs = 0;
  if (ioctl(fd, SIOCETHTOOL, &req) == 0) {
    const uint32_t mbps = ethtool_cmd_speed(&cmd);
    if (mbps != 0 && mbps != static_cast<uint32_t>(SPEED_UNKNOWN)) gbs = mbps / 8000.0;
  }
  close(fd);
  return gbs;
}

}  // namespace meshccl
