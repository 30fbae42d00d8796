/*
 * meshccl extensions to the NCCL API.
 *
 * Host streams: ordered queues of communication work on host memory, with
 * priorities. Pass one wherever NCCL takes a cudaStream_t (cast with
 * meshcclStreamAsCuda): the call returns at once and the operation runs in
 * stream order. Operations on a higher-priority stream are scheduled ahead of
 * those on lower-priority streams. A NULL stream with host buffers completes the
 * operation before the call returns.
 *
 * Launcher integration: meshcclCommInitFromEnv creates the world communicator from
 * the variables set by meshrun, Open MPI's mpirun, MPICH's mpiexec or Slurm's srun.
 */
#ifndef MESHCCL_H_
#define MESHCCL_H_

#include "nccl.h"

#define MESHCCL_MAJOR 0
#define MESHCCL_MINOR 1
#define MESHCCL_PATCH 0
#define MESHCCL_VERSION_CODE (MESHCCL_MAJOR * 10000 + MESHCCL_MINOR * 100 + MESHCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

typedef struct meshcclStream* meshcclStream_t;

/*
 * Priorities follow CUDA's convention: a lower number is more urgent. The range
 * is [greatest, least] = [-3, 0]; 0 is the default. Values outside it are clamped.
 */
ncclResult_t meshcclStreamGetPriorityRange(int* leastPriority, int* greatestPriority);
ncclResult_t meshcclStreamCreate(meshcclStream_t* stream);
ncclResult_t meshcclStreamCreateWithPriority(meshcclStream_t* stream, int priority);
ncclResult_t meshcclStreamGetPriority(meshcclStream_t stream, int* priority);
/* Waits until every operation enqueued so far has completed; returns the first
 * error any of them hit (the stream is then unusable: destroy it). */
ncclResult_t meshcclStreamSynchronize(meshcclStream_t stream);
/* ncclSuccess when idle, ncclInProgress while work is pending, or the error. */
ncclResult_t meshcclStreamQuery(meshcclStream_t stream);
/* Waits for pending work, then frees the stream. */
ncclResult_t meshcclStreamDestroy(meshcclStream_t stream);

static inline cudaStream_t meshcclStreamAsCuda(meshcclStream_t stream) {
  return (cudaStream_t)(void*)stream;
}

/*
 * Creates the world communicator of a job started by a launcher. Rank and size
 * come from MESHCCL_RANK/MESHCCL_NRANKS (meshrun), OMPI_COMM_WORLD_RANK/SIZE,
 * PMI_RANK/PMI_SIZE or SLURM_PROCID/SLURM_NTASKS. Rank 0 hosts the rendezvous:
 * at MESHCCL_COMM_ID (host:port) when set, else it publishes its id in the
 * file MESHCCL_COMM_FILE (default: a per-job file under /tmp, which suits one
 * host; set either variable for multi-host jobs). config may be NULL.
 */
ncclResult_t meshcclCommInitFromEnv(ncclComm_t* comm, ncclConfig_t* config);

/* Rank, size and local rank (rank among processes on this host) as the launcher
 * reports them, without creating a communicator. Any pointer may be NULL. */
ncclResult_t meshcclGetLaunchInfo(int* rank, int* nranks, int* localRank);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MESHCCL_H_ */
