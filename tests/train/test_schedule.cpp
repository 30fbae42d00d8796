// Pipeline schedules: op counts, dependencies, in-flight bounds, makespan and
// deadlock freedom of the point-to-point groups under rendezvous semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "comm.h"
#include "schedule.h"

using namespace meshtrain;

namespace {

// Unit-cost event simulation without communication time: returns the makespan.
double makespan(PipeSchedule sched, int p, int m, double tf, double tb) {
  std::vector<std::vector<PipeOp>> ops(p);
  for (int s = 0; s < p; s++) ops[s] = stage_ops(sched, p, s, m);
  std::map<std::tuple<int, int, int>, double> done;  // (fwd, stage, micro) -> finish
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; s++) {
      if (next[s] == ops[s].size()) continue;
      const PipeOp op = ops[s][next[s]];
      double ready = free_at[s];
      if (op.forward && s > 0) {
        auto it = done.find({1, s - 1, op.micro});
        if (it == done.end()) continue;
        ready = std::max(ready, it->second);
      }
      if (!op.forward) {
        auto f = done.find({1, s, op.micro});
        if (f == done.end()) continue;
        ready = std::max(ready, f->second);
        if (s < p - 1) {
          auto it = done.find({0, s + 1, op.micro});
          if (it == done.end()) continue;
          ready = std::max(ready, it->second);
        }
      }
      free_at[s] = ready + (op.forward ? tf : tb);
      done[{op.forward ? 1 : 0, s, op.micro}] = free_at[s];
      next[s]++;
      progress = true;
    }
  }
  for (int s = 0; s < p; s++) EXPECT_EQ(next[s], ops[s].size()) << "dependency cycle";
  return *std::max_element(free_at.begin(), free_at.end());
}

// Rendezvous: a message completes only while both sides have it posted; a
// group is posted until all its messages are complete. Returns false on deadlock.
bool groups_complete(PipeSchedule sched, int p, int m) {
  std::vector<std::vector<std::vector<PipeMsg>>> g(p);
  for (int s = 0; s < p; s++) g[s] = stage_groups(stage_ops(sched, p, s, m), p, s);
  std::vector<size_t> cur(p, 0);
  std::vector<std::vector<bool>> done(p);
  auto posted = [&](int s) { return cur[s] < g[s].size(); };
  for (int s = 0; s < p; s++) done[s].assign(posted(s) ? g[s][0].size() : 0, false);
  for (;;) {
    bool progress = false;
    for (int s = 0; s < p; s++) {
      if (!posted(s)) continue;
      auto& grp = g[s][cur[s]];
      for (size_t i = 0; i < grp.size(); i++) {
        if (done[s][i]) continue;
        const PipeMsg& a = grp[i];
        const int q = a.peer;
        if (!posted(q)) continue;
        auto& other = g[q][cur[q]];
        for (size_t j = 0; j < other.size(); j++) {
          const PipeMsg& b = other[j];
          if (!done[q][j] && b.peer == s && b.send != a.send && b.grad == a.grad && b.micro == a.micro) {
            done[s][i] = done[q][j] = true;
            progress = true;
          }
        }
      }
    }
    for (int s = 0; s < p; s++) {
      while (posted(s) && std::all_of(done[s].begin(), done[s].end(), [](bool b) { return b; })) {
        cur[s]++;
        done[s].assign(posted(s) ? g[s][cur[s]].size() : 0, false);
        progress = true;
      }
    }
    bool all = true;
    for (int s = 0; s < p; s++) all = all && !posted(s);
    if (all) return true;
    if (!progress) return false;
  }
}

}  // namespace

TEST(Schedule, EachStageRunsEveryMicroBatchOnceInDependencyOrder) {
  for (PipeSchedule sched : {PipeSchedule::GPipe, PipeSchedule::OneFOneB}) {
    for (int p = 1; p <= 8; p++) {
      for (int m = 1; m <= 16; m++) {
        for (int s = 0; s < p; s++) {
          const auto ops = stage_ops(sched, p, s, m);
          std::vector<int> f(m, 0), b(m, 0);
          for (const auto& op : ops) {
            if (op.forward) {
              f[op.micro]++;
            } else {
              ASSERT_EQ(f[op.micro], 1) << "backward before forward";
              b[op.micro]++;
            }
          }
          for (int i = 0; i < m; i++) ASSERT_TRUE(f[i] == 1 && b[i] == 1);
          const int bound = sched == PipeSchedule::GPipe ? m : std::min(p - s, m);
          EXPECT_LE(max_in_flight(ops), bound) << schedule_name(sched) << " p=" << p << " s=" << s;
          if (sched == PipeSchedule::OneFOneB) { EXPECT_EQ(max_in_flight(ops), bound); }
        }
      }
    }
  }
}

