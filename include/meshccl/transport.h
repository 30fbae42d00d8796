/*
 * meshccl transport plugin interface, version 1.
 *
 * A transport moves tagged messages between two ranks. meshccl ships `shm`
 * (same host) and `socket` (TCP) built in; others (`ucx`, `ofi`) are shared
 * objects named libmeshccl-transport-<name>.so that export a symbol
 * `meshccl_transport_v1` of type meshccl_transport_v1_t. The loader asks for the
 * newest version symbol it knows first; a later version gets a new struct and a
 * new symbol name, and plugins may export several.
 *
 * Loading: the host loads a plugin only when a pair of ranks needs it, with
 * dlopen on a thread of its own whose working directory is "/", and puts back
 * every signal disposition that loading or init changed: a plugin and its
 * libraries cannot keep signal handlers, and should read configuration (not
 * the working directory) at load or in init. The table's name must be the
 * <name> of the file (1 to 15 of a-z, 0-9, '_' and '-').
 *
 * Scope: once the plugin is loaded, the host opens one context (init),
 * reads properties(ctx, 0, ...) and finalizes it, and keeps props.scope,
 * which must not depend on settings: MESHCCL_SCOPE_HOST for a transport
 * that reaches only processes of one machine (the host never uses it
 * between machines, and prefers it to any network one within a host),
 * MESHCCL_SCOPE_NETWORK for one that reaches any two ranks. A plugin whose
 * init fails then, or that declares another value, is not used.
 *
 * Optionally a plugin also exports
 *   const char* meshccl_transport_v1_describe(void);
 * returning a short, static description of what it runs on (e.g. "UCX
 * 1.13.1"), which meshccl_info prints next to the library's path. It may be
 * called without init and must not block.
 *
 * Optionally a plugin also exports
 *   int meshccl_transport_v1_probe(void* recv_comm, uint64_t tag, int* found);
 * (type meshccl_transport_v1_probe_t below), which a receive from any of
 * several peers (meshcclRecvAnySource) needs: without it such a receive over
 * this transport fails with ncclInvalidUsage, and nothing else changes.
 *
 * Optionally a plugin also exports
 *   int meshccl_transport_v1_wait_fd(void* ctx, int* fd);
 * (type meshccl_transport_v1_wait_fd_t below): a file descriptor the host
 * may block on (poll for POLLIN) instead of polling test() while nothing
 * moves. Without it the host sleeps in small steps, and nothing else changes.
 *
 * Life of a connection (A sends to B):
 *   B: listen(ctx, dev, handle, &lcomm)   -> handle travels to A via bootstrap
 *   A: connect(ctx, dev, handle, &scomm)  -> called until *scomm != NULL
 *   B: accept(lcomm, &rcomm)              -> called until *rcomm != NULL
 *   A: isend(scomm, ...)  B: irecv(rcomm, ...)  both: test(req, ...) until done
 *   close_send / close_recv / close_listen, then finalize(ctx).
 *
 * Matching: a send matches the oldest pending receive on the same connection
 * with the same tag; sends and receives with the same tag pair up in the order
 * they were posted, different tags are independent. A message may be shorter
 * than the receive buffer (test reports its size); a longer one fails the
 * receive with MESHCCL_T_INVALID_USAGE.
 *
 * Threads and blocking: the host creates one context per communicator and
 * never calls into one context from two threads at once, so a plugin needs no
 * locks of its own. No function may block: connect/accept report "not yet" with
 * a NULL result, isend/irecv with a NULL request (retry later), and all
 * progress happens inside isend, irecv and test (the host polls test on every
 * outstanding request). A plugin may run helper threads of its own.
 *
 * Memory: the host owns every buffer passed in and keeps it valid until the
 * request completes. Handles are plain bytes (at most
 * MESHCCL_TRANSPORT_HANDLE_BYTES) that must mean the same in another process.
 * Requests are owned by the plugin and freed when test reports done, or when
 * their comm is closed (closing a comm with requests in flight cancels them).
 * After an operation failed, the user may free its buffers before the host
 * closes the comms that still hold its requests: from the first close_* call
 * on a context on, the plugin must not write into the buffer of any receive
 * still in flight on any comm of that context (a plugin that cannot stop such
 * a transfer keeps its resources instead and never progresses it again).
 *
 * Every function returns a meshccl_tresult_t. Meaning of the errors:
 *   MESHCCL_T_SYSTEM_ERROR   an OS or network call failed
 *   MESHCCL_T_INTERNAL_ERROR the host misused the interface (a bug)
 *   MESHCCL_T_INVALID_USAGE  the user's request cannot be honoured (e.g. truncation)
 *   MESHCCL_T_REMOTE_ERROR   the peer vanished or closed the connection
 */
#ifndef MESHCCL_TRANSPORT_H_
#define MESHCCL_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MESHCCL_TRANSPORT_V1 1
#define MESHCCL_TRANSPORT_HANDLE_BYTES 128

/* Same values as the matching ncclResult_t codes. */
typedef enum {
  MESHCCL_T_SUCCESS = 0,
  MESHCCL_T_SYSTEM_ERROR = 2,
  MESHCCL_T_INTERNAL_ERROR = 3,
  MESHCCL_T_INVALID_USAGE = 5,
  MESHCCL_T_REMOTE_ERROR = 6
} meshccl_tresult_t;

