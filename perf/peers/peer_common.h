// Shared by the peer benchmarks (Open MPI, MPICH, Gloo): the same sweep,
// byte counts, bus-bandwidth factors, buffer rotation and averaging as the
// nccl-tests-compatible tools, float32 sum only, and one CSV format:
//   library,collective,nranks,bytes,count,time_us,algbw_gbs,busbw_gbs,wrong
// Built by MPICH's compiler wrapper too, so it depends on nothing of meshccl.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace peer {

enum class Coll { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAlltoAll };

const char* CollName(Coll c);  // allreduce, broadcast, allgather, reducescatter, alltoall
bool FindColl(const std::string& name, Coll* c);

struct Options {
  std::vector<Coll> colls;
  size_t min_bytes = 8;
  size_t max_bytes = 256u << 20;
  size_t step_factor = 2;
  int iters = 20;
  int warmup = 2;
  int check = 1;
  bool header = true;
  std::string store;  // Gloo: rendezvous directory
};

// Parses -C <coll[,coll..]|all> -b -e -f -n -w -c, --no-header, --store.
// Returns false (with a message) on bad input.
bool ParseOptions(int argc, char** argv, Options* o, std::string* err);

// Element counts of one measurement, as nccl-tests defines them for float32.
struct Sizes {
  size_t send_count = 0;
  size_t recv_count = 0;
  size_t count = 0;      // the per-call count (nccl-tests' count column)
  size_t bytes = 0;      // the size column: max(send, recv) bytes
  double alg_bytes = 0;  // bytes for algbw
  double bus_factor = 1;
};
Sizes SizesFor(Coll c, size_t bytes, int nranks);

// Data for checking: small integers, so every summation order is exact.
void FillInput(Coll c, const Sizes& s, int rank, int nranks, float* send);
void FillExpected(Coll c, const Sizes& s, int rank, int nranks, float* expected);
size_t CountWrong(const float* got, const float* expected, size_t n);

// What a library provides to the common loop.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void Barrier() = 0;
  virtual void SumDoubles(double* v, int n) = 0;  // over all ranks, in place
  // One blocking call of collective c; root 0 for broadcast (data in recv).
  virtual void Run(Coll c, const Sizes& s, float* send, float* recv) = 0;
  // Called when a size starts, with the unrotated buffers, before any Run of
  // that size, outside the timings (Gloo's reduce-scatter sizes its scratch
  // buffer there).
  virtual void Prepare(Coll, const Sizes&, float*, float*) {}
};

// Sweeps every collective and size, prints CSV rows on rank 0; returns the
// process exit status (1 if any check failed).
int RunSweep(Backend& b, const Options& o);

}  // namespace peer
