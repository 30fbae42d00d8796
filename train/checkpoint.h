// Checkpoint files, without any communication: one shard per rank under
// DIR/step_XXXXXXXX/rank_XXXXX.bin and the `latest` pointer, where XXXXXXXX
// is the number of steps done (as the progress lines count them). A shard is
// a header (format, layout, model, steps done, learning-rate schedule,
// payload size, CRC-32 of header and payload) followed by the rank's
// parameters and AdamW moments. Whatever is read must be this user's and
// closed to writes by others: the directories, `latest` and every shard
// (regular files, opened without following a link or waiting on a FIFO).
// Every function throws CheckpointError with a message naming the file and,
// for system failures, the OS reason.
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

// The learning-rate schedule a run follows (optim.h): resuming under another
// one would change the rates of the steps still to come.
struct LrSchedule {
  int32_t total_steps, warmup;
  float lr, min_lr_ratio;
  bool operator==(const LrSchedule& o) const {
    return total_steps == o.total_steps && warmup == o.warmup && lr == o.lr && min_lr_ratio == o.min_lr_ratio;
  }
};

// Format 4. Format 3 (read, not written) had no schedule and named a
// checkpoint after the 0-based index of its last step.
struct ShardHeader {
  char magic[8];
  int32_t version, dp, pp, tp, rank;
  int32_t vocab, seq, layers, d_model, heads, tied;
  uint64_t seed;
  int32_t step, tp_mode;       // step: steps done
  int32_t layer_lo, layer_hi;  // the stage's layers [lo, hi)
  uint64_t nparams;
  uint64_t payload_bytes;  // 3 * nparams * sizeof(float)
  uint64_t tokenizer;      // the word tokenizer's fingerprint; 0: bytes
  LrSchedule schedule;
  uint32_t crc;  // CRC-32 of this header (crc = 0) and the payload
  uint32_t pad;
};

// steps_done: the steps the saved state has taken (the checkpoint's name).
ShardHeader make_shard_header(const ModelConfig& m, const Layout& l, int rank, int steps_done, uint64_t nparams,
                              int layer_lo, int layer_hi);

std::string step_dir_name(int steps_done);  // step_00000042: after 42 steps
std::string rank_file_name(int rank);       // rank_00003.bin
// Parses what `latest` holds: exactly step_ and 8 digits (so never "..", "/"
// or anything outside the directory). Returns the step, or -1.
int parse_step_dir(const std::string& name);

// Creates dir if needed and checks that it is trusted (check_dir_trusted)
// and that a file can be written there.
void check_dir_usable(const std::string& dir, int rank);
// Throws unless dir is a directory of this user that other users cannot write
// (resuming loads what it holds). A checkpoint's step directory must also not
// be a symbolic link.
void check_dir_trusted(const std::string& dir);
void check_step_dir_trusted(const std::string& dir, int steps_done);
// Removes the temporary files a killed save of `rank` may have left
// (rank 0 also the pointer's). Returns how many it removed.
int remove_stale_tmp(const std::string& dir, int rank);

// Writes the shard under a temporary name, syncs it and renames it into place;
// on failure removes the temporary file.
void write_shard(const std::string& path, ShardHeader h, const float* params, const float* m, const float* v);
// Reads and verifies a shard: a regular file of this user that others cannot
// write, format, header fields against `want` (layout, rank, model, parameter
// count), size on disk, checksum, finite values. Returns the steps the saved
// state has done; fills *schedule (if given) with the learning-rate schedule
// the saving run followed, when the shard records one (format 4).
int read_shard(const std::string& path, const ShardHeader& want, std::vector<float>* params, std::vector<float>* m,
               std::vector<float>* v, LrSchedule* schedule = nullptr);
// "--steps 100 (warmup 5, lr 0.003, min-lr-ratio 0.1)"
std::string schedule_text(const LrSchedule& s);

// Points DIR/latest at a checkpoint (temporary file, sync, rename).
void write_latest(const std::string& dir, int steps_done);
// The checkpoint DIR/latest names; throws when there is no pointer, it is
// invalid, or it is not a regular file of this user closed to others.
int read_latest(const std::string& dir);

// Keeps the `keep` newest checkpoints of steps up to `current` (current
// included) and removes the older ones; keep <= 0 keeps all. Returns the
// steps removed.
std::vector<int> prune_checkpoints(const std::string& dir, int current, int keep);

}  // namespace meshtrain
