// alltoall_perf: ncclAlltoAll, block p of rank r going to rank p; busbw =
// algbw * (n-1)/n. In place it is timed but not checked, like nccl-tests
// (#wrong reads N/A); meshccl does support it (tests/collectives/direct_test.cpp).
#include "coll.h"

namespace {

using namespace perf;

Counts GetCounts(size_t bytes, size_t elt, int n) {
  Counts c;
  const size_t base = AlignedBase(bytes, elt, n);
  c.send_count = c.recv_count = base * n;
  c.param_count = base;
  return c;
}

void Init(const InitArgs& a) {
  const size_t base = a.counts->param_count;
  const int n = a.spec->nranks;
  FillInput(*a.spec, a.rank, 0, a.counts->send_count, a.send);
  char* exp = static_cast<char*>(a.expected);
  for (int q = 0; q < n; q++)  // block q comes from rank q's block for us
    FillInput(*a.spec, q, a.rank * base, base, exp + q * base * a.spec->type->size);
}

ncclResult_t Call(const CallArgs& a) {
  return ncclAlltoAll(a.send, a.recv, a.counts->param_count, a.type->type, a.comm, a.stream);
}

const CollTest kTest{"AlltoAll", false,     false,         false, false, true,
                     GetCounts,  RecvBytes, RingBusFactor, Init,  Call,  nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
