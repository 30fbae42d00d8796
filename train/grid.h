// The dp x pp x tp grid and everything derived from it: pure functions of
// (rank, layout, model shape), with no I/O, so they can be tested exhaustively.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain {

struct ModelConfig {
  int vocab = 256;    // real vocabulary (bytes)
  int seq = 128;      // context length T (also the size of the position table)
  int layers = 4;
  int d_model = 256;
  int heads = 4;
  bool tied = true;   // output projection shares the token embedding
  uint64_t seed = 42;
};

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int world() const { return dp * pp * tp; }
  bool single() const { return world() == 1; }
};

// Coordinates of a rank; tp varies fastest, then pp, then dp (Megatron's
// "tp-pp-dp" order), so tensor-parallel peers are neighbours in the world.
struct Coords {
  int dp = 0, pp = 0, tp = 0;
};

Coords coords_of(int rank, const Layout& l);
int rank_of(const Coords& c, const Layout& l);

// Colours for ncclCommSplit: ranks with the same colour form one communicator,
// ordered by their coordinate along that dimension (used as the key).
int tp_color(const Coords& c, const Layout& l);
int pp_color(const Coords& c, const Layout& l);
int dp_color(const Coords& c, const Layout& l);
// The first and last stage of each (dp, tp) pair share the tied embedding;
// -1 (NCCL_SPLIT_NOCOLOR) for ranks that hold no copy or when pp == 1 or untied.
int embed_color(const Coords& c, const Layout& l, bool tied);

struct LayerRange {
  int lo = 0, hi = 0;  // [lo, hi)
  int count() const { return hi - lo; }
};
// Balanced split: the first (layers % pp) stages get one extra layer.
LayerRange stage_layers(int layers, int pp, int stage);

// Vocabulary padded so that every tensor-parallel slice has the same number of
// rows, a multiple of 8 floats; padded entries never take part in the softmax.
int padded_vocab(int vocab, int tp);

// Empty when the combination is possible, else a message that says what is wrong.
std::string check_layout(const ModelConfig& m, const Layout& l, int world_size, int micro_batch,
                         int grad_accum);

}  // namespace meshtrain
