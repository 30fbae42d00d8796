// The MPI peer: MPI_Allreduce, MPI_Bcast, MPI_Allgather,
// MPI_Reduce_scatter_block and MPI_Alltoall with float32 sum, built once
// against Open MPI (mpi_bench) and once with MPICH's wrapper (mpi_bench_mpich).
//   mpirun --oversubscribe --allow-run-as-root -np 2 mpi_bench -C all -b 8 -e 256M
//   mpiexec.mpich -n 2 mpi_bench_mpich -C allreduce
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "peer_common.h"

namespace {

class MpiBackend final : public peer::Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
#if defined(OPEN_MPI)
    snprintf(name_, sizeof name_, "openmpi-%d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
    snprintf(name_, sizeof name_, "mpich-%s", MPICH_VERSION);
#else
    snprintf(name_, sizeof name_, "mpi");
#endif
  }
  const char* name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  void SumDoubles(double* v, int n) override { MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); }
  void Run(peer::Coll c, const peer::Sizes& s, float* send, float* recv) override {
    const int count = static_cast<int>(s.count);
    switch (c) {
      case peer::Coll::kAllReduce: MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
      case peer::Coll::kBroadcast: MPI_Bcast(recv, count, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
      case peer::Coll::kAllGather: MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD); break;
      case peer::Coll::kReduceScatter:
        MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case peer::Coll::kAlltoAll: MPI_Alltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD); break;
    }
  }

 private:
  int rank_ = 0, size_ = 1;
  char name_[64];
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MpiBackend b;
  peer::Options o;
  std::string err;
  if (!peer::ParseOptions(argc, argv, &o, &err)) {
    if (b.rank() == 0) fprintf(stderr, "%s\n", err.c_str());
    MPI_Finalize();
    return 2;
  }
  const int rc = peer::RunSweep(b, o);
  MPI_Finalize();
  return rc;
}
