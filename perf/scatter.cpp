// scatter_perf: ncclScatter of one global sequence from the root, block r to
// rank r; busbw = algbw * (n-1)/n.
#include "coll.h"

namespace {

using namespace perf;

void Init(const InitArgs& a) {
  const size_t base = a.counts->recv_count;
  if (a.rank == a.root) FillInput(*a.spec, 0, 0, a.counts->send_count, a.send);
  FillInput(*a.spec, 0, a.rank * base, base, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  if (a.counts->param_count == 0) return ncclSuccess;
  return ncclScatter(a.send, a.recv, a.counts->param_count, a.type->type, a.root, a.comm, a.stream);
}

const CollTest kTest{"Scatter",        false,     true,          false, true, true,
                     AllToBlockCounts, SendBytes, RingBusFactor, Init,  Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