// Eager-1F1B (spec 4.3): every micro-batch once, at most min(m, 2(p-s)-1)
// in flight (reached), and with no communication the makespan of 1F1B.
TEST(Schedule, EagerOneFOneB) {
  for (int p = 1; p <= 8; p++) {
    for (int m = 1; m <= 16; m++) {
      for (int s = 0; s < p; s++) {
        const auto ops = stage_ops(PipeSchedule::Eager1F1B, p, s, m);
        std::vector<int> f(m, 0), b(m, 0);
        for (const auto& op : ops) {
          if (op.forward) f[op.micro]++;
          else {
            ASSERT_EQ(f[op.micro], 1) << "backward before forward";
            b[op.micro]++;
          }
        }
        for (int i = 0; i < m; i++) ASSERT_TRUE(f[i] == 1 && b[i] == 1);
        EXPECT_EQ(max_in_flight(ops), std::min(m, 2 * (p - s) - 1)) << "p=" << p << " s=" << s << " m=" << m;
      }
      EXPECT_DOUBLE_EQ(makespan(PipeSchedule::Eager1F1B, p, m, 1, 2), makespan(PipeSchedule::OneFOneB, p, m, 1, 2))
          << p << " " << m;
    }
  }
  EXPECT_DOUBLE_EQ(makespan(PipeSchedule::Eager1F1B, 4, 8, 1, 2), 33.0);
  PipeSchedule s;
  EXPECT_TRUE(parse_schedule("eager-1f1b", &s));
  EXPECT_EQ(s, PipeSchedule::Eager1F1B);
}

TEST(Schedule, MakespanMatchesTheBubbleFormula) {
  EXPECT_DOUBLE_EQ(makespan(PipeSchedule::GPipe, 4, 8, 1, 2), 33.0);
  EXPECT_DOUBLE_EQ(makespan(PipeSchedule::OneFOneB, 4, 8, 1, 2), 33.0);
  for (int p = 1; p <= 6; p++) {
    for (int m = 1; m <= 10; m++) { EXPECT_DOUBLE_EQ(makespan(PipeSchedule::OneFOneB, p, m, 1, 2), (m + p - 1) * 3.0); }
  }
}

TEST(Schedule, PointToPointGroupsNeverDeadlock) {
  for (PipeSchedule sched :
       {PipeSchedule::GPipe, PipeSchedule::OneFOneB, PipeSchedule::Eager1F1B, PipeSchedule::ForwardOnly}) {
    for (int p = 1; p <= 8; p++) {
      for (int m = 1; m <= 16; m++) {
        EXPECT_TRUE(groups_complete(sched, p, m)) << schedule_name(sched) << " p=" << p << " m=" << m;
      }
    }
  }
}

TEST(Schedule, GroupsPairSendsWithReceives) {
  // Steady-state 1F1B on a middle stage: send activations forward together with
  // receiving a gradient, as Megatron's send_forward_recv_backward does.
  const auto ops = stage_ops(PipeSchedule::OneFOneB, 4, 1, 8);
  const auto g = stage_groups(ops, 4, 1);
  ASSERT_EQ(g.size(), ops.size() + 1);
  bool paired = false;
  for (const auto& grp : g) {
    if (grp.size() == 2 && grp[0].send && !grp[0].grad && !grp[1].send && grp[1].grad) paired = true;
  }
  EXPECT_TRUE(paired);
  bool send_only_last = g.back().size() == 1 && g.back()[0].send && g.back()[0].grad;
  EXPECT_TRUE(send_only_last);
  EXPECT_TRUE(stage_groups(stage_ops(PipeSchedule::GPipe, 1, 0, 4), 1, 0).back().empty());
}

TEST(Schedule, ParseNames) {
  PipeSchedule s;
  EXPECT_TRUE(parse_schedule("gpipe", &s));
  EXPECT_EQ(s, PipeSchedule::GPipe);
  EXPECT_TRUE(parse_schedule("1f1b", &s));
  EXPECT_EQ(s, PipeSchedule::OneFOneB);
  EXPECT_FALSE(parse_schedule("interleaved", &s));
}

// --comm-sched priority: pipeline before tensor-parallel before every
// data-parallel bucket (the first layer's before the last's) before the
// embedding gradients, all within meshccl's stream priorities; fifo: one.
TEST(CommSched, PrioritiesFollowDependencies) {
  CommSched s = CommSched::Fifo;
  EXPECT_TRUE(parse_comm_sched("priority", &s));
  EXPECT_EQ(s, CommSched::Priority);
  EXPECT_TRUE(parse_comm_sched("fifo", &s));
  EXPECT_EQ(s, CommSched::Fifo);
  EXPECT_FALSE(parse_comm_sched("lifo", &s));
  const CommSched p = CommSched::Priority;
  const int pipe = comm_priority(p, CommKind::Pipeline), tensor = comm_priority(p, CommKind::Tensor);
  const int first = comm_priority(p, CommKind::DataParallel, 0.0),
            last = comm_priority(p, CommKind::DataParallel, 0.99);
  const int sparse = comm_priority(p, CommKind::Sparse);
  EXPECT_LT(pipe, tensor);
  EXPECT_LT(tensor, first);
  EXPECT_LT(first, comm_priority(p, CommKind::DataParallel, 0.5));
  EXPECT_LT(comm_priority(p, CommKind::DataParallel, 0.5), last);
  EXPECT_LT(last, sparse);
  EXPECT_GE(pipe, -7);  // meshcclStreamGetPriorityRange's greatest
  EXPECT_LE(sparse, 0);
  for (CommKind k : {CommKind::Pipeline, CommKind::Tensor, CommKind::DataParallel, CommKind::Sparse})
    EXPECT_EQ(comm_priority(CommSched::Fifo, k, 0.3), 0);
}
