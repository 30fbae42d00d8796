// The idle step of waits on network transfers (sched/engine.h, FdWaiter):
// when it starts blocking on the transports' descriptors, and that wakes
// that move nothing send it back to sleeping only until the next progress,
// and that one waiter per engine polls and blocks while the others sleep.
// A pipe stands in for a transport's wait descriptor.
#include <gtest/gtest.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "sched/engine.h"
#include "util/wait.h"

namespace {

using meshccl::Backoff;
using meshccl::FdClaims;
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

// A gather that gives the pipe's read end and counts how often it was asked.
auto counting_gather(const Pipe& p, int* gathers) {
  return [&p, gathers](std::vector<pollfd>* fds, FdClaims*) {
    ++*gathers;
    fds->push_back(pollfd{p.read_end(), POLLIN, 0});
    return true;
  };
}

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
  std::vector<long> gathered_at;
  std::thread writer;
  // The first ask claims the engines at the start of the idle stretch; the
  // second, after the poll time, is the one that blocks.
  for (int i = 0; i < 100000000 && gathered_at.size() < 2; ++i) {
    fd.idle(backoff, policy, [&](std::vector<pollfd>* fds, FdClaims*) {
      gathered_at.push_back(backoff.idle_ns());
      if (gathered_at.size() == 2) writer = std::thread([&p] { p.put(); });  // wakes the block that follows
      fds->push_back(pollfd{p.read_end(), POLLIN, 0});
      return true;
    });
  }
  writer.join();
  ASSERT_EQ(gathered_at.size(), 2u);
  EXPECT_LT(gathered_at[0], policy.fd_after_ns) << "the claim comes first, at the start of the stretch";
  EXPECT_GE(gathered_at[1], policy.fd_after_ns) << "blocked on descriptors before the poll time";
}

TEST(FdWaiter, WithoutWaitFdItNeverBlocks) {
  WaitPolicy policy = long_yields(0);
  policy.fd = false;
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0;
  for (int i = 0; i < 200; ++i)
    fd.idle(backoff, policy, [&](std::vector<pollfd>*, FdClaims*) { return ++gathers > 0; });
  EXPECT_EQ(gathers, 0);
}

