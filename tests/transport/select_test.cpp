// Transport selection: a pure function of the ranks' identities (unit cases
// over synthetic peers), and init failing on every rank when a transport
// that is asked for is missing (real communicators, ranks as threads).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "meshccl/transport.h"
#include "bootstrap/unique_id.h"
#include "transport/registry.h"
#include "transport/select.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {
namespace {

using Record = TransportRecord;

// A transport a synthetic rank has: its name, the scope it declared (0: found,
// not loaded) and its place in the rank's order of preference.
struct Has {
  const char* name;
  int scope;
  int preference;
};
constexpr int kNode = MESHCCL_SCOPE_HOST, kNet = MESHCCL_SCOPE_NETWORK;

// What a rank of this build has with these plugins loaded: each plugin
// before the built-in ones (shm, socket), in the order given.
std::vector<Has> with(std::initializer_list<const char*> plugins) {
  std::vector<Has> v = {{"shm", kNode, 0}, {"socket", kNet, 0}};
  int pref = 0;
  for (const char* p : plugins) v.push_back({p, kNet, pref++});
  v[0].preference = pref++;
  v[1].preference = pref;
  return v;
}

PeerInfo peer(int rank, uint64_t host, const std::vector<Has>& have, uint64_t machine = 0) {
  PeerInfo p;
  std::memset(&p, 0, sizeof(p));
  p.rank = rank;
  p.machine_hash = machine != 0 ? machine : host;
  p.host_hash = host;
  for (size_t i = 0; i < have.size(); ++i) {
    std::strncpy(p.transports.have[i].name, have[i].name, Record::kNameBytes - 1);
    p.transports.have[i].scope = static_cast<uint8_t>(have[i].scope);
    p.transports.have[i].preference = static_cast<uint8_t>(have[i].preference);
  }
  std::snprintf(p.host_id, sizeof(p.host_id), "host%llu", static_cast<unsigned long long>(host));
  return p;
}

void ask(std::vector<PeerInfo>& peers, uint8_t kind, const char* name) {
  for (PeerInfo& p : peers) {
    p.transports.request_kind = kind;
    std::memset(p.transports.request, 0, sizeof(p.transports.request));
    std::strncpy(p.transports.request, name, Record::kNameBytes - 1);
  }
}

class Select : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MESHCCL_SHM_DISABLE");
    param_refresh();
  }
};

TEST_F(Select, SameHostShmOtherHostsThePreferredCommonOne) {
  std::vector<PeerInfo> peers = {peer(0, 1, with({"ucx", "ofi"})), peer(1, 1, with({"ucx"})),
                                 peer(2, 2, with({"ucx", "ofi"})), peer(3, 3, with({"ofi"})), peer(4, 4, with({}))};
  EXPECT_EQ(choose_transport(peers, 0, 1), "shm");
  EXPECT_EQ(choose_transport(peers, 0, 2), "ucx");
  EXPECT_EQ(choose_transport(peers, 1, 2), "ucx");
  EXPECT_EQ(choose_transport(peers, 0, 3), "ofi");
  EXPECT_EQ(choose_transport(peers, 1, 3), "socket");  // no common plugin
  EXPECT_EQ(choose_transport(peers, 2, 4), "socket");
  for (int a = 0; a < 5; ++a) {
    for (int b = 0; b < 5; ++b) {
      if (a != b) { EXPECT_EQ(choose_transport(peers, a, b), choose_transport(peers, b, a)) << a << " " << b; }
    }
  }
  EXPECT_TRUE(node_local(peers, 0, 1));
  EXPECT_FALSE(node_local(peers, 0, 2));
  EXPECT_TRUE(check_transport_request(peers, 0).ok());
}

