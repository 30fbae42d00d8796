// meshccl_sim: predicted time and bus bandwidth of every algorithm the tuner
// knows, and its pick, per collective and size, on a preset cluster or one
// described by a topology file, for up to kMaxRanks ranks. See docs/simulator.md.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshccl_config.h"
#include "sim.h"
#include "util/param.h"

extern char** environ;

namespace {

using namespace meshccl;
using namespace meshccl::sim;

const char* kUsage =
    "usage: meshccl_sim (--preset NAME[:HOSTS] | --topo FILE) [options]\n"
    "Prints, per collective, rank count and size, every algorithm's predicted time (us) and bus\n"
    "bandwidth (GB/s, nccl-tests' convention) under meshccl's cost model, and the tuner's pick.\n"
    "  --preset NAME[:HOSTS]  a preset cluster; without HOSTS the tables go from 8 to 16384 ranks:\n%s\n"
    "  --topo FILE            a topology file: meshccl's (MESHCCL_TOPO_DUMP_FILE) or NCCL's XML\n"
    "  --hosts N[,N...]       host counts to tabulate (a file's hosts are repeated in turn)\n"
    "  --ranks-per-host N     ranks on each host the file places none on (default: one per GPU)\n"
    "  --coll LIST            allreduce,allgather,reducescatter,broadcast,reduce,alltoall,gather,scatter\n"
    "                         or all (default: the first six)\n"
    "  -b, -e BYTES           smallest and largest size (default 8, 1G; K M G suffixes)\n"
    "  -f FACTOR              size step (default 4)\n"
    "  --shm-alpha-us X --shm-gbs X --net-alpha-us X --net-gbs X --reduce-gbs X\n"
    "                         cost-model constants (else MESHCCL_TUNE_*, else the preset's or the\n"
    "                         file's bandwidths with built-in latencies)\n"
    "  --csv FILE             every row as CSV\n"
    "  --png FILE             a plot of the CSV (python3 and matplotlib; scripts/sim_plot.py)\n"
    "  --quiet                no tables on standard output\n"
    "  -V, --version          print meshccl_sim's version\n"
    "MESHCCL_ALGO restricts the candidates as it does in the library.\n";

constexpr double kMaxBytes = double(uint64_t{1} << 40);

struct Options {
  std::string preset, topo, csv, png;
  std::vector<int> hosts;
  int ranks_per_host = 0;
  std::vector<OpKind> kinds;
  Sizes sizes;
  Overrides over;
  bool quiet = false;
};

int fail(const std::string& msg) {
  std::fprintf(stderr, "meshccl_sim: %s\n", msg.c_str());
  return 2;
}

// "64K", "1G", "1.5": a positive finite number.
bool parse_number(const char* s, double* out) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s) return false;
  if (*end != 0 && end[1] == 0) {
    const char* suffixes = "KMGT";
    const char* at = std::strchr(suffixes, *end);
    if (at == nullptr) return false;
    v *= std::pow(1024.0, 1 + (at - suffixes));
    ++end;
  }
  if (*end != 0 || !std::isfinite(v) || v <= 0) return false;
  *out = v;
  return true;
}

bool parse_kinds(const std::string& list, std::vector<OpKind>* out) {
  static const std::pair<const char*, OpKind> kNames[] = {
      {"allreduce", OpKind::AllReduce}, {"allgather", OpKind::AllGather}, {"reducescatter", OpKind::ReduceScatter},
      {"broadcast", OpKind::Broadcast}, {"reduce", OpKind::Reduce},       {"alltoall", OpKind::AlltoAll},
      {"gather", OpKind::Gather},       {"scatter", OpKind::Scatter}};
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    bool found = false;
    for (const auto& [n, k] : kNames) {
      if (name == n || name == "all") out->push_back(k), found = true;
      if (found && name != "all") break;
    }
    if (!found) return false;
    pos = comma + 1;
  }
  return !out->empty();
}

bool parse_hosts(const std::string& list, std::vector<int>* out) {
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string s = list.substr(pos, comma - pos);
    if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    const int v = std::atoi(s.c_str());
    if (v < 1 || v > kMaxRanks) return false;
    out->push_back(v);
    pos = comma + 1;
  }
  return true;
}

