// all_reduce_perf: ncclAllReduce; busbw = algbw * 2(n-1)/n.
#include "coll.h"

namespace {

using namespace perf;

Counts GetCounts(size_t bytes, size_t elt, int) {
  Counts c;
  c.send_count = c.recv_count = c.param_count = bytes / elt;
  return c;
}

double AlgBytes(const Counts& c, size_t elt, int) { return static_cast<double>(c.param_count * elt); }
double BusFactor(int n) { return 2.0 * (n - 1) / n; }

void Init(const InitArgs& a) {
  FillInput(*a.spec, a.rank, 0, a.counts->send_count, a.send);
  FillReduced(*a.spec, 0, a.counts->recv_count, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  return ncclAllReduce(a.send, a.recv, a.counts->param_count, a.type->type, a.op, a.comm, a.stream);
}

const CollTest kTest{"AllReduce", true, false, false, true, true, GetCounts, AlgBytes, BusFactor, Init, Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