// The lower rank's order of preference decides, so both ends agree however
// their orders differ.
TEST_F(Select, TheLowerRanksPreferenceDecides) {
  std::vector<PeerInfo> peers = {peer(0, 1, with({"ofi", "ucx"})), peer(1, 2, with({"ucx", "ofi"})),
                                 peer(2, 3, with({"ofi", "ucx"}))};
  EXPECT_EQ(choose_transport(peers, 0, 1), "ofi");
  EXPECT_EQ(choose_transport(peers, 1, 0), "ofi");
  EXPECT_EQ(choose_transport(peers, 1, 2), "ucx");
  EXPECT_EQ(choose_transport(peers, 2, 1), "ucx");
  EXPECT_EQ(choose_transport(peers, 0, 2), "ofi");
  // A plugin comes before the built-in network transport, whatever the order
  // of the entries.
  std::vector<PeerInfo> two = {peer(0, 1, {{"socket", kNet, 1}, {"zeta", kNet, 0}}),
                               peer(1, 2, {{"socket", kNet, 1}, {"zeta", kNet, 0}})};
  EXPECT_EQ(choose_transport(two, 0, 1), "zeta");
}

// Plugins found but not loaded (scope 0) are never chosen: their scope is
// not known.
TEST_F(Select, AnUnloadedPluginIsNotChosen) {
  std::vector<PeerInfo> peers = {peer(0, 1, {{"shm", kNode, 2}, {"socket", kNet, 3}, {"ucx", 0, 0}}),
                                 peer(1, 2, {{"shm", kNode, 2}, {"socket", kNet, 3}, {"ucx", 0, 0}})};
  EXPECT_EQ(choose_transport(peers, 0, 1), "socket");
  EXPECT_EQ(pair_scope(peers, 0, 1, "ucx"), 0);
}

// A node-scope plugin is never picked between hosts, even when it is every
// rank's first choice; within a host it wins over shm.
TEST_F(Select, ANodeScopePluginIsNeverPickedBetweenHosts) {
  const std::vector<Has> have = {{"shm", kNode, 2}, {"socket", kNet, 3}, {"xpmem", kNode, 0}, {"ucx", kNet, 1}};
  std::vector<PeerInfo> peers = {peer(0, 1, have), peer(1, 1, have), peer(2, 2, have),
                                 peer(3, 3, have, /*machine=*/1)};  // another host on rank 0's machine
  EXPECT_EQ(choose_transport(peers, 0, 1), "xpmem");
  EXPECT_TRUE(node_local(peers, 0, 1));
  EXPECT_EQ(choose_transport(peers, 0, 2), "ucx");
  EXPECT_EQ(choose_transport(peers, 1, 2), "ucx");
  EXPECT_EQ(choose_transport(peers, 0, 3), "ucx");  // other host, same machine: the network
  EXPECT_FALSE(node_local(peers, 0, 2));
  // What scope allows: a node-scope transport only on one machine.
  EXPECT_TRUE(scope_allows(kNode, peers[0], peers[1]));
  EXPECT_TRUE(scope_allows(kNode, peers[0], peers[3]));
  EXPECT_FALSE(scope_allows(kNode, peers[0], peers[2]));
  EXPECT_TRUE(scope_allows(kNet, peers[0], peers[2]));
  EXPECT_FALSE(scope_allows(0, peers[0], peers[1]));
  // Either rank declaring node scope makes it node scope for the pair.
  peers[2].transports.have[3].scope = kNode;  // rank 2's ucx says node
  EXPECT_EQ(pair_scope(peers, 0, 2, "ucx"), kNode);
  EXPECT_EQ(choose_transport(peers, 0, 2), "socket");
  // Forced for every pair: chosen, and its scope refuses the pairs between
  // machines (Mesh::connect_all fails them).
  ask(peers, Record::kEveryPair, "xpmem");
  EXPECT_EQ(choose_transport(peers, 0, 2), "xpmem");
  EXPECT_FALSE(scope_allows(pair_scope(peers, 0, 2, "xpmem"), peers[0], peers[2]));
  // Asked for between hosts: refused on every rank, naming it.
  ask(peers, Record::kBetweenHosts, "xpmem");
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("xpmem is not a network transport"), std::string::npos) << last_error();
}

