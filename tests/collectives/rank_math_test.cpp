// Trees and halving-doubling partners, checked exhaustively for 1..64 ranks.
#include "collectives/rank_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "collectives/rank_math.h"

namespace meshccl {
namespace {

using Links = std::function<TreeLinks(int rank)>;

// A spanning tree of n ranks: one root, parent and child links agree, at most
// two children, every rank reaches the root; returns the root and the depth.
void check_tree(int n, const Links& links, int* root, int* depth) {
  std::vector<TreeLinks> t(n);
  for (int r = 0; r < n; ++r) t[r] = links(r);
  *root = -1;
  for (int r = 0; r < n; ++r) {
    if (t[r].parent < 0) {
      ASSERT_EQ(*root, -1) << "two roots, n=" << n;
      *root = r;
    } else {
      ASSERT_LT(t[r].parent, n);
      ASSERT_NE(t[r].parent, r);
      const TreeLinks& p = t[t[r].parent];
      ASSERT_TRUE(p.child[0] == r || p.child[1] == r) << "n=" << n << " rank " << r << " not a child of its parent";
    }
    for (int c : t[r].child) {
      if (c < 0) continue;
      ASSERT_LT(c, n);
      ASSERT_EQ(t[c].parent, r) << "n=" << n;
    }
    if (t[r].child[1] >= 0) { ASSERT_GE(t[r].child[0], 0); }
    ASSERT_NE(t[r].child[0], t[r].child[1] >= 0 ? t[r].child[1] : -2);
  }
  ASSERT_GE(*root, 0);
  *depth = 0;
  for (int r = 0; r < n; ++r) {
    int d = 0;
    for (int x = r; t[x].parent >= 0; x = t[x].parent) ASSERT_LE(++d, n) << "cycle, n=" << n;
    *depth = std::max(*depth, d);
  }
}

TEST(RankMath, BinaryTreeIsNcclsInOrderTree) {
  // The 14-rank example from NCCL's trees.cc.
  const TreeLinks r8 = binary_tree(14, 8), r12 = binary_tree(14, 12), r13 = binary_tree(14, 13);
  EXPECT_EQ(binary_tree(14, 0).child[0], 8);
  EXPECT_EQ(r8.parent, 0);
  EXPECT_EQ(r8.child[0], 4);
  EXPECT_EQ(r8.child[1], 12);
  EXPECT_EQ(r12.child[0], 10);
  EXPECT_EQ(r12.child[1], 13);
  EXPECT_EQ(r13.parent, 12);
  EXPECT_EQ(binary_tree(14, 6).child[1], 7);
  for (int n = 1; n <= 64; ++n) {
    int root, depth;
    check_tree(
        n, [n](int r) { return binary_tree(n, r); }, &root, &depth);
    EXPECT_EQ(root, 0);
    EXPECT_EQ(depth, binary_tree_depth(n)) << n;
    EXPECT_LE(binary_tree(n, 0).nchildren(), 1);
  }
}

TEST(RankMath, DoubleTreeLeavesMostRanksIdleInOneTree) {
  for (int n = 1; n <= 64; ++n) {
    int root1, depth1, root0, depth0;
    check_tree(
        n, [n](int r) { return double_tree(n, r, 0); }, &root0, &depth0);
    check_tree(
        n, [n](int r) { return double_tree(n, r, 1); }, &root1, &depth1);
    EXPECT_EQ(depth1, binary_tree_depth(n));
    if (n > 1) { EXPECT_NE(root0, root1) << n; }
    int both = 0;
    for (int r = 0; r < n; ++r) both += double_tree(n, r, 0).nchildren() > 0 && double_tree(n, r, 1).nchildren() > 0;
    EXPECT_LE(both, n % 2 == 0 ? 0 : 1) << "ranks inner in both trees, n=" << n;
  }
}

TEST(RankMath, RootedDoubleTreeHangsBelowAnyRoot) {
  for (int n = 1; n <= 40; ++n) {
    for (int root = 0; root < n; ++root) {
      for (int t = 0; t < 2; ++t) {
        int got_root, depth;
        check_tree(
            n, [&](int r) { return rooted_double_tree(n, root, r, t); }, &got_root, &depth);
        EXPECT_EQ(got_root, root);
        EXPECT_EQ(depth, rooted_tree_depth(n)) << "n=" << n << " root " << root << " tree " << t;
        EXPECT_EQ(rooted_double_tree(n, root, root, t).nchildren(), n > 1 ? 1 : 0);
      }
    }
  }
}

TEST(RankMath, HalvingDoublingFold) {
  for (int n = 1; n <= 64; ++n) {
    const int p2 = hd_pof2(n), rem = n - p2;
    ASSERT_TRUE(p2 <= n && 2 * p2 > n && (p2 & (p2 - 1)) == 0) << n;
    std::vector<int> seen(p2, 0);
    for (int r = 0; r < n; ++r) {
      const int nr = hd_newrank(n, r);
      if (nr < 0) {
        // Sits out: an even rank of the first 2*rem, folded into r+1.
        EXPECT_TRUE(r < 2 * rem && r % 2 == 0) << n << " " << r;
        EXPECT_GE(hd_newrank(n, r + 1), 0);
        continue;
      }
      ASSERT_LT(nr, p2);
      ++seen[nr];
      EXPECT_EQ(hd_rank_of(n, nr), r);
      // New rank nr stands for old ranks [first(nr), first(nr+1)), which holds r.
      EXPECT_LE(hd_first(n, nr), r);
      EXPECT_LT(r, hd_first(n, nr + 1));
    }
    for (int c : seen) EXPECT_EQ(c, 1);
    EXPECT_EQ(hd_first(n, 0), 0);
    EXPECT_EQ(hd_first(n, p2), n);
  }
}

TEST(RankMath, TreeLoads) {
  // Two ranks: each is the root of one tree and the leaf of the other.
  TreeLoad two = double_tree_load(2);
  EXPECT_EQ(two.depth, 1);
  EXPECT_EQ(two.links, 2);
  EXPECT_EQ(two.children, 1);
  for (int n = 3; n <= 64; ++n) {
    TreeLoad l = double_tree_load(n);
    // At worst inner in one tree (parent + 2 children) and a root with one
    // child or a leaf in the other.
    EXPECT_GE(l.links, 3);
    EXPECT_LE(l.links, 4);
    EXPECT_LE(l.children, 3);
    TreeLoad rl = rooted_double_tree_load(n);
    EXPECT_EQ(rl.depth, rooted_tree_depth(n));
    EXPECT_GE(rl.children, 2);
    EXPECT_LE(rl.children, 3);
  }
}

}  // namespace
}  // namespace meshccl

