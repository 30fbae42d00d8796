// Command line of the nccl-tests-compatible tools: the same flags, defaults,
// parsing and messages as nccl-tests 2.19.6.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "data.h"

namespace perf {

struct Options {
  int nthreads = 1;
  int ngpus = 1;
  size_t min_bytes = 32 * 1024 * 1024;
  size_t max_bytes = 32 * 1024 * 1024;
  size_t step_bytes = 1024 * 1024;
  size_t step_factor = 1;
  int iters = 20;
  int agg_iters = 1;
  int warmup_iters = 1;
  int run_cycles = 1;
  int parallel_init = 0;
  int check = 1;
  std::vector<Op> ops{Op::kSum};
  std::vector<const TypeInfo*> types;  // filled with float by ParseArgs
  int root = 0;                        // -1: every root in turn
  int blocking = 0;
  int stream_null = 0;
  int timeout_s = 0;
  int graph = 0;
  int report_cputime = 0;
  int report_timestamps = 0;
  std::string json_path;
  int average = 1;
  int local_register = 0;
  int cta_policy = -1;  // -1: unset
  int device_impl = 0;
  int device_cta_count = 16;
  int memory_report = 0;
  int unalign = 0;
  int per_iter_timing = 0;
  int per_iter_skip = 0;
};

enum class ParseResult {
  kRun,
  kExitSuccess,  // -h or an unknown option: usage printed, exit 0
  kExitUsage,    // bad sizes and the like: exit 255 before running
};

// Parses argv into *opts. Messages (warnings, usage, errors) are appended to
// *out exactly as nccl-tests prints them on stdout; callers print *out.
ParseResult ParseArgs(int argc, char** argv, Options* opts, std::string* out);

// NCCL_TESTS_SPLIT: "<op> <value>" with op AND/&, OR/|, MOD/%, DIV//, value
// decimal, 0x hex or 0b binary, applied to the process index. Returns false
// on a malformed spec.
bool SplitColor(const char* spec, int proc, int* color);

// Sizes of one sweep: min, then *factor or +step, up to max inclusive.
std::vector<size_t> SweepSizes(const Options& opts);

}  // namespace perf
