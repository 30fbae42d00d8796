// meshccl_info: version, build features, transports and every setting with its
// current value.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "meshccl.h"
#include "meshccl/transport.h"
#include "meshccl_config.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/memory.h"
#endif
#include "collectives/algorithms.h"
#include "kernels/reduce.h"
#include "topo/discover.h"
#include "topo/topo_file.h"
#include "transport/registry.h"
#include "util/log.h"
#include "util/param.h"

namespace {

int print_topo() {
  meshccl::HostTopo host;
  const std::string& file = meshccl::param_str(meshccl::Param::TopoFile);
  if (!file.empty()) {
    meshccl::TopoFile parsed;
    if (!meshccl::topo_read_file(file, &parsed).ok()) {
      std::fprintf(stderr, "meshccl_info: %s\n", meshccl::last_error().c_str());
      return 1;
    }
    host = parsed.hosts[0];
  } else {
    host = meshccl::local_host_topo();
  }
  std::printf("%s", meshccl::describe_host(host).c_str());
  const meshccl::CpuSet bound = meshccl::current_binding();
  const int numa = host.numa_of(bound);
  std::printf("this process: cpus %s, numa %s\n", bound.to_list().c_str(),
              numa >= 0 ? std::to_string(numa).c_str() : "unbound (spans several NUMA nodes)");
  return 0;
}

void print_header() {
  int v = 0;
  ncclGetVersion(&v);
  std::printf("meshccl %s (NCCL API %d.%d.%d, version code %d)\n\n", MESHCCL_VERSION_STRING, NCCL_MAJOR, NCCL_MINOR,
              NCCL_PATCH, v);
  std::printf("Build features\n");
  std::printf("  %-10s %s\n", "cuda", MESHCCL_HAVE_CUDA ? "yes" : "no");
  std::printf("  %-10s %s\n", "hwloc", MESHCCL_HAVE_HWLOC ? "yes" : "no");
  std::printf("  %-10s %s\n\n", "kernels", meshccl::kernels::isa_name());
#if MESHCCL_HAVE_CUDA
  std::printf("CUDA (driver loaded at run time)\n%s\n", meshccl::cuda::describe().c_str());
#endif
  // What the registry has: the built-in transports and every plugin on the
  // search path, each loaded, with the scope its properties declare.
  std::printf("Transports (scope: node = processes of one machine, network = any two ranks)\n");
  std::vector<meshccl::TransportInfo> all = meshccl::transport_inventory();
  for (const meshccl::TransportInfo& t : all) {
    std::printf("  %-8s %-8s %-28s %s\n", t.name.c_str(), t.problem.empty() ? meshccl::scope_name(t.scope) : "-",
                t.problem.empty() ? t.version.c_str() : "(does not load)", t.path.c_str());
    if (!t.problem.empty()) std::printf("           %s\n", t.problem.c_str());
  }
  // The registry's order of preference, per scope, of what loaded.
  std::stable_sort(all.begin(), all.end(), [](const meshccl::TransportInfo& a, const meshccl::TransportInfo& b) {
    return a.preference < b.preference;
  });
  for (int scope : {MESHCCL_SCOPE_HOST, MESHCCL_SCOPE_NETWORK}) {
    std::string order;
    for (const meshccl::TransportInfo& t : all)
      if (t.problem.empty() && t.scope == scope) order += (order.empty() ? "" : ", ") + t.name;
    std::printf("  %s: %s\n",
                scope == MESHCCL_SCOPE_HOST ? "within a host, preferred first" : "between hosts, preferred first",
                order.empty() ? "(none)" : order.c_str());
  }
  std::printf("  (MESHCCL_TRANSPORT, NCCL_NET or ncclConfig_t.netName choose one by name)\n");
}

// Every setting with the value in force; which variable set it, and why a
// value set was refused.
void print_settings() {
  using meshccl::Param;
  std::printf("\nSettings (value in force: the environment's, else the default)\n");
  for (size_t i = 0; i < meshccl::all_params().size(); ++i) {
    const Param p = static_cast<Param>(i);
    const meshccl::ParamInfo& info = meshccl::param_info(p);
    std::string problem = meshccl::param_problem(p);
    if (p == Param::Algo && problem.empty() && !meshccl::check_algo_setting().ok())
      problem = meshccl::thread_last_error();
    const bool set = !problem.empty() || meshccl::param_env(p) != nullptr;
    std::string note;
    if (!problem.empty())
      note = std::string("  (") + meshccl::param_set_name(p) + "=\"" + meshccl::param_raw(p) +
             "\" refused: " + problem + "; a communicator would not be made)";
    else if (set) note = std::string("  (set as ") + meshccl::param_set_name(p) + ")";
    std::printf("  %s=%s%s\n", info.name, meshccl::param_str(p).c_str(), note.c_str());
    if (info.alias) std::printf("      alias %s\n", info.alias);
    std::printf("      %s (accepts %s)\n", info.help, meshccl::param_accepts(info).c_str());
  }
  std::printf("\nNCCL settings accepted without effect\n");
  for (const meshccl::IgnoredNcclParam& p : meshccl::ignored_nccl_params()) {
    const char* v = std::getenv(p.name);
    std::printf("  %s%s%s\n      %s\n", p.name, v ? "=" : "", v ? (std::string(v) + "  (set)").c_str() : "", p.why);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (argc > 2) {
    std::fprintf(stderr, "meshccl_info: one argument at most (try --help)\n");
    return 2;
  }
  if (arg == "-h" || arg == "--help") {
    std::printf(
        "usage: meshccl_info [--brief | --markdown | --topo | --version]\n"
        "Prints the meshccl version, build features, transports (the file each loads from) and every setting\n"
        "with the value in force, which variable set it (MESHCCL_X or its NCCL_X alias) and why a value is refused.\n"
        "  --brief     version, build features and transports only\n"
        "  --markdown  only the settings, as the table of docs/environment.md\n"
        "  --topo      this host's topology (MESHCCL_TOPO_FILE's first host when set) and where this process runs\n"
        "  --version   the version line\n"
        "Exit status: 0, or 2 for a bad argument. docs/environment.md explains every setting.\n");
    return 0;
  }
  if (arg == "--version" || arg == "-V") {
    std::printf("meshccl_info (meshccl) %s\n", MESHCCL_VERSION_STRING);
    return 0;
  }
  if (arg == "--markdown") {
    std::printf("| variable | NCCL alias | default | accepts | meaning |\n| --- | --- | --- | --- | --- |\n");
    for (const meshccl::ParamInfo& p : meshccl::all_params())
      std::printf("| `%s` | %s | `%s` | %s | %s |\n", p.name, p.alias ? ("`" + std::string(p.alias) + "`").c_str() : "",
                  p.default_value, meshccl::param_accepts(p).c_str(), p.help);
    std::printf("\n| NCCL variable accepted without effect | why |\n| --- | --- |\n");
    for (const meshccl::IgnoredNcclParam& p : meshccl::ignored_nccl_params())
      std::printf("| `%s` | %s |\n", p.name, p.why);
    return 0;
  }
  if (arg == "--topo") return print_topo();
  if (!arg.empty() && arg != "--brief") {
    std::fprintf(stderr, "meshccl_info: unknown argument '%s' (try --help)\n", arg.c_str());
    return 2;
  }
  print_header();
  if (arg != "--brief") print_settings();
  return 0;
}