namespace meshccl {
namespace {

// Every host of 1..8 ranks under a widest host of up to 8: each share has one
// owner, owners take consecutive shares, and every local rank owns one.
TEST(HierRankMath, SharesCoverEveryHostRank) {
  for (int widest = 1; widest <= 8; ++widest)
    for (int k = 1; k <= widest; ++k) {
      std::vector<int> owned(static_cast<size_t>(k), 0);
      int prev = 0;
      for (int j = 0; j < widest; ++j) {
        const int o = share_owner(k, widest, j);
        ASSERT_GE(o, prev);
        ASSERT_LT(o, k);
        ++owned[o];
        prev = o;
      }
      for (int c : owned) EXPECT_GE(c, 1) << k << " of " << widest;
      if (k == widest) {
        for (int j = 0; j < widest; ++j) EXPECT_EQ(share_owner(k, widest, j), j);
      }
    }
}

TEST(HierRankMath, HostGroupsInOrderOfLowestRank) {
  const HostGroups g = host_groups({7, 3, 7, 9, 3});
  ASSERT_EQ(g.members.size(), 3u);
  EXPECT_EQ(g.members[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(g.members[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(g.members[2], (std::vector<int>{3}));
  EXPECT_EQ(g.host, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(g.local, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(g.widest, 2);
}

}  // namespace
}  // namespace meshccl
