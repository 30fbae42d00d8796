#include "bootstrap/identity.h"

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
  struct stat st{};
  if (stat("/proc/self/ns/pid", &st) == 0) key += "|" + std::to_string(st.st_ino);
  return key;
}
}  // namespace

PeerInfo local_peer_info() {
  PeerInfo info;
  std::memset(&info, 0, sizeof(info));
  info.pid = static_cast<int32_t>(getpid());
  info.cuda_dev = -1;
  if (param_int(Param::Checks) != 0) info.flags |= kPeerChecks;
  std::string mk = machine_key();
  info.machine_hash = hash64(mk.data(), mk.size());
  std::string hostid = param_str(Param::HostId);
  if (hostid.empty()) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    hostid = host;
    info.host_hash = info.machine_hash;  // one real host
  } else {
    info.host_hash = hash64(hostid.data(), hostid.size(), 0x51ed);
  }
  std::strncpy(info.host_id, hostid.c_str(), sizeof(info.host_id) - 1);
  return info;
}

}  // namespace meshccl
