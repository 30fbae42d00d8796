// Text output of the nccl-tests-compatible tools. Every string here reproduces
// nccl-tests 2.19.6 byte for byte (see docs/performance.md), because users diff
// our tables against NVIDIA runs and feed them to the same parsers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace perf {

// Renders value into exactly `width` characters the way nccl-tests does: two
// decimals while the integer part leaves room, then one, then none, then
// scientific notation.
std::string FloatStr(double value, int width);

struct PreambleInfo {
  const char* program = "";
  int nccl_headers = 0;
  int nccl_library = 0;
  int nthreads = 1;
  int ngpus = 1;
  size_t min_bytes = 0;
  size_t max_bytes = 0;
  size_t step_bytes = 0;
  size_t step_factor = 1;
  int warmup_iters = 0;
  int iters = 0;
  int agg_iters = 0;
  int check = 0;
  int graph = 0;
  int unalign = 0;
  int blocking = 0;
  bool parallel_init = false;
  bool per_iter_timing = false;
};

// Version line, program line, parameter line, optional mode lines and "#".
std::string Preamble(const PreambleInfo& info);

// One "#  Rank ..." line of the "# Using devices" block.
std::string DeviceLine(int rank, int group, int pid, const char* host, int device, unsigned domain, unsigned bus,
                       unsigned dev, const char* name);

// "#" followed by the three header lines of the result table.
std::string TableHeader(bool report_cputime, bool report_timestamps, bool per_iter_timing);

// Row start: size, count, type, op and root columns.
std::string RowStart(size_t bytes, size_t count, const char* type, const char* op, int root);
// One mode (out-of-place or in-place) of a row. wrong < 0 prints N/A.
std::string RowBody(double time_us, double algbw, double busbw, int64_t wrong);
// A mode that was not run: every column reads N/A, in the same widths.
std::string RowBodyNotRun();
// The per-iteration columns (-I 1) following one mode.
std::string RowPerIter(double min_us, double max_us, double p99_us, double cv_pct);
// The timestamp column of -S 1.
std::string RowTimestamp(const char* stamp);

// "Out of bounds values", "Avg bus bandwidth", "#", "Collective test concluded".
// min_bw < 0 means NCCL_TESTS_MIN_BW was not set (no OK/FAILED after the value).
std::string Footer(int out_of_bounds, double avg_busbw, double min_bw, const char* program);

// "# GPU memory usage     : Initialization X | User-Allocated Y | Collective Z | Total  T"
// (-M 1), amounts in bytes rendered as nccl-tests does (binary KB/MB/GB).
std::string MemoryLine(double init, double user, double coll);
std::string MemString(double bytes);

// Parses a size with optional K/M/G suffix (binary multiples, any case,
// decimals allowed). Returns false on malformed or negative input.
bool ParseSize(const char* text, size_t* bytes);

}  // namespace perf
