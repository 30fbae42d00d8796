#include "util/wait.h"

#include <sched.h>
#include <time.h>

#include "util/param.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MESHCCL_CPU_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MESHCCL_CPU_PAUSE() asm volatile("yield" ::: "memory")
#else
#define MESHCCL_CPU_PAUSE() ((void)0)
#endif

namespace meshccl {

namespace {
struct BackoffConfig {
  uint32_t spin;
  uint32_t yield;
  BackoffConfig()
      : spin(static_cast<uint32_t>(param_int(Param::SpinCount))),
        yield(static_cast<uint32_t>(param_int(Param::YieldCount))) {}
};
const BackoffConfig& backoff_config() {
  static const BackoffConfig c;
  return c;
}
}  // namespace

Backoff::Backoff() : spin_(backoff_config().spin), yield_(backoff_config().yield) {}

void Backoff::idle() {
  ++n_;
  if (n_ <= spin_) {
    MESHCCL_CPU_PAUSE();
    return;
  }
  if (n_ <= spin_ + yield_) {
    sched_yield();
    return;
  }
  // Sleep 10 us, doubling to 1 ms: bounded added latency, no starvation.
  uint32_t k = n_ - spin_ - yield_;
  long ns = 10000L << (k < 7 ? k : 7);
  if (ns > 1000000L) ns = 1000000L;
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
}

Deadline Deadline::after(double seconds) {
  Deadline d;
  if (seconds > 0) {
    d.finite_ = true;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds));
  }
  return d;
}

Deadline Deadline::from_timeout_param() { return after(timeout_seconds()); }

double Deadline::seconds_left() const {
  if (!finite_) return 1e30;
  return std::chrono::duration<double>(at_ - Clock::now()).count();
}

double timeout_seconds() { return static_cast<double>(param_int(Param::Timeout)); }

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace meshccl
