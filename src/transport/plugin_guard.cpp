#include "transport/plugin_guard.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

namespace meshccl {

namespace {

std::recursive_mutex g_keeper_mu;

bool same_action(const struct sigaction& a, const struct sigaction& b) {
  return a.sa_handler == b.sa_handler && a.sa_flags == b.sa_flags;
}

bool same_mask(const sigset_t& a, const sigset_t& b) {
  for (int s = 1; s < NSIG; ++s)
    if (sigismember(&a, s) != sigismember(&b, s)) return false;
  return true;
}

std::string signal_name(int s) {
  const char* abbrev = sigabbrev_np(s);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(s);
}

// "" when nobody but this user or root can have put files into the
// working directory.
std::string cwd_open_to_others() {
  struct stat st {};
  if (::stat(".", &st) != 0) return std::string("it cannot be examined: ") + std::strerror(errno);
  if ((st.st_mode & S_IWOTH) != 0) return "other users can write it";
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) return "it belongs to another user";
  return "";
}

}  // namespace

SignalKeeper::SignalKeeper() : lock_(g_keeper_mu) {
  for (int s = 1; s < NSIG; ++s) {
    std::memset(&saved_[s], 0, sizeof(saved_[s]));
    // SIGKILL and SIGSTOP cannot change; glibc refuses its own (32, 33).
    have_[s] = s != SIGKILL && s != SIGSTOP && sigaction(s, nullptr, &saved_[s]) == 0;
  }
  pthread_sigmask(SIG_SETMASK, nullptr, &mask_);
}

std::string SignalKeeper::restore() {
  if (done_) return "";
  done_ = true;
  std::string names;
  for (int s = 1; s < NSIG; ++s) {
    if (!have_[s]) continue;
    struct sigaction now;
    std::memset(&now, 0, sizeof(now));
    if (sigaction(s, nullptr, &now) != 0 || same_action(now, saved_[s])) continue;
    sigaction(s, &saved_[s], nullptr);
    names += (names.empty() ? "" : ", ") + signal_name(s);
  }
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  if (!same_mask(mask, mask_)) pthread_sigmask(SIG_SETMASK, &mask_, nullptr);
  lock_.unlock();
  return names;
}

bool run_in_root_dir(const std::function<void()>& fn, std::string* why) {
  bool ran = false;
  int err = 0;
  try {
    std::thread t([&] {
      if (::unshare(CLONE_FS) != 0 || ::chdir("/") != 0) {
        err = errno;
        return;
      }
      fn();
      ran = true;
    });
    t.join();
  } catch (const std::system_error& e) { err = e.code().value(); }
  if (ran) return true;
  const std::string open = cwd_open_to_others();
  if (!open.empty()) {
    *why = "it would load with a working directory that " + open + " (libraries may read configuration from there, " +
           "e.g. UCX's ./ucx.conf), and a private one could not be made (" + std::strerror(err) + ")";
    return false;
  }
  fn();
  return true;
}

}  // namespace meshccl
