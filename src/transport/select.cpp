#include "transport/select.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "meshccl/transport.h"
#include "transport/registry.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

using Record = TransportRecord;

std::string text_of(const char (&field)[Record::kNameBytes]) {
  return std::string(field, strnlen(field, sizeof field));
}

// The entry of a transport in a record, or nullptr.
const Record::Entry* entry_of(const Record& r, const std::string& name) {
  for (const Record::Entry& e : r.have) {
    if (e.name[0] == '\0') break;
    if (text_of(e.name) == name) return &e;
  }
  return nullptr;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const char* request_source(const PeerInfo& p) {
  return p.transports.request_kind == Record::kEveryPair ? "MESHCCL_TRANSPORT" : "NCCL_NET/ncclConfig_t.netName";
}

bool same_host(const PeerInfo& a, const PeerInfo& b) {
  return a.machine_hash == b.machine_hash && a.host_hash == b.host_hash;
}

// The request's fields from what was asked for: a name that cannot be a
// transport's is kept (cut to the field, unprintable bytes as '?') with the
// reason, so that every rank refuses it alike.
void set_request(const std::string& want, uint8_t kind, Record* r) {
  r->request_kind = want.empty() ? Record::kAutomatic : kind;
  if (want.empty()) return;
  r->request_problem = want.size() >= Record::kNameBytes ? Record::kNameTooLong
                       : transport_name_ok(want)         ? Record::kNameOk
                                                         : Record::kNameBadChars;
  for (size_t i = 0; i < want.size() && i + 1 < Record::kNameBytes; ++i)
    r->request[i] = want[i] >= 0x20 && want[i] < 0x7f ? want[i] : '?';
}

void set_entry(Record::Entry* e, const std::string& name, int scope, int preference) {
  std::memset(e, 0, sizeof(*e));
  std::memcpy(e->name, name.data(), std::min(name.size(), sizeof(e->name) - 1));
  e->scope = static_cast<uint8_t>(scope);
  e->preference = static_cast<uint8_t>(std::min(preference, 255));
}

// This rank's record once it loaded what it may use between hosts: the
// transport it was asked for, or else every plugin it found. A plugin found
// but not asked for stays listed unloaded (scope 0; it only shows in
// messages); one that does not load leaves the list.
Record loaded_record(const PeerInfo& me) {
  const Record& was = me.transports;
  const std::string want = text_of(was.request);
  Record r = was;
  std::memset(r.have, 0, sizeof(r.have));
  size_t n = 0;
  for (const Record::Entry& e : was.have) {
    if (e.name[0] == '\0') break;
    const std::string name = text_of(e.name);
    int scope = e.scope;
    if (scope == 0 && (was.request_kind == Record::kAutomatic || name == want)) {
      const meshccl_transport_v1_t* api = nullptr;
      std::string why;
      if (!load_transport(name, &api, &why)) continue;
      scope = transport_scope(name);
    }
    set_entry(&r.have[n++], name, scope, e.preference);
  }
  return r;
}

}  // namespace

Status fill_transport_request(const std::string& net_name, PeerInfo* me) {
  Record& r = me->transports;
  std::memset(&r, 0, sizeof(r));
  const std::string forced = lower(param_str(Param::Transport));
  const std::string net = lower(!net_name.empty() ? net_name : param_str(Param::Net));
  if (!forced.empty()) set_request(forced, Record::kEveryPair, &r);
  else set_request(net, Record::kBetweenHosts, &r);
  const std::string want = text_of(r.request);
  // Built-in ones first, then plugins by preference; the one asked for is
  // kept when there are more than a record holds.
  std::vector<TransportInfo> all = transport_list();
  for (const TransportInfo& t : all)
    if (t.builtin && !t.problem.empty())
      return MC_ERROR(ncclInvalidUsage, "%s (a built-in transport: check its settings)", t.problem.c_str());
  size_t room = Record::kEntries;
  for (const TransportInfo& t : all) room -= t.builtin || t.name == want ? 1 : 0;
  size_t n = 0;
  for (const TransportInfo& t : all) {
    if (!t.builtin && t.name != want) {
      if (room == 0) continue;
      --room;
    }
    set_entry(&r.have[n++], t.name, t.builtin ? t.scope : 0, t.preference);
  }
  return kOk;
}

bool needs_network(const std::vector<PeerInfo>& peers) {
  if (peers.size() < 2) return false;
  const PeerInfo& first = peers[0];
  if (first.transports.request_kind == Record::kEveryPair) {
    const Record::Entry* e = entry_of(first.transports, text_of(first.transports.request));
    return e == nullptr || e->scope != MESHCCL_SCOPE_HOST;
  }
  if (param_int(Param::ShmDisable) != 0) return true;
  return std::any_of(peers.begin(), peers.end(), [&](const PeerInfo& p) { return !same_host(p, first); });
}

Status agree_on_networks(Bootstrap& bs, std::vector<PeerInfo>* peers) {
  if (!needs_network(*peers)) return kOk;
  std::vector<Record> records(peers->size());
  records[bs.rank()] = loaded_record((*peers)[bs.rank()]);
  MC_TRY(bs.allgather(records.data(), sizeof(Record)));
  for (size_t r = 0; r < peers->size(); ++r) {
    std::string why;
    if (!check_transport_record(records[r], &why))
      return MC_ERROR(ncclRemoteError, "rank %zu sent a malformed transport record: %s", r, why.c_str());
    (*peers)[r].transports = records[r];
  }
  return kOk;
}

Status transport_request(const std::string& net_name, Record* out) {
  PeerInfo p{};
  MC_TRY(fill_transport_request(net_name, &p));
  *out = p.transports;
  return kOk;
}

