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

// How ranks are pinned to the machine's cores (through hwloc).
enum class Bind { None, Core, Numa };

struct Options {
  int nranks = 0;
  int hostid_per_rank = 0;         // 0: no emulated hosts, all ranks share one host
  std::string cluster;             // --cluster NAME: hosts are its network namespaces
  std::vector<std::string> hosts;  // --hosts a,b,...: network namespaces (or hI of --cluster)
  int ranks_per_host = 0;          // --ranks-per-host K: blocked placement; 0: round-robin
  Bind bind = Bind::None;
  bool report_bindings = false;
  bool keep_going = false;  // --keep-going: a failed rank does not stop the others
  double timeout_s = 0;     // 0: no time limit
  bool prefix = false;      // --tag-output
  bool version = false;
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

// A name scripts/cluster accepts: 1 to 12 of [a-z0-9].
bool is_cluster_name(const std::string& name);

// Where one rank runs: host index, its rank among that host's ranks and how
// many the host has, and its position in the machine-wide order (host by
// host), which --bind uses.
struct Placement {
  int host = 0;
  int local_rank = 0;
  int local_size = 0;
  int slot = 0;
};

// Places nranks on nhosts: blocks of per_host consecutive ranks, or
// round-robin when per_host is 0. Returns "" or why they do not fit.
std::string place_ranks(int nranks, int nhosts, int per_host, std::vector<Placement>* out);

// A valid environment variable name for -x: [A-Za-z_][A-Za-z0-9_]*.
bool is_env_name(const std::string& name);

std::string usage();

}  // namespace meshrun