TEST(FdWaiter, FruitlessWakesSendItBackToPollingOnlyUntilTheNextProgress) {
  const WaitPolicy policy = long_yields(0);  // block at once
  Pipe p;
  p.put();  // never read: every block returns at once, and no pass moves anything
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0;
  auto gather = counting_gather(p, &gathers);
  for (int stretch = 0; stretch < 5; ++stretch) {
    gathers = 0;
    for (int i = 0; i < 40; ++i) fd.idle(backoff, policy, gather);
    // The claim at the start of the stretch, then one per fruitless block.
    EXPECT_EQ(gathers, FdWaiter::kFruitless + 1) << "stretch " << stretch;
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
  for (int i = 0; i < 100000000 && asked.size() < 4; ++i)
    fd.idle(backoff, policy, [&](std::vector<pollfd>*, FdClaims*) {
      asked.push_back(backoff.idle_ns());
      return false;  // some transfer has no descriptor (shared memory)
    });
  ASSERT_EQ(asked.size(), 4u);
  // asked[0]: the claim at the start of the stretch.
  for (size_t k = 1; k < asked.size(); ++k)
    EXPECT_GE(asked[k], static_cast<long>(k) * policy.fd_after_ns) << "ask " << k;
}

// A transport that says "not now" (UCX: events pending, which its next test
// takes in) is asked again after the next poll, without a sleep in between,
// up to FdWaiter::kNotNow times in a row; then the wait sleeps in steps, and
// progress starts the count again.
TEST(FdWaiter, NotNowIsAskedAgainAfterAPollNotASleep) {
  WaitPolicy policy = long_yields(0);
  policy.spin = 0;
  policy.yield = 0;  // past polling at once: every idle step would sleep
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0;
  auto not_now = [&](std::vector<pollfd>*, FdClaims* claims) {
    ++gathers;
    claims->not_now();
    return false;
  };
  for (int stretch = 0; stretch < 3; ++stretch) {
    gathers = 0;
    for (int i = 0; i < FdWaiter::kNotNow; ++i) fd.idle(backoff, policy, not_now);
    EXPECT_EQ(backoff.slept_ns(), 0) << "slept while the transport asked for a poll, stretch " << stretch;
    EXPECT_GE(gathers, FdWaiter::kNotNow) << "not asked again at every step, stretch " << stretch;
    for (int i = 0; i < 4; ++i) fd.idle(backoff, policy, not_now);
    EXPECT_GT(backoff.slept_ns(), 0) << "a transport that never lets itself be armed kept the wait from sleeping";
    backoff.progress();
    fd.moved();
  }
  // A gather that has no descriptor for some transfer (shared memory) is
  // not a "not now": the wait sleeps.
  auto none = [](std::vector<pollfd>*, FdClaims*) { return false; };
  for (int i = 0; i < 4; ++i) fd.idle(backoff, policy, none);
  EXPECT_GT(backoff.slept_ns(), 0);
}

// A wait whose recent idle stretches lasted far longer than the poll time
// (a network link paces its progress) blocks at its first idle step, after
// the claim, without polling for the poll time first.
TEST(FdWaiter, PacedWaitsBlockAtOnce) {
  const WaitPolicy policy = long_yields(50000);  // 50 us
  Pipe p;
  p.put();  // readable: a block returns at once
  Backoff backoff(policy);
  // Stretches of about 700 us: at least kPacedPolls x the poll time.
  for (int k = 0; k < 8; ++k) {
    backoff.idle();
    timespec ts{0, 700000};
    nanosleep(&ts, nullptr);
    backoff.progress();
  }
  ASSERT_GE(backoff.gap_ns(), FdWaiter::kPacedPolls * policy.fd_after_ns);
  FdWaiter fd;
  int gathers = 0;
  auto gather = counting_gather(p, &gathers);
  fd.idle(backoff, policy, gather);  // claims, then blocks (and returns: the pipe is readable)
  EXPECT_EQ(gathers, 2) << "polled before blocking although the recent stretches were long";
}

TEST(FdWaiter, OneWaiterPerEngineWhileTheOthersSleepAndAskAgain) {
  const WaitPolicy policy = long_yields(0);  // block at once
  Pipe p;
  p.put();                                 // readable: a block returns at once
  std::atomic<bool> engine_claimed{true};  // another thread's wait holds this engine
  Backoff backoff(policy);
  FdWaiter fd;
  int gathers = 0, blocks = 0;
  auto gather = [&](std::vector<pollfd>* fds, FdClaims* claims) {
    ++gathers;
    if (!claims->take(&engine_claimed)) {
      EXPECT_TRUE(claims->other());
      return false;
    }
    fds->push_back(pollfd{p.read_end(), POLLIN, 0});
    return true;
  };
  for (int i = 0; i < 5; ++i)
    fd.idle(backoff, policy, [&](std::vector<pollfd>* fds, FdClaims* claims) {
      const bool ok = gather(fds, claims);
      blocks += ok;
      return ok;
    });
  // Never blocked, and asked at every step: the other thread may be done.
  EXPECT_EQ(gathers, 5);
  EXPECT_EQ(blocks, 0);
  EXPECT_TRUE(engine_claimed.load()) << "a claim it never took was let go";
  engine_claimed = false;  // the other thread's wait ended
  fd.idle(backoff, policy, gather);
  EXPECT_TRUE(engine_claimed.load()) << "this wait holds the claim through its idle stretch";
  fd.moved();
  EXPECT_FALSE(engine_claimed.load()) << "the claim outlived the idle stretch";
}

TEST(FdWaiter, ClaimsOnSeveralEnginesAreLetGoTogether) {
  std::atomic<bool> a{false}, b{true};
  {
    FdClaims claims;
    EXPECT_TRUE(claims.take(&a));
    EXPECT_TRUE(claims.take(&a)) << "a claim this wait holds already";
    EXPECT_FALSE(claims.take(&b));
    EXPECT_TRUE(claims.other());
    claims.release();
    EXPECT_FALSE(a.load());
    EXPECT_TRUE(b.load()) << "let go of a claim another thread holds";
    EXPECT_TRUE(claims.other()) << "release() keeps what it learned";
    claims.reset();
    EXPECT_FALSE(claims.other());
    EXPECT_TRUE(claims.take(&a));
  }
  EXPECT_FALSE(a.load()) << "a claim outlived its FdClaims";
}

}  // namespace
