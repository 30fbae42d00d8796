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

#include <stdint.h>

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
 * is [greatest, least] = [-7, 0]; 0 is the default. Values outside it are clamped.
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

static inline cudaStream_t meshcclStreamAsCuda(meshcclStream_t stream) { return (cudaStream_t)(void*)stream; }

/*
 * Per-communicator settings beyond NCCL's: a meshcclConfig_t starts with an
 * ncclConfig_t and is passed wherever one is (ncclCommInitRankConfig,
 * ncclCommSplit, ncclCommShrink, meshcclCommInitFromEnv) as &cfg.nccl.
 * Start from meshcclConfigInit, which marks it with MESHCCL_CONFIG_MAGIC in
 * nccl.magic; fields left at NCCL_CONFIG_UNDEF_INT keep the setting (or, for a
 * split or shrink child, the parent's value).
 *   timeoutSeconds  seconds an operation of this communicator may make no
 *                   progress before it fails (MESHCCL_TIMEOUT for this
 *                   communicator only); at init, also its bootstrap's waits
 *   priority        1: priority scheduling, 0: FIFO (MESHCCL_PRIORITY for this
 *                   communicator; 0 on any rank applies to all of it). Read at
 *                   ncclCommInitRankConfig / meshcclCommInitFromEnv: a split or
 *                   shrink child keeps its parent's, and a config asking a
 *                   child for another is refused.
 * The plan-shaping settings (MESHCCL_ALGO, MESHCCL_CHUNKSIZE,
 * MESHCCL_DIRECT_MAX_BYTES, MESHCCL_SPARSE_ALGO, MESHCCL_P2P_EAGER) are frozen
 * into every communicator when it is made, rank 0's for all of its ranks
 * (docs/environment.md).
 */
#define MESHCCL_CONFIG_MAGIC 0x6d657368u
typedef struct meshcclConfig_v1 {
  ncclConfig_t nccl;  /* NCCL's fields; nccl.magic is MESHCCL_CONFIG_MAGIC */
  size_t size;        /* sizeof(meshcclConfig_t) of the caller's header */
  int timeoutSeconds; /* > 0, or NCCL_CONFIG_UNDEF_INT */
  int priority;       /* 0 or 1, or NCCL_CONFIG_UNDEF_INT */
} meshcclConfig_t;

