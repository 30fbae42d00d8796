// What one nccl-tests-compatible binary adds to the common driver: buffer
// counts, the bus-bandwidth factor, data initialisation with expected values,
// and the call itself (nccl-tests' per-collective shape).
#pragma once

#include <cstddef>

#include "data.h"
#include "nccl.h"

namespace perf {

struct Counts {
  size_t send_count = 0;   // elements of the send buffer
  size_t recv_count = 0;   // elements of the recv buffer (what is checked)
  size_t param_count = 0;  // the count passed to NCCL (the `count` column)
  // In-place variants use, in elements of the recv allocation:
  //   send = recv_base + send_inplace_offset * rank
  //   recv = recv_base + recv_inplace_offset * rank
  size_t send_inplace_offset = 0;
  size_t recv_inplace_offset = 0;
};

// Arguments of one call of a collective on one rank.
struct CallArgs {
  const void* send;
  void* recv;
  const Counts* counts;
  const TypeInfo* type;
  ncclRedOp_t op;
  int root;
  int rank;
  int nranks;
  ncclComm_t comm;
  cudaStream_t stream;
};

// Arguments of data initialisation on one rank. `send` points where this rank's
// input must be written (inside the recv buffer for in-place runs); `expected`
// receives the recv_count elements the recv buffer must hold afterwards. The
// recv region has been zeroed before init is called.
struct InitArgs {
  const DataSpec* spec;
  const Counts* counts;
  int rank;
  int root;
  bool in_place;
  void* send;
  void* expected;
};

struct CollTest {
  const char* name;     // e.g. "AllReduce"
  bool reduces;         // loops over -o ops and prints the op
  bool rooted;          // loops over roots with -r -1 and prints the root
  bool blank_op;        // prints an empty op column (hypercube)
  bool check_in_place;  // false: in-place #wrong is reported as N/A
  // false: the in-place variant cannot run, so its columns read N/A and stay
  // out of the average.
  bool in_place_defined;
  Counts (*counts)(size_t bytes, size_t elt, int nranks);
  double (*alg_bytes)(const Counts& c, size_t elt, int nranks);
  double (*bus_factor)(int nranks);
  void (*init)(const InitArgs& a);
  ncclResult_t (*run)(const CallArgs& a);
  // Non-null: the reason no row can run with this many ranks (printed, no rows).
  bool (*unsupported)(int nranks, char* why, size_t len);
};

// Helpers shared by the per-collective files.
// The per-rank count of the (r) collectives: floor(c/n) rounded down to a
// multiple of 16 bytes worth of elements.
size_t AlignedBase(size_t bytes, size_t elt, int nranks);
// One block in, n blocks out (AllGather, Gather, HyperCube); in place the
// input is block `rank` of the output.
Counts BlockToAllCounts(size_t bytes, size_t elt, int nranks);
// n blocks in, one block out (ReduceScatter, Scatter); in place the output is
// block `rank` of the input.
Counts AllToBlockCounts(size_t bytes, size_t elt, int nranks);
// Algorithm bytes = the larger buffer, for the two shapes above.
double RecvBytes(const Counts& c, size_t elt, int nranks);
double SendBytes(const Counts& c, size_t elt, int nranks);
// busbw factor of collectives where each byte crosses n-1 of n links.
double RingBusFactor(int nranks);

// The whole program: parse flags, create ranks, sweep, print, exit status.
int RunMain(const CollTest& test, int argc, char** argv);

}  // namespace perf
