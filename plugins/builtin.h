/*
 * The transports compiled into the meshccl runtime. Each is a complete
 * meshccl_transport_v1_t (see meshccl/transport.h); the runtime registers
 * them next to the ones it loads from plugin shared objects.
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MESHCCL_PLUGINS_BUILTIN_H_ */
