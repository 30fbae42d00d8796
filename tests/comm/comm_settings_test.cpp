// Settings that belong to a communicator: the plan-shaping ones are frozen
// into it when it is made (a later change of the environment, and the new
// communicators that read it, leave it alone), its ranks agree on rank 0's,
// and meshcclConfig_t gives one communicator its own timeout and scheduling.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "meshccl.h"
#include "tests/common/procs.h"

namespace {

using namespace meshccl_test;

constexpr double kChildDeadline = 60;

// Each rank sends 2 MiB (past every transport's own eager size) to the other
// and then receives, outside a group: completes only while sends of that size
// are eager.
ncclResult_t crossing(ncclComm_t comm, int rank) {
  std::vector<float> out(524288, float(rank)), in(524288, -1.0f);
  ncclResult_t r = ncclSend(out.data(), out.size(), ncclFloat, 1 - rank, comm, nullptr);
  if (r != ncclSuccess) return r;
  r = ncclRecv(in.data(), in.size(), ncclFloat, 1 - rank, comm, nullptr);
  if (r != ncclSuccess) return r;
  return in[524287] == float(1 - rank) ? ncclSuccess : ncclInternalError;
}

// A communicator made before MESHCCL_P2P_EAGER changes keeps its eager sends;
// one made after takes the new value, and the timeout its config gives it
// (2 s, while MESHCCL_TIMEOUT is 10): its crossing sends fail at that
// timeout, named as the config's.
TEST(CommSettings, FrozenAtCreationWithTheConfigsTimeout) {
  SharedArray<SharedId> sid(2);
  SharedSlots slots(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_TIMEOUT", "10", 1);
    ncclUniqueId id;
    if (ncclResult_t r = shared_id(sid, rank, &id, 0); r != ncclSuccess) return fail(9, rank, "id", r);
    ncclComm_t a = nullptr, b = nullptr;
    if (ncclResult_t r = ncclCommInitRank(&a, 2, id, rank); r != ncclSuccess) return fail(10, rank, "init a", r);
    setenv("MESHCCL_P2P_EAGER", "0", 1);
    if (ncclResult_t r = shared_id(sid, rank, &id, 1); r != ncclSuccess) return fail(9, rank, "id", r);
    meshcclConfig_t cfg;
    meshcclConfigInit(&cfg);
    cfg.timeoutSeconds = 2;
    if (ncclResult_t r = ncclCommInitRankConfig(&b, 2, id, rank, &cfg.nccl); r != ncclSuccess)
      return fail(11, rank, "init b", r);
    if (ncclResult_t r = crossing(a, rank); r != ncclSuccess) return fail(12, rank, "crossing on a", r);
    auto t0 = Clock::now();
    slots[rank].result = crossing(b, rank);
    slots[rank].seconds = since(t0);
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(b));
    (void)ncclCommAbort(b);
    if (ncclResult_t r = crossing(a, rank); r != ncclSuccess) return fail(13, rank, "crossing on a after", r);
    ncclResult_t r = ncclCommDestroy(a);
    return r == ncclSuccess ? 0 : fail(14, rank, "destroy a", r);
  });
  ASSERT_EQ(kids.size(), size_t(2));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(slots[r].result, ncclRemoteError) << "rank " << r << ": " << slots[r].message;
    EXPECT_LT(slots[r].seconds, 8) << "rank " << r << " waited for MESHCCL_TIMEOUT, not the config's";
    named |= std::string(slots[r].message).find("(meshcclConfig_t.timeoutSeconds=2)") != std::string::npos;
    std::printf("[settings] rank %d: %.2f s: %s\n", r, slots[r].seconds, slots[r].message);
  }
  EXPECT_TRUE(named) << "no rank named the config's timeout";
}

// Rank 0 asks for the ring, the others for the tree: the communicator takes
// rank 0's rules on every rank, so the AllReduce is one algorithm everywhere
// (two would not pair up) and its result is right.
TEST(CommSettings, RanksTakeRankZerosPlanSettings) {
  const int n = 3;
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_TIMEOUT", "10", 1);
    setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);
    setenv("MESHCCL_ALGO", rank == 0 ? "allreduce:ring" : "allreduce:tree", 1);
    setenv("MESHCCL_CHUNKSIZE", rank == 0 ? "65536" : "1M", 1);
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, n, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    std::vector<double> buf(300007);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = double(rank + 1) * double(i % 97);
    if (ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclDouble, ncclSum, comm, nullptr);
        r != ncclSuccess)
      return fail(11, rank, "ncclAllReduce", r);
    for (size_t i = 0; i < buf.size(); ++i)
      if (buf[i] != 6.0 * double(i % 97)) return 12;
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(13, rank, "destroy", r);
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
}

// Bad values of meshcclConfig_t fail with ncclInvalidArgument naming the
// field; a split child cannot ask for other scheduling than its parent's.
TEST(CommSettings, ConfigValuesAreChecked) {
  SharedArray<SharedId> sid(3);
  SharedSlots slots(3);
  auto kids = run_procs(1, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    meshcclConfig_t cfg;
    ncclComm_t comm = nullptr;
    meshcclConfigInit(&cfg);
    cfg.timeoutSeconds = -5;
    if (shared_id(sid, rank, &id, 0) != ncclSuccess) return 9;
    slots[0].result = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg.nccl);
    std::snprintf(slots[0].message, sizeof(slots[0].message), "%s", ncclGetLastError(nullptr));
    meshcclConfigInit(&cfg);
    cfg.priority = 3;
    if (shared_id(sid, rank, &id, 1) != ncclSuccess) return 9;
    slots[1].result = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg.nccl);
    std::snprintf(slots[1].message, sizeof(slots[1].message), "%s", ncclGetLastError(nullptr));
    meshcclConfigInit(&cfg);
    cfg.priority = 0;  // FIFO
    if (shared_id(sid, rank, &id, 2) != ncclSuccess) return 9;
    if (ncclCommInitRankConfig(&comm, 1, id, 0, &cfg.nccl) != ncclSuccess) return 10;
    cfg.priority = 1;
    ncclComm_t child = nullptr;
    slots[2].result = ncclCommSplit(comm, 0, 0, &child, &cfg.nccl);
    std::snprintf(slots[2].message, sizeof(slots[2].message), "%s", ncclGetLastError(comm));
    cfg.priority = 0;  // the parent's: fine
    if (ncclCommSplit(comm, 0, 0, &child, &cfg.nccl) != ncclSuccess) return 11;
    if (ncclCommDestroy(child) != ncclSuccess || ncclCommDestroy(comm) != ncclSuccess) return 12;
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(1));
  EXPECT_TRUE(exited_ok(kids[0])) << describe(kids[0]);
  const char* field[] = {"timeoutSeconds", "priority", "keeps its parent's"};
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(slots[k].result, ncclInvalidArgument) << slots[k].message;
    EXPECT_NE(std::string(slots[k].message).find(field[k]), std::string::npos) << slots[k].message;
  }
}

}  // namespace
