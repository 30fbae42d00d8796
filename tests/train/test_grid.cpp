// Rank math of the dp x pp x tp grid, exhaustively over small sizes.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

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
    if (c.pp == 1) { EXPECT_EQ(color, -1); }
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
  EXPECT_NE(check_layout(m, {1, 5, 1}, 5, 2, 2).find("more pipeline stages than the 4 layer"), std::string::npos);
  EXPECT_NE(check_layout(m, {0, 1, 1}, 0, 2, 2).find("at least 1"), std::string::npos);
  EXPECT_NE(check_layout(m, {1, 1, 1}, 1, 0, 2).find("--micro-batch"), std::string::npos);
  m.heads = 5;
  EXPECT_NE(check_layout(m, {1, 1, 1}, 1, 2, 2).find("not divisible by heads"), std::string::npos);
}

// The named grid, for every order of three dimensions and sizes 1..4:
// coordinates round-trip, the fastest dimension varies fastest, and the groups
// over every subset of dimensions partition the world, with keys 0..size-1 in
// the order of the group's own coordinates and members listed in key order.
TEST(Grid, NamedGridsEveryOrderAndEveryGroup) {
  const std::vector<std::string> perms[] = {{"tp", "pp", "dp"}, {"tp", "dp", "pp"}, {"pp", "tp", "dp"},
                                            {"pp", "dp", "tp"}, {"dp", "tp", "pp"}, {"dp", "pp", "tp"}};
  for (const auto& names : perms) {
    const std::string order = names[0] + "-" + names[1] + "-" + names[2];
    for (int a = 1; a <= 4; a++) {
      for (int b = 1; b <= 4; b++) {
        for (int c = 1; c <= 4; c++) {
          Grid g;
          ASSERT_EQ(Grid::parse(order, {{"tp", a}, {"pp", b}, {"dp", c}}, &g), "") << order;
          ASSERT_EQ(g.world(), a * b * c);
          ASSERT_EQ(g.dim(0).name, names[0]);
          for (int r = 0; r < g.world(); r++) {
            const auto co = g.coords(r);
            ASSERT_EQ(g.rank(co), r);
            ASSERT_EQ(co[0], r % g.dim(0).size) << "the first dimension is the fastest";
          }
          // Every subset of the three dimensions.
          for (int mask = 0; mask < 8; mask++) {
            std::vector<std::string> dims;
            for (int d = 0; d < 3; d++) {
              if (mask & (1 << d)) dims.push_back(names[d]);
            }
            const int gs = g.group_size(dims);
            std::map<int, std::vector<int>> by_color;
            for (int r = 0; r < g.world(); r++) {
              const int color = g.group_color(r, dims), key = g.group_key(r, dims);
              ASSERT_GE(color, 0);
              ASSERT_LT(color, g.world() / gs);
              ASSERT_GE(key, 0);
              ASSERT_LT(key, gs);
              auto& v = by_color[color];
              if (v.empty()) v.assign(gs, -1);
              ASSERT_EQ(v[key], -1) << "two ranks with the same colour and key";
              v[key] = r;
              // Members of a group differ only along the group's dimensions.
              const auto members = g.group_members(r, dims);
              ASSERT_EQ(static_cast<int>(members.size()), gs);
              ASSERT_EQ(members[key], r);
              for (int m : members) {
                ASSERT_EQ(g.group_color(m, dims), color);
                const auto cm = g.coords(m), cr = g.coords(r);
                for (int d = 0; d < 3; d++) {
                  if (!(mask & (1 << d))) { ASSERT_EQ(cm[d], cr[d]); }
                }
              }
            }
            EXPECT_EQ(static_cast<int>(by_color.size()), g.world() / gs);
            for (const auto& [col, v] : by_color) {
              // Keys run through the group's coordinates in grid order.
              for (int k = 1; k < gs; k++) EXPECT_LT(v[k - 1], v[k]);
            }
          }
        }
      }
    }
  }
}

TEST(Grid, LayoutOrdersPlaceTheDimensions) {
  for (const char* order : {"tp-pp-dp", "dp-pp-tp", "pp-tp-dp", "tp-dp-pp"}) {
    Layout l{2, 3, 2};
    l.order = order;
    const Grid g = l.grid();
    std::set<std::vector<int>> seen;
    for (int r = 0; r < l.world(); r++) {
      const Coords c = coords_of(r, l);
      ASSERT_EQ(rank_of(c, l), r) << order;
      EXPECT_TRUE(seen.insert({c.dp, c.pp, c.tp}).second);
      EXPECT_EQ(c.tp, g.coord(r, "tp"));
    }
    // The first named dimension's peers are neighbours.
    const std::string first = std::string(order).substr(0, 2);
    EXPECT_EQ(g.coord(1, first), 1) << order;
  }
  Layout dp_first{2, 1, 2};
  dp_first.order = "dp-tp-pp";
  EXPECT_EQ(coords_of(1, dp_first).dp, 1);
  EXPECT_EQ(coords_of(1, dp_first).tp, 0);
  EXPECT_EQ(coords_of(2, dp_first).tp, 1);
}

TEST(Grid, BadOrdersAreExplained) {
  Grid g;
  const std::vector<Grid::Dim> dims = {{"tp", 2}, {"pp", 1}, {"dp", 1}};
  EXPECT_NE(Grid::parse("tp-pp", dims, &g).find("leaves out dimension 'dp'"), std::string::npos);
  EXPECT_NE(Grid::parse("tp-pp-dp-tp", dims, &g).find("twice"), std::string::npos);
  EXPECT_NE(Grid::parse("tp-pp-xx", dims, &g).find("unknown dimension 'xx'"), std::string::npos);
  EXPECT_NE(Grid::parse("tp--pp-dp", dims, &g).find("empty dimension"), std::string::npos);
  EXPECT_NE(Grid::parse("", dims, &g).find("empty dimension"), std::string::npos);
  ModelConfig m;
  m.layers = 4;
  m.d_model = 64;
  m.heads = 4;
  Layout l{1, 1, 1};
  l.order = "tp-pp";
  EXPECT_NE(check_layout(m, l, 1, 2, 2).find("--order"), std::string::npos);
  EXPECT_THROW(l.grid(), std::invalid_argument);
}

