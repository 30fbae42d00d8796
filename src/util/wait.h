// Polling waits that stay cheap when a peer answers quickly and polite when it
// does not: spin (with a CPU pause), then sched_yield, then sleeps of a
// quarter of the time already slept (at least 10 us, at most 1 ms), so a wait
// oversleeps its peer by at most about a quarter. Oversubscribed ranks (8 on
// 2 cores) thus leave the CPU to the peer they wait for. A wait whose idle
// stretches have been long (Backoff::kLongGapNs) goes from spinning straight
// to sleeping. Deadline bounds every wait.
#pragma once

#include <chrono>
#include <cstdint>

namespace meshccl {

// How a wait polls. Per communicator: while no more of its ranks share this
// machine's cores than there are cores, a wait yields far longer before it
// sleeps; otherwise it leaves the CPU to the peer it waits for sooner.
// MESHCCL_SPIN_COUNT / MESHCCL_YIELD_COUNT override, as read at the last
// settings refresh (communicator creation).
struct WaitPolicy {
  uint32_t spin = 32;
  uint32_t yield = 20000;
  // MESHCCL_WAIT_FD: a wait that would sleep may block on the network
  // transports' wait descriptors instead (Engine::idle).
  bool fd = true;
  // MESHCCL_POLL_US: how long such a wait polls after its last progress
  // before it blocks on the descriptors, whatever its spin and yield counts.
  long fd_after_ns = 50000;
  // How long the calling thread may drive an operation of one direct round
  // itself before handing the rest to the engine (the express path,
  // run_direct_now). MESHCCL_INLINE_US when set; otherwise its default, or
  // kOversubscribedExpressUs while the ranks outnumber the cores.
  double express_one_round_us = 20;
  // There a peer's arrival waits for the scheduler to run it, often longer
  // than 20 us, and each hand-off woke the stream's thread, one more thread
  // on the shared cores: 4 ranks on 2 cores took 3.5 us per 256-byte
  // AllReduce with the kernel's 2+2 placement and 7 us with 3+1, and
  // unpinned ranks drifted between the two while the stream threads woke
  // (5.3-9.5 us in 3 runs with 20 us; 3.5-4.6 us with 0.2-20 ms).
  static constexpr double kOversubscribedExpressUs = 1000;
  // For a communicator with local_ranks ranks on this machine's cores.
  static WaitPolicy for_local_ranks(int local_ranks);
  // Waits that belong to no communicator (setup, tools).
  static WaitPolicy standalone() { return for_local_ranks(1); }
};

class Backoff {
 public:
  explicit Backoff(const WaitPolicy& policy = WaitPolicy::standalone()) : spin_(policy.spin), yield_(policy.yield) {}
  // A wait that moves on to work of another policy; the count goes on.
  void set_policy(const WaitPolicy& policy) {
    spin_ = policy.spin;
    yield_ = policy.yield;
  }
  // Call after a poll that found nothing to do.
  void idle();
  // Nanoseconds since the current idle stretch began (0 outside one).
  long idle_ns() const { return n_ == 0 ? 0 : now_ns() - idle_since_ns_; }
  // Nanoseconds slept (or blocked, idle_by) since the last progress.
  long slept_ns() const { return slept_ns_; }
  // The recent idle stretches' length, smoothed (0 before the first).
  long gap_ns() const { return gap_ns_; }
  // Whether the next idle() would sleep (past spinning and yielding).
  bool sleeps_next() const { return n_ + 1 > spin_ && (n_ + 1 > spin_ + yield_ || gap_ns_ >= kLongGapNs); }
  // Instead of idle() when it would sleep: the caller blocked elsewhere (on
  // descriptors) for up to max_ns, which counts as this wait's sleep.
  // Returns the nanoseconds actually spent.
  template <class Block>
  long idle_by(Block&& block) {
    if (n_++ == 0) idle_since_ns_ = now_ns();
    const long t0 = now_ns();
    block();
    const long ns = now_ns() - t0;
    slept_ns_ += ns;
    return ns;
  }
  static long now_ns();
  // Like idle() in its sleeping phase, whatever the counts: for a wait that
  // another thread's wait covers (FdWaiter).
  void idle_sleeping();
  // Like idle(), but never sleeps: for short bounded waits.
  void yield_only();
  // Call after a poll that made progress.
  void progress() {
    if (n_ > 0) note_gap();
    n_ = 0;
    slept_ns_ = 0;
  }
  // A new wait on other work: what the polls so far found says nothing of it.
  void restart() {
    n_ = 0;
    slept_ns_ = 0;
    gap_ns_ = 0;
  }

  // Idle stretches that, smoothed, last longer than this skip the yield
  // phase: progress comes in rare steps (a network link's chunks), and
  // yielding between them only burns the cores (2x2 at 200 Mbit/s: the
  // ranks used 0.5-0.6 core yielding, 0.26-0.31 sleeping, the same time).
  static constexpr long kLongGapNs = 1000000;
  // Whether idle() goes from spinning straight to sleeping now.
  bool skips_yields() const { return gap_ns_ >= kLongGapNs; }

 private:
  void note_gap();
  void sleep_step();
  uint32_t n_ = 0;
  long slept_ns_ = 0;       // slept since the last progress
  long idle_since_ns_ = 0;  // when the current idle stretch began
  long gap_ns_ = 0;         // recent idle stretches, smoothed
  uint32_t spin_;
  uint32_t yield_;
};

// Cores this process may run on.
int online_cores();

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  // A deadline seconds from now; seconds <= 0 never expires.
  static Deadline after(double seconds);
  // The MESHCCL_TIMEOUT deadline.
  static Deadline from_timeout_param();
  bool expired() const { return finite_ && Clock::now() >= at_; }
  double seconds_left() const;

 private:
  Clock::time_point at_{};
  bool finite_ = false;
};

// MESHCCL_TIMEOUT, or the calling thread's ScopedTimeout while one lives.
double timeout_seconds();

// While it lives, timeout_seconds() on the calling thread is `seconds` (a
// communicator's own timeout while the communicator is made); 0: no change.
class ScopedTimeout {
 public:
  explicit ScopedTimeout(double seconds);
  ~ScopedTimeout();
  ScopedTimeout(const ScopedTimeout&) = delete;
  ScopedTimeout& operator=(const ScopedTimeout&) = delete;

 private:
  double saved_;
};
double now_us();  // steady clock, microseconds

}  // namespace meshccl
