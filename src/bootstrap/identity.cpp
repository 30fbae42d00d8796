#include "bootstrap/identity.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "util/param.h"

namespace meshccl {

uint64_t hash64(const void* data, size_t size, uint64_t seed) {
  // FNV-1a then a final mix: stable across processes and builds.
  uint64_t h = 1469598103934665603ull ^ seed;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

namespace {
std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string machine_key() {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  std::string key = host;
  key += "|" + read_first_line("/proc/sys/kernel/random/boot_id");
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) == 0) key += "|" + std::to_string(st.st_ino);
  return key;
}

// The network namespace this process runs in: hosts emulated with namespaces
// (scripts/cluster, meshrun --cluster) are different hosts with no setting.
// Returns "" when it cannot be told (no /proc): then one machine is one host.
struct NetNs {
  std::string key;   // inode and device of the namespace
  std::string name;  // its `ip netns` name, or "" for the machine's own namespace
};

NetNs net_namespace() {
  NetNs ns;
  struct stat self {};
  if (stat("/proc/self/ns/net", &self) != 0) return ns;
  ns.key = std::to_string(self.st_dev) + ":" + std::to_string(self.st_ino);
  struct stat init {};
  if (stat("/proc/1/ns/net", &init) == 0 && init.st_ino == self.st_ino && init.st_dev == self.st_dev) return ns;
  // A named namespace (`ip netns add`) is a bind mount of the same inode.
  if (DIR* d = opendir("/run/netns")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::string path = std::string("/run/netns/") + e->d_name;
      struct stat st {};
      if (stat(path.c_str(), &st) == 0 && st.st_ino == self.st_ino && st.st_dev == self.st_dev) {
        ns.name = e->d_name;
        break;
      }
    }
    closedir(d);
  }
  if (ns.name.empty()) ns.name = "netns" + std::to_string(self.st_ino);
  return ns;
}
}  // namespace

PeerInfo local_peer_info() {
  PeerInfo info;
  std::memset(&info, 0, sizeof(info));
  info.pid = static_cast<int32_t>(getpid());
  info.cuda_dev = -1;
  if (param_int(Param::Checks) != 0) info.flags |= kPeerChecks;
  if (param_int(Param::Priority) == 0) info.flags |= kPeerFifo;
  std::string mk = machine_key();
  info.machine_hash = hash64(mk.data(), mk.size());
  std::string hostid = param_str(Param::HostId);
  if (hostid.empty()) {
    // One host = one kernel, pid namespace and network namespace.
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    hostid = host;
    NetNs ns = net_namespace();
    if (!ns.name.empty()) hostid += ":" + ns.name;
    std::string hk = mk + "|net " + ns.key;
    info.host_hash = hash64(hk.data(), hk.size());
  } else {
    info.host_hash = hash64(hostid.data(), hostid.size(), 0x51ed);
  }
  std::strncpy(info.host_id, hostid.c_str(), sizeof(info.host_id) - 1);
  return info;
}

}  // namespace meshccl
