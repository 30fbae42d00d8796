// The bootstrap under attack: connections that never greet, greetings forged
// without the communicator's key, a squatter on the MESHCCL_COMM_ID port and
// a replayed rendezvous must neither stall nor join a communicator, and the
// secret never crosses the wire.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "util/log.h"
#include "nccl.h"
#include "util/param.h"

namespace meshccl {
namespace {

SockAddr loopback(int port) {
  SockAddr a;
  auto* s = reinterpret_cast<sockaddr_in*>(&a.ss);
  s->sin_family = AF_INET;
  s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  s->sin_port = htons(static_cast<uint16_t>(port));
  a.len = sizeof(sockaddr_in);
  return a;
}

int raw_connect(const SockAddr& to) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to.ss), to.len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class BootstrapAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    param_refresh();
    for (int r = 0; r < kRanks; ++r) {
      SockAddr bound;
      ASSERT_TRUE(socket_listen(loopback(0), &listeners_[r], &bound).ok());
      addrs_.push_back(bound);
    }
    for (int i = 0; i < kSecretBytes; ++i) secret_[i] = static_cast<uint8_t>(0x40 + i);
  }
  void TearDown() override {
    for (int fd : strangers_) ::close(fd);
  }

  // Every rank allgathers its rank number; true when all saw every block.
  bool allgather_ok() {
    std::vector<std::thread> threads;
    std::vector<int> ok(kRanks, 0);
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        Bootstrap b(r, kRanks, std::move(listeners_[r]), addrs_, secret_, nullptr);
        std::vector<int> all(kRanks, -1);
        all[r] = r * 10;
        if (!b.allgather(all.data(), sizeof(int)).ok()) return;
        bool good = true;
        for (int p = 0; p < kRanks; ++p) good = good && all[p] == p * 10;
        ok[r] = good;
      });
    }
    for (auto& t : threads) t.join();
    for (int v : ok)
      if (!v) return false;
    return true;
  }

  static constexpr int kRanks = 3;
  Socket listeners_[kRanks];
  std::vector<SockAddr> addrs_;
  uint8_t secret_[kSecretBytes];
  std::vector<int> strangers_;
};

// Ten idle connections to every rank's port made every init fail at
// MESHCCL_TIMEOUT: greetings were read one at a time, 10 s each.
TEST_F(BootstrapAttack, IdleConnectionsDoNotStallTheRealPeers) {
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < 10; ++i) {
      int fd = raw_connect(addrs_[r]);
      ASSERT_GE(fd, 0);
      strangers_.push_back(fd);
    }
  EXPECT_TRUE(allgather_ok());
}

// Greetings that claim to be a real rank but were made without the key, or
// for another receiver, are refused; the real rank's connection is still taken.
TEST_F(BootstrapAttack, ForgedGreetingsAreRefused) {
  std::vector<char> g(greeting_size());
  uint8_t wrong[kSecretBytes];
  std::memcpy(wrong, secret_, kSecretBytes);
  wrong[3] ^= 1;  // one bit wrong
  auto send_greeting = [&](int to) {
    int fd = raw_connect(addrs_[to]);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, g.data(), g.size(), 0), static_cast<ssize_t>(g.size()));
    strangers_.push_back(fd);
  };
  for (int r = 0; r < kRanks; ++r) {
    for (int from = 0; from < kRanks; ++from) {
      make_greeting(wrong, from, r, g.data());
      send_greeting(r);
      make_greeting(secret_, from, (r + 1) % kRanks, g.data());  // another rank's: replayed here
      send_greeting(r);
    }
    for (int from : {-1, kRanks, 1 << 30}) {  // out of range, with the right key
      make_greeting(secret_, from, r, g.data());
      send_greeting(r);
    }
    int fd = raw_connect(addrs_[r]);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, "GET / HTTP/1.0\r\n\r\n", 18, 0), 18);
    strangers_.push_back(fd);
  }
  EXPECT_TRUE(allgather_ok());
}

// A greeting proves the key without holding it, and is checked whole.
TEST(Greeting, ProvesTheKeyWithoutCarryingIt) {
  uint8_t key[kSecretBytes];
  for (int i = 0; i < kSecretBytes; ++i) key[i] = static_cast<uint8_t>(0xa0 + i);
  std::vector<char> g(greeting_size()), h(greeting_size());
  make_greeting(key, 2, 1, g.data());
  make_greeting(key, 2, 1, h.data());
  EXPECT_EQ(greeting_sender(g.data(), g.size(), key, 4, 1), 2);
  EXPECT_NE(g, h) << "two greetings must differ (fresh nonces)";
  EXPECT_EQ(std::string(g.begin(), g.end()).find(std::string(key, key + kSecretBytes)), std::string::npos);
  EXPECT_EQ(greeting_sender(g.data(), g.size(), key, 4, 0), -1);  // sent to rank 1, not 0
  EXPECT_EQ(greeting_sender(g.data(), g.size() - 1, key, 4, 1), -1);
  for (size_t i = 0; i < g.size(); ++i) {
    std::vector<char> bad = g;
    bad[i] ^= 0x10;
    EXPECT_EQ(greeting_sender(bad.data(), bad.size(), key, 4, 1), -1) << "byte " << i;
  }
}

