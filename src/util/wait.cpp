#include "util/wait.h"

#include <algorithm>

#include <sched.h>
#include <unistd.h>

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

int online_cores() {
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? static_cast<int>(c) : 1;
  }();
  return n;
}

WaitPolicy WaitPolicy::for_local_ranks(int local_ranks) {
  WaitPolicy p;
  p.spin = static_cast<uint32_t>(param_int(Param::SpinCount));
  p.fd = param_int(Param::WaitFd) != 0;
  p.fd_after_ns = static_cast<long>(param_int(Param::PollUs)) * 1000;
  // A sleep costs tens of microseconds of latency when the peer answers, so
  // waits yield long before sleeping unless the ranks outnumber the cores.
  p.yield = param_env(Param::YieldCount) != nullptr ? static_cast<uint32_t>(param_int(Param::YieldCount))
            : local_ranks > online_cores()          ? 200
                                                    : 20000;
  p.express_one_round_us = static_cast<double>(param_int(Param::InlineUs));
  if (param_env(Param::InlineUs) == nullptr && local_ranks > online_cores())
    p.express_one_round_us = std::max(p.express_one_round_us, kOversubscribedExpressUs);
  return p;
}

long Backoff::now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

void Backoff::note_gap() {
  // One long stretch (a peer computing for seconds) counts as a few long
  // ones, so that short stretches bring the yields back within a few steps.
  const long gap = std::min(now_ns() - idle_since_ns_, 4 * kLongGapNs);
  gap_ns_ = gap_ns_ == 0 ? gap : (3 * gap_ns_ + gap) / 4;
}

void Backoff::idle() {
  if (n_++ == 0) idle_since_ns_ = now_ns();
  if (n_ <= spin_) {
    MESHCCL_CPU_PAUSE();
    return;
  }
  if (n_ <= spin_ + yield_ && gap_ns_ < kLongGapNs) {
    sched_yield();
    return;
  }
  sleep_step();
}

void Backoff::idle_sleeping() {
  if (n_++ == 0) idle_since_ns_ = now_ns();
  sleep_step();
}

void Backoff::sleep_step() {
  // Each sleep a quarter of the time asleep so far (measured: a sleep lasts
  // longer than asked), from 10 us up to 1 ms: a peer that became ready
  // meanwhile waits at most about a quarter of this wait longer (doubling
  // sleeps could double a wait), and a long wait settles at about a thousand
  // wake-ups a second.
  const long t0 = now_ns();
  const long ns = std::clamp(slept_ns_ / 4, 10000L, 1000000L);
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
  slept_ns_ += now_ns() - t0;
}

void Backoff::yield_only() {
  if (n_++ == 0) idle_since_ns_ = now_ns();
  if (n_ <= spin_) {
    MESHCCL_CPU_PAUSE();
    return;
  }
  sched_yield();
}

Deadline Deadline::after(double seconds) {
  Deadline d;
  if (seconds > 0) {
    d.finite_ = true;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  return d;
}

Deadline Deadline::from_timeout_param() { return after(timeout_seconds()); }

double Deadline::seconds_left() const {
  if (!finite_) return 1e30;
  return std::chrono::duration<double>(at_ - Clock::now()).count();
}

namespace {
thread_local double t_timeout_s = 0;
}  // namespace

double timeout_seconds() { return t_timeout_s > 0 ? t_timeout_s : static_cast<double>(param_int(Param::Timeout)); }

ScopedTimeout::ScopedTimeout(double seconds) : saved_(t_timeout_s) {
  if (seconds > 0) t_timeout_s = seconds;
}
ScopedTimeout::~ScopedTimeout() { t_timeout_s = saved_; }

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace meshccl