static inline void meshcclConfigInit(meshcclConfig_t* config) {
  ncclConfig_t nccl = NCCL_CONFIG_INITIALIZER;
  nccl.magic = MESHCCL_CONFIG_MAGIC;
  config->nccl = nccl;
  config->size = sizeof(meshcclConfig_t);
  config->timeoutSeconds = NCCL_CONFIG_UNDEF_INT;
  config->priority = NCCL_CONFIG_UNDEF_INT;
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

/*
 * Cross-mesh resharding (docs/resharding.md). A tensor sharded over one mesh
 * of ranks is delivered to another mesh with another sharding.
 *
 * A mesh is a 1-3 dimensional array of communicator ranks, axis 0 major: rank
 * of position (i, j) of a (a, b) mesh is ranks[i * b + j]. A sharding spec
 * gives, per tensor dimension, the mesh axes that cut it (major first): none
 * is R (replicated), {0} is S0, {1} is S1, {0, 1} is S01. Mesh axes that cut
 * no dimension replicate. Dimension d of length L cut into n chunks gives
 * chunk k the elements [floor(k L / n), floor((k + 1) L / n)), so lengths need
 * not divide. Each rank's buffer holds its tile, dense, row-major.
 */
#define MESHCCL_MESH_MAX_DIMS 3
#define MESHCCL_TENSOR_MAX_DIMS 8

typedef struct {
  int ndims; /* 1..3 */
  int shape[MESHCCL_MESH_MAX_DIMS];
  const int* ranks; /* shape[0] * ... ranks of the communicator, distinct */
} meshcclMesh_t;

typedef struct {
  int naxes;                       /* 0: R */
  int axes[MESHCCL_MESH_MAX_DIMS]; /* mesh axes cutting this dimension, major first */
} meshcclShardDim_t;

typedef struct {
  int ndims; /* the tensor's dimensions, 1..8 */
  meshcclShardDim_t dims[MESHCCL_TENSOR_MAX_DIMS];
} meshcclShardSpec_t;

typedef enum {
  meshcclReshardAuto = 0,              /* the lowest predicted time on the communicator's links */
  meshcclReshardSendRecv = 1,          /* one message per (receiver, slice) */
  meshcclReshardSendRecvAllGather = 2, /* each receiver of a host gets 1/k, then an all-gather on the host */
  meshcclReshardBroadcast = 3          /* one pipelined chain broadcast per slice, crossing each host once */
} meshcclReshardStrategy_t;

typedef enum {
  meshcclReshardBalanceNone = 0, /* first replica sends, natural order */
  meshcclReshardBalanceSize = 1, /* least-loaded replica sends */
  meshcclReshardBalanceOrder = 2 /* size and issue order (the default) */
} meshcclReshardBalance_t;

typedef struct {
  meshcclReshardStrategy_t strategy;
  meshcclReshardBalance_t balance;
} meshcclReshardConfig_t;
#define MESHCCL_RESHARD_CONFIG_INITIALIZER \
  { meshcclReshardAuto, meshcclReshardBalanceOrder }

typedef struct meshcclReshardPlan* meshcclReshardPlan_t;

/*
 * Collective over comm: every rank calls it with the same arguments (checked:
 * any difference, or any bad argument on any rank, fails it on every rank
 * with the problem named). config may be NULL. A rank in neither mesh gets a
 * plan too, whose meshcclReshard returns at once.
 */
ncclResult_t meshcclReshardPlanCreate(const meshcclMesh_t* srcMesh, const meshcclShardSpec_t* srcSpec,
                                      const meshcclMesh_t* dstMesh, const meshcclShardSpec_t* dstSpec,
                                      const size_t* shape, ncclDataType_t datatype, ncclComm_t comm,
                                      const meshcclReshardConfig_t* config, meshcclReshardPlan_t* plan);
/*
 * Moves this rank's source tile (sendbuf, if it is in the source mesh) and
 * fills its destination tile (recvbuf, if in the destination mesh). Called by
 * the ranks of either mesh, as often as needed; its messages follow each
 * pair's point-to-point order, like ncclSend/ncclRecv, so the ranks of a pair
 * must issue their reshards and sends in the same order. Not inside a group.
 */
ncclResult_t meshcclReshard(meshcclReshardPlan_t plan, const void* sendbuf, void* recvbuf, cudaStream_t stream);
ncclResult_t meshcclReshardPlanDestroy(meshcclReshardPlan_t plan);

typedef struct {
  meshcclReshardStrategy_t strategy; /* the one the plan uses */
  size_t sendCount, recvCount;       /* elements of this rank's source and destination tiles */
  size_t bytesSent;                  /* bytes this rank sends to other ranks per reshard */
  size_t bytesNetwork;               /* bytes every rank together sends between hosts */
  double predictedUs;                /* the plan's predicted time */
  double linkUs;                     /* the busiest link's time under this plan */
  double lowerBoundUs;               /* link-limited lower bound of any plan */
  double netGBs, shmGBs;             /* the link bandwidths these figures assume (the communicator's measured ones) */
} meshcclReshardInfo_t;
ncclResult_t meshcclReshardPlanGetInfo(meshcclReshardPlan_t plan, meshcclReshardInfo_t* info);

/* This rank's tile under (mesh, spec): offset and extent per dimension;
 * ncclInvalidArgument when rank is not in the mesh. No communicator needed. */
ncclResult_t meshcclShardTile(const meshcclMesh_t* mesh, const meshcclShardSpec_t* spec, const size_t* shape, int rank,
                              size_t* offset, size_t* extent);

/*
 * Row-sparse all-reduce (docs/sparse.md). The tensor has rows x rowLen
 * elements of datatype, row-major. Each rank holds nnz of its rows: indices
 * (nnz row numbers, each in [0, rows)) and sendvalues (nnz * rowLen elements,
 * row k of them being row indices[k]). A row a rank does not hold counts as
 * zeros there; a row number given twice or more by one rank counts once, its
 * rows combined with op in the order given (summed for ncclAvg and
 * PreMulSum). Indices need not be sorted; nnz may differ between ranks and
 * be 0. Every rank gets the dense result in recvbuff (rows * rowLen
 * elements, overwritten whole): exactly what ncclAllReduce of the densified
 * tensors gives in value, every op (ncclSum, ncclProd, ncclMax, ncclMin,
 * ncclAvg, PreMulSum with a host scalar) and datatype.
 *
 * Two strategies, chosen per call by the cost model from every rank's nnz
 * (or forced with MESHCCL_SPARSE_ALGO=dense|gather): a dense all-reduce of
 * the densified tensor, or an all-gather of indices and rows followed by a
 * local reduction. Both combine the contributions in rank order
 * (((c0 op c1) op c2) ...), so the result is bitwise the same whichever is
 * taken, on every rank, for every datatype (also floating point with three
 * or more ranks, where ncclAllReduce's order may differ in the last bit).
 *
 * A collective: every rank passes the same rows, rowLen, datatype and op
 * (checked). An index outside [0, rows), recvbuff overlapping sendvalues or
 * indices, or differing arguments fail the call on every rank with
 * ncclInvalidArgument, naming the rank, before any data moves; the
 * communicator stays usable. Host memory only; a host stream or NULL
 * (synchronous), inside groups too; the buffers are read and written when
 * the stream reaches the operation. rows * rowLen == 0 does nothing (but
 * nnz > 0 rows of a 0-row tensor is ncclInvalidArgument on that rank).
 */
ncclResult_t meshcclSparseAllReduce(const void* sendvalues, const int64_t* indices, size_t nnz, void* recvbuff,
                                    size_t rows, size_t rowLen, ncclDataType_t datatype, ncclRedOp_t op,
                                    ncclComm_t comm, cudaStream_t stream);

/*
 * Tagged point-to-point, as Gloo's and MPI's: a meshcclSendTagged to `peer`
 * with tag t matches the peer's meshcclRecvTagged from this rank with the same
 * t; messages of one (peer, tag) pair match in the order they were posted,
 * and different tags are independent of each other and of ncclSend/ncclRecv
 * (which keep NCCL's order: the n-th send to a peer matches its n-th
 * receive). Any int is a tag. Otherwise as ncclSend/ncclRecv: the same
 * argument checks, groups, streams, eager sends of up to MESHCCL_P2P_EAGER
 * bytes, a message larger than its receive fails both with ncclInvalidUsage.
 */
ncclResult_t meshcclSendTagged(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, int tag,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t meshcclRecvTagged(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, int tag,
                               ncclComm_t comm, cudaStream_t stream);

/*
 * Receive from any source, as MPI_ANY_SOURCE: meshcclRecvAnySource takes the
 * next message that any other rank sends this one with ncclSend, and
 * meshcclRecvTaggedAnySource the next one sent with meshcclSendTagged and
 * this tag; *source is set to the rank that sent it once the receive has
 * completed (as the buffer is: for a host stream, when the stream reaches the
 * receive). The message taken is one that has arrived when the receive looks
 * (at least its first bytes): the first peer found with one, asking the
 * peers in turn. Each message is taken by exactly one receive, and the
 * messages of one peer in the order it sent them, so receives from that
 * peer and from any source can be mixed freely (a receive from one peer
 * takes its number when it is called; one from any source, when it finds
 * its message).
 *
 * As ncclRecv otherwise, with the same argument checks; the message must
 * have exactly the size of the receive above two link chunks (a shorter one
 * fails the receive with ncclInvalidUsage, as for ncclRecv). Not inside a
 * group (ncclInvalidUsage); host memory and a host stream or NULL only;
 * count == 0 receives nothing and sets *source to -1. Until a message is
 * found the receive can fail alone and leave the communicator usable: on a
 * communicator of one rank, over a transport plugin that exports no probe
 * (transport.h), or when every other rank has gone (ncclRemoteError).
 */
ncclResult_t meshcclRecvAnySource(void* recvbuff, size_t count, ncclDataType_t datatype, int* source, ncclComm_t comm,
                                  cudaStream_t stream);
ncclResult_t meshcclRecvTaggedAnySource(void* recvbuff, size_t count, ncclDataType_t datatype, int tag, int* source,
                                        ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */

#endif

#endif /* MESHCCL_H_ */
