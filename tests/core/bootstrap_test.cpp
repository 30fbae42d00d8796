// The bootstrap channel under attack: connections that never greet, and
// greetings forged without the communicator's secret, must neither stall nor
// join a communicator.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "util/param.h"

namespace meshccl {
namespace {

// The greeting's layout on the wire (bootstrap.cpp).
struct WireGreeting {
  uint32_t magic;
  uint8_t secret[kSecretBytes];
  int32_t from;
};

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

// Greetings that claim to be a real rank but lack the secret are refused;
// the real rank's connection is still taken.
TEST_F(BootstrapAttack, ForgedGreetingsAreRefused) {
  for (int r = 0; r < kRanks; ++r) {
    for (int from = 0; from < kRanks; ++from) {
      WireGreeting g{};
      g.magic = kIdMagic;
      std::memcpy(g.secret, secret_, kSecretBytes);
      g.secret[from % kSecretBytes] ^= 1;  // one bit wrong
      g.from = from;
      int fd = raw_connect(addrs_[r]);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::send(fd, &g, sizeof g, 0), static_cast<ssize_t>(sizeof g));
      strangers_.push_back(fd);
    }
    // Out-of-range ranks with the right secret, and garbage.
    for (int from : {-1, kRanks, 1 << 30}) {
      WireGreeting g{};
      g.magic = kIdMagic;
      std::memcpy(g.secret, secret_, kSecretBytes);
      g.from = from;
      int fd = raw_connect(addrs_[r]);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::send(fd, &g, sizeof g, 0), static_cast<ssize_t>(sizeof g));
      strangers_.push_back(fd);
    }
    int fd = raw_connect(addrs_[r]);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, "GET / HTTP/1.0\r\n\r\n", 18, 0), 18);
    strangers_.push_back(fd);
  }
  EXPECT_TRUE(allgather_ok());
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

}  // namespace
}  // namespace meshccl
