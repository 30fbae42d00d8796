// The idle step of waits on network transfers (sched/engine.h, FdWaiter):
// when it starts blocking on the transports' descriptors, and that wakes
// that move nothing send it back to sleeping only until the next progress.
// A pipe stands in for a transport's wait descriptor.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "sched/engine.h"
#include "util/wait.h"

namespace {

using meshccl::Backoff;
using meshccl::FdWaiter;
using meshccl::WaitPolicy;

class Pipe {
 public:
  Pipe() { EXPECT_EQ(pipe(fd_), 0); }
  ~Pipe() {
    close(fd_[0]);
    close(fd_[1]);
  }
  int read_end() const { return fd_[0]; }
  void put() { ASSERT_EQ(write(fd_[1], "x", 1), 1); }

 private:
  int fd_[2] = {-1, -1};
};

// Polls that would yield for a long time before sleeping: only the poll time
// sends such a wait to its descriptors.
WaitPolicy long_yields(long fd_after_ns) {
  WaitPolicy p;
  p.spin = 4;
  p.yield = 1000000000;
  p.fd = true;
  p.fd_after_ns = fd_after_ns;
  return p;
}

TEST(FdWaiter, BlocksOnTheDescriptorsOncePolledForThePollTime) {
  const WaitPolicy policy = long_yields(2000000);  // 2 ms
  Pipe p;
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0;
  long idle_at_gather = -1;
  std::thread writer;
  for (int i = 0; i < 100000000 && gathers == 0; ++i) {
    fd.idle(backoff, policy, [&](std::vector<pollfd>* fds) {
      if (gathers++ == 0) {
        idle_at_gather = backoff.idle_ns();
        writer = std::thread([&p] { p.put(); });  // wakes the block that follows
      }
      fds->push_back(pollfd{p.read_end(), POLLIN, 0});
      return true;
    });
  }
  writer.join();
  ASSERT_EQ(gathers, 1);
  EXPECT_GE(idle_at_gather, policy.fd_after_ns) << "asked for descriptors before the poll time";
}

TEST(FdWaiter, WithoutWaitFdItNeverBlocks) {
  WaitPolicy policy = long_yields(0);
  policy.fd = false;
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0;
  for (int i = 0; i < 200; ++i) fd.idle(backoff, policy, [&](std::vector<pollfd>*) { return ++gathers > 0; });
  EXPECT_EQ(gathers, 0);
}

TEST(FdWaiter, FruitlessWakesSendItBackToPollingOnlyUntilTheNextProgress) {
  const WaitPolicy policy = long_yields(0);  // block at once
  Pipe p;
  p.put();  // never read: every block returns at once, and no pass moves anything
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0;
  auto gather = [&](std::vector<pollfd>* fds) {
    ++gathers;
    fds->push_back(pollfd{p.read_end(), POLLIN, 0});
    return true;
  };
  for (int stretch = 0; stretch < 5; ++stretch) {
    gathers = 0;
    for (int i = 0; i < 40; ++i) fd.idle(backoff, policy, gather);
    EXPECT_EQ(gathers, FdWaiter::kFruitless) << "stretch " << stretch;
    // A pass moved something: the descriptors are worth waiting on again.
    backoff.progress();
    fd.moved();
  }
}

TEST(FdWaiter, AGatherWithoutDescriptorsIsAskedAgainOnlyAfterThePollTime) {
  const WaitPolicy policy = long_yields(1000000);  // 1 ms
  Backoff backoff(policy);
  FdWaiter fd;
  std::vector<long> asked;
  for (int i = 0; i < 100000000 && asked.size() < 3; ++i)
    fd.idle(backoff, policy, [&](std::vector<pollfd>*) {
      asked.push_back(backoff.idle_ns());
      return false;  // some transfer has no descriptor (shared memory)
    });
  ASSERT_EQ(asked.size(), 3u);
  for (size_t k = 0; k < asked.size(); ++k)
    EXPECT_GE(asked[k], static_cast<long>(k + 1) * policy.fd_after_ns) << "ask " << k;
}

}  // namespace
