// -J: the run as one JSON object in nccl-tests' layout (version 3), written by
// process 0 when the run ends.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "args.h"

namespace perf {

class JsonWriter {
 public:
  ~JsonWriter();
  // Opens path without overwriting (path, then path.0, path.1, ...); prints
  // "# Writing JSON output to <file>" or why it is skipped.
  bool Open(const std::string& path, int argc, char** argv, int nccl_version);
  void Config(const Options& o);
  void Devices(const char* lines);  // "#  Rank ..." lines
  void EndConfig();
  void Row(size_t bytes, size_t count, const char* type, const char* op, int root, double oop_time, double oop_algbw,
           double oop_busbw, int64_t oop_wrong, double ip_time, double ip_algbw, double ip_busbw, int64_t ip_wrong,
           bool cputime, int iters, const char* name);
  void Finish(int out_of_bounds, double avg_bw, double min_bw, const char* error);

  static std::string Quote(const char* s);

 private:
  FILE* f_ = nullptr;
  std::string doc_;
  std::string devices_;
  std::string rows_;
};

}  // namespace perf
