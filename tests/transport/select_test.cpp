// Transport selection: a pure function of the ranks' identities (unit cases
// over synthetic peers), and init failing on every rank when a transport
// that is asked for is missing (real communicators, ranks as threads).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "transport/select.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {
namespace {

constexpr uint32_t kUcx = 1u << 0, kOfi = 1u << 1, kSocket = 1u << 2, kAsked = 1u << 31;

PeerInfo peer(int rank, uint64_t host, uint32_t nets) {
  PeerInfo p;
  std::memset(&p, 0, sizeof(p));
  p.rank = rank;
  p.machine_hash = host;
  p.host_hash = host;
  p.nets = nets;
  std::snprintf(p.host_id, sizeof(p.host_id), "host%llu", static_cast<unsigned long long>(host));
  return p;
}

void ask(std::vector<PeerInfo>& peers, uint32_t scope, const char* name, bool loads_everywhere) {
  for (PeerInfo& p : peers) {
    p.transport_scope = scope;
    std::strncpy(p.transport, name, sizeof(p.transport) - 1);
    if (loads_everywhere) p.nets |= kAsked;
  }
}

class Select : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MESHCCL_SHM_DISABLE");
    param_refresh();
  }
};

TEST_F(Select, SameHostShmOtherHostsTheFirstCommonOfUcxOfiSocket) {
  std::vector<PeerInfo> peers = {peer(0, 1, kUcx | kOfi | kSocket), peer(1, 1, kUcx | kSocket),
                                 peer(2, 2, kUcx | kOfi | kSocket), peer(3, 3, kOfi | kSocket), peer(4, 4, kSocket)};
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
  EXPECT_TRUE(check_transport_request(peers, 0).ok());
}

TEST_F(Select, ShmDisabledUsesTheNetworkOnOneHost) {
  setenv("MESHCCL_SHM_DISABLE", "1", 1);
  param_refresh();
  std::vector<PeerInfo> peers = {peer(0, 1, kUcx | kSocket), peer(1, 1, kUcx | kSocket)};
  EXPECT_EQ(choose_transport(peers, 0, 1), "ucx");
  unsetenv("MESHCCL_SHM_DISABLE");
  param_refresh();
}

TEST_F(Select, ForcedForEveryPairOrOnlyBetweenHosts) {
  std::vector<PeerInfo> peers = {peer(0, 1, kUcx | kSocket), peer(1, 1, kUcx | kSocket), peer(2, 2, kUcx | kSocket)};
  ask(peers, 1, "socket", true);
  EXPECT_TRUE(check_transport_request(peers, 0).ok());
  EXPECT_EQ(choose_transport(peers, 0, 1), "socket");
  EXPECT_EQ(choose_transport(peers, 0, 2), "socket");
  ask(peers, 2, "socket", true);  // NCCL_NET: shm stays within a host
  EXPECT_EQ(choose_transport(peers, 0, 1), "shm");
  EXPECT_EQ(choose_transport(peers, 1, 2), "socket");
}

TEST_F(Select, MissingOnOneRankFailsNamingTheRankAndWhatItHas) {
  std::vector<PeerInfo> peers = {peer(0, 1, kUcx | kSocket), peer(1, 2, kUcx | kSocket), peer(2, 3, kSocket)};
  ask(peers, 2, "ucx", false);
  peers[0].nets |= kAsked;
  peers[1].nets |= kAsked;
  Status s = check_transport_request(peers, 0);
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  std::string why = last_error();
  EXPECT_NE(why.find("NCCL_NET/ncclConfig_t.netName=ucx is not available on rank 2 (host3)"), std::string::npos) << why;
  EXPECT_NE(why.find("available there: shm, socket"), std::string::npos) << why;
}

TEST_F(Select, RanksAskingForDifferentTransportsFail) {
  std::vector<PeerInfo> peers = {peer(0, 1, kSocket), peer(1, 2, kSocket)};
  ask(peers, 1, "socket", true);
  std::strcpy(peers[1].transport, "ucx");
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("ranks ask for different transports"), std::string::npos) << last_error();
  ask(peers, 1, "socket", true);
  peers[1].transport_scope = 0;
  peers[1].transport[0] = '\0';
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
}

TEST_F(Select, ShmIsNotANetworkTransport) {
  std::vector<PeerInfo> peers = {peer(0, 1, kSocket), peer(1, 2, kSocket)};
  ask(peers, 2, "shm", true);
  EXPECT_EQ(check_transport_request(peers, 0).code(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("shm is not a network transport"), std::string::npos) << last_error();
}

TEST_F(Select, ThisRankReportsWhatItHas) {
  PeerInfo me = peer(0, 1, 0);
  unsetenv("MESHCCL_TRANSPORT");
  unsetenv("NCCL_NET");
  unsetenv("MESHCCL_NET");
  param_refresh();
  fill_transport_request("", &me);
  EXPECT_EQ(me.transport_scope, 0u);
  EXPECT_TRUE(me.nets & kSocket) << "socket is built in";
  fill_transport_request("Socket", &me);  // netName, any case
  EXPECT_EQ(me.transport_scope, 2u);
  EXPECT_STREQ(me.transport, "socket");
  EXPECT_TRUE(me.nets & kAsked);
  fill_transport_request("nosuch", &me);
  EXPECT_FALSE(me.nets & kAsked);
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
