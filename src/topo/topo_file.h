// Topology files: meshccl's own format (<meshccl_topology version="1">, see
// docs/topology.md), which MESHCCL_TOPO_DUMP_FILE writes and
// MESHCCL_TOPO_FILE reads, and NCCL's topology XML (<system>, as
// NCCL_TOPO_FILE and NCCL_TOPO_DUMP_FILE use it), which describes one host.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "topo/topology.h"
#include "util/status.h"

namespace meshccl {

struct TopoFile {
  enum class Format { kMeshccl, kNccl };
  Format format = Format::kMeshccl;
  std::vector<HostTopo> hosts;   // at least one
  std::vector<RankPlace> ranks;  // meshccl files only; empty when the file places no ranks
};

// Parses a topology file of either format from bytes. Never logs, never
// crashes; on malformed input returns false with "<name>:<line>: <what>" in
// *err. The entry point for fuzzing.
bool topo_parse(const std::string& name, const char* data, size_t size, TopoFile* out, std::string* err);

// Reads and parses a file; failures are ncclInvalidArgument with the parse
// error (file:line) as message.
Status topo_read_file(const std::string& path, TopoFile* out);

// The graph in meshccl's format: hosts, rank placements, and (up to 64
// ranks) every pair's link, which topo_parse checks against the placements.
std::string topo_to_xml(const SystemGraph& graph);
// One host, as a file with no ranks.
std::string host_to_xml(const HostTopo& host);
Status topo_write_file(const std::string& path, const SystemGraph& graph);

// NCCL's format (topo/nccl_xml.cpp): the <system> root into one host.
struct XmlElement;
struct XmlError;
bool nccl_system_to_host(const XmlElement& root, HostTopo* out, XmlError* err);

}  // namespace meshccl
