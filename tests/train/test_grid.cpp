// Rank math of the dp x pp x tp grid, exhaustively over small sizes.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "grid.h"

using namespace meshtrain;

TEST(Grid, CoordsRoundTripAndGroupsPartitionTheWorld) {
  for (int dp = 1; dp <= 4; dp++) {
    for (int pp = 1; pp <= 4; pp++) {
      for (int tp = 1; tp <= 4; tp++) {
        const Layout l{dp, pp, tp};
        std::map<int, std::set<int>> tpg, ppg, dpg;
        for (int r = 0; r < l.world(); r++) {
          const Coords c = coords_of(r, l);
          ASSERT_EQ(rank_of(c, l), r);
          ASSERT_TRUE(c.dp < dp && c.pp < pp && c.tp < tp);
          tpg[tp_color(c, l)].insert(c.tp);
          ppg[pp_color(c, l)].insert(c.pp);
          dpg[dp_color(c, l)].insert(c.dp);
        }
        // Each group holds every coordinate of its dimension exactly once.
        EXPECT_EQ(tpg.size(), static_cast<size_t>(dp * pp));
        EXPECT_EQ(ppg.size(), static_cast<size_t>(dp * tp));
        EXPECT_EQ(dpg.size(), static_cast<size_t>(pp * tp));
        for (auto& [k, v] : tpg) EXPECT_EQ(v.size(), static_cast<size_t>(tp));
        for (auto& [k, v] : ppg) EXPECT_EQ(v.size(), static_cast<size_t>(pp));
        for (auto& [k, v] : dpg) EXPECT_EQ(v.size(), static_cast<size_t>(dp));
        // Tensor-parallel peers are neighbours in the world.
        EXPECT_EQ(coords_of(tp - 1, l).tp, tp - 1);
      }
    }
  }
}

TEST(Grid, EmbedGroupsPairFirstAndLastStage) {
  const Layout l{2, 3, 2};
  std::map<int, std::set<int>> groups;
  for (int r = 0; r < l.world(); r++) {
    const Coords c = coords_of(r, l);
    const int color = embed_color(c, l, true);
    if (c.pp == 1) {
      EXPECT_EQ(color, -1);
    }
    if (color >= 0) groups[color].insert(c.pp);
    EXPECT_EQ(embed_color(c, l, false), -1);
    EXPECT_EQ(embed_color(c, Layout{2, 1, 2}, true), -1);
  }
  EXPECT_EQ(groups.size(), 4u);
  for (auto& [k, v] : groups) EXPECT_EQ(v, (std::set<int>{0, 2}));
}

TEST(Grid, StageLayersCoverAllLayersBalanced) {
  for (int layers = 1; layers <= 24; layers++) {
    for (int pp = 1; pp <= layers; pp++) {
      int next = 0, lo = layers, hi = 0;
      for (int s = 0; s < pp; s++) {
        const LayerRange r = stage_layers(layers, pp, s);
        ASSERT_EQ(r.lo, next);
        ASSERT_GE(r.count(), 1);
        lo = std::min(lo, r.count());
        hi = std::max(hi, r.count());
        next = r.hi;
      }
      EXPECT_EQ(next, layers);
      EXPECT_LE(hi - lo, 1);
    }
  }
  EXPECT_EQ(stage_layers(4, 3, 0).count(), 2);
  EXPECT_EQ(stage_layers(4, 3, 2).count(), 1);
}

TEST(Grid, PaddedVocabSplitsEvenly) {
  for (int tp = 1; tp <= 8; tp++) {
    for (int v : {2, 50, 255, 256, 257, 50257}) {
      const int p = padded_vocab(v, tp);
      EXPECT_GE(p, v);
      EXPECT_EQ(p % (8 * tp), 0);
      EXPECT_LT(p - v, 8 * tp);
    }
  }
}

TEST(Grid, ImpossibleLayoutsAreExplained) {
  ModelConfig m;
  m.layers = 4;
  m.d_model = 64;
  m.heads = 4;
  EXPECT_EQ(check_layout(m, {2, 2, 2}, 8, 2, 2), "");
  EXPECT_NE(check_layout(m, {2, 2, 2}, 4, 2, 2).find("but the job has 4 rank(s)"), std::string::npos);
  EXPECT_NE(check_layout(m, {1, 1, 3}, 3, 2, 2).find("not divisible by tp 3"), std::string::npos);
  EXPECT_NE(check_layout(m, {1, 5, 1}, 5, 2, 2).find("more pipeline stages than the 4 layer"),
            std::string::npos);
  EXPECT_NE(check_layout(m, {0, 1, 1}, 0, 2, 2).find("at least 1"), std::string::npos);
  EXPECT_NE(check_layout(m, {1, 1, 1}, 1, 0, 2).find("--micro-batch"), std::string::npos);
  m.heads = 5;
  EXPECT_NE(check_layout(m, {1, 1, 1}, 1, 2, 2).find("not divisible by heads"), std::string::npos);
}
