#include "hostload.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace perf {

namespace {

// Bytes of headers a packet carries in the device's tx_bytes: Ethernet 14,
// IPv4 20, TCP 20 with the timestamp option 12 (Linux's default). With GSO
// one packet is one super-packet of one set of headers, as tx_packets counts
// it, so tx_bytes - 66 tx_packets is the TCP payload, retransmissions
// included (and the few bytes of ARP and of bare ACKs' options: none).
constexpr double kHeaderBytes = 66;

bool ReadCounter(const std::string& dev, const char* name, double* v) {
  const std::string path = "/sys/class/net/" + dev + "/statistics/" + name;
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    std::printf("# MESHCCL_PERF_NETDEV: cannot read %s\n", path.c_str());
    return false;
  }
  unsigned long long x = 0;
  const bool ok = std::fscanf(f, "%llu", &x) == 1;
  std::fclose(f);
  if (!ok) std::printf("# MESHCCL_PERF_NETDEV: %s holds no number\n", path.c_str());
  *v = static_cast<double>(x);
  return ok;
}

}  // namespace

const std::string& NetDev() {
  static const std::string dev = [] {
    const char* e = std::getenv("MESHCCL_PERF_NETDEV");
    return std::string(e != nullptr && std::strchr(e, '/') == nullptr ? e : "");
  }();
  return dev;
}

bool SampleHostLoad(bool count_net, HostLoad* out) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  out->cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  out->tcp_payload = 0;
  if (!count_net) return true;
  double bytes = 0, packets = 0;
  if (!ReadCounter(NetDev(), "tx_bytes", &bytes) || !ReadCounter(NetDev(), "tx_packets", &packets)) return false;
  out->tcp_payload = bytes - kHeaderBytes * packets;
  return true;
}

}  // namespace perf