TEST_F(Select, ShmDisabledUsesTheNetworkOnOneHost) {
  setenv("MESHCCL_SHM_DISABLE", "1", 1);
  param_refresh();
  std::vector<PeerInfo> peers = {peer(0, 1, with({"ucx"})), peer(1, 1, with({"ucx"}))};
  EXPECT_EQ(choose_transport(peers, 0, 1), "ucx");
  EXPECT_FALSE(node_local(peers, 0, 1));
  EXPECT_TRUE(needs_network(peers));
  unsetenv("MESHCCL_SHM_DISABLE");
  param_refresh();
}

TEST_F(Select, ForcedForEveryPairOrOnlyBetweenHosts) {
  std::vector<PeerInfo> peers = {peer(0, 1, with({"ucx"})), peer(1, 1, with({"ucx"})), peer(2, 2, with({"ucx"}))};
  ask(peers, Record::kEveryPair, "socket");
  EXPECT_TRUE(check_transport_request(peers, 0).ok());
  EXPECT_EQ(choose_transport(peers, 0, 1), "socket");
  EXPECT_EQ(choose_transport(peers, 0, 2), "socket");
  EXPECT_FALSE(node_local(peers, 0, 1));
  ask(peers, Record::kBetweenHosts, "socket");  // NCCL_NET: shm stays within a host
  EXPECT_EQ(choose_transport(peers, 0, 1), "shm");
  EXPECT_EQ(choose_transport(peers, 1, 2), "socket");
}

// Whether a pair may need a network transport decides whether plugins load:
// MESHCCL_TRANSPORT naming a node-scope transport needs none, one whose
// scope is not known yet (a plugin not loaded) does.
TEST_F(Select, WhatNeedsTheNetwork) {
  std::vector<PeerInfo> one_host = {peer(0, 1, with({})), peer(1, 1, with({}))};
  EXPECT_FALSE(needs_network(one_host));
  ask(one_host, Record::kEveryPair, "shm");
  EXPECT_FALSE(needs_network(one_host));
  ask(one_host, Record::kEveryPair, "socket");
  EXPECT_TRUE(needs_network(one_host));
  ask(one_host, Record::kEveryPair, "nosuch");
  EXPECT_TRUE(needs_network(one_host));
  std::vector<PeerInfo> two_hosts = {peer(0, 1, with({})), peer(1, 2, with({}))};
  EXPECT_TRUE(needs_network(two_hosts));
}

// Ranks with nothing in common that reaches between them: no choice (the
// mesh then fails naming what each has).
TEST_F(Select, NothingInCommonChoosesNothing) {
  std::vector<PeerInfo> peers = {peer(0, 1, {{"shm", kNode, 1}, {"ucx", kNet, 0}}),
                                 peer(1, 2, {{"shm", kNode, 1}, {"ofi", kNet, 0}})};
  EXPECT_EQ(choose_transport(peers, 0, 1), "");
  EXPECT_FALSE(node_local(peers, 0, 1));
  EXPECT_EQ(transports_of(peers[1]), "shm, ofi");
}

TEST_F(Select, MissingOnOneRankFailsNamingTheRankAndWhatItHas) {
  std::vector<PeerInfo> peers = {peer(0, 1, with({"ucx"})), peer(1, 2, with({"ucx"})), peer(2, 3, with({}))};
  ask(peers, Record::kBetweenHosts, "ucx");
  Status s = check_transport_request(peers, 0);
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  std::string why = last_error();
  EXPECT_NE(why.find("NCCL_NET/ncclConfig_t.netName=ucx is not available on rank 2 (host3)"), std::string::npos) << why;
  EXPECT_NE(why.find("available there: shm, socket"), std::string::npos) << why;
  // Found but not loaded, where a pair needs the network, is missing too.
  peers[2] = peer(2, 3, {{"shm", kNode, 1}, {"socket", kNet, 2}, {"ucx", 0, 0}});
  peers[2].transports.request_kind = Record::kBetweenHosts;
  std::strcpy(peers[2].transports.request, "ucx");
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("available there: shm, socket, ucx"), std::string::npos) << last_error();
}

