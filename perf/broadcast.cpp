// broadcast_perf: ncclBroadcast from the root; busbw = algbw (the root's link bounds it).
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
  if (a.rank == a.root) FillInput(*a.spec, a.root, 0, a.counts->send_count, a.send);
  FillInput(*a.spec, a.root, 0, a.counts->recv_count, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  return ncclBroadcast(a.send, a.recv, a.counts->param_count, a.type->type, a.root, a.comm, a.stream);
}

const CollTest kTest{"Broadcast", false, true, false, true, true, GetCounts, AlgBytes, BusFactor, Init, Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
