// gather_perf: ncclGather to the root of one global sequence; non-roots must
// find their recv buffer untouched. busbw = algbw * (n-1)/n.
#include <cstring>

#include "coll.h"

namespace {

using namespace perf;

void Init(const InitArgs& a) {
  const size_t base = a.counts->send_count;
  const size_t elt = a.spec->type->size;
  FillInput(*a.spec, 0, a.rank * base, base, a.send);
  if (a.rank == a.root) {
    FillInput(*a.spec, 0, 0, a.counts->recv_count, a.expected);
    return;
  }
  std::memset(a.expected, 0, a.counts->recv_count * elt);
  if (a.in_place)  // its input sits inside its own (unused) recv buffer
    FillInput(*a.spec, 0, a.rank * base, base, static_cast<char*>(a.expected) + a.rank * base * elt);
}

ncclResult_t Call(const CallArgs& a) {
  if (a.counts->param_count == 0) return ncclSuccess;
  return ncclGather(a.send, a.recv, a.counts->param_count, a.type->type, a.root, a.comm, a.stream);
}

const CollTest kTest{"Gather",         false,     true,          false, true, true,
                     BlockToAllCounts, RecvBytes, RingBusFactor, Init,  Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