TEST_F(Select, RanksAskingForDifferentTransportsFail) {
  std::vector<PeerInfo> peers = {peer(0, 1, with({})), peer(1, 2, with({}))};
  ask(peers, Record::kEveryPair, "socket");
  std::strcpy(peers[1].transports.request, "ucx");
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("ranks ask for different transports"), std::string::npos) << last_error();
  ask(peers, Record::kEveryPair, "socket");
  peers[1].transports.request_kind = Record::kAutomatic;
  peers[1].transports.request[0] = '\0';
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
}

TEST_F(Select, ShmIsNotANetworkTransport) {
  std::vector<PeerInfo> peers = {peer(0, 1, with({})), peer(1, 2, with({}))};
  ask(peers, Record::kBetweenHosts, "shm");
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("shm is not a network transport"), std::string::npos) << last_error();
}

TEST_F(Select, ThisRankReportsWhatItHas) {
  PeerInfo me = peer(0, 1, {});
  unsetenv("MESHCCL_TRANSPORT");
  unsetenv("NCCL_NET");
  unsetenv("MESHCCL_NET");
  param_refresh();
  ASSERT_TRUE(fill_transport_request("", &me).ok());
  std::string why;
  EXPECT_TRUE(check_transport_record(me.transports, &why)) << why;
  EXPECT_EQ(me.transports.request_kind, Record::kAutomatic);
  ASSERT_STREQ(me.transports.have[0].name, "shm") << "built-in transports come first";
  EXPECT_EQ(me.transports.have[0].scope, kNode) << "from shm's properties";
  ASSERT_STREQ(me.transports.have[1].name, "socket");
  EXPECT_EQ(me.transports.have[1].scope, kNet) << "from socket's properties";
  for (size_t i = 2; i < Record::kEntries && me.transports.have[i].name[0] != '\0'; ++i) {
    EXPECT_EQ(me.transports.have[i].scope, 0) << me.transports.have[i].name << ": found, not loaded";
    EXPECT_LT(me.transports.have[i].preference, me.transports.have[0].preference) << "plugins come first";
  }
  ASSERT_TRUE(fill_transport_request("Socket", &me).ok());  // netName, any case
  EXPECT_EQ(me.transports.request_kind, Record::kBetweenHosts);
  EXPECT_STREQ(me.transports.request, "socket");
  ASSERT_TRUE(fill_transport_request("nosuch", &me).ok());
  EXPECT_STREQ(me.transports.request, "nosuch");
  EXPECT_EQ(transports_of(me).find("nosuch"), std::string::npos);
  // Names that cannot be a transport's are kept, with the reason, and
  // refused alike on every rank.
  ASSERT_TRUE(fill_transport_request("../../tmp/evil", &me).ok());
  EXPECT_EQ(me.transports.request_problem, Record::kNameBadChars);
  EXPECT_TRUE(check_transport_record(me.transports, &why)) << why;
  std::vector<PeerInfo> peers = {me, me};
  peers[1].rank = 1;
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("is not a transport name"), std::string::npos) << last_error();
  ASSERT_TRUE(fill_transport_request("averyveryverylongname", &me).ok());
  EXPECT_EQ(me.transports.request_problem, Record::kNameTooLong);
  peers = {me, me};
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("longer than any transport name"), std::string::npos) << last_error();
}

