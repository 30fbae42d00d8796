// libFuzzer target for the topology reader (built with clang only; see
// tests/topo/meson.build). Any input must parse or fail with "name:line: ...".
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "topo/topo_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  meshccl::TopoFile f;
  std::string err;
  if (meshccl::topo_parse("fuzz.xml", reinterpret_cast<const char*>(data), size, &f, &err)) {
    if (f.hosts.empty() || f.hosts[0].numa.empty()) std::abort();
    // What parses also writes and reads back.
    meshccl::SystemGraph g;
    g.hosts = f.hosts;
    g.ranks = f.ranks;
    const std::string text = meshccl::topo_to_xml(g);
    meshccl::TopoFile back;
    if (!meshccl::topo_parse("again.xml", text.data(), text.size(), &back, &err)) std::abort();
    g.hosts = back.hosts;
    g.ranks = back.ranks;
    if (meshccl::topo_to_xml(g) != text) std::abort();
  } else if (err.rfind("fuzz.xml:", 0) != 0) {
    std::abort();
  }
  return 0;
}
