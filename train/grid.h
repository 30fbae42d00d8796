// The rank grid and everything derived from it: pure functions of (rank,
// layout, model shape), with no I/O, so they can be tested exhaustively.
//
// A Grid is a named N-dimensional box of ranks built from an order string in
// Megatron's convention: "tp-pp-dp" lists the dimensions fastest first, so
// tensor-parallel peers are neighbours in the world. A group over a set of
// dimensions is the ranks that differ from a rank only along those dimensions;
// its colour and key are what ncclCommSplit needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct ModelConfig {
  int vocab = 256;  // real vocabulary (bytes, or the word tokenizer's ids)
  int seq = 128;    // context length T (also the size of the position table)
  int layers = 4;
  int d_model = 256;
  int heads = 4;
  bool tied = true;  // output projection shares the token embedding
  uint64_t seed = 42;
  bool words = false;      // the word tokenizer (tokenizer.h): --tokenizer word
  uint64_t tokenizer = 0;  // its fingerprint (set by the engine from the corpus; kept in checkpoints)
};

class Grid {
 public:
  struct Dim {
    std::string name;
    int size = 1;
  };
  Grid() = default;
  // dims fastest first; names must be distinct and non-empty, sizes >= 1
  // (checked by parse(); the constructor trusts its caller).
  explicit Grid(std::vector<Dim> dims) : dims_(std::move(dims)) {}
  // Builds a grid from "a-b-c" (fastest first) and one size per name, in the
  // order's order. Returns an empty string on success, else what is wrong.
  static std::string parse(const std::string& order, const std::vector<Dim>& sizes, Grid* out);

  int ndims() const { return static_cast<int>(dims_.size()); }
  const Dim& dim(int d) const { return dims_[d]; }
  int find(const std::string& name) const;  // index of the dimension, -1 if absent
  int world() const;
  std::vector<int> coords(int rank) const;
  int rank(const std::vector<int>& coords) const;
  int coord(int rank, const std::string& name) const;  // 0 for a dimension not in the grid
  // World-rank distance between neighbours along the dimension: the product
  // of the sizes of the dimensions before it; 0 for one not in the grid.
  int stride(const std::string& name) const;

  // The group of `rank` over `names` (dimensions not in the grid are ignored):
  // colour numbers the groups (mixed radix over the other dimensions), key is
  // the rank's index inside its group (mixed radix over `names`, grid order).
  int group_color(int rank, const std::vector<std::string>& names) const;
  int group_key(int rank, const std::vector<std::string>& names) const;
  int group_size(const std::vector<std::string>& names) const;
  // World ranks of the group, in key order.
  std::vector<int> group_members(int rank, const std::vector<std::string>& names) const;

 private:
  std::vector<bool> mask(const std::vector<std::string>& names) const;
  std::vector<Dim> dims_;
};

// How the tensor-parallel ranks cut the model (see tp.h): Megatron 1D, or
// Colossal-AI 3D over a q x q x q cube.
enum class TpMode { OneD, ThreeD };
bool parse_tp_mode(const std::string& s, TpMode* out);
const char* tp_mode_name(TpMode m);

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  std::string order = "tp-pp-dp";  // fastest first; a permutation of tp, pp, dp
  TpMode tp_mode = TpMode::OneD;
  std::vector<int> stages;  // layers per pipeline stage; empty: balanced split
  // Tensor-parallel degree of each pipeline stage (1D only; `--tp 2,1`);
  // empty: tp on every stage. With it, the ranks of one data-parallel
  // replica are the stages in turn, each its tp ranks (tp fastest), and
  // activations cross stages through reshard plans.
  std::vector<int> stage_tp;
  bool hetero() const { return !stage_tp.empty(); }
  int tp_of(int stage) const { return hetero() ? stage_tp[stage] : tp; }
  int replica() const;                // ranks of one data-parallel replica
  int stage_offset(int stage) const;  // first rank of a stage inside its replica
  // The layout one stage sees: tp = tp_of(stage), no per-stage list.
  Layout stage_view(int stage) const;
  int world() const { return hetero() ? dp * replica() : dp * pp * tp; }
  bool single() const { return world() == 1; }
  // Side of the 3D cube (q with q^3 == tp), 0 when tp is not a cube.
  int cube() const;
  // The named grid: in 3D mode "tp" stands for three dimensions of size q,
  // tp3o-tp3i-tp3w (the cube's output, input and weight axes, o fastest).
  // Throws std::invalid_argument when the order is not a permutation of tp, pp, dp.
  Grid grid() const;
  // Names of the tensor-parallel dimensions of grid(): {"tp"} or the three cube axes.
  std::vector<std::string> tp_dims() const;
};

// Names of the cube's axes in the grid, indexed by CubeAxis.
enum CubeAxis { kAxisI = 0, kAxisW = 1, kAxisO = 2 };
const char* cube_axis_dim(int axis);

// Coordinates of a rank: tp is the rank's index in its tensor-parallel group
// (in 3D, o + q * (i + q * w)).
struct Coords {
  int dp = 0, pp = 0, tp = 0;
};

struct CubeCoords {
  int i = 0, w = 0, o = 0;
  int axis(int a) const { return a == kAxisI ? i : (a == kAxisW ? w : o); }
};
CubeCoords cube_coords(int tp_rank, int q);

Coords coords_of(int rank, const Layout& l);
int rank_of(const Coords& c, const Layout& l);

// Colours for ncclCommSplit: ranks with the same colour form one communicator,
// ordered by their coordinate along that dimension (the key: Coords' field).
int tp_color(const Coords& c, const Layout& l);
int pp_color(const Coords& c, const Layout& l);
int dp_color(const Coords& c, const Layout& l);
// The group along one cube axis (3D mode), keyed by the coordinate on that axis.
int cube_axis_color(const Coords& c, const Layout& l, int axis);
// The first and last stage of each (dp, tp) pair share the tied embedding;
// -1 (NCCL_SPLIT_NOCOLOR) for ranks that hold no copy or when pp == 1 or untied.
int embed_color(const Coords& c, const Layout& l, bool tied);

struct LayerRange {
  int lo = 0, hi = 0;  // [lo, hi)
  int count() const { return hi - lo; }
};
// Balanced split: the first (layers % pp) stages get one extra layer.
LayerRange stage_layers(int layers, int pp, int stage);
// The layout's split: l.stages when given, else the balanced one.
LayerRange stage_layers(const Layout& l, int layers, int stage);

// Vocabulary padded so that every tensor-parallel slice has the same number of
// rows, a multiple of 8 floats; padded entries never take part in the softmax.
int padded_vocab(int vocab, int tp);

// Bounds on the model's sizes that keep every row and column count (4 x
// d-model, tokens per micro-batch) an int; memory runs out well before.
constexpr int kMaxDModel = 1 << 16;
constexpr int kMaxLayers = 1 << 16;
constexpr int kMaxSeq = 1 << 20;
constexpr int64_t kMaxTokens = int64_t{1} << 30;

// Empty when the combination is possible, else a message that says what is wrong.
std::string check_layout(const ModelConfig& m, const Layout& l, int world_size, int micro_batch, int grad_accum);

}  // namespace meshtrain