// Parses argv; returns -1 to go on, else the exit status.
int parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(kUsage, preset_names().c_str());
      return 0;
    }
    if (a == "-V" || a == "--version") {
      std::printf("meshccl_sim (meshccl) %s\n", MESHCCL_VERSION_STRING);
      return 0;
    }
    if (a == "--quiet") {
      o->quiet = true;
      continue;
    }
    if (i + 1 >= argc) return fail(a + " needs a value (or is unknown); see --help");
    const char* v = argv[++i];
    double* num = a == "-b"               ? &o->sizes.min_bytes
                  : a == "-e"             ? &o->sizes.max_bytes
                  : a == "-f"             ? &o->sizes.factor
                  : a == "--shm-alpha-us" ? &o->over.shm_alpha_us
                  : a == "--shm-gbs"      ? &o->over.shm_gbs
                  : a == "--net-alpha-us" ? &o->over.net_alpha_us
                  : a == "--net-gbs"      ? &o->over.net_gbs
                  : a == "--reduce-gbs"   ? &o->over.reduce_gbs
                                          : nullptr;
    if (num != nullptr) {
      if (!parse_number(v, num)) return fail(a + " " + v + ": not a positive number");
    } else if (a == "--preset") o->preset = v;
    else if (a == "--topo") o->topo = v;
    else if (a == "--csv") o->csv = v;
    else if (a == "--png") o->png = v;
    else if (a == "--hosts") {
      if (!parse_hosts(v, &o->hosts))
        return fail(std::string("--hosts ") + v + ": not a list of counts 1.." + std::to_string(kMaxRanks));
    } else if (a == "--ranks-per-host") {
      std::vector<int> n;
      if (!parse_hosts(v, &n) || n.size() != 1) return fail(std::string("--ranks-per-host ") + v + ": not a count");
      o->ranks_per_host = n[0];
    } else if (a == "--coll") {
      if (!parse_kinds(v, &o->kinds)) return fail(std::string("--coll ") + v + ": unknown collective; see --help");
    } else return fail("unknown option " + a + "; see --help");
  }
  if (o->preset.empty() == o->topo.empty()) return fail("give one of --preset and --topo; see --help");
  if (o->sizes.min_bytes > o->sizes.max_bytes) return fail("-b is larger than -e");
  if (o->sizes.max_bytes > kMaxBytes) return fail("-e: at most 1T (2^40 bytes)");
  if (o->sizes.factor > 1 && std::log(o->sizes.max_bytes / o->sizes.min_bytes) / std::log(o->sizes.factor) > 4096)
    return fail("more than 4096 sizes: raise -f");
  if (o->sizes.factor < 1.01 && o->sizes.min_bytes != o->sizes.max_bytes) return fail("-f must be above 1");
  if (o->kinds.empty())
    o->kinds = {OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter,
                OpKind::Broadcast, OpKind::Reduce,    OpKind::AlltoAll};
  return -1;
}

// Flags win over MESHCCL_TUNE_*, as settings win over measurements in the library.
void env_overrides(Overrides* o) {
  auto take = [](double* field, Param p) {
    if (*field <= 0) *field = param_double(p, 0);
  };
  take(&o->shm_alpha_us, Param::TuneShmAlphaUs);
  take(&o->shm_gbs, Param::TuneShmBwGbs);
  take(&o->net_alpha_us, Param::TuneNetAlphaUs);
  take(&o->net_gbs, Param::TuneNetBwGbs);
  take(&o->reduce_gbs, Param::TuneReduceGbs);
}

// The clusters to tabulate: a preset without a count sweeps 8..16384 ranks.
bool clusters_of(const Options& o, std::vector<Cluster>* out, std::string* err) {
  std::vector<int> hosts = o.hosts;
  if (hosts.empty() && !o.preset.empty() && preset_sweeps(o.preset)) {
    const int per = preset_ranks_per_host(o.preset);
    for (int ranks = 8; ranks <= 16384; ranks *= 2)
      if (ranks % per == 0) hosts.push_back(ranks / per);
  }
  if (hosts.empty()) hosts.push_back(0);  // as the spec or the file says
  for (int h : hosts) {
    Cluster c;
    const bool ok =
        o.preset.empty() ? file_cluster(o.topo, h, o.ranks_per_host, &c, err) : preset_cluster(o.preset, h, &c, err);
    if (!ok) return false;
    apply(o.over, &c);
    out->push_back(std::move(c));
  }
  return true;
}

int plot(const std::string& csv, const std::string& png) {
  const std::string script = MESHCCL_SIM_PLOT;
  if (access(script.c_str(), R_OK) != 0) return fail("the plot script " + script + " is not there");
  std::vector<std::string> args = {"python3", script, csv, png};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), environ) != 0)
    return fail("cannot run python3 for the plot");
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fail("the plot script failed (python3 " + script + " " + csv + " " + png + ")");
  return 0;
}

int run(const Options& o) {
  std::vector<Cluster> clusters;
  std::string err;
  if (!clusters_of(o, &clusters, &err)) return fail(err);
  const std::string csv = !o.csv.empty() ? o.csv : !o.png.empty() ? o.png + ".csv" : "";
  std::FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (!csv.empty() && out == nullptr) return fail("cannot write " + csv + ": " + std::strerror(errno));
  if (out != nullptr) write_csv_header(out);
  double slowest_ms = 0;
  int tables = 0;
  for (const Cluster& c : clusters) {
    for (OpKind kind : o.kinds) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<Row> rows;
      if (!predict(c, kind, o.sizes, &rows, &err)) {
        if (out != nullptr) std::fclose(out);
        return fail(err);
      }
      slowest_ms = std::max(slowest_ms,
                            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      ++tables;
      if (!o.quiet) print_table(stdout, c, kind, rows);
      if (out != nullptr) write_csv(out, c, rows);
    }
  }
  if (out != nullptr && std::fclose(out) != 0) return fail("cannot write " + csv);
  std::fprintf(stderr, "meshccl_sim: %d tables, %d to %d ranks, slowest %.1f ms%s%s\n", tables,
               clusters.front().graph.nranks(), clusters.back().graph.nranks(), slowest_ms, csv.empty() ? "" : ", CSV ",
               csv.c_str());
  return o.png.empty() ? 0 : plot(csv, o.png);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const int st = parse(argc, argv, &o);
  if (st >= 0) return st;
  env_overrides(&o.over);
  return run(o);
}
