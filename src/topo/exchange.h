// The communicator's system graph, made at init: each rank describes its host
// and where it runs (discovered, or read from MESHCCL_TOPO_FILE), the ranks
// allgather the descriptions over the bootstrap, and every rank merges the
// same graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topo/topo_file.h"
#include "topo/topology.h"
#include "util/status.h"

namespace meshccl {

class Bootstrap;
struct PeerInfo;

// What one rank brings to the graph.
struct LocalTopo {
  HostTopo host;
  RankPlace place;        // .host unused here
  uint64_t host_key = 0;  // equal on ranks of one (described) host
  bool from_file = false;
};

// This rank's contribution. `file` is the parsed MESHCCL_TOPO_FILE, or null to
// discover. Pure apart from discovery and the calling thread's binding, which
// come in through `host` (when file is null) and `binding`.
Status topo_local(int rank, const std::vector<PeerInfo>& peers, int cuda_dev, const TopoFile* file,
                  const std::string& file_name, const HostTopo& discovered, const CpuSet& binding,
                  const std::string& ifname, double net_gbs, LocalTopo* out);

// Collective over the bootstrap: every rank gets the same graph. Reads
// MESHCCL_TOPO_FILE when set.
Status topo_init(int rank, Bootstrap& bootstrap, const std::vector<PeerInfo>& peers, int cuda_dev, SystemGraph* out);

// After init: logs the graph (INFO, subsystem GRAPH; the whole graph on rank
// 0, its own placement on the others) and, on rank 0, writes
// MESHCCL_TOPO_DUMP_FILE when set: "%c" in the name becomes the
// communicator's id (hex), so each communicator has its own file; without
// it only communicators made by init write (not those made by a split, whose
// graph is a part of their parent's).
Status topo_publish(int rank, const SystemGraph& graph, uint64_t comm_hash, bool from_split);
// The dump file name for a communicator, "" when it writes none.
std::string topo_dump_name(const std::string& setting, uint64_t comm_hash, bool from_split);

}  // namespace meshccl
