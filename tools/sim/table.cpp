// meshccl_sim's tables: the tuner's estimate of every candidate and its pick,
// per collective and size, printed and as CSV.
#include <algorithm>
#include <cmath>
#include <map>

#include "collectives/algorithms.h"
#include "sim.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl::sim {

namespace {

// Collectives whose count is per rank (or per peer): nccl-tests' size is the
// whole buffer, n counts.
bool per_rank_count(OpKind k) {
  return k == OpKind::AllGather || k == OpKind::ReduceScatter || k == OpKind::AlltoAll || k == OpKind::Gather ||
         k == OpKind::Scatter;
}

OpDesc op_for(OpKind kind, int nranks, double bytes) {
  OpDesc op;
  op.kind = kind;
  op.dtype = ncclFloat32;
  op.nranks = nranks;
  op.chunk_bytes = static_cast<size_t>(param_int(Param::ChunkSize));
  const double elems = std::floor(bytes / static_cast<double>(op.elem()));
  op.count = static_cast<size_t>(per_rank_count(kind) ? std::floor(elems / nranks) : elems);
  return op;
}

std::string size_str(double bytes) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g%s", bytes, units[u]);
  return buf;
}

}  // namespace

double busbw_factor(OpKind kind, int n) {
  if (n <= 1) return 1;
  switch (kind) {
    case OpKind::AllReduce: return 2.0 * (n - 1) / n;
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AlltoAll:
    case OpKind::Gather:
    case OpKind::Scatter: return static_cast<double>(n - 1) / n;
    default: return 1;
  }
}

bool predict(const Cluster& c, OpKind kind, const Sizes& sizes, std::vector<Row>* rows, std::string* err) {
  const TuneModel model = c.model();
  const int n = model.nranks;
  for (double want = sizes.min_bytes; want <= sizes.max_bytes * (1 + 1e-9); want *= sizes.factor) {
    const OpDesc op = op_for(kind, n, want);
    if (op.count == 0) continue;  // less than one element per rank
    const double bytes = static_cast<double>(op.count * op.elem()) * (per_rank_count(kind) ? n : 1);
    const Algorithm* pick = nullptr;
    if (!choose_algorithm(model, op, &pick).ok()) {
      *err = last_error();
      return false;
    }
    for (const Candidate& cand : estimate_candidates(model, op)) {
      Row r;
      r.kind = kind;
      r.nranks = n;
      r.nhosts = c.nhosts();
      r.bytes = bytes;
      r.algorithm = cand.algorithm->name;
      r.us = cand.cost_us;
      r.algbw_gbs = r.us > 0 ? bytes / (r.us * 1e3) : 0;
      r.busbw_gbs = r.algbw_gbs * busbw_factor(kind, n);
      r.allowed = cand.allowed;
      r.picked = cand.algorithm == pick;
      rows->push_back(std::move(r));
    }
    if (sizes.factor <= 1) break;
  }
  return true;
}

void print_table(std::FILE* f, const Cluster& c, OpKind kind, const std::vector<Row>& rows) {
  if (rows.empty()) return;
  std::vector<std::string> algos;  // in the tuner's order
  for (const Row& r : rows)
    if (r.bytes == rows.front().bytes) algos.push_back(r.algorithm);
  const int rails = c.model().rails;
  const std::string nics = rails > 1 ? " per NIC, " + std::to_string(rails) + " NICs per host" : "";
  char share[64] = "";
  if (c.model().cpu_share < 1) std::snprintf(share, sizeof(share), " (%.3g of a CPU per rank)", c.model().cpu_share);
  std::fprintf(
      f, "# %s on %d ranks, %d host%s (%s): shm %.3g us %.4g GB/s, net %.3g us %.4g GB/s%s, reduce %.4g GB/s%s\n",
      op_kind_name(kind), rows.front().nranks, rows.front().nhosts, rows.front().nhosts == 1 ? "" : "s", c.name.c_str(),
      c.shm.alpha_us, c.shm.bw_gbs, c.net.alpha_us, c.net.bw_gbs, nics.c_str(), c.reduce_gbs, share);
  std::vector<int> width;  // of each algorithm's time column
  std::fprintf(f, "# %9s", "size");
  for (const std::string& a : algos) {
    width.push_back(std::max<int>(10, static_cast<int>(a.size()) + 3));
    std::fprintf(f, " %*s %9s", width.back(), (a + " us").c_str(), "busbw");
  }
  std::fprintf(f, "  %s\n", "pick");
  for (size_t i = 0; i < rows.size(); i += algos.size()) {
    std::fprintf(f, "  %9s", size_str(rows[i].bytes).c_str());
    const char* pick = "?";
    for (size_t j = i; j < i + algos.size() && j < rows.size(); ++j) {
      std::fprintf(f, " %*.4g %9.4g", width[j - i], rows[j].us, rows[j].busbw_gbs);
      if (rows[j].picked) pick = rows[j].algorithm.c_str();
    }
    std::fprintf(f, "  %s\n", pick);
  }
}

void write_csv_header(std::FILE* f) {
  std::fprintf(f, "cluster,collective,nranks,nhosts,bytes,algorithm,time_us,algbw_gbs,busbw_gbs,allowed,picked\n");
}

void write_csv(std::FILE* f, const Cluster& c, const std::vector<Row>& rows) {
  for (const Row& r : rows)
    std::fprintf(f, "%s,%s,%d,%d,%.0f,%s,%.6g,%.6g,%.6g,%d,%d\n", c.name.c_str(), op_kind_name(r.kind), r.nranks,
                 r.nhosts, r.bytes, r.algorithm.c_str(), r.us, r.algbw_gbs, r.busbw_gbs, r.allowed ? 1 : 0,
                 r.picked ? 1 : 0);
}

}  // namespace meshccl::sim
