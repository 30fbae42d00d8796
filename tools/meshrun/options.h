// Command line of meshrun. Parsing is pure (no I/O, no exit) so it can be
// tested directly; main() turns an error into a message and exit status 2.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace meshrun {

// Upper bound on -n: each rank costs two pipes and a process, and a job this
// size on one machine is certainly a typo.
inline constexpr int kMaxRanks = 4096;

struct Options {
  int nranks = 0;
  int hostid_per_rank = 0;  // 0: no emulated hosts, all ranks share one host
  double timeout_s = 0;     // 0: no time limit
  bool prefix = true;
  bool help = false;
  std::vector<std::pair<std::string, std::string>> env;  // -x NAME=VALUE, in order
  std::vector<std::string> command;                      // prog args...
};

// Fills *out from argv[1..argc). Returns "" on success, else a one-line
// description of what is wrong with the arguments.
std::string parse_options(int argc, const char* const* argv, Options* out);

// A duration in seconds: a non-negative decimal number ("3", "0.5").
// Returns false on anything else (empty, trailing junk, negative, inf, nan).
bool parse_seconds(const std::string& text, double* seconds);

// A valid environment variable name for -x: [A-Za-z_][A-Za-z0-9_]*.
bool is_env_name(const std::string& name);

std::string usage();

}  // namespace meshrun
