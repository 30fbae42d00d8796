// A transfer's queue of chunks in flight (sched/links.h, Xfer::Fifo): first
// in, first out across its inline slot and its vector, whatever the mix of
// pushes and pops.
#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

#include "sched/links.h"

namespace {

using meshccl::Xfer;

Xfer::Chunk chunk(size_t id) { return Xfer::Chunk{{}, id, 0.0}; }

std::vector<size_t> contents(const Xfer::Fifo& f) {
  std::vector<size_t> out;
  f.for_each([&](const Xfer::Chunk& c) { out.push_back(c.bytes); });
  return out;
}

TEST(XferFifo, OneChunkAtATime) {
  Xfer::Fifo f;
  EXPECT_TRUE(f.empty());
  for (size_t i = 1; i <= 5; ++i) {
    f.push_back(chunk(i));
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f.front().bytes, i);
    f.pop_front();
    EXPECT_TRUE(f.empty());
  }
}

TEST(XferFifo, KeepsOrderAgainstADequeUnderRandomPushesAndPops) {
  std::mt19937 rng(7);
  Xfer::Fifo f;
  std::deque<size_t> model;
  size_t next = 1;
  for (int step = 0; step < 20000; ++step) {
    const bool push = model.empty() || rng() % 100 < 55;
    if (push) {
      f.push_back(chunk(next));
      model.push_back(next++);
    } else {
      ASSERT_EQ(f.front().bytes, model.front()) << "step " << step;
      f.pop_front();
      model.pop_front();
    }
    ASSERT_EQ(f.size(), model.size()) << "step " << step;
    ASSERT_EQ(f.empty(), model.empty());
    if (step % 97 == 0) ASSERT_EQ(contents(f), std::vector<size_t>(model.begin(), model.end())) << "step " << step;
    if (step % 5000 == 4999) {
      f.clear();
      model.clear();
      ASSERT_TRUE(f.empty());
    }
  }
}

}  // namespace
