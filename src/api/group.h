// ncclGroupStart/End: per-thread nesting depth and the operations recorded
// while it is > 0. The outermost End launches them: all NULL-stream work runs
// together on this thread (so one thread can drive several ranks), each host
// stream gets its share as one work item.
#pragma once

#include <vector>

#include "collectives/algorithms.h"
#include "comm/comm.h"

struct meshcclStream;

namespace meshccl {

struct PendingOp {
  ncclComm* comm;
  OpDesc desc;
  meshcclStream* stream;
  uint64_t tag_base;
};

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

// Launches ops now (outside a group or at group end).
Status launch(std::vector<PendingOp>& ops);
// Launches one op outside a group; a small direct collective with nothing
// ahead of it completes on the calling thread without a hand-off.
Status launch_one(PendingOp& op);

}  // namespace meshccl
