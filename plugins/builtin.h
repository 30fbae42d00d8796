/*
 * The transports compiled into the meshccl runtime. Each is a complete
 * meshccl_transport_v1_t (see meshccl/transport.h); the runtime registers
 * them (meshccl_builtin_transports, below) next to the ones it loads from
 * plugin shared objects, and knows each only by its table: its name, and
 * the scope its properties declare.
 */
#ifndef MESHCCL_PLUGINS_BUILTIN_H_
#define MESHCCL_PLUGINS_BUILTIN_H_

#include "meshccl/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Processes (or threads) of one host: a shared-memory ring per connection,
 * large messages copied once from the sender's memory. */
extern const meshccl_transport_v1_t meshccl_transport_shm;

/* TCP, between hosts or when forced. */
extern const meshccl_transport_v1_t meshccl_transport_socket;

/* Their probes (meshccl_transport_v1_probe_t, transport.h). */
extern const meshccl_transport_v1_probe_t meshccl_transport_shm_probe;
extern const meshccl_transport_v1_probe_t meshccl_transport_socket_probe;

/* The socket transport's wait descriptor (meshccl_transport_v1_wait_fd_t);
 * shm has none: its waits stay on the polling path. */
extern const meshccl_transport_v1_wait_fd_t meshccl_transport_socket_wait_fd;

/* One built-in transport: its table and its optional probe and wait
 * descriptor (NULL if none). */
typedef struct {
  const meshccl_transport_v1_t* transport;
  meshccl_transport_v1_probe_t probe;
  meshccl_transport_v1_wait_fd_t wait_fd;
} meshccl_builtin_transport_t;

/* Every built-in transport, in their order of preference among themselves
 * (the registry prefers any plugin it loaded to all of them); the list ends
 * with an entry whose transport is NULL. */
extern const meshccl_builtin_transport_t meshccl_builtin_transports[];

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MESHCCL_PLUGINS_BUILTIN_H_ */
