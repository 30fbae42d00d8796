#include "bootstrap/identity.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "meshccl/transport.h"
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

bool transport_name_ok(const std::string& name) {
  if (name.empty() || name.size() >= TransportRecord::kNameBytes) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; });
}

namespace {

// The text of a fixed-size name field: false when it has no NUL in it.
bool field_text(const char (&field)[TransportRecord::kNameBytes], std::string* out) {
  const void* nul = std::memchr(field, '\0', sizeof(field));
  if (nul == nullptr) return false;
  out->assign(field, static_cast<const char*>(nul));
  return true;
}

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  return std::all_of(b, b + n, [](unsigned char c) { return c == 0; });
}

}  // namespace

bool check_transport_record(const TransportRecord& r, std::string* why) {
  std::vector<std::string> names;
  bool ended = false;
  for (size_t i = 0; i < TransportRecord::kEntries; ++i) {
    const TransportRecord::Entry& e = r.have[i];
    std::string name;
    if (!field_text(e.name, &name)) {
      *why = "transport " + std::to_string(i) + " has no end to its name";
      return false;
    }
    if (ended || name.empty()) {
      ended = true;
      if (!all_zero(&e, sizeof(e))) {
        *why = "transport " + std::to_string(i) + " follows the end of the list";
        return false;
      }
      continue;
    }
    if (!transport_name_ok(name)) {
      *why = "transport " + std::to_string(i) + " is named \"" + name + "\", not a transport name";
      return false;
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      *why = "transport \"" + name + "\" is listed twice";
      return false;
    }
    if (e.scope != 0 && e.scope != MESHCCL_SCOPE_HOST && e.scope != MESHCCL_SCOPE_NETWORK) {
      *why = "transport \"" + name + "\" has scope " + std::to_string(e.scope) + ", not one transport.h defines";
      return false;
    }
    names.push_back(name);
  }
  std::string request;
  if (!field_text(r.request, &request)) {
    *why = "the requested transport has no end to its name";
    return false;
  }
  if (!std::all_of(request.begin(), request.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) {
    *why = "the requested transport's name has characters that are not printable";
    return false;
  }
  if (r.request_kind > TransportRecord::kBetweenHosts || r.request_problem > TransportRecord::kNameBadChars) {
    *why = "the request's kind (" + std::to_string(r.request_kind) + ") or problem (" +
           std::to_string(r.request_problem) + ") is out of range";
    return false;
  }
  const bool automatic = r.request_kind == TransportRecord::kAutomatic;
  if (automatic != request.empty() || (automatic && r.request_problem != TransportRecord::kNameOk)) {
    *why = "the request's kind does not match its name \"" + request + "\"";
    return false;
  }
  if (!automatic && r.request_problem == TransportRecord::kNameOk && !transport_name_ok(request)) {
    *why = "the requested transport \"" + request + "\" is not a transport name";
    return false;
  }
  return true;
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
