#include "procgroup.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "meshccl.h"
#include "nccl.h"

#if MESHCCL_PERF_MPI
#include <mpi.h>
#endif

namespace perf {

namespace {

class SingleGroup final : public ProcGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  bool Barrier() override { return true; }
  bool AllReduce(double*, int, Reduce) override { return true; }
  bool Broadcast(void*, size_t, int) override { return true; }
  std::unique_ptr<ProcGroup> Split(int) override { return std::make_unique<SingleGroup>(); }
  void Finish() override {}
};

#if MESHCCL_PERF_MPI
class MpiGroup final : public ProcGroup {
 public:
  MpiGroup(MPI_Comm comm, bool world) : comm_(comm), world_(world) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Lower-numbered ranks on this host, as nccl-tests counts them.
    MPI_Comm local;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_free(&local);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  bool Barrier() override { return MPI_Barrier(comm_) == MPI_SUCCESS; }
  bool AllReduce(double* v, int n, Reduce op) override {
    const MPI_Op mop = op == Reduce::kSum ? MPI_SUM : op == Reduce::kMin ? MPI_MIN : MPI_MAX;
    return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, mop, comm_) == MPI_SUCCESS;
  }
  bool Broadcast(void* data, size_t bytes, int root) override {
    return MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_) == MPI_SUCCESS;
  }
  std::unique_ptr<ProcGroup> Split(int color) override {
    MPI_Comm sub;
    if (MPI_Comm_split(comm_, color, rank_, &sub) != MPI_SUCCESS) return nullptr;
    return std::make_unique<MpiGroup>(sub, false);
  }
  void Finish() override {
    if (world_) MPI_Finalize();
    else if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

 private:
  MPI_Comm comm_;
  bool world_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};
#endif

// Coordination over a meshccl communicator on host memory with the NULL
// stream, so every call has completed when it returns.
class MeshcclGroup final : public ProcGroup {
 public:
  MeshcclGroup(ncclComm_t comm, int rank, int size, int local) : comm_(comm), rank_(rank), size_(size), local_(local) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_; }
  bool Barrier() override {
    double one = 1;
    return AllReduce(&one, 1, Reduce::kSum);
  }
  bool AllReduce(double* v, int n, Reduce op) override {
    const ncclRedOp_t nop = op == Reduce::kSum ? ncclSum : op == Reduce::kMin ? ncclMin : ncclMax;
    return Check(ncclAllReduce(v, v, n, ncclFloat64, nop, comm_, nullptr), "ncclAllReduce");
  }
  bool Broadcast(void* data, size_t bytes, int root) override {
    return Check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, nullptr), "ncclBroadcast");
  }
  std::unique_ptr<ProcGroup> Split(int color) override {
    ncclComm_t sub = nullptr;
    if (!Check(ncclCommSplit(comm_, color, rank_, &sub, nullptr), "ncclCommSplit")) return nullptr;
    int rank = 0, size = 1;
    if (!Check(ncclCommUserRank(sub, &rank), "ncclCommUserRank") || !Check(ncclCommCount(sub, &size), "ncclCommCount"))
      return nullptr;
    return std::make_unique<MeshcclGroup>(sub, rank, size, local_);
  }
  void Finish() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

 private:
  bool Check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return true;
    printf("process coordination: %s failed: '%s / %s'\n", what, ncclGetErrorString(r), ncclGetLastError(comm_));
    return false;
  }
  ncclComm_t comm_;
  int rank_, size_, local_;
};

}  // namespace

std::unique_ptr<ProcGroup> CreateProcGroup(int* argc, char*** argv) {
#if MESHCCL_PERF_MPI
  MPI_Init(argc, argv);
  return std::make_unique<MpiGroup>(MPI_COMM_WORLD, true);
#else
  (void)argc;
  (void)argv;
  int rank = 0, nranks = 1, local = 0;
  if (meshcclGetLaunchInfo(&rank, &nranks, &local) != ncclSuccess || nranks <= 1)
    return std::make_unique<SingleGroup>();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = meshcclCommInitFromEnv(&comm, nullptr);
  if (r != ncclSuccess) {
    printf("process coordination: meshcclCommInitFromEnv failed: '%s / %s'\n", ncclGetErrorString(r),
           ncclGetLastError(nullptr));
    return nullptr;
  }
  return std::make_unique<MeshcclGroup>(comm, rank, nranks, local);
#endif
}

}  // namespace perf
