// reduce_scatter_perf: ncclReduceScatter; rank r receives block r of the
// reduction; busbw = algbw * (n-1)/n.
#include "coll.h"

namespace {

using namespace perf;

void Init(const InitArgs& a) {
  const size_t base = a.counts->recv_count;
  FillInput(*a.spec, a.rank, 0, a.counts->send_count, a.send);
  FillReduced(*a.spec, a.rank * base, base, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  return ncclReduceScatter(a.send, a.recv, a.counts->param_count, a.type->type, a.op, a.comm, a.stream);
}

const CollTest kTest{"ReduceScatter",  true,      false,         false, true, true,
                     AllToBlockCounts, SendBytes, RingBusFactor, Init,  Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
