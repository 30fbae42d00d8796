// Coordination between the processes of one test run (barriers, combining
// times and error counts, sharing the ncclUniqueId): MPI when the tools are
// built for mpirun, otherwise a meshccl communicator created from the
// launcher's environment (meshrun, or mpirun/srun without MPI linked), or
// nothing at all for a single process.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace perf {

enum class Reduce { kSum, kMin, kMax };

class ProcGroup {
 public:
  virtual ~ProcGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  // Each returns false on failure after printing why.
  virtual bool Barrier() = 0;
  virtual bool AllReduce(double* values, int n, Reduce op) = 0;
  virtual bool Broadcast(void* data, size_t bytes, int root) = 0;
  // The processes with the same color as this one, as a group of their own
  // (NCCL_TESTS_SPLIT). Collective over this group; nullptr on failure.
  virtual std::unique_ptr<ProcGroup> Split(int color) = 0;
  // Runs down the group: MPI_Finalize, or destroys the communicator.
  virtual void Finish() = 0;
};

// Creates the group that fits how this process was started. *argc/*argv may
// be rewritten by MPI_Init. Returns nullptr after printing the reason.
std::unique_ptr<ProcGroup> CreateProcGroup(int* argc, char*** argv);

}  // namespace perf
