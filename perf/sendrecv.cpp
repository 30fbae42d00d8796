// sendrecv_perf: every rank sends to rank+1 and receives from rank-1 in one
// group; busbw = algbw. In-place is timed but not verified (as nccl-tests).
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
  const int n = a.spec->nranks;
  FillInput(*a.spec, a.rank, 0, a.counts->send_count, a.send);
  FillInput(*a.spec, (a.rank + n - 1) % n, 0, a.counts->recv_count, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  const size_t count = a.counts->param_count;
  const int next = (a.rank + 1) % a.nranks, prev = (a.rank + a.nranks - 1) % a.nranks;
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = ncclSend(a.send, count, a.type->type, next, a.comm, a.stream);
  if (r == ncclSuccess) r = ncclRecv(a.recv, count, a.type->type, prev, a.comm, a.stream);
  const ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}

// nccl-tests loops sendrecv over the -o ops too (the op only labels the row).
const CollTest kTest{"SendRecv", true, false, false, false, true, GetCounts, AlgBytes, BusFactor, Init, Call, nullptr};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
