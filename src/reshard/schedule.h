// Which rank sends which slice to whom, for each strategy, and what that is
// predicted to cost on the communicator's links. Pure: a function of the two
// layouts, the ranks' hosts and the link costs, identical on every rank.
#pragma once

#include <cstddef>
#include <vector>

#include "reshard/solver.h"
#include "reshard/tiles.h"
#include "topo/cost_model.h"

namespace meshccl::reshard {

enum class Strategy { Auto = 0, SendRecv = 1, LocalAllGather = 2, Broadcast = 3 };
const char* strategy_name(Strategy s);

// What one copy step of a rank's plan costs beyond its bytes, as bytes copied
// at the shared-memory rate (so that both scale alike when ranks share
// cores). A slice that is not one contiguous run of the sender's tile is
// packed run by run before it is sent (and unpacked run by run after it
// arrives), each run a step the rank's scheduler instantiates and runs.
// Measured: case 9 of perf/reshard_perf on one host (10 ranks on 2 cores,
// 2026-11-29, load 7-8), where send/recv's senders pack 65,536 more runs of
// 256 B than broadcast's and took 60-180 ms longer (1-2.5 us a run), while
// the receivers' 64 MiB of large copies each fitted in broadcast's 70-150 ms
// in all: a run costs as much as several KiB of copying.
constexpr size_t kCopyStepBytes = 4096;

// What the schedule needs of the communicator: each rank's host and the cost
// of the two link classes.
struct Placement {
  std::vector<int> host;  // per communicator rank
  LinkCost shm, net;
  size_t chunk_bytes = 512 * 1024;          // the pipeline step of a chain (make_program's chunk)
  size_t copy_step_bytes = kCopyStepBytes;  // per copy step of a pack, unpack or local copy
  int nhosts() const;
};

// Elements [lo, hi) of a slice (packed row-major), along a chain: chain[0]
// sends, each later rank receives and passes it to the next.
struct Xfer {
  int slice = 0;
  size_t lo = 0, hi = 0;
  std::vector<int> chain;
};

// The receivers of one host that got one part each: an all-gather among them.
struct Gather {
  int slice = 0;
  std::vector<int> group;    // group[i] received part i
  std::vector<size_t> cuts;  // part i = [cuts[i], cuts[i+1]) elements
};

// A rank that holds the slice in its source tile copies it locally.
struct LocalCopy {
  int slice = 0;
  int rank = 0;
};

struct Schedule {
  Strategy strategy = Strategy::Broadcast;
  std::vector<Slice> slices;
  std::vector<Xfer> xfers;  // in issue order
  std::vector<Gather> gathers;
  std::vector<LocalCopy> copies;
  double predicted_us = 0;  // this schedule's link-limited time plus latencies
  double link_us = 0;       // the busiest link under this schedule
  size_t net_bytes = 0;     // bytes that cross between hosts
  int host_flows = 0;       // most rank pairs that cross one host's link in one direction
};

// The schedule for one strategy (not Auto).
Schedule make_schedule(const Layout& src, const Layout& dst, const Placement& pl, size_t elem, Strategy s,
                       Balance balance);
// Auto: the strategy with the lowest predicted time. Predictions within 2% of
// the lowest count as equal; among those, the fewest flows through one host's
// link win (several TCP flows through one shaped link lose packets at its
// queue and wait out retransmissions, which the link loads do not show),
// then the lowest prediction (ties: broadcast, then send/recv + all-gather,
// then send/recv).
Schedule choose_schedule(const Layout& src, const Layout& dst, const Placement& pl, size_t elem, Strategy s,
                         Balance balance);
// Link-limited lower bound of any schedule, microseconds: every destination
// host must receive over its NIC each byte it needs that none of its ranks
// holds, every source host must send once each byte only it holds, and every
// destination rank must receive what it does not hold.
double lower_bound_us(const Layout& src, const Layout& dst, const Placement& pl, size_t elem);

}  // namespace meshccl::reshard
