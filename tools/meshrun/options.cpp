#include "options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace meshrun {

namespace {

bool parse_int(const std::string& text, long lo, long hi, int* value) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || text[0] == ' ') return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *value = static_cast<int>(v);
  return true;
}

// Splits "--name=value" into name and value; plain options leave value empty
// and has_value false.
struct Split {
  std::string name;
  std::string value;
  bool has_value = false;
};

Split split_long(const std::string& arg) {
  Split s;
  auto eq = arg.find('=');
  if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    s.name = arg.substr(0, eq);
    s.value = arg.substr(eq + 1);
    s.has_value = true;
  } else {
    s.name = arg;
  }
  return s;
}

}  // namespace

bool parse_seconds(const std::string& text, double* seconds) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || text[0] == ' ') return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || c == '.')) return false;
  }
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < 0) return false;
  *seconds = v;
  return true;
}

bool is_env_name(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    bool digit = c >= '0' && c <= '9';
    if (!(alpha || (digit && i > 0))) return false;
  }
  return true;
}

std::string parse_options(int argc, const char* const* argv, Options* out) {
  Options opt;
  bool have_n = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") break;  // the program
    if (arg == "-h" || arg == "--help") {
      opt.help = true;
      *out = opt;
      return "";
    }
    if (arg == "--no-prefix") {
      opt.prefix = false;
      continue;
    }

    // Options taking a value: "-n 4", "-n4", "--np 4", "--np=4".
    Split s = split_long(arg);
    std::string name = s.name;
    std::string value;
    bool attached = s.has_value;
    if (!attached && (arg.rfind("-n", 0) == 0 || arg.rfind("-x", 0) == 0) && arg.size() > 2 &&
        arg != "-np") {
      name = arg.substr(0, 2);
      value = arg.substr(2);
      attached = true;
    } else if (attached) {
      value = s.value;
    }
    bool known = name == "-n" || name == "-np" || name == "--np" || name == "--hostid-per-rank" ||
                 name == "--timeout" || name == "-x";
    if (!known) return "unknown option '" + arg + "'";
    if (!attached) {
      if (i + 1 >= argc) return "option '" + name + "' needs a value";
      value = argv[++i];
    }

    if (name == "-n" || name == "-np" || name == "--np") {
      if (!parse_int(value, 1, kMaxRanks, &opt.nranks))
        return "-n needs a number of ranks from 1 to " + std::to_string(kMaxRanks) + ", got '" +
               value + "'";
      have_n = true;
    } else if (name == "--hostid-per-rank") {
      if (!parse_int(value, 1, kMaxRanks, &opt.hostid_per_rank))
        return "--hostid-per-rank needs a positive number of ranks per host, got '" + value + "'";
    } else if (name == "--timeout") {
      if (!parse_seconds(value, &opt.timeout_s) || opt.timeout_s <= 0)
        return "--timeout needs a positive number of seconds, got '" + value + "'";
    } else {  // -x
      auto eq = value.find('=');
      if (eq == std::string::npos)
        return "-x needs NAME=VALUE, got '" + value +
               "' (variables already in meshrun's environment reach the ranks without -x)";
      std::string var = value.substr(0, eq);
      if (!is_env_name(var)) return "-x: '" + var + "' is not a valid variable name";
      opt.env.emplace_back(var, value.substr(eq + 1));
    }
  }
  for (; i < argc; ++i) opt.command.emplace_back(argv[i]);

  if (!have_n) return "missing -n N (number of ranks)";
  if (opt.command.empty()) return "missing the program to run";
  *out = std::move(opt);
  return "";
}

std::string usage() {
  return "usage: meshrun -n N [options] prog [args...]\n"
         "\n"
         "Starts N local processes of 'prog args', each with the environment of one\n"
         "rank of a meshccl job (MESHCCL_RANK, MESHCCL_NRANKS, MESHCCL_LOCAL_RANK,\n"
         "MESHCCL_LOCAL_SIZE, MESHCCL_COMM_FILE and, with --hostid-per-rank,\n"
         "MESHCCL_HOSTID).\n"
         "\n"
         "options:\n"
         "  -n N, --np N            number of ranks (1.." +
         std::to_string(kMaxRanks) +
         ")\n"
         "  --hostid-per-rank K     every K consecutive ranks form one emulated host\n"
         "                          (MESHCCL_HOSTID=host<rank/K>)\n"
         "  --timeout S             kill the job after S seconds (exit status 124)\n"
         "  -x NAME=VALUE           set an environment variable in every rank\n"
         "  --no-prefix             pass rank output through unchanged instead of\n"
         "                          prefixing each line with '[rank] '\n"
         "  -h, --help              print this help\n"
         "\n"
         "If a rank fails (non-zero exit or a signal), the other ranks get SIGTERM,\n"
         "then SIGKILL after MESHCCL_KILL_GRACE seconds (default 3), and meshrun exits\n"
         "with the failed rank's status (128+signal for a signal). SIGINT, SIGTERM\n"
         "and SIGHUP sent to meshrun are forwarded to every rank.\n"
         "Exit status: 0 success, 2 bad arguments, 124 timeout, 127 program not found.\n";
}

}  // namespace meshrun
