// meshccl_info: version, build features, transports and every setting with its
// current value.
#include <cstdio>
#include <string>

#include "meshccl.h"
#include "meshccl_config.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/memory.h"
#endif
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

}  // namespace

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "-h" || arg == "--help") {
    std::printf(
        "usage: meshccl_info [--markdown | --topo]\nPrints the meshccl version, build features, transports and settings.\n"
        "--markdown prints only the settings, as the table of docs/environment.md.\n"
        "--topo prints this host's topology (MESHCCL_TOPO_FILE's first host when set) and where this process runs.\n");
    return 0;
  }
  if (arg == "--markdown") {
    std::printf("| variable | NCCL alias | default | meaning |\n| --- | --- | --- | --- |\n");
    for (const meshccl::ParamInfo& p : meshccl::all_params())
      std::printf("| `%s` | %s | `%s` | %s |\n", p.name, p.alias ? ("`" + std::string(p.alias) + "`").c_str() : "",
                  p.default_value, p.help);
    return 0;
  }
  if (arg == "--topo") return print_topo();
  if (!arg.empty()) {
    std::fprintf(stderr, "meshccl_info: unknown argument '%s' (try --help)\n", arg.c_str());
    return 2;
  }
  int v = 0;
  ncclGetVersion(&v);
  std::printf("meshccl %s (NCCL API %d.%d.%d, version code %d)\n\n", MESHCCL_VERSION_STRING, NCCL_MAJOR, NCCL_MINOR,
              NCCL_PATCH, v);
  std::printf("Build features\n");
  std::printf("  %-10s %s\n", "cuda", MESHCCL_HAVE_CUDA ? "yes" : "no");
  std::printf("  %-10s %s\n", "hwloc", MESHCCL_HAVE_HWLOC ? "yes" : "no");
  std::printf("  %-10s %s\n", "ucx", MESHCCL_HAVE_UCX ? "yes" : "no");
  std::printf("  %-10s %s\n", "ofi", MESHCCL_HAVE_OFI ? "yes" : "no");
  std::printf("  %-10s %s\n\n", "kernels", meshccl::kernels::isa_name());
#if MESHCCL_HAVE_CUDA
  std::printf("CUDA (driver loaded at run time)\n%s\n", meshccl::cuda::describe().c_str());
#endif
  std::printf("Transports\n");
  for (const meshccl::TransportInfo& t : meshccl::transport_inventory()) {
    std::printf("  %-8s %-28s %s\n", t.name.c_str(), t.problem.empty() ? t.version.c_str() : "(does not load)", t.path.c_str());
    if (!t.problem.empty()) std::printf("           %s\n", t.problem.c_str());
  }
  std::printf("  between hosts: the first of ucx, ofi, socket that both ranks load (MESHCCL_TRANSPORT, NCCL_NET to choose)\n");
  std::printf("\nSettings (environment value, else default)\n");
  for (const meshccl::ParamInfo& p : meshccl::all_params()) {
    const char* env = std::getenv(p.name);
    if (env == nullptr && p.alias) env = std::getenv(p.alias);
    std::printf("  %s=%s%s\n", p.name, env ? env : p.default_value, env ? "  (set)" : "");
    if (p.alias) std::printf("      alias %s\n", p.alias);
    std::printf("      %s\n", p.help);
  }
  return 0;
}
