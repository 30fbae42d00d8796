// Polling waits that stay cheap when a peer answers quickly and polite when it
// does not: spin (with a CPU pause), then sched_yield, then short sleeps that
// grow to a cap. Oversubscribed ranks (8 on 2 cores) thus leave the CPU to the
// peer they wait for. Deadline bounds every wait. While a host runs no more
// ranks than it has cores, a wait yields far longer before it sleeps: a sleep
// costs tens of microseconds of latency when the peer answers.
#pragma once

#include <chrono>
#include <cstdint>

namespace meshccl {

class Backoff {
 public:
  Backoff();
  // Call after a poll that found nothing to do.
  void idle();
  // Like idle(), but never sleeps: for short bounded waits.
  void yield_only();
  // Call after a poll that made progress.
  void progress() { n_ = 0; }

 private:
  uint32_t n_ = 0;
  uint32_t spin_;
  uint32_t yield_;
};

// Records that this process takes part in a communicator with `n` ranks on
// this host; the largest count seen decides whether waits may oversubscribe.
void note_local_ranks(int n);
bool host_oversubscribed();

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

double timeout_seconds();  // MESHCCL_TIMEOUT
double now_us();           // steady clock, microseconds

}  // namespace meshccl
