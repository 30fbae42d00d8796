#include "reshard/solver.h"

#include <algorithm>
#include <numeric>

namespace meshccl::reshard {

namespace {
// Start of work w with sender s, given the workers' free times.
double start_of(const Work& w, int s, const std::vector<double>& free) {
  double t = free[s];
  for (int r : w.receivers) t = std::max(t, free[r]);
  return t;
}
void occupy(const Work& w, int s, double until, std::vector<double>* free) {
  (*free)[s] = until;
  for (int r : w.receivers) (*free)[r] = until;
}
}  // namespace

double makespan(const std::vector<Work>& works, const Solution& sol, int nworkers) {
  std::vector<double> free(nworkers, 0.0);
  double end = 0;
  for (int i : sol.order) {
    const Work& w = works[i];
    const double t = start_of(w, sol.sender[i], free) + w.duration;
    occupy(w, sol.sender[i], t, &free);
    end = std::max(end, t);
  }
  return end;
}

double makespan_bound(const std::vector<Work>& works, int nworkers) {
  std::vector<double> load(nworkers, 0.0);
  double lb = 0;
  for (const Work& w : works) {
    for (int r : w.receivers) load[r] += w.duration;
    lb = std::max(lb, w.duration);
  }
  for (double l : load) lb = std::max(lb, l);
  return lb;
}

Solution solve_none(const std::vector<Work>& works) {
  Solution s;
  s.order.resize(works.size());
  std::iota(s.order.begin(), s.order.end(), 0);
  for (const Work& w : works) s.sender.push_back(w.senders.empty() ? 0 : w.senders[0]);
  return s;
}

Solution solve_size(const std::vector<Work>& works, int nworkers) {
  Solution s = solve_none(works);
  std::vector<double> load(nworkers, 0.0);
  for (size_t i = 0; i < works.size(); ++i) {
    int best = s.sender[i];
    for (int c : works[i].senders)
      if (load[c] < load[best]) best = c;
    s.sender[i] = best;
    load[best] += works[i].duration;
  }
  return s;
}

Solution solve_list(const std::vector<Work>& works, int nworkers) {
  Solution s;
  s.sender.assign(works.size(), 0);
  std::vector<double> free(nworkers, 0.0), load(nworkers, 0.0);
  std::vector<char> placed(works.size(), 0);
  for (size_t n = 0; n < works.size(); ++n) {
    int bw = -1, bs = -1;
    double bfin = 0, bdur = 0, bload = 0;
    for (size_t i = 0; i < works.size(); ++i) {
      if (placed[i]) continue;
      for (int c : works[i].senders) {
        const double fin = start_of(works[i], c, free) + works[i].duration;
        // Earliest finish; then the longer work; then the less loaded sender.
        const bool better = bw < 0 || fin < bfin || (fin == bfin && works[i].duration > bdur) ||
                            (fin == bfin && works[i].duration == bdur && load[c] < bload);
        if (better) bw = static_cast<int>(i), bs = c, bfin = fin, bdur = works[i].duration, bload = load[c];
      }
    }
    if (bw < 0) break;
    placed[bw] = 1;
    s.sender[bw] = bs;
    s.order.push_back(bw);
    occupy(works[bw], bs, bfin, &free);
    load[bs] += works[bw].duration;
  }
  // Works without candidates (none in practice) keep their natural place.
  for (size_t i = 0; i < works.size(); ++i)
    if (!placed[i]) s.order.push_back(static_cast<int>(i));
  return s;
}

namespace {
struct Search {
  const std::vector<Work>& works;
  int nworkers;
  long budget;
  std::vector<double> free;
  std::vector<char> placed;
  Solution cur;
  Solution* best;
  double* best_time;
  bool improved = false;

  double bound(double now_end) const {
    // Every receiver must still receive its remaining works.
    std::vector<double> t = free;
    double lb = now_end;
    for (size_t i = 0; i < works.size(); ++i) {
      if (placed[i]) continue;
      for (int r : works[i].receivers) t[r] += works[i].duration;
    }
    for (double x : t) lb = std::max(lb, x);
    return lb;
  }

  void dfs(size_t depth, double end) {
    if (--budget < 0) return;
    if (depth == works.size()) {
      if (end < *best_time) {
        *best_time = end;
        *best = cur;
        improved = true;
      }
      return;
    }
    if (bound(end) >= *best_time) return;
    for (size_t i = 0; i < works.size(); ++i) {
      if (placed[i]) continue;
      std::vector<int> cands = works[i].senders;
      std::sort(cands.begin(), cands.end());
      cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
      for (int c : cands) {
        const std::vector<double> saved = free;
        const double fin = start_of(works[i], c, free) + works[i].duration;
        occupy(works[i], c, fin, &free);
        placed[i] = 1;
        cur.sender[i] = c;
        cur.order.push_back(static_cast<int>(i));
        dfs(depth + 1, std::max(end, fin));
        cur.order.pop_back();
        placed[i] = 0;
        free = saved;
        if (budget < 0) return;
      }
    }
  }
};
}  // namespace

bool solve_search(const std::vector<Work>& works, int nworkers, long max_nodes, Solution* best, double* best_time) {
  Search s{works, nworkers, max_nodes, std::vector<double>(nworkers, 0.0), std::vector<char>(works.size(), 0),
           {},    best,     best_time};
  s.cur.sender.assign(works.size(), 0);
  s.dfs(0, 0.0);
  return s.improved;
}

Solution solve(const std::vector<Work>& works, int nworkers, Balance mode) {
  if (mode == Balance::None) return solve_none(works);
  Solution best = solve_size(works, nworkers);
  if (mode == Balance::Size) return best;
  double best_time = makespan(works, best, nworkers);
  Solution list = solve_list(works, nworkers);
  const double lt = makespan(works, list, nworkers);
  if (lt < best_time) best = list, best_time = lt;
  // Exhaustive enough for the few works of a small plan; bounded for large ones.
  if (best_time > makespan_bound(works, nworkers) && works.size() <= 12)
    solve_search(works, nworkers, 200000, &best, &best_time);
  return best;
}

}  // namespace meshccl::reshard
