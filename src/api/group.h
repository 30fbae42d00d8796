// ncclGroupStart/End: per-thread nesting depth and the operations recorded
// while it is > 0. The outermost End launches them: all NULL-stream work runs
// together on this thread (so one thread can drive several ranks), each host
// stream gets its share as one work item.
#pragma once

#include <vector>

#include "comm/comm.h"
#include "sched/launch.h"

namespace meshccl {

struct PendingInit {
  ncclComm* comm;
  int nranks;
  ncclUniqueId id;
  int rank;
};

bool in_group();
void group_record(PendingOp op);
void group_record_init(PendingInit init);
Status group_start();
Status group_end();
// Only estimates (ncclGroupSimulateEnd); recorded work is dropped.
Status group_simulate_end(ncclSimInfo_t* info);

}  // namespace meshccl
