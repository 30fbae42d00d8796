// The one validate-and-enqueue path every communication entry point calls.
#pragma once

#include "collectives/algorithms.h"
#include "comm/comm.h"

namespace meshccl {

// desc has buffers, counts, dtype, op fields filled; comm and stream checked.
// Assigns the operation's tag (sequence number) and records it in the open
// group or launches it.
Status enqueue(ncclComm* comm, OpDesc& desc, cudaStream_t stream);

}  // namespace meshccl
