// The cost model's pure parts: building a model from constants and a host
// layout. No communicator, engine or measurement, so tools and fuzzers that
// read topologies link them alone.
#include "topo/cost_model.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace meshccl {

TuneModel make_tune_model(int nranks, bool network, LinkCost shm, LinkCost net, double reduce_gbs) {
  TuneModel t;
  t.nranks = nranks;
  t.network = network;
  t.shm = shm;
  t.cross_numa = shm;
  t.net = net;
  t.reduce_gbs = reduce_gbs;
  return t;
}

TuneModel with_hosts(TuneModel model, std::vector<int> host) {
  model.host = std::move(host);
  return model;
}

double TuneModel::host_net_gbs(int streams) const { return net.bw_gbs * std::clamp(streams, 1, std::max(rails, 1)); }

int TuneModel::hosts() const { return host.empty() ? 1 : *std::max_element(host.begin(), host.end()) + 1; }

}  // namespace meshccl
