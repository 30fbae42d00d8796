// meshccl_sim: the library's cost model and tuner on a described cluster.
// A cluster is a system graph (hosts and rank placements, from a preset or a
// topology file) and the cost model's constants; the tables ask the tuner
// (collectives/tuner.cpp estimate_candidates, choose_algorithm) for every
// candidate's prediction and its pick, so a new algorithm appears here as
// soon as the tuner knows it.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "base/op.h"
#include "topo/cost_model.h"
#include "topo/topology.h"

namespace meshccl::sim {

struct Cluster {
  std::string name;  // what it was made from: "dgx-h100:4", "file x.xml"
  SystemGraph graph;
  LinkCost shm;  // between ranks of one host
  LinkCost net;  // between hosts, per rank
  double reduce_gbs = kBuiltinReduceGbs;
  TuneModel model() const { return tune_model_for(graph, shm, net, reduce_gbs); }
  int nhosts() const { return static_cast<int>(graph.hosts.size()); }
};

// Constants given on the command line (or MESHCCL_TUNE_*); <= 0: not given.
struct Overrides {
  double shm_alpha_us = 0, shm_gbs = 0, net_alpha_us = 0, net_gbs = 0, reduce_gbs = 0;
};

// The known presets, for help and errors: "dgx-h100", "cpu".
std::string preset_names();
// A preset as "NAME" or "NAME:HOSTS". hosts > 0 overrides the spec's count;
// a spec without a count and hosts 0 is one host. False with the reason in
// *err for an unknown name or a bad count.
bool preset_cluster(const std::string& spec, int hosts, Cluster* out, std::string* err);
// True when spec names a preset without a host count (the tables then sweep
// 8..16384 ranks).
bool preset_sweeps(const std::string& spec);
int preset_ranks_per_host(const std::string& spec);
// A topology file (meshccl's format or NCCL's XML). hosts 0: the file's hosts
// as they are; else the file's hosts repeated in turn to make `hosts`. Hosts
// the file places no ranks on get ranks_per_host ranks (0: one per GPU).
bool file_cluster(const std::string& path, int hosts, int ranks_per_host, Cluster* out, std::string* err);
void apply(const Overrides& o, Cluster* c);
// The most ranks a table may have.
constexpr int kMaxRanks = 1 << 20;

// One candidate at one size.
struct Row {
  OpKind kind = OpKind::AllReduce;
  int nranks = 0, nhosts = 0;
  double bytes = 0;  // nccl-tests' size: the whole buffer
  std::string algorithm;
  double us = 0;  // predicted time; +inf where the algorithm does not apply
  double algbw_gbs = 0, busbw_gbs = 0;
  bool allowed = true;  // by MESHCCL_ALGO
  bool picked = false;  // the tuner's choice
};

struct Sizes {
  double min_bytes = 8, max_bytes = double(size_t{1} << 30), factor = 4;
};

// Every candidate's prediction for kind on cluster c at each size, and the
// tuner's pick. False with the reason when the tuner refuses (a bad
// MESHCCL_ALGO).
bool predict(const Cluster& c, OpKind kind, const Sizes& sizes, std::vector<Row>* rows, std::string* err);
// nccl-tests' bus bandwidth factor for kind on n ranks.
double busbw_factor(OpKind kind, int n);
void print_table(std::FILE* f, const Cluster& c, OpKind kind, const std::vector<Row>& rows);
void write_csv_header(std::FILE* f);
void write_csv(std::FILE* f, const Cluster& c, const std::vector<Row>& rows);

}  // namespace meshccl::sim