// In 3D mode "tp" stands for three cube axes of size q, o fastest; the tp
// coordinate is the rank in the cube and the axis groups are lines of the cube.
TEST(Grid, CubeAxesInThreeDMode) {
  for (const char* order : {"tp-pp-dp", "dp-tp-pp"}) {
    Layout l{2, 1, 8};
    l.order = order;
    l.tp_mode = TpMode::ThreeD;
    ASSERT_EQ(l.cube(), 2);
    const Grid g = l.grid();
    EXPECT_EQ(g.ndims(), 5);
    std::map<int, std::set<int>> cube;
    for (int r = 0; r < l.world(); r++) {
      const Coords c = coords_of(r, l);
      ASSERT_EQ(rank_of(c, l), r);
      cube[tp_color(c, l)].insert(c.tp);
      const CubeCoords cc = cube_coords(c.tp, 2);
      for (int a = 0; a < 3; a++) {
        EXPECT_EQ(g.coord(r, cube_axis_dim(a)), cc.axis(a));
        // The other members of this axis group differ only along the axis.
        for (int m : g.group_members(r, {cube_axis_dim(a)})) {
          const CubeCoords cm = cube_coords(coords_of(m, l).tp, 2);
          for (int b = 0; b < 3; b++) {
            if (b != a) { EXPECT_EQ(cm.axis(b), cc.axis(b)); }
          }
          EXPECT_EQ(cube_axis_color(coords_of(m, l), l, a), cube_axis_color(c, l, a));
        }
      }
    }
    EXPECT_EQ(cube.size(), 2u);
    for (auto& [k, v] : cube) EXPECT_EQ(v.size(), 8u);
  }
  for (int q = 1; q <= 4; q++) {
    for (int r = 0; r < q * q * q; r++) {
      const CubeCoords c = cube_coords(r, q);
      EXPECT_EQ(c.o + q * (c.i + q * c.w), r);
    }
  }
  Layout bad{1, 1, 4};
  bad.tp_mode = TpMode::ThreeD;
  EXPECT_EQ(bad.cube(), 0);
  ModelConfig m;
  m.layers = 4;
  m.d_model = 64;
  m.heads = 4;
  EXPECT_NE(check_layout(m, bad, 4, 4, 1).find("tp to be a cube"), std::string::npos);
  Layout ok{1, 1, 8};
  ok.tp_mode = TpMode::ThreeD;
  EXPECT_EQ(check_layout(m, ok, 8, 4, 1), "");
  EXPECT_NE(check_layout(m, ok, 8, 2, 1).find("not divisible by q^2"), std::string::npos);
  m.heads = 3;
  m.d_model = 48;
  EXPECT_NE(check_layout(m, ok, 8, 4, 1).find("cube side"), std::string::npos);
}

TEST(Grid, UnevenStages) {
  ModelConfig m;
  m.layers = 6;
  m.d_model = 64;
  m.heads = 4;
  Layout l{1, 3, 1};
  l.stages = {3, 2, 1};
  EXPECT_EQ(check_layout(m, l, 3, 2, 2), "");
  EXPECT_EQ(stage_layers(l, 6, 0).lo, 0);
  EXPECT_EQ(stage_layers(l, 6, 1).lo, 3);
  EXPECT_EQ(stage_layers(l, 6, 1).hi, 5);
  EXPECT_EQ(stage_layers(l, 6, 2).count(), 1);
  l.stages = {3, 3};
  EXPECT_NE(check_layout(m, l, 3, 2, 2).find("names 2 stage(s) but pp is 3"), std::string::npos);
  l.stages = {4, 2, 1};
  EXPECT_NE(check_layout(m, l, 3, 2, 2).find("6 layer(s) in all"), std::string::npos);
  l.stages = {6, 0, 0};
  EXPECT_NE(check_layout(m, l, 3, 2, 2).find("at least one layer"), std::string::npos);
  l.stages.clear();
  EXPECT_EQ(stage_layers(l, 6, 1).count(), stage_layers(6, 3, 1).count());
}

// A dimension's stride is the world distance between neighbours along it:
// the ranks one step apart along it differ by exactly that much.
TEST(Grid, StrideIsTheDistanceBetweenNeighbours) {
  for (const std::string order : {"tp-pp-dp", "dp-tp-pp", "pp-dp-tp"}) {
    Grid g;
    ASSERT_EQ(Grid::parse(order, {{"tp", 2}, {"pp", 3}, {"dp", 4}}, &g), "");
    for (const std::string name : {"tp", "pp", "dp"}) {
      const int s = g.stride(name);
      std::vector<int> c = g.coords(0);
      c[g.find(name)] = 1;
      EXPECT_EQ(g.rank(c), s) << order << " " << name;
    }
    EXPECT_EQ(g.stride("ep"), 0);
  }
  Grid g;
  ASSERT_EQ(Grid::parse("pp-tp-dp", {{"tp", 2}, {"pp", 3}, {"dp", 4}}, &g), "");
  EXPECT_EQ(g.stride("pp"), 1);
  EXPECT_EQ(g.stride("tp"), 3);
  EXPECT_EQ(g.stride("dp"), 6);
}
