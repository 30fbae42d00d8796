// Plans built for a sub-group of a communicator: every algorithm's steps name
// only the group's communicator ranks, carry the group's tag base, and every
// send finds the matching receive on its peer (same tag and size), so
// algorithms compose on sub-groups (hierarchical algorithms, resharding).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl {
namespace {

using Msg = std::tuple<int, int, uint32_t, size_t>;  // from, to, tag, bytes

// Communicator ranks 0..15 on 3 hosts (r % 3), so that the hierarchical
// algorithms find hosts in every group of two or more.
TuneModel model(int n) {
  std::vector<int> host(16);
  for (int r = 0; r < 16; ++r) host[r] = r % 3;
  return with_hosts(make_tune_model(n, true, {1.0, 10.0}, {20.0, 1.25}, 10.0), host);
}

// Builds algorithm `a` at every position of `group` and checks the messages pair up.
void check_group(const Algorithm& a, const std::vector<int>& group, size_t count, uint32_t tag_base) {
  const int g = static_cast<int>(group.size());
  std::vector<float> send(count * g + 8), recv(count * g + 8);
  std::multiset<Msg> sends, recvs;
  for (int pos = 0; pos < g; ++pos) {
    OpDesc op;
    op.kind = a.kind;
    op.dtype = ncclFloat32;
    op.count = count;
    op.root = g - 1;  // a position in the group
    op.sendbuff = send.data();
    op.recvbuff = recv.data();
    op.chunk_bytes = 4096;  // several chunks per piece
    op.rank = group[pos];   // the communicator's view, unused by builders
    op.nranks = 16;
    const TuneModel m = model(g);
    const BuildCtx ctx{m, pos, g, group.data(), tag_base};
    Plan plan;
    ASSERT_TRUE(build_in(ctx, a.build, op, &plan).ok()) << a.name;
    for (const Step& s : plan.steps()) {
      if (s.kind != StepKind::Send && s.kind != StepKind::Recv && s.kind != StepKind::RecvReduce) continue;
      ASSERT_TRUE(std::find(group.begin(), group.end(), s.peer) != group.end())
          << a.name << " names rank " << s.peer << " outside the group";
      ASSERT_GE(s.tag, tag_base) << a.name;
      if (s.kind == StepKind::Send) sends.insert({group[pos], s.peer, s.tag, s.bytes});
      else recvs.insert({s.peer, group[pos], s.tag, s.bytes});
    }
  }
  EXPECT_EQ(sends, recvs) << a.name << " " << op_kind_name(a.kind) << " on " << g << " ranks, count " << count;
}

TEST(GroupPlans, EveryAlgorithmPairsItsMessagesWithinTheGroup) {
  const std::vector<std::vector<int>> groups = {{5}, {3, 11}, {1, 4, 6}, {0, 2, 9, 15, 7}, {8, 1, 3, 12, 14, 6, 10}};
  for (const Algorithm& a : algorithm_table()) {
    if (a.build == nullptr || is_p2p(a.kind)) continue;
    for (const auto& group : groups)
      for (size_t count : {size_t{0}, size_t{1}, size_t{1021}, size_t{5000}}) check_group(a, group, count, 1u << 16);
  }
}

TEST(GroupPlans, TagBaseKeepsComposedPlansApart) {
  // Two sub-plans of one plan over disjoint tag ranges: no tag repeats
  // between the same pair of ranks.
  const Algorithm* ring = nullptr;
  for (const Algorithm& a : algorithm_table())
    if (a.kind == OpKind::AllReduce && std::string(a.name) == "ring") ring = &a;
  ASSERT_NE(ring, nullptr);
  const std::vector<int> group = {2, 0, 1};
  std::vector<float> buf(3000);
  OpDesc op;
  op.count = 1000;
  op.sendbuff = buf.data();
  op.recvbuff = buf.data();
  op.chunk_bytes = 1024;
  const TuneModel m = model(3);
  Plan plan;
  ASSERT_TRUE(build_in(BuildCtx{m, 1, 3, group.data(), 0}, ring->build, op, &plan).ok());
  const size_t first = plan.size();
  ASSERT_TRUE(build_in(BuildCtx{m, 1, 3, group.data(), 1u << 20}, ring->build, op, &plan).ok());
  std::map<std::pair<int, uint32_t>, int> seen;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Step& s = plan.steps()[i];
    if (s.kind != StepKind::Send) continue;
    EXPECT_EQ(s.tag >= (1u << 20), i >= first);
    EXPECT_EQ(++seen[std::make_pair(s.peer, s.tag)], 1);
  }
}

}  // namespace
}  // namespace meshccl
