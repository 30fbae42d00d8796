// The sender load balancer and orderer: deterministic, never worse than the
// size-balancing (greedy) baseline, optimal on small cases, and the spec's
// examples of why order and sender choice matter.
#include "reshard/solver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace meshccl::reshard {
namespace {

std::vector<Work> random_works(std::mt19937& rng, int nworkers, int nworks) {
  std::vector<Work> ws;
  std::uniform_int_distribution<int> w(0, nworkers - 1), k(1, 3), dur(1, 9);
  for (int i = 0; i < nworks; ++i) {
    Work x;
    for (int j = k(rng); j > 0; --j) x.senders.push_back(w(rng));
    for (int j = k(rng); j > 0; --j) {
      const int r = w(rng);
      if (std::find(x.receivers.begin(), x.receivers.end(), r) == x.receivers.end()) x.receivers.push_back(r);
    }
    x.duration = dur(rng);
    ws.push_back(x);
  }
  return ws;
}

bool valid(const std::vector<Work>& ws, const Solution& s) {
  std::vector<int> o = s.order;
  std::sort(o.begin(), o.end());
  for (size_t i = 0; i < o.size(); ++i)
    if (o[i] != static_cast<int>(i)) return false;
  if (o.size() != ws.size()) return false;
  for (size_t i = 0; i < ws.size(); ++i)
    if (std::find(ws[i].senders.begin(), ws[i].senders.end(), s.sender[i]) == ws[i].senders.end()) return false;
  return true;
}

TEST(ReshardSolver, DeterministicAndNeverWorseThanGreedy) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int nw = 2 + trial % 5, n = 1 + trial % 14;
    const std::vector<Work> ws = random_works(rng, nw, n);
    const Solution a = solve(ws, nw, Balance::Order), b = solve(ws, nw, Balance::Order);
    ASSERT_EQ(a.sender, b.sender);
    ASSERT_EQ(a.order, b.order);
    ASSERT_TRUE(valid(ws, a));
    ASSERT_TRUE(valid(ws, solve(ws, nw, Balance::Size)));
    ASSERT_TRUE(valid(ws, solve(ws, nw, Balance::None)));
    const double full = makespan(ws, a, nw);
    EXPECT_LE(full, makespan(ws, solve_size(ws, nw), nw));
    EXPECT_LE(full, makespan(ws, solve_list(ws, nw), nw));
    EXPECT_GE(full, makespan_bound(ws, nw));
  }
}

// Exhaustive enumeration of orders and senders on tiny inputs: the search
// finds the optimum.
double brute(const std::vector<Work>& ws, int nw) {
  std::vector<int> order(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) order[i] = static_cast<int>(i);
  double best = 1e300;
  do {
    std::vector<size_t> pick(ws.size(), 0);
    while (true) {
      Solution s{std::vector<int>(ws.size()), order};
      for (size_t i = 0; i < ws.size(); ++i) s.sender[i] = ws[i].senders[pick[i]];
      best = std::min(best, makespan(ws, s, nw));
      size_t i = 0;
      while (i < ws.size() && ++pick[i] == ws[i].senders.size()) pick[i++] = 0;
      if (i == ws.size()) break;
    }
  } while (std::next_permutation(order.begin(), order.end()));
  return best;
}

TEST(ReshardSolver, SearchIsOptimalOnSmallInputs) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int nw = 2 + trial % 3, n = 1 + trial % 5;
    const std::vector<Work> ws = random_works(rng, nw, n);
    EXPECT_DOUBLE_EQ(makespan(ws, solve(ws, nw, Balance::Order), nw), brute(ws, nw));
  }
}

// Spec 1.6: two source hosts holding halves that two destination hosts both
// need finish in two rounds only when the first round is crossed.
TEST(ReshardSolver, OrderMatters) {
  // Workers 0,1 send; 2,3 receive. Works: (0->2), (0->3), (1->2), (1->3).
  std::vector<Work> ws{{{0}, {2}, 1}, {{0}, {3}, 1}, {{1}, {2}, 1}, {{1}, {3}, 1}};
  EXPECT_EQ(makespan(ws, solve_none(ws), 4), 3);
  EXPECT_EQ(makespan(ws, solve(ws, 4, Balance::Order), 4), 2);
}

// A fully replicated source: balancing spreads the senders.
TEST(ReshardSolver, SenderChoiceMatters) {
  std::vector<Work> ws{{{0, 1}, {2}, 1}, {{0, 1}, {3}, 1}};
  EXPECT_EQ(makespan(ws, solve_none(ws), 4), 2);
  EXPECT_EQ(makespan(ws, solve(ws, 4, Balance::Size), 4), 1);
}

}  // namespace
}  // namespace meshccl::reshard
