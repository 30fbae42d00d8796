#include "transport/select.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "transport/registry.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

constexpr int kNets = static_cast<int>(std::size(kNetOrder));
constexpr uint32_t kRequestHere = 1u << 31;

// Which of kNetOrder this process has: found on the search path before the
// exchange (nothing is loaded), loaded after it when needed.
uint32_t found_nets() {
  uint32_t bits = 0;
  std::string why;
  for (int i = 0; i < kNets; ++i)
    if (transport_exists(kNetOrder[i], &why)) bits |= 1u << i;
  return bits;
}

// Loads what this rank may use between hosts: the transport it was asked
// for, or else every network transport it found. A transport found but not
// asked for keeps its bit unloaded (it only shows in messages).
uint32_t loaded_nets(const PeerInfo& me) {
  const meshccl_transport_v1_t* api = nullptr;
  std::string why;
  uint32_t bits = 0;
  for (int i = 0; i < kNets; ++i) {
    if ((me.nets & (1u << i)) == 0) continue;
    const bool use = me.transport_scope == 0 || std::strcmp(me.transport, kNetOrder[i]) == 0;
    if (!use || load_transport(kNetOrder[i], &api, &why)) bits |= 1u << i;
  }
  if (me.transport_scope != 0 && load_transport(me.transport, &api, &why)) bits |= kRequestHere;
  return bits;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const char* request_source(const PeerInfo& p) {
  return p.transport_scope == 1 ? "MESHCCL_TRANSPORT" : "NCCL_NET/ncclConfig_t.netName";
}

bool same_host(const PeerInfo& a, const PeerInfo& b) {
  return a.machine_hash == b.machine_hash && a.host_hash == b.host_hash;
}

}  // namespace

void fill_transport_request(const std::string& net_name, PeerInfo* me) {
  me->nets = found_nets();
  std::string forced = lower(param_str(Param::Transport));
  std::string net = lower(!net_name.empty() ? net_name : param_str(Param::Net));
  me->transport_scope = !forced.empty() ? 1 : !net.empty() ? 2 : 0;
  const std::string& want = !forced.empty() ? forced : net;
  std::memset(me->transport, 0, sizeof(me->transport));
  std::strncpy(me->transport, want.c_str(), sizeof(me->transport) - 1);
  std::string why;
  if (!want.empty() && want.size() < sizeof(me->transport) && transport_exists(want, &why)) me->nets |= kRequestHere;
}

bool needs_network(const std::vector<PeerInfo>& peers) {
  if (peers.size() < 2) return false;
  const PeerInfo& first = peers[0];
  if (first.transport_scope == 1) return std::strcmp(first.transport, "shm") != 0;
  if (param_int(Param::ShmDisable) != 0) return true;
  return std::any_of(peers.begin(), peers.end(), [&](const PeerInfo& p) { return !same_host(p, first); });
}

Status agree_on_networks(Bootstrap& bs, std::vector<PeerInfo>* peers) {
  if (!needs_network(*peers)) return kOk;
  std::vector<uint32_t> nets(peers->size());
  nets[bs.rank()] = loaded_nets((*peers)[bs.rank()]);
  MC_TRY(bs.allgather(nets.data(), sizeof(uint32_t)));
  for (size_t r = 0; r < peers->size(); ++r) (*peers)[r].nets = nets[r];
  return kOk;
}

TransportRequest transport_request(const std::string& net_name) {
  PeerInfo p{};
  fill_transport_request(net_name, &p);
  TransportRequest r{};
  r.nets = p.nets;
  r.scope = p.transport_scope;
  static_assert(sizeof(r.transport) == sizeof(p.transport));
  std::memcpy(r.transport, p.transport, sizeof(r.transport));
  return r;
}

void apply_transport_request(const TransportRequest& req, PeerInfo* p) {
  p->nets = req.nets;
  p->transport_scope = req.scope;
  std::memcpy(p->transport, req.transport, sizeof(p->transport));
  p->transport[sizeof(p->transport) - 1] = '\0';
}

std::string transports_of(const PeerInfo& p) {
  std::string s = "shm";
  for (int i = 0; i < kNets; ++i)
    if (p.nets & (1u << i)) s += std::string(", ") + kNetOrder[i];
  return s;
}

Status check_transport_request(const std::vector<PeerInfo>& peers, int me) {
  const PeerInfo& first = peers[0];
  for (const PeerInfo& p : peers) {
    if (p.transport_scope != first.transport_scope ||
        std::strncmp(p.transport, first.transport, sizeof(p.transport)) != 0)
      return MC_ERROR(ncclInvalidUsage,
                      "ranks ask for different transports: rank 0 (%s) %s=\"%s\", rank %d (%s) %s=\"%s\"",
                      first.host_id, first.transport_scope ? request_source(first) : "automatic", first.transport,
                      p.rank, p.host_id, p.transport_scope ? request_source(p) : "automatic", p.transport);
  }
  if (first.transport_scope == 0) return kOk;
  const std::string name = first.transport;
  if (name.size() >= sizeof(first.transport) - 1)
    return MC_ERROR(ncclInvalidUsage, "%s names a transport \"%s...\" longer than any known", request_source(first),
                    first.transport);
  if (name == "shm") {
    if (first.transport_scope == 2)
      return MC_ERROR(ncclInvalidUsage,
                      "NCCL_NET/netName=shm: shm is not a network transport; use MESHCCL_TRANSPORT=shm");
    return kOk;  // built in; Mesh::connect_all refuses pairs on different machines
  }
  for (const PeerInfo& p : peers) {
    if (p.nets & kRequestHere) continue;
    if (p.rank == me) {
      const meshccl_transport_v1_t* api = nullptr;
      std::string why;
      if (!needs_network(peers)) transport_exists(name, &why);
      else load_transport(name, &api, &why);  // what it said (remembered: nothing is loaded again)
      return MC_ERROR(ncclInvalidUsage, "%s=%s is not available on rank %d (%s): %s; available there: %s",
                      request_source(p), name.c_str(), p.rank, p.host_id, why.c_str(), transports_of(p).c_str());
    }
    return MC_ERROR(ncclInvalidUsage, "%s=%s is not available on rank %d (%s); available there: %s", request_source(p),
                    name.c_str(), p.rank, p.host_id, transports_of(p).c_str());
  }
  return kOk;
}

std::string choose_transport(const std::vector<PeerInfo>& peers, int a, int b) {
  const PeerInfo& pa = peers[a];
  const PeerInfo& pb = peers[b];
  if (pa.transport_scope == 1) return pa.transport;
  if (same_host(pa, pb) && param_int(Param::ShmDisable) == 0) return "shm";
  if (pa.transport_scope == 2) return pa.transport;
  const uint32_t both = pa.nets & pb.nets;
  for (int i = 0; i < kNets; ++i)
    if (both & (1u << i)) return kNetOrder[i];
  return "socket";  // built in everywhere
}

}  // namespace meshccl
