// reduce_perf: ncclReduce to the root; non-roots must find their recv buffer
// untouched. busbw = algbw.
#include <cstring>

#include "coll.h"

namespace {

using namespace perf;

Counts GetCounts(size_t bytes, size_t elt, int) {
  Counts c;
  c.send_count = c.recv_count = c.param_count = bytes / elt;
  return c;
}

double AlgBytes(const Counts& c, size_t elt, int) { return static_cast<double>(c.param_count * elt); }
double BusFactor(int) { return 1.0; }

void Init(const InitArgs& a) {
  const size_t n = a.counts->recv_count;
  FillInput(*a.spec, a.rank, 0, a.counts->send_count, a.send);
  if (a.rank == a.root) FillReduced(*a.spec, 0, n, a.expected);
  else if (a.in_place) FillInput(*a.spec, a.rank, 0, n, a.expected);  // its own input
  else std::memset(a.expected, 0, n * a.spec->type->size);            // still zero
}

ncclResult_t Call(const CallArgs& a) {
  return ncclReduce(a.send, a.recv, a.counts->param_count, a.type->type, a.op, a.root, a.comm, a.stream);
}

const CollTest kTest{"Reduce", true, true, false, true, true, GetCounts, AlgBytes, BusFactor, Init, Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
