#include "hosts.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#if MESHRUN_HWLOC
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#endif

namespace meshrun {

namespace {

bool netns_exists(const std::string& name) {
  struct stat st {};
  return ::stat((std::string(kNetnsDir) + "/" + name).c_str(), &st) == 0;
}

std::string cluster_host(const std::string& cluster, int i) { return "mcc-" + cluster + "-h" + std::to_string(i); }

}  // namespace

std::string resolve_hosts(const Options& opt, std::vector<std::string>* names) {
  names->clear();
  if (opt.cluster.empty()) {
    for (const auto& h : opt.hosts) {
      if (!netns_exists(h))
        return "no network namespace '" + h + "' (" + kNetnsDir + "/" + h + "; see 'ip netns list')";
      names->push_back(h);
    }
    return "";
  }
  const std::string prefix = "mcc-" + opt.cluster + "-";
  if (!netns_exists(cluster_host(opt.cluster, 0)))
    return "cluster '" + opt.cluster + "' is not up (no network namespace " + cluster_host(opt.cluster, 0) +
           "; scripts/cluster up --name " + opt.cluster + " --hosts N)";
  if (opt.hosts.empty()) {
    for (int i = 0; i < kMaxRanks && netns_exists(cluster_host(opt.cluster, i)); ++i)
      names->push_back(cluster_host(opt.cluster, i));
    return "";
  }
  for (const auto& h : opt.hosts) {
    std::string full = h.rfind(prefix, 0) == 0 ? h : prefix + h;
    if (!netns_exists(full)) return "cluster '" + opt.cluster + "' has no host '" + h + "' (no " + full + ")";
    names->push_back(full);
  }
  return "";
}

std::string open_namespaces(const std::vector<std::string>& names, std::vector<int>* fds) {
  for (const auto& n : names) {
    std::string path = std::string(kNetnsDir) + "/" + n;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
    fds->push_back(fd);
  }
  return "";
}

int enter_netns(int fd, const char** step) {
  *step = "setns(CLONE_NEWNET)";
  if (::setns(fd, CLONE_NEWNET) != 0) return errno;
  // The rest only makes /sys match the namespace (hwloc and others read
  // network devices there); the rank runs correctly without it, so a failure
  // leaves the machine's /sys in place. A fresh sysfs mounted over /sys in a
  // private mount namespace (propagation off) shows the current network
  // namespace's devices.
  if (::unshare(CLONE_NEWNS) != 0) return 0;
  if (::mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0) return 0;
  struct statvfs sv {};
  unsigned long flags = (::statvfs("/sys", &sv) == 0 && (sv.f_flag & ST_RDONLY)) ? MS_RDONLY : 0;
  (void)::mount("sysfs", "/sys", "sysfs", flags, nullptr);
  return 0;
}

#if MESHRUN_HWLOC
std::string compute_bindings(Bind how, const std::vector<Placement>& placement, std::vector<Binding>* out) {
  out->clear();
  if (how == Bind::None) return "";
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return "hwloc: cannot initialise a topology";
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return "hwloc: cannot discover this machine's topology";
  }
  hwloc_obj_type_t type = how == Bind::Core ? HWLOC_OBJ_CORE : HWLOC_OBJ_NUMANODE;
  int nobj = hwloc_get_nbobjs_by_type(topo, type);
  if (nobj <= 0 && type == HWLOC_OBJ_CORE) {  // some virtual machines show no cores
    type = HWLOC_OBJ_PU;
    nobj = hwloc_get_nbobjs_by_type(topo, type);
  }
  std::string err;
  if (nobj <= 0) err = "hwloc finds no cores or NUMA nodes to bind to";
  int nslots = static_cast<int>(placement.size());
  for (size_t r = 0; r < placement.size() && err.empty(); ++r) {
    int slot = placement[r].slot;
    int index = how == Bind::Core ? slot % nobj : static_cast<int>(static_cast<long>(slot) * nobj / nslots);
    hwloc_obj_t obj = hwloc_get_obj_by_type(topo, type, static_cast<unsigned>(index));
    if (obj == nullptr || obj->cpuset == nullptr) {
      err = "hwloc: no object " + std::to_string(index) + " to bind rank " + std::to_string(r) + " to";
      break;
    }
    Binding b{};
    CPU_ZERO(&b.cpus);
    if (hwloc_cpuset_to_glibc_sched_affinity(topo, obj->cpuset, &b.cpus, sizeof b.cpus) != 0) {
      err = "hwloc: cannot convert the cpu set of rank " + std::to_string(r);
      break;
    }
    char* list = nullptr;
    hwloc_bitmap_list_asprintf(&list, obj->cpuset);
    b.where = std::string(how == Bind::Core ? (type == HWLOC_OBJ_PU ? "cpu " : "core ") : "NUMA node ") +
              std::to_string(index) + " (cpus " + (list ? list : "?") + ")";
    std::free(list);
    out->push_back(b);
  }
  hwloc_topology_destroy(topo);
  return err;
}
#else
std::string compute_bindings(Bind how, const std::vector<Placement>&, std::vector<Binding>* out) {
  out->clear();
  if (how == Bind::None) return "";
  return "--bind needs hwloc, and this meshrun was built without it (meson -Dhwloc)";
}
#endif

}  // namespace meshrun