Status apply_transport_request(const Record& req, int from, PeerInfo* p) {
  std::string why;
  if (!check_transport_record(req, &why))
    return MC_ERROR(ncclRemoteError, "rank %d sent a malformed transport record: %s", from, why.c_str());
  p->transports = req;
  return kOk;
}

std::string transports_of(const PeerInfo& p) {
  std::string s;
  for (const Record::Entry& e : p.transports.have) {
    if (e.name[0] == '\0') break;
    s += (s.empty() ? "" : ", ") + text_of(e.name);
  }
  return s.empty() ? "none" : s;
}

Status check_transport_request(const std::vector<PeerInfo>& peers, int me) {
  const PeerInfo& first = peers[0];
  const Record& want = first.transports;
  for (const PeerInfo& p : peers) {
    const Record& r = p.transports;
    if (r.request_kind != want.request_kind || text_of(r.request) != text_of(want.request))
      return MC_ERROR(
          ncclInvalidUsage, "ranks ask for different transports: rank 0 (%s) %s=\"%s\", rank %d (%s) %s=\"%s\"",
          first.host_id, want.request_kind ? request_source(first) : "automatic", text_of(want.request).c_str(), p.rank,
          p.host_id, r.request_kind ? request_source(p) : "automatic", text_of(r.request).c_str());
  }
  if (want.request_kind == Record::kAutomatic) return kOk;
  const std::string name = text_of(want.request);
  if (want.request_problem == Record::kNameTooLong)
    return MC_ERROR(ncclInvalidUsage,
                    "%s names a transport \"%s...\" longer than any transport name (at most %zu "
                    "characters)",
                    request_source(first), name.c_str(), Record::kNameBytes - 1);
  if (want.request_problem != Record::kNameOk)
    return MC_ERROR(ncclInvalidUsage, "%s=\"%s\" is not a transport name (1 to %zu of a-z, 0-9, '_' and '-')",
                    request_source(first), name.c_str(), Record::kNameBytes - 1);
  const Record::Entry* declared = entry_of(want, name);
  if (want.request_kind == Record::kBetweenHosts && declared != nullptr && declared->scope == MESHCCL_SCOPE_HOST)
    return MC_ERROR(ncclInvalidUsage,
                    "NCCL_NET/netName=%s: %s is not a network transport (its scope is one machine); use "
                    "MESHCCL_TRANSPORT=%s",
                    name.c_str(), name.c_str(), name.c_str());
  // Loaded (scope known) when a pair needs a network transport, else found.
  const bool loaded = needs_network(peers);
  for (const PeerInfo& p : peers) {
    const Record::Entry* e = entry_of(p.transports, name);
    if (e != nullptr && (!loaded || e->scope != 0)) continue;
    if (p.rank == me) {
      const meshccl_transport_v1_t* api = nullptr;
      std::string why = "it does not load";
      if (!loaded) transport_exists(name, &why);
      else load_transport(name, &api, &why);  // what it said (a failed dlopen is remembered)
      return MC_ERROR(ncclInvalidUsage, "%s=%s is not available on rank %d (%s): %s; available there: %s",
                      request_source(p), name.c_str(), p.rank, p.host_id, why.c_str(), transports_of(p).c_str());
    }
    return MC_ERROR(ncclInvalidUsage, "%s=%s is not available on rank %d (%s); available there: %s", request_source(p),
                    name.c_str(), p.rank, p.host_id, transports_of(p).c_str());
  }
  return kOk;
}

int pair_scope(const std::vector<PeerInfo>& peers, int a, int b, const std::string& name) {
  const Record::Entry* ea = entry_of(peers[a].transports, name);
  const Record::Entry* eb = entry_of(peers[b].transports, name);
  if (ea == nullptr || eb == nullptr || ea->scope == 0 || eb->scope == 0) return 0;
  return ea->scope == MESHCCL_SCOPE_HOST || eb->scope == MESHCCL_SCOPE_HOST ? MESHCCL_SCOPE_HOST
                                                                            : MESHCCL_SCOPE_NETWORK;
}

bool scope_allows(int scope, const PeerInfo& a, const PeerInfo& b) {
  return scope == MESHCCL_SCOPE_NETWORK || (scope == MESHCCL_SCOPE_HOST && a.machine_hash == b.machine_hash);
}

std::string choose_transport(const std::vector<PeerInfo>& peers, int a, int b) {
  const PeerInfo& pa = peers[a];
  const PeerInfo& pb = peers[b];
  if (pa.transports.request_kind == Record::kEveryPair) return text_of(pa.transports.request);
  // The transport of that scope both have, may connect them, and the lower
  // rank prefers (its earlier entry on a tie).
  const int lo = std::min(a, b);
  auto preferred = [&](int scope) -> std::string {
    const Record::Entry* pick = nullptr;
    for (const Record::Entry& e : peers[lo].transports.have) {
      if (e.name[0] == '\0') break;
      if (pair_scope(peers, a, b, text_of(e.name)) != scope || !scope_allows(scope, pa, pb)) continue;
      if (pick == nullptr || e.preference < pick->preference) pick = &e;
    }
    return pick != nullptr ? text_of(pick->name) : "";
  };
  if (same_host(pa, pb) && param_int(Param::ShmDisable) == 0) {
    std::string local = preferred(MESHCCL_SCOPE_HOST);
    if (!local.empty()) return local;
  }
  if (pa.transports.request_kind == Record::kBetweenHosts) return text_of(pa.transports.request);
  return preferred(MESHCCL_SCOPE_NETWORK);
}

bool node_local(const std::vector<PeerInfo>& peers, int a, int b) {
  const std::string name = choose_transport(peers, a, b);
  return !name.empty() && pair_scope(peers, a, b, name) == MESHCCL_SCOPE_HOST;
}

}  // namespace meshccl
