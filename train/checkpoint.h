// Checkpoint files, without any communication: one shard per rank under
// DIR/step_XXXXXXXX/rank_XXXXX.bin and the `latest` pointer. A shard is a
// header (format, layout, model, step, payload size, CRC-32 of header and
// payload) followed by the rank's parameters and AdamW moments. Every function
// throws CheckpointError with a message naming the file and, for system
// failures, the OS reason.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "grid.h"

namespace meshtrain {

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ShardHeader {
  char magic[8];
  int32_t version, dp, pp, tp, rank;
  int32_t vocab, seq, layers, d_model, heads, tied;
  uint64_t seed;
  int32_t step, tp_mode;
  int32_t layer_lo, layer_hi;  // the stage's layers [lo, hi)
  uint64_t nparams;
  uint64_t payload_bytes;  // 3 * nparams * sizeof(float)
  uint64_t tokenizer;      // the word tokenizer's fingerprint; 0: bytes
  uint32_t crc;            // CRC-32 of this header (crc = 0) and the payload
  uint32_t pad;
};

ShardHeader make_shard_header(const ModelConfig& m, const Layout& l, int rank, int step,
                              uint64_t nparams, int layer_lo, int layer_hi);

std::string step_dir_name(int step);     // step_00000042
std::string rank_file_name(int rank);    // rank_00003.bin
// Parses what `latest` holds: exactly step_ and 8 digits (so never "..", "/"
// or anything outside the directory). Returns the step, or -1.
int parse_step_dir(const std::string& name);

// Creates dir if needed and checks that a file can be written there.
void check_dir_usable(const std::string& dir, int rank);
// Removes the temporary files a killed save of `rank` may have left
// (rank 0 also the pointer's). Returns how many it removed.
int remove_stale_tmp(const std::string& dir, int rank);

// Writes the shard under a temporary name, syncs it and renames it into place;
// on failure removes the temporary file.
void write_shard(const std::string& path, ShardHeader h, const float* params, const float* m,
                 const float* v);
// Reads and verifies a shard: format, header fields against `want` (layout,
// rank, model, parameter count), size on disk, checksum, finite values.
void read_shard(const std::string& path, const ShardHeader& want, std::vector<float>* params,
                std::vector<float>* m, std::vector<float>* v);

// Points DIR/latest at a step (temporary file, sync, rename).
void write_latest(const std::string& dir, int step);
// The step DIR/latest names; throws when there is no pointer or it is invalid.
int read_latest(const std::string& dir);

// Keeps the `keep` newest checkpoints of steps up to `current` (current
// included) and removes the older ones; keep <= 0 keeps all. Returns the
// steps removed.
std::vector<int> prune_checkpoints(const std::string& dir, int current, int keep);

}  // namespace meshtrain
