// hypercube_perf: an all-gather built from send/recv, exchanging with
// rank ^ mask for mask = 1, 2, 4, ...; needs a power-of-two rank count.
// algbw counts the (n-1) blocks each rank receives; busbw = algbw.
#include <cstdio>

#include "coll.h"

namespace {

using namespace perf;

double AlgBytes(const Counts& c, size_t elt, int n) { return static_cast<double>((n - 1) * c.param_count * elt); }
double BusFactor(int) { return 1.0; }

void Init(const InitArgs& a) {
  const size_t base = a.counts->send_count;
  FillInput(*a.spec, 0, a.rank * base, base, a.send);
  FillInput(*a.spec, 0, 0, a.counts->recv_count, a.expected);
}

ncclResult_t Call(const CallArgs& a) {
  const size_t count = a.counts->param_count;
  if (count == 0) return ncclSuccess;
  const size_t bytes = count * a.type->size;
  char* recv = static_cast<char*>(a.recv);
  const char* own = recv + a.rank * bytes;
  for (int mask = 1; mask < a.nranks; mask <<= 1) {
    const int peer = a.rank ^ mask;
    const int mine = a.rank & ~(mask - 1), theirs = mine ^ mask;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    if (mask == 1 && a.send != own) {
      // Out-of-place: our own block reaches recv through a send to ourselves,
      // which keeps it in stream order with the other transfers.
      r = ncclSend(a.send, count, a.type->type, a.rank, a.comm, a.stream);
      if (r == ncclSuccess) r = ncclRecv(recv + a.rank * bytes, count, a.type->type, a.rank, a.comm, a.stream);
      if (r == ncclSuccess) r = ncclSend(a.send, count, a.type->type, peer, a.comm, a.stream);
    } else if (r == ncclSuccess) {
      r = ncclSend(recv + mine * bytes, count * mask, a.type->type, peer, a.comm, a.stream);
    }
    if (r == ncclSuccess) r = ncclRecv(recv + theirs * bytes, count * mask, a.type->type, peer, a.comm, a.stream);
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess) return r;
    if (end != ncclSuccess) return end;
  }
  return ncclSuccess;
}

bool Unsupported(int n, char* why, size_t len) {
  if (n > 0 && (n & (n - 1)) == 0) return false;
  snprintf(why, len, "nRanks %d is not a power of 2, skipping", n);
  return true;
}

const CollTest kTest{"HyperCube",      false,    false,     true, true, true,
                     BlockToAllCounts, AlgBytes, BusFactor, Init, Call, Unsupported};

}  // namespace

int main(int argc, char** argv) { return perf::RunMain(kTest, argc, argv); }
