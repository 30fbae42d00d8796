// The cost model behind algorithm choice: alpha (latency of one dependent
// message step), beta (time per byte on a link, 1 / bandwidth) and gamma
// (time per byte of local reduction), kept per link class. Its constants are
// set by parameter or measured at communicator init, then agreed across ranks
// so that every rank picks the same algorithm for the same operation.
#pragma once

#include <vector>

#include "util/status.h"

namespace meshccl {

class Bootstrap;
class Engine;
class Mesh;
struct PeerInfo;
struct SystemGraph;

// What one message step costs on a class of links.
struct LinkCost {
  double alpha_us = 0;  // latency of one dependent step, microseconds
  double bw_gbs = 0;    // bandwidth per direction, GB/s (beta = 1 / bw)
};

// Everything a cost function may look at. Identical on every rank of a
// communicator (a pure function of agreed values), so costs compare alike.
struct TuneModel {
  int nranks = 1;
  bool network = false;  // some pair of ranks talks over a network transport
  LinkCost shm;          // shared memory between processes of one host
  LinkCost net;          // network transports (socket, plugins)
  double reduce_gbs = 0; // local reduction throughput, bytes of output per ns

  // Flat algorithms run at the pace of their slowest link: the network
  // class as soon as one pair of ranks uses it.
  const LinkCost& link() const { return network ? net : shm; }
  double alpha() const { return link().alpha_us; }
  double beta() const { return 1e-3 / link().bw_gbs; }  // us per byte
  double gamma() const { return 1e-3 / reduce_gbs; }    // us per byte
};

// The constants used where no rank knows better (no link of that class,
// nothing measured or set); topology.h's nominal bandwidths match them.
constexpr LinkCost kBuiltinShm{2.0, 5.0};
constexpr LinkCost kBuiltinNet{20.0, 1.25};
constexpr double kBuiltinReduceGbs = 5.0;

// A model from explicit constants (tests, tools).
TuneModel make_tune_model(int nranks, bool network, LinkCost shm, LinkCost net, double reduce_gbs);
// The model of a communicator laid out as `graph` (its ranks, and which of
// them share a host) with the given constants: how a described cluster
// becomes a model (tools/meshccl_sim).
TuneModel tune_model_for(const SystemGraph& graph, LinkCost shm, LinkCost net, double reduce_gbs);

// Collective over the communicator (link_measure.cpp), once its connections and engine exist:
// fills the model from MESHCCL_TUNE_* parameters, transport properties and a
// short measurement (a few milliseconds), agreed across ranks through the
// bootstrap.
Status tune_init(int rank, Bootstrap& bootstrap, Mesh& mesh, Engine& engine, const std::vector<PeerInfo>& peers,
                 TuneModel* out);

}  // namespace meshccl