// A record from another rank is checked before it is used: what the init
// exchange, split's allgather, shrink's records and agree_on_networks carry.
TEST(TransportRecordCheck, MalformedRecordsAreRefusedWithTheReason) {
  const PeerInfo good = peer(0, 1, with({"ucx"}));
  std::string why;
  ASSERT_TRUE(check_transport_record(good.transports, &why)) << why;
  auto refused = [&](const char* what, const std::function<void(Record&)>& spoil, const char* needle) {
    Record r = good.transports;
    spoil(r);
    std::string reason;
    EXPECT_FALSE(check_transport_record(r, &reason)) << what;
    EXPECT_NE(reason.find(needle), std::string::npos) << what << ": " << reason;
  };
  refused(
      "no NUL", [](Record& r) { std::memset(r.have[1].name, 'a', Record::kNameBytes); }, "no end to its name");
  refused(
      "bad name", [](Record& r) { std::strcpy(r.have[2].name, "Uc X"); }, "not a transport name");
  refused(
      "twice", [](Record& r) { std::strcpy(r.have[2].name, "shm"); }, "listed twice");
  refused(
      "scope", [](Record& r) { r.have[0].scope = 7; }, "has scope 7");
  refused(
      "after the end", [](Record& r) { std::strcpy(r.have[5].name, "ofi"); }, "follows the end");
  refused(
      "kind", [](Record& r) { r.request_kind = 9; }, "out of range");
  refused(
      "kind without a name", [](Record& r) { r.request_kind = Record::kEveryPair; }, "does not match");
  refused(
      "unprintable request",
      [](Record& r) {
        r.request_kind = Record::kEveryPair;
        r.request_problem = Record::kNameBadChars;
        std::strcpy(r.request, "a\x01");
      },
      "not printable");
  // The init exchange's table is refused as a whole, naming the entry.
  std::vector<PeerInfo> table = {good, good};
  table[1].rank = 1;
  for (PeerInfo& p : table) p.bootstrap_addr.ss_family = AF_INET;
  ASSERT_TRUE(check_peer_table(&table, 2).ok()) << last_error();
  std::strcpy(table[1].transports.have[3].name, "bad/name");
  EXPECT_EQ(check_peer_table(&table, 2).code(), ncclRemoteError);
  EXPECT_NE(last_error().find("entry 1: transport 3 is named \"bad/name\""), std::string::npos) << last_error();
  // A child's record (split, shrink).
  PeerInfo child{};
  Record bad = good.transports;
  bad.have[0].scope = 3;
  EXPECT_EQ(apply_transport_request(bad, 4, &child).code(), ncclRemoteError);
  EXPECT_NE(last_error().find("rank 4 sent a malformed transport record"), std::string::npos) << last_error();
  EXPECT_TRUE(apply_transport_request(good.transports, 4, &child).ok());
}

// The registry's order and scopes: built-in ones first in the list, every
// plugin preferred to them; scopes from the transports' properties once
// loaded; a name that cannot be a transport's is refused before any file is
// looked for.
TEST(Registry, OrderScopeAndBadNames) {
  param_refresh();
  std::vector<TransportInfo> all = transport_list();
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all[0].name, "shm");
  EXPECT_TRUE(all[0].builtin);
  EXPECT_EQ(all[0].scope, kNode);
  EXPECT_EQ(all[1].name, "socket");
  EXPECT_EQ(all[1].scope, kNet);
  EXPECT_LT(all[0].preference, all[1].preference);
  for (size_t i = 2; i < all.size(); ++i) {
    EXPECT_FALSE(all[i].builtin);
    EXPECT_LT(all[i].preference, all[0].preference) << all[i].name;
    if (i > 2) { EXPECT_LT(all[i - 1].preference, all[i].preference); }
  }
  const meshccl_transport_v1_t* api = nullptr;
  std::string why;
  EXPECT_FALSE(load_transport("../evil", &api, &why));
  EXPECT_NE(why.find("is not a transport name"), std::string::npos) << why;
  EXPECT_FALSE(load_transport("nosuch", &api, &why));
  EXPECT_NE(why.find("neither built in (shm, socket) nor found as a plugin"), std::string::npos) << why;
  EXPECT_EQ(transport_scope("nosuch"), 0);
  EXPECT_STREQ(scope_name(kNode), "node");
  EXPECT_STREQ(scope_name(kNet), "network");
}

// Real communicators: every rank's init fails, and the message names the
// transport and what is available.
void init_all_expect_failure(int n, const std::string& needle) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  std::vector<ncclResult_t> res(n);
  std::vector<std::string> why(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      res[r] = ncclCommInitRank(&c, n, id, r);
      why[r] = ncclGetLastError(nullptr);
      if (c != nullptr) ncclCommDestroy(c);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(res[r], ncclInvalidUsage) << "rank " << r << ": " << why[r];
    EXPECT_NE(why[r].find(needle), std::string::npos) << "rank " << r << ": " << why[r];
    EXPECT_NE(why[r].find("available there: shm, "), std::string::npos) << "rank " << r << ": " << why[r];
  }
}

