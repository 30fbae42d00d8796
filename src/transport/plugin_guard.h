// What loading and initialising a transport plugin may change in the
// process, and how the registry keeps it unchanged. A plugin's libraries run
// code meshccl does not control: their constructors when the plugin is
// loaded, and their setup in the plugin's init. Two things they do that a
// library must not do to the program that uses it:
//   - install signal handlers: libucs (SIGSEGV, SIGBUS, SIGILL, SIGFPE and
//     SIGHUP, when it loads), libinfinipath (linked by Debian's libfabric for
//     its psm provider: SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGILL, SIGABRT,
//     when it loads). Its SIGTERM handler calls exit(), which deadlocks a
//     process already exiting: a rank told to stop then never does.
//   - read configuration from the working directory: libucs reads
//     ./ucx.conf when it loads, and the working directory may be one that
//     other users can write (/tmp, a shared project folder).
// See docs/transports.md ("Loading a plugin").
#pragma once

#include <signal.h>

#include <functional>
#include <mutex>
#include <string>

namespace meshccl {

// Saves the disposition of every signal and the calling thread's signal
// mask; restore() (or the destructor) puts back whatever changed since. One
// keeper at a time in the process (a second waits), so two plugins set up
// by two threads never save each other's changes as the program's.
class SignalKeeper {
 public:
  SignalKeeper();
  ~SignalKeeper() { restore(); }
  SignalKeeper(const SignalKeeper&) = delete;
  SignalKeeper& operator=(const SignalKeeper&) = delete;

  // The signals whose disposition was put back ("SIGSEGV, SIGBUS"), "" if none.
  std::string restore();

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  struct sigaction saved_[NSIG];
  bool have_[NSIG];
  sigset_t mask_;
  bool done_ = false;
};

// Runs fn on a thread of its own whose working directory is "/", apart from
// the process's (unshare(CLONE_FS)), so that a library reading its
// configuration from the working directory as it loads reads none another
// user could have put there. Where unshare is refused (some container
// profiles), fn runs on the calling thread if the working directory belongs
// to this user or root and others cannot write it; otherwise fn does not
// run: false, with *why.
bool run_in_root_dir(const std::function<void()>& fn, std::string* why);

}  // namespace meshccl