// More strangers than the cap: the oldest are dropped, the peers still get in.
TEST_F(BootstrapAttack, ManyStrangersAreCapped) {
  for (int i = 0; i < 100; ++i) {
    int fd = raw_connect(addrs_[1]);
    ASSERT_GE(fd, 0);
    strangers_.push_back(fd);
  }
  EXPECT_TRUE(allgather_ok());
}

// --- the root rendezvous ----------------------------------------------------

// Everything readable from fd until it closes or `seconds` pass.
std::string drain(int fd, double seconds) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct FixedId {
  ncclUniqueId id;
  IdContents c;
  FixedId(const std::string& addr, const std::string& phrase) {
    setenv("MESHCCL_COMM_ID", addr.c_str(), 1);
    setenv("MESHCCL_COMM_SECRET", phrase.c_str(), 1);
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    unsetenv("MESHCCL_COMM_ID");
    unsetenv("MESHCCL_COMM_SECRET");
    std::memcpy(&c, id.internal, sizeof c);
  }
  std::string secret() const { return std::string(c.secret, c.secret + kSecretBytes); }
};

// A stranger who binds the MESHCCL_COMM_ID port first and answers like a
// root: the rank used to send it the secret in its first message (the
// stranger then joined the job's next run with it). Now the rank sends only
// a nonce, sees that the answer proves nothing, and says so.
TEST(RootRendezvous, SquatterOnTheFixedPortLearnsNoSecret) {
  param_refresh();
  Socket squatter;
  SockAddr bound;
  ASSERT_TRUE(socket_listen(loopback(0), &squatter, &bound).ok());
  const std::string phrase = "squatted-7c1e9a0b5d3f4e28";
  FixedId f("127.0.0.1:" + std::to_string(bound.port()), phrase);
  ncclResult_t res = ncclInternalError;
  std::string why;
  std::thread rank1([&] {
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, 2, f.id, 1);
    why = ncclGetLastError(nullptr);
    if (comm != nullptr) ncclCommDestroy(comm);
  });
  Socket conn;
  ASSERT_TRUE(socket_accept(squatter, Deadline::after(10), nullptr, &conn).ok());
  std::string got = drain(conn.fd(), 1.0);
  // What a root sends back (magic, nonce, proof), with a proof it cannot make.
  std::vector<char> answer(4 + 16 + 32, 0);
  const uint32_t magic = kIdMagic;
  std::memcpy(answer.data(), &magic, sizeof magic);
  (void)::send(conn.fd(), answer.data(), answer.size(), MSG_NOSIGNAL);
  got += drain(conn.fd(), 8.0);
  rank1.join();
  EXPECT_EQ(got.find(f.secret()), std::string::npos) << "the rank sent the secret to a squatter";
  EXPECT_EQ(got.find(phrase), std::string::npos);
  EXPECT_LE(got.size(), 24u) << "the rank sent more than its challenge to a root that proved nothing";
  EXPECT_EQ(res, ncclInvalidUsage);
  EXPECT_NE(why.find("did not prove it holds this communicator's secret"), std::string::npos) << why;
}

// Rank 0 cannot host the root on a port someone else listens on: it says so.
TEST(RootRendezvous, TakenPortIsNamed) {
  param_refresh();
  Socket squatter;
  SockAddr bound;
  ASSERT_TRUE(socket_listen(loopback(0), &squatter, &bound).ok());
  FixedId f("127.0.0.1:" + std::to_string(bound.port()), "taken-port-0d9c8b7a6f5e4d3c");
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, f.id, 0), ncclSystemError);
  const std::string why = ncclGetLastError(nullptr);
  EXPECT_NE(why.find("the port is taken"), std::string::npos) << why;
  EXPECT_NE(why.find(std::to_string(bound.port())), std::string::npos) << why;
}

