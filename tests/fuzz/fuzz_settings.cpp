// libFuzzer: settings are bytes from the environment. The first byte picks a
// setting, the rest is its value: integers (MESHCCL_TIMEOUT and others),
// numbers, and MESHCCL_SOCKET_IFNAME matched against a fixed interface list.
#include <arpa/inet.h>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "plugins/common/socket_iface.h"
#include "util/param.h"

namespace {
std::vector<meshccl::plugin::socket::Iface> fake_ifaces() {
  using meshccl::plugin::socket::Iface;
  std::vector<Iface> all;
  const char* names[] = {"lo", "eth0", "eth1", "docker0", "ib0"};
  for (int i = 0; i < 5; ++i) {
    Iface f;
    f.name = names[i];
    f.family = i == 4 ? AF_INET6 : AF_INET;
    f.up = i != 2;
    f.loopback = i == 0;
    f.addr.ss_family = static_cast<sa_family_t>(f.family);
    f.addr_len = f.family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    all.push_back(f);
  }
  return all;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshccl;
  static const std::vector<plugin::socket::Iface> ifaces = fake_ifaces();
  if (size < 1) return 0;
  std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  value = value.substr(0, value.find('\0'));
  const int pick = data[0] % 4;
  if (pick == 0) {
    int i = plugin::socket::pick_iface(ifaces, value.c_str(), data[0] & 0x10 ? AF_INET : AF_UNSPEC);
    if (i < -1 || i >= static_cast<int>(ifaces.size())) __builtin_trap();
    return 0;
  }
  static const Param ints[] = {Param::Timeout, Param::ChunkSize, Param::ShmBuffsize};
  const Param p = pick == 3 ? Param::TuneShmBwGbs : ints[pick - 1];
  setenv(param_info(p).name, value.c_str(), 1);
  param_refresh();
  if (p == Param::Timeout && param_int(p) <= 0) __builtin_trap();  // never "wait forever"
  if (pick == 3) (void)param_double(p, 0);
  else (void)param_int(p);
  unsetenv(param_info(p).name);
  return 0;
}
