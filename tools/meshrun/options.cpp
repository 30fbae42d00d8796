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

bool is_cluster_name(const std::string& name) {
  if (name.empty() || name.size() > 12) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

std::string place_ranks(int nranks, int nhosts, int per_host, std::vector<Placement>* out) {
  if (nranks < 1 || nhosts < 1) return "no ranks or no hosts to place them on";
  if (per_host > 0 && static_cast<long>(per_host) * nhosts < nranks)
    return "-n " + std::to_string(nranks) + " does not fit on " + std::to_string(nhosts) + " host(s) with " +
           std::to_string(per_host) + " rank(s) per host";
  std::vector<Placement> p(nranks);
  std::vector<int> size(nhosts, 0);
  for (int r = 0; r < nranks; ++r) {
    p[r].host = per_host > 0 ? r / per_host : r % nhosts;
    p[r].local_rank = size[p[r].host]++;
  }
  for (int r = 0; r < nranks; ++r) p[r].local_size = size[p[r].host];
  // Machine-wide order: hosts in turn, each host's ranks in local order.
  std::vector<int> first(nhosts, 0);
  for (int h = 1; h < nhosts; ++h) first[h] = first[h - 1] + size[h - 1];
  for (int r = 0; r < nranks; ++r) p[r].slot = first[p[r].host] + p[r].local_rank;
  *out = std::move(p);
  return "";
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
    if (arg == "--no-prefix") {  // the default; kept for older scripts
      opt.prefix = false;
      continue;
    }
    if (arg == "--tag-output") {
      opt.prefix = true;
      continue;
    }
    if (arg == "--version" || arg == "-V") {
      opt.version = true;
      *out = opt;
      return "";
    }
    if (arg == "--keep-going") {
      opt.keep_going = true;
      continue;
    }
    if (arg == "--report-bindings") {
      opt.report_bindings = true;
      continue;
    }

    // Options taking a value: "-n 4", "-n4", "--np 4", "--np=4".
    Split s = split_long(arg);
    std::string name = s.name;
    std::string value;
    bool attached = s.has_value;
    if (!attached && (arg.rfind("-n", 0) == 0 || arg.rfind("-x", 0) == 0) && arg.size() > 2 && arg != "-np") {
      name = arg.substr(0, 2);
      value = arg.substr(2);
      attached = true;
    } else if (attached) {
      value = s.value;
    }
    bool known = name == "-n" || name == "-np" || name == "--np" || name == "--hostid-per-rank" ||
                 name == "--timeout" || name == "-x" || name == "--cluster" || name == "--hosts" ||
                 name == "--ranks-per-host" || name == "--bind";
    if (!known) return "unknown option '" + arg + "'";
    if (!attached) {
      if (i + 1 >= argc) return "option '" + name + "' needs a value";
      value = argv[++i];
    }

    if (name == "-n" || name == "-np" || name == "--np") {
      if (!parse_int(value, 1, kMaxRanks, &opt.nranks))
        return "-n needs a number of ranks from 1 to " + std::to_string(kMaxRanks) + ", got '" + value + "'";
      have_n = true;
    } else if (name == "--hostid-per-rank") {
      if (!parse_int(value, 1, kMaxRanks, &opt.hostid_per_rank))
        return "--hostid-per-rank needs a positive number of ranks per host, got '" + value + "'";
    } else if (name == "--cluster") {
      if (!is_cluster_name(value))
        return "--cluster needs the name of a cluster made by scripts/cluster (1 to 12 lower-case letters or "
               "digits), got '" +
               value + "'";
      opt.cluster = value;
    } else if (name == "--hosts") {
      opt.hosts.clear();
      size_t start = 0;
      while (start <= value.size()) {
        size_t end = value.find(',', start);
        if (end == std::string::npos) end = value.size();
        std::string h = value.substr(start, end - start);
        if (h.empty() || h.find('/') != std::string::npos || h == "." || h == "..")
          return "--hosts needs a comma-separated list of network namespace names, got '" + value + "'";
        for (const auto& seen : opt.hosts)
          if (seen == h) return "--hosts names '" + h + "' twice";
        if (opt.hosts.size() >= static_cast<size_t>(kMaxRanks)) return "--hosts names too many hosts";
        opt.hosts.push_back(h);
        start = end + 1;
      }
    } else if (name == "--ranks-per-host") {
      if (!parse_int(value, 1, kMaxRanks, &opt.ranks_per_host))
        return "--ranks-per-host needs a positive number of ranks, got '" + value + "'";
    } else if (name == "--bind") {
      if (value == "none") opt.bind = Bind::None;
      else if (value == "core") opt.bind = Bind::Core;
      else if (value == "numa") opt.bind = Bind::Numa;
      else return "--bind needs core, numa or none, got '" + value + "'";
    } else if (name == "--timeout") {
      if (!parse_seconds(value, &opt.timeout_s) || opt.timeout_s <= 0)
        return "--timeout needs a positive number of seconds, got '" + value + "'";
    } else {  // -x NAME=VALUE, or -x NAME: meshrun's own value (as Open MPI's mpirun)
      auto eq = value.find('=');
      std::string var = value.substr(0, eq);
      if (!is_env_name(var)) return "-x: '" + var + "' is not a valid variable name";
      if (eq != std::string::npos) {
        opt.env.emplace_back(var, value.substr(eq + 1));
      } else if (const char* own = std::getenv(var.c_str())) {
        opt.env.emplace_back(var, own);
      } else {
        return "-x " + var + ": " + var + " is not set in meshrun's environment (use -x " + var + "=VALUE)";
      }
    }
  }
  for (; i < argc; ++i) opt.command.emplace_back(argv[i]);

  if (!have_n) return "missing -n N (number of ranks)";
  const bool netns = !opt.cluster.empty() || !opt.hosts.empty();
  if (netns && opt.hostid_per_rank > 0)
    return "--hostid-per-rank emulates hosts by MESHCCL_HOSTID; it cannot be combined with --cluster or --hosts";
  if (opt.ranks_per_host > 0 && !netns)
    return "--ranks-per-host needs --cluster or --hosts (for hosts without namespaces use --hostid-per-rank)";
  if (opt.ranks_per_host > 0 && !opt.hosts.empty() &&
      static_cast<long>(opt.ranks_per_host) * static_cast<long>(opt.hosts.size()) < opt.nranks)
    return "-n " + std::to_string(opt.nranks) + " does not fit on " + std::to_string(opt.hosts.size()) +
           " host(s) with --ranks-per-host " + std::to_string(opt.ranks_per_host);
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
         "  --cluster NAME          run the ranks on the hosts of an emulated cluster\n"
         "                          (scripts/cluster up --name NAME): one network\n"
         "                          namespace per host\n"
         "  --hosts H0,H1,...       run the ranks in these network namespaces (with\n"
         "                          --cluster: h0,h2,... of that cluster)\n"
         "  --ranks-per-host K      ranks 0..K-1 on the first host, K..2K-1 on the next\n"
         "                          (default with hosts: round-robin, rank r on host r%H)\n"
         "  --bind core|numa|none   pin each rank to one core or one NUMA node (hwloc)\n"
         "  --report-bindings       print where each rank is pinned\n"
         "  --keep-going            a rank that fails does not stop the others (survivors shrink)\n"
         "  --timeout S             kill the job after S seconds (exit status 124)\n"
         "  -x NAME=VALUE           set an environment variable in every rank\n"
         "  -x NAME                 pass meshrun's own NAME to every rank (as mpirun -x)\n"
         "  --tag-output            prefix each line of a rank's output with '[rank] '\n"
         "                          (default: output passes through unchanged, so\n"
         "                          nccl-tests parsers read it; --no-prefix is the default)\n"
         "  -V, --version           print meshrun's version\n"
         "  -h, --help              print this help\n"
         "\n"
         "If a rank fails (non-zero exit or a signal), the other ranks get SIGTERM,\n"
         "then SIGKILL after MESHCCL_KILL_GRACE seconds (default 3), and meshrun exits\n"
         "with the failed rank's status (128+signal for a signal). SIGINT, SIGTERM\n"
         "and SIGHUP sent to meshrun are forwarded to every rank.\n"
         "Exit status: 0 success, 2 bad arguments, 124 timeout, 127 program not found.\n";
}

}  // namespace meshrun
