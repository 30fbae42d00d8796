// Pipeline schedules as pure op lists per stage (section 4 of the algorithms
// notes), and the point-to-point groups each stage posts between its ops.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

enum class PipeSchedule { GPipe, OneFOneB, Eager1F1B, ForwardOnly };

// Parses "gpipe", "1f1b" or "eager-1f1b"; returns false on anything else.
bool parse_schedule(const std::string& s, PipeSchedule* out);
const char* schedule_name(PipeSchedule s);

struct PipeOp {
  bool forward = true;
  int micro = 0;
};

// The ops of stage s of p for m micro-batches.
//   GPipe: all forwards, then all backwards in reverse order.
//   1F1B (DAPPLE early backward): min(p-s-1, m) warm-up forwards, then one
//   forward / one backward, then the remaining backwards.
//   Eager-1F1B (Alpa's overlap-friendly schedule): min(2(p-s)-1, m) warm-up
//   forwards, then one backward / one forward, then the remaining backwards,
//   so an activation is sent well before the next stage needs it.
std::vector<PipeOp> stage_ops(PipeSchedule sched, int p, int s, int m);

// Largest number of micro-batches between their forward and backward at once.
int max_in_flight(const std::vector<PipeOp>& ops);

// One message of a group: activations go to stage+1, gradients to stage-1.
struct PipeMsg {
  bool send = false;
  bool grad = false;  // false: activations of `micro`; true: their gradient
  int micro = 0;
  int peer = 0;  // stage on the other side
};

// Group k is posted before op k (k == ops.size(): after the last op). It holds
// the send of op k-1's output and the receive of op k's input, so that the
// pairs two neighbouring stages wait on are always in one group on each side.
std::vector<std::vector<PipeMsg>> stage_groups(const std::vector<PipeOp>& ops, int p, int s);

}  // namespace meshtrain
