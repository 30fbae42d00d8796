// Load balancing of senders among replicas and the order of transfers
// (spec section 1.6). Workers are NIC domains (hosts): one transfer at a time
// each. Pure and deterministic: the same works give the same answer on every
// rank.
#pragma once

#include <vector>

namespace meshccl::reshard {

struct Work {
  std::vector<int> senders;    // candidate sender workers
  std::vector<int> receivers;  // receiver workers (distinct)
  double duration = 0;
};

struct Solution {
  std::vector<int> sender;  // chosen worker per work
  std::vector<int> order;   // issue order: a permutation of the works
};

enum class Balance {
  None,   // first candidate, natural order
  Size,   // least-loaded candidate by accumulated duration, natural order (Alpa's "normal")
  Order,  // size and order: the best of the size baseline, list scheduling and (small inputs) search
};

// Completion time of every work issued in sol.order, each starting when its
// sender and all its receivers are free.
double makespan(const std::vector<Work>& works, const Solution& sol, int nworkers);
// A lower bound on any solution's makespan: the busiest receiver, and each
// work's duration.
double makespan_bound(const std::vector<Work>& works, int nworkers);

Solution solve(const std::vector<Work>& works, int nworkers, Balance mode);

// The baselines, exposed for tests.
Solution solve_none(const std::vector<Work>& works);
Solution solve_size(const std::vector<Work>& works, int nworkers);
// Greedy list scheduling: repeatedly issue the (work, sender) that finishes first.
Solution solve_list(const std::vector<Work>& works, int nworkers);
// Depth-first branch and bound over (next work, sender), at most max_nodes
// nodes; returns false (and leaves *best alone) when it finds nothing better.
bool solve_search(const std::vector<Work>& works, int nworkers, long max_nodes, Solution* best, double* best_time);

}  // namespace meshccl::reshard