// Forwards one connection from `front` to `back` both ways; records what the
// connecting side sent. Ends when either side closes (at most 10 s).
std::string relay(const Socket& front, const SockAddr& back) {
  Socket in, out;
  if (!socket_accept(front, Deadline::after(10), nullptr, &in).ok()) return "";
  if (!socket_connect(back, Deadline::after(10), nullptr, &out).ok()) return "";
  std::string sent;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p[2] = {{in.fd(), POLLIN, 0}, {out.fd(), POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    char buf[4096];
    for (int k = 0; k < 2; ++k) {
      if (p[k].revents == 0) continue;
      const ssize_t n = ::recv(p[k].fd, buf, sizeof buf, 0);
      if (n <= 0) return sent;
      if (k == 0) sent.append(buf, static_cast<size_t>(n));
      (void)::send(p[1 - k].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
    }
  }
  return sent;
}

// The attack the fixed secret allowed: record a rank's rendezvous (as a relay
// on its path would), then replay it to the next root of the same id. The
// root's fresh nonce makes the recorded proof worthless: the replay is
// refused, and the real rank still joins.
TEST(RootRendezvous, RecordedRendezvousCannotBeReplayed) {
  param_refresh();
  uint8_t secret[kSecretBytes];
  for (int i = 0; i < kSecretBytes; ++i) secret[i] = static_cast<uint8_t>(0x31 * i + 7);
  Socket front;
  SockAddr front_addr, root_addr;
  ASSERT_TRUE(socket_listen(loopback(0), &front, &front_addr).ok());
  ASSERT_TRUE(root_start(loopback(0), secret, &root_addr, false).ok());
  std::string recorded;
  std::thread mitm([&] { recorded = relay(front, root_addr); });
  PeerInfo mine{};
  mine.bootstrap_addr = loopback(4242).ss;
  std::vector<PeerInfo> all;
  uint8_t key1[kSecretBytes], key2[kSecretBytes];
  ASSERT_TRUE(root_exchange(front_addr, secret, 1, 0, mine, &all, key1, nullptr, false).ok());
  mitm.join();
  ASSERT_GT(recorded.size(), 24u);
  EXPECT_EQ(recorded.find(std::string(secret, secret + kSecretBytes)), std::string::npos);

  // The next run: a new root with the same secret. The replay comes first.
  ASSERT_TRUE(root_start(loopback(0), secret, &root_addr, false).ok());
  const int fd = raw_connect(root_addr);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::send(fd, recorded.data(), recorded.size(), MSG_NOSIGNAL), static_cast<ssize_t>(recorded.size()));
  const std::string heard = drain(fd, 3.0);
  ::close(fd);
  EXPECT_EQ(heard.size(), 4u + 16 + 32) << "the replay got more than the root's challenge answer";
  ASSERT_TRUE(root_exchange(root_addr, secret, 1, 0, mine, &all, key2, nullptr, false).ok());
  EXPECT_NE(std::memcmp(key1, key2, kSecretBytes), 0) << "two communicators of one secret share a key";
}

// The rank tables of tests/fuzz/corpus/bootstrap are in this build's layout
// (the fuzzers build only with clang; this keeps their seeds honest in every
// build): fuzz_bootstrap reads a table of nranks PeerInfos after one byte,
// and check_peer_table takes the well-formed ones and refuses the one whose
// transport record names no transport.
std::vector<PeerInfo> corpus_table(const std::string& file, int* nranks) {
  std::FILE* f = std::fopen((std::string(MESHCCL_FUZZ_CORPUS) + "/bootstrap/" + file).c_str(), "rb");
  if (f == nullptr) return {};
  std::vector<unsigned char> bytes(1 << 16);
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  if (bytes.empty()) return {};
  *nranks = 1 + bytes[0] % 8;
  EXPECT_EQ(bytes.size(), 1 + sizeof(PeerInfo) * static_cast<size_t>(*nranks)) << file << ": not this layout";
  std::vector<PeerInfo> table(static_cast<size_t>(*nranks));
  std::memcpy(table.data(), bytes.data() + 1, std::min(bytes.size() - 1, sizeof(PeerInfo) * table.size()));
  return table;
}

TEST(RankTable, FuzzSeedsAreInThisLayout) {
  for (const char* file : {"peer_table", "peer_table_net_request"}) {
    int n = 0;
    std::vector<PeerInfo> table = corpus_table(file, &n);
    ASSERT_EQ(n, 2) << file;
    EXPECT_TRUE(check_peer_table(&table, n).ok()) << file << ": " << last_error();
    EXPECT_STREQ(table[1].transports.have[2].name, "ucx") << file;
  }
  int n = 0;
  std::vector<PeerInfo> table = corpus_table("peer_table_bad_transport", &n);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(check_peer_table(&table, n).code(), ncclRemoteError);
  EXPECT_NE(last_error().find("entry 1: transport 2 is named \"u/x\""), std::string::npos) << last_error();
}

}  // namespace
}  // namespace meshccl
