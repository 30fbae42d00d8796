// ncclGroupStart/End: per-thread nesting depth and the operations recorded
// while it is > 0. The outermost End launches them: all NULL-stream work runs
// together on this thread (so one thread can drive several ranks), each host
// stream gets its share as one work item.
#pragma once

#include <string>
#include <vector>

#include "comm/comm.h"
#include "sched/launch.h"

namespace meshccl {

struct PendingInit {
  ncclComm* comm;
  int nranks;
  ncclUniqueId id;
  int rank;
  uint64_t serial = 0;  // comm's, set when recorded
};

bool in_group();
// device: the op goes the CUDA device path (src/cuda) on cuda_stream.
// owner: op.comm's communicator (held until the group launches).
void group_record(ncclComm* owner, PendingOp op, bool device = false, const void* cuda_stream = nullptr);
void group_record_init(PendingInit init);
Status group_start();
Status group_end();
// Only estimates (ncclGroupSimulateEnd); recorded work is dropped.
Status group_simulate_end(ncclSimInfo_t* info);

// A call inside the open group failed: the first such error is what the
// outermost ncclGroupEnd returns, and the group's operations are dropped.
void group_note_error(ncclResult_t code, const std::string& message);
// comm is being destroyed: this thread's open group forgets what it recorded
// for comm (ncclGroupEnd then reports that they were dropped). Returns how
// many operations were dropped.
size_t group_forget(const ncclComm* comm);

}  // namespace meshccl
