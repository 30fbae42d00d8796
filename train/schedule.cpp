#include "schedule.h"

#include "comm.h"

#include <algorithm>
#include <set>

namespace meshtrain {

bool parse_schedule(const std::string& s, PipeSchedule* out) {
  if (s == "gpipe") {
    *out = PipeSchedule::GPipe;
  } else if (s == "1f1b") {
    *out = PipeSchedule::OneFOneB;
  } else if (s == "eager-1f1b") {
    *out = PipeSchedule::Eager1F1B;
  } else {
    return false;
  }
  return true;
}

const char* schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::GPipe: return "gpipe";
    case PipeSchedule::OneFOneB: return "1f1b";
    case PipeSchedule::Eager1F1B: return "eager-1f1b";
    case PipeSchedule::ForwardOnly: return "forward";
  }
  return "?";
}

std::vector<PipeOp> stage_ops(PipeSchedule sched, int p, int s, int m) {
  std::vector<PipeOp> ops;
  if (sched == PipeSchedule::ForwardOnly || sched == PipeSchedule::GPipe) {
    for (int i = 0; i < m; i++) ops.push_back({true, i});
    if (sched == PipeSchedule::GPipe) {
      for (int i = m - 1; i >= 0; i--) ops.push_back({false, i});
    }
    return ops;
  }
  int f = 0, b = 0;
  if (sched == PipeSchedule::Eager1F1B) {
    const int warm = std::min(2 * (p - s) - 1, m);
    for (; f < warm; f++) ops.push_back({true, f});
    while (f < m) {
      ops.push_back({false, b++});
      ops.push_back({true, f++});
    }
    while (b < m) ops.push_back({false, b++});
    return ops;
  }
  const int warmup = std::min(p - s - 1, m);
  for (; f < warmup; f++) ops.push_back({true, f});
  while (f < m) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < m) ops.push_back({false, b++});
  return ops;
}

int max_in_flight(const std::vector<PipeOp>& ops) {
  std::set<int> live;
  int most = 0;
  for (const auto& op : ops) {
    if (op.forward) {
      live.insert(op.micro);
      most = std::max(most, static_cast<int>(live.size()));
    } else {
      live.erase(op.micro);
    }
  }
  return most;
}

std::vector<std::vector<PipeMsg>> stage_groups(const std::vector<PipeOp>& ops, int p, int s) {
  std::vector<std::vector<PipeMsg>> groups(ops.size() + 1);
  for (size_t k = 0; k <= ops.size(); k++) {
    auto& g = groups[k];
    if (k > 0) {  // output of op k-1
      const PipeOp& prev = ops[k - 1];
      if (prev.forward && s < p - 1) g.push_back({true, false, prev.micro, s + 1});
      if (!prev.forward && s > 0) g.push_back({true, true, prev.micro, s - 1});
    }
    if (k < ops.size()) {  // input of op k
      const PipeOp& op = ops[k];
      if (op.forward && s > 0) g.push_back({false, false, op.micro, s - 1});
      if (!op.forward && s < p - 1) g.push_back({false, true, op.micro, s + 1});
    }
  }
  return groups;
}

bool parse_comm_sched(const std::string& s, CommSched* out) {
  if (s == "fifo") *out = CommSched::Fifo;
  else if (s == "priority") *out = CommSched::Priority;
  else return false;
  return true;
}

const char* comm_sched_name(CommSched s) { return s == CommSched::Fifo ? "fifo" : "priority"; }

int comm_priority(CommSched sched, CommKind kind, double position) {
  if (sched == CommSched::Fifo) return 0;
  switch (kind) {
    case CommKind::Pipeline: return -7;
    case CommKind::Tensor: return -6;
    case CommKind::DataParallel: {
      // Four levels, -5 for the buckets holding the first quarter of the
      // parameters (needed first by the next forward) .. -2 for the last.
      const int quarter = std::clamp(static_cast<int>(position * 4.0), 0, 3);
      return -5 + quarter;
    }
    case CommKind::Sparse: return 0;
  }
  return 0;
}

}  // namespace meshtrain
