// all_gather_perf: ncclAllGather of one global sequence, each rank owning a
// block; busbw = algbw * (n-1)/n.
#include "coll.h"

namespace {

using namespace perf;

Counts GetCounts(size_t bytes, size_t elt, int n) {
  Counts c;
  const size_t base = AlignedBase(bytes, elt, n);
  c.send_count = c.param_count = base;
  c.recv_count = base * n;
  c.send_inplace_offset = base;
  return c;
}

double AlgBytes(const Counts& c, size_t elt, int) { return static_cast<double>(c.recv_count * elt); }
double BusFactor(int n) { return static_cast<double>(n - 1) / n; }

void Init(const InitArgs& a) {
  const size_t base = a.counts->send_count;
  FillInput(*a.spec, 0, a.rank * base, base, a.send);
  FillInput(*a.spec, 0, 0, a.counts->recv_count, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  return ncclAllGather(a.send, a.recv, a.counts->param_count, a.type->type, a.comm, a.stream);
}

const CollTest kTest{"AllGather", false, false, false, true, true, GetCounts, AlgBytes, BusFactor,
                     Init, Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
