// One parameter tensor of a rank: its logical shape, where this rank's slice
// lies in it (set by the tensor-parallel scheme) and where it sits in the
// parameter arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshtrain {

struct ParamSpec {
  std::string name;        // "wte", "h3.qkvw", ...
  uint64_t key = 0;        // initialisation stream
  int rows = 0, cols = 0;  // logical shape
  float init_std = 0.0f;   // normal(0, std) when > 0, else init_value everywhere
  float init_value = 0.0f;
  bool decay = false;   // AdamW weight decay applies (matrices only)
  bool in_norm = true;  // this copy counts once in the global gradient norm
  size_t offset = 0, size = 0;
  int local_rows = 0, local_cols = 0;
  // Placement, set by the tensor-parallel scheme: rows are cut into
  // row_slices slices (this rank's is row_slice), each cut into row_subs
  // blocks (this rank's is row_sub). With qkv the rows are [Q | K | V] and a
  // slice takes its share of each third (whole heads). Columns are cut into
  // col_parts blocks.
  int row_slices = 1, row_slice = 0, row_subs = 1, row_sub = 0;
  bool qkv = false;
  int col_parts = 1, col_part = 0;
  int sync = 0;  // scheme-defined: which ranks' partial gradients finish_grads sums
};

// Index in the logical tensor of element `local` of this rank's slice (the
// placement is in the spec; tp_rank and tp are kept for callers' symmetry).
size_t global_index(const ParamSpec& s, size_t local, int tp_rank = 0, int tp = 1);

}  // namespace meshtrain
