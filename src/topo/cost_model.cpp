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

std::vector<int> one_pair_per_host(const std::vector<int>& match, const std::vector<int>& host) {
  std::vector<int> out(match.size(), -1);
  std::vector<bool> busy(host.size() + 1, false);
  for (size_t r = 0; r < match.size(); ++r) {
    const int m = match[r];
    if (m < static_cast<int>(r)) continue;  // unmatched, or counted from its lower end
    const size_t a = static_cast<size_t>(host[r]), b = static_cast<size_t>(host[static_cast<size_t>(m)]);
    if (busy[a] || busy[b]) continue;
    busy[a] = busy[b] = true;
    out[r] = m;
    out[static_cast<size_t>(m)] = static_cast<int>(r);
  }
  return out;
}

int TuneModel::hosts() const { return host.empty() ? 1 : *std::max_element(host.begin(), host.end()) + 1; }

}  // namespace meshccl