/* Log levels of the host's logger. */
enum { MESHCCL_LOG_WARN = 1, MESHCCL_LOG_INFO = 2, MESHCCL_LOG_TRACE = 3 };

typedef void (*meshccl_log_fn_t)(int level, const char* file, int line, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* A region of memory that a process on the same host can map: open
 * /proc/<pid>/fd/<fd> and map `size` bytes at `offset`. */
typedef struct {
  int32_t pid;
  int32_t fd;
  uint64_t offset; /* where the queried pointer lies in the file */
  uint64_t size;   /* bytes from offset to the end of the region */
} meshccl_shared_region_v1_t;

/* What the host gives a plugin at init. Valid until finalize. */
typedef struct {
  uint32_t version; /* MESHCCL_TRANSPORT_V1 */
  meshccl_log_fn_t log;
  /* Value of a setting (e.g. "MESHCCL_SOCKET_IFNAME"), or NULL when unset. */
  const char* (*get_param)(const char* name);
  /* 1 and *out filled when [ptr, ptr+size) lies in memory that same-host
   * processes can map (e.g. from ncclMemAlloc), else 0. */
  int (*find_shared)(const void* ptr, size_t size, meshccl_shared_region_v1_t* out);
  int32_t rank; /* for log lines */
  int32_t nranks;
} meshccl_transport_host_v1_t;

enum { MESHCCL_SCOPE_HOST = 1, MESHCCL_SCOPE_NETWORK = 2 };
enum { MESHCCL_PTR_HOST = 1, MESHCCL_PTR_CUDA = 2 };

typedef struct {
  const char* name;     /* device name for logs, e.g. "shm" or "lo" */
  double bandwidth_gbs; /* expected bandwidth per direction, GB/s */
  double latency_us;    /* expected one-way latency of a small message, us */
  int32_t scope;        /* MESHCCL_SCOPE_HOST: only between processes of one machine; NETWORK: any (see above) */
  int32_t ptr_support;  /* MESHCCL_PTR_* bits */
  int32_t max_requests; /* outstanding requests per comm, 0 = no limit */
} meshccl_transport_props_v1_t;

typedef struct meshccl_transport_v1 {
  const char* name; /* "shm", "socket", "ucx", ... matched by MESHCCL_TRANSPORT */
  uint32_t version; /* MESHCCL_TRANSPORT_V1 */

  /* Per-communicator context. May fail with MESHCCL_T_SYSTEM_ERROR when the
   * transport is unusable here; the host then skips it. */
  int (*init)(const meshccl_transport_host_v1_t* host, void** ctx);
  int (*devices)(void* ctx, int* ndev);
  int (*properties)(void* ctx, int dev, meshccl_transport_props_v1_t* props);

  /* Receiving endpoint for exactly one sender; fills handle. */
  int (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  /* Non-blocking; *send_comm stays NULL until established. */
  int (*connect)(void* ctx, int dev, const void* handle, void** send_comm);
  /* Non-blocking; *recv_comm stays NULL until the sender connected. */
  int (*accept)(void* listen_comm, void** recv_comm);

  /* Optional registration (may set *mhandle = NULL and succeed). comm is a
   * send or receive comm. */
  int (*reg_mr)(void* comm, void* data, size_t size, void** mhandle);
  int (*dereg_mr)(void* comm, void* mhandle);

  /* Post a send / receive; *request NULL means "busy, retry". */
  int (*isend)(void* send_comm, const void* data, size_t size, uint64_t tag, void* mhandle, void** request);
  int (*irecv)(void* recv_comm, void* data, size_t size, uint64_t tag, void* mhandle, void** request);
  /* Progress; *done = 1 when complete (request freed), *size = bytes moved.
   * An error also frees the request. */
  int (*test)(void* request, int* done, size_t* size);

  int (*close_send)(void* send_comm);
  int (*close_recv)(void* recv_comm);
  int (*close_listen)(void* listen_comm);
  int (*finalize)(void* ctx);
} meshccl_transport_v1_t;

/* Optional (see above): progresses recv_comm as test does, then sets
 * *found = 1 when a message with `tag` has arrived on it (at least enough of
 * it to know its tag) that no posted receive has taken, so that the next
 * irecv with that tag matches it; otherwise *found = 0. Takes and changes
 * nothing else; never blocks. MESHCCL_T_REMOTE_ERROR when no such message is
 * there and the sender has gone (no such message can come any more). */
typedef int (*meshccl_transport_v1_probe_t)(void* recv_comm, uint64_t tag, int* found);

/* Optional (see above): arms and returns the context's wait descriptor.
 * Sets *fd to a descriptor that becomes readable (POLLIN, or POLLERR/POLLHUP)
 * once test() on a request outstanding on any of ctx's connections may make
 * progress: bytes arrived or a peer closed, room to write for a send that
 * waits for it, a completion queued. The host calls it each time right
 * before it blocks (at most a few milliseconds) in poll on that descriptor,
 * then calls test() on its requests, whatever poll said; it never reads from
 * or closes the descriptor. *fd = -1: do not block now (progress is possible
 * already, e.g. UCX's worker arm said busy, or the plugin has no descriptor
 * for what is outstanding); the host polls test() again. The descriptor
 * belongs to the context and stays valid until finalize. Never blocks; same
 * threading rule as every other call on ctx. */
typedef int (*meshccl_transport_v1_wait_fd_t)(void* ctx, int* fd);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MESHCCL_TRANSPORT_H_ */
