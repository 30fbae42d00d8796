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
// Three link classes: shared memory within a NUMA node (`shm`), shared memory
// across NUMA nodes (`cross_numa`), and the network between hosts (`net`: the
// bandwidth of one network link of a host; a host has `rails` of them, and
// ranks that talk across hosts at once share min(rails, ranks) links).
struct TuneModel {
  int nranks = 1;
  bool network = false;           // some pair of ranks talks over a network transport
  bool cross_numa_links = false;  // some pair of ranks of one host is on different NUMA nodes
  LinkCost shm;                   // shared memory between processes of one NUMA node
  LinkCost cross_numa;            // shared memory between NUMA nodes of one host
  LinkCost net;                   // network transports (socket, plugins): one host's link
  double reduce_gbs = 0;          // local reduction throughput, bytes of output per ns
  // Network links per host, each of net.bw_gbs: 1 where a host's ranks share
  // one NIC (the emulated clusters, most CPU hosts); one per local rank on
  // rail-optimized GPU nodes (a NIC per GPU).
  int rails = 1;
  // Host of each rank (0..hosts-1, numbered in order of their lowest rank),
  // from the system graph; empty: every rank on host 0.
  std::vector<int> host;
  // The share of a CPU each rank has on the most crowded host: min(1, CPUs /
  // ranks) from the topology (1 where unknown). Reductions run on the CPU
  // while every rank of the host reduces at once, but reduce_gbs is measured
  // by one rank at a time: the model divides it among the ranks of a host
  // that has fewer CPUs than ranks.
  double cpu_share = 1;

  // Flat algorithms run at the pace of their slowest link: the network
  // class as soon as one pair of ranks uses it.
  const LinkCost& local() const { return cross_numa_links ? cross_numa : shm; }
  const LinkCost& link() const { return network ? net : local(); }
  double alpha() const { return link().alpha_us; }
  double beta() const { return 1e-3 / link().bw_gbs; }              // us per byte
  double gamma() const { return 1e-3 / (reduce_gbs * cpu_share); }  // us per byte
  int host_of(int rank) const { return host.empty() ? 0 : host[static_cast<size_t>(rank)]; }
  int hosts() const;
  // Bandwidth out of one host (GB/s) when `streams` of its ranks send across
  // hosts at once: each stream on its own rail while there are rails.
  double host_net_gbs(int streams) const;
};

// The constants used where no rank knows better (no link of that class,
// nothing measured or set); topology.h's nominal bandwidths match them.
constexpr LinkCost kBuiltinShm{2.0, 5.0};
constexpr LinkCost kBuiltinNet{20.0, 1.25};
constexpr double kBuiltinReduceGbs = 5.0;

// A model from explicit constants (tests, tools): every rank on one host,
// cross-NUMA links as fast as same-NUMA ones (set the fields to say otherwise).
TuneModel make_tune_model(int nranks, bool network, LinkCost shm, LinkCost net, double reduce_gbs);
// The same model with ranks placed on hosts (host[r] as in TuneModel::host).
TuneModel with_hosts(TuneModel model, std::vector<int> host);
// The model of a communicator laid out as `graph` (its ranks, which of them
// share a host, which pairs of a host are across NUMA nodes) with the given
// constants, cross-NUMA as shm: how a described cluster becomes a model
// (tools/meshccl_sim).
TuneModel tune_model_for(const SystemGraph& graph, LinkCost shm, LinkCost net, double reduce_gbs);
// Network links per host of graph: the fewest distinct interfaces (ifname)
// the ranks of one host name (ranks without a name share one), at least 1.
int rails_of(const SystemGraph& graph);
// Host of each rank of graph, numbered in order of their lowest rank (TuneModel::host).
std::vector<int> host_numbers(const SystemGraph& graph);
// The pairs of a matching (match[r]: r's partner, -1 when unmatched) that
// measure the network's bandwidth in tune_init: the first pair, by lower rank,
// of every host not yet in one (host[r]: r's host), so that each host's link
// carries one flow each way, as it does under the ring and the hierarchical
// algorithms (one flow per channel). With every pair at once (4 flows through
// one 100 Mbit/s link of 2 emulated hosts x 4 ranks) TCP lost packets at the
// link's queue, and 6 inits measured 0.77-0.97 of the link's 95.5 Mbit/s,
// which a hierarchical AllReduce filled to 0.98-1.0. Same form as match.
std::vector<int> one_pair_per_host(const std::vector<int>& match, const std::vector<int>& host);
// TuneModel::cpu_share of graph: over its hosts with a known CPU count, the
// least of min(1, CPUs / ranks on the host); 1 where no host's count is known.
double cpu_share_of(const SystemGraph& graph);

// Collective over the communicator (link_measure.cpp), once its connections and engine exist:
// fills the model from MESHCCL_TUNE_* parameters, the system graph (hosts,
// NUMA placement, the cross-NUMA to same-NUMA bandwidth ratio), transport
// properties and a short measurement (a few milliseconds), agreed across ranks
// through the bootstrap. A split or shrink child passes its parent's model
// as `inherited`: every member of a child has the same parent and so the same
// agreed constants, which the child takes (for its own ranks and hosts)
// without measuring or agreeing again; communicators made by applications
// that split often (a split per phase, a shrink after every failure) would
// otherwise pay the measurement each time.
Status tune_init(int rank, Bootstrap& bootstrap, Mesh& mesh, Engine& engine, const std::vector<PeerInfo>& peers,
                 const SystemGraph& graph, const TuneModel* inherited, TuneModel* out);

}  // namespace meshccl
