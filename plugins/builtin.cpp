// The table of built-in transports (builtin.h): what the registry registers
// without loading anything.
#include "plugins/builtin.h"

extern "C" const meshccl_builtin_transport_t meshccl_builtin_transports[] = {
    {&meshccl_transport_shm, meshccl_transport_shm_probe, nullptr},
    {&meshccl_transport_socket, meshccl_transport_socket_probe, meshccl_transport_socket_wait_fd},
    {nullptr, nullptr, nullptr},
};
