// all_gather_perf: ncclAllGather of one global sequence, each rank owning a
// block; busbw = algbw * (n-1)/n.
#include "coll.h"

namespace {

using namespace perf;

void Init(const InitArgs& a) {
  const size_t base = a.counts->send_count;
  FillInput(*a.spec, 0, a.rank * base, base, a.send);
  FillInput(*a.spec, 0, 0, a.counts->recv_count, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  return ncclAllGather(a.send, a.recv, a.counts->param_count, a.type->type, a.comm, a.stream);
}

const CollTest kTest{"AllGather",      false,     false,         false, true, true,
                     BlockToAllCounts, RecvBytes, RingBusFactor, Init,  Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
