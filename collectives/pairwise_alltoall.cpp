// Pairwise AlltoAll: every rank exchanges one block with every other rank; the
// exchanges are independent and progress concurrently.
#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_pairwise_alltoall(const OpDesc& op, Plan* plan) {
  const int n = op.nranks, r = op.rank;
  const size_t es = op.elem(), c = op.count, bytes = c * es;
  plan->algorithm = "pairwise";
  plan->copy(at(op.recvbuff, r * c, es), at(op.sendbuff, r * c, es), bytes);
  if (bytes == 0) return kOk;
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    plan->send(to, 0, at(op.sendbuff, to * c, es), bytes);
    plan->recv(from, 0, at(op.recvbuff, from * c, es), bytes);
  }
  return kOk;
}

}  // namespace meshccl