TEST(SelectInit, MissingTransportFailsEveryRank) {
  setenv("MESHCCL_TRANSPORT", "nosuch", 1);
  init_all_expect_failure(3, "MESHCCL_TRANSPORT=nosuch is not available on rank 0");
  unsetenv("MESHCCL_TRANSPORT");
}

TEST(SelectInit, MissingNcclNetFailsEveryRank) {
  setenv("NCCL_NET", "IB", 1);
  init_all_expect_failure(2, "NCCL_NET/ncclConfig_t.netName=ib is not available on rank 0");
  unsetenv("NCCL_NET");
}

TEST(SelectInit, NetNameOfTheConfig) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  std::vector<ncclResult_t> res(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.netName = "nosuch";
      ncclComm_t c = nullptr;
      res[r] = ncclCommInitRankConfig(&c, 2, id, r, &cfg);
      if (c != nullptr) ncclCommDestroy(c);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(res[0], ncclInvalidUsage);
  EXPECT_EQ(res[1], ncclInvalidUsage);
}

// A communicator made from another (ncclCommSplit, ncclCommShrink) takes
// the transport its own config names, not its parent's: a netName that
// cannot load fails every member with the usual error, one that loads works.
TEST(SelectInit, SplitAndShrinkTakeTheirConfigsNetName) {
  const int n = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  std::vector<ncclResult_t> split_bad(n), shrink_bad(n), split_ok(n), shrink_ok(n);
  std::vector<std::string> why_split(n), why_shrink(n);
  std::vector<int> sums(n, -1);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t parent = nullptr;
      if (ncclCommInitRank(&parent, n, id, r) != ncclSuccess) return;
      ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
      bad.netName = "nosuch";
      ncclComm_t child = nullptr;
      split_bad[r] = ncclCommSplit(parent, 0, r, &child, &bad);
      why_split[r] = ncclGetLastError(nullptr);
      if (child != nullptr) ncclCommDestroy(child);
      child = nullptr;
      shrink_bad[r] = ncclCommShrink(parent, nullptr, 0, &child, &bad, NCCL_SHRINK_DEFAULT);
      why_shrink[r] = ncclGetLastError(nullptr);
      if (child != nullptr) ncclCommDestroy(child);
      ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
      good.netName = "Socket";
      child = nullptr;
      split_ok[r] = ncclCommSplit(parent, 0, r, &child, &good);
      if (child != nullptr) {
        int one = 1;
        if (ncclAllReduce(&one, &sums[r], 1, ncclInt, ncclSum, child, nullptr) != ncclSuccess) sums[r] = -2;
        ncclCommDestroy(child);
      }
      child = nullptr;
      shrink_ok[r] = ncclCommShrink(parent, nullptr, 0, &child, &good, NCCL_SHRINK_DEFAULT);
      if (child != nullptr) ncclCommDestroy(child);
      ncclCommDestroy(parent);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(split_bad[r], ncclInvalidUsage) << "rank " << r << ": " << why_split[r];
    EXPECT_NE(why_split[r].find("NCCL_NET/ncclConfig_t.netName=nosuch is not available on rank"), std::string::npos)
        << why_split[r];
    EXPECT_EQ(shrink_bad[r], ncclInvalidUsage) << "rank " << r << ": " << why_shrink[r];
    EXPECT_NE(why_shrink[r].find("NCCL_NET/ncclConfig_t.netName=nosuch is not available on rank"), std::string::npos)
        << why_shrink[r];
    EXPECT_EQ(split_ok[r], ncclSuccess) << "rank " << r;
    EXPECT_EQ(sums[r], n) << "rank " << r;
    EXPECT_EQ(shrink_ok[r], ncclSuccess) << "rank " << r;
  }
}

}  // namespace
}  // namespace meshccl
