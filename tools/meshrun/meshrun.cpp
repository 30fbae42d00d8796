// meshrun: starts the N local processes of a meshccl job and watches them.
//
// One thread, one poll loop over: a signalfd (SIGCHLD and the signals we
// forward), the stdout/stderr pipe of every rank, and meshrun's own stdout and
// stderr when output is queued for them. Every wait in the loop is bounded so
// the job timeout and the kill grace period fire even while output is backed
// up or a rank ignores SIGTERM.
//
// Ranks never outlive meshrun: each rank leads its own process group (so a
// signal reaches whatever it started), dies with meshrun through
// PR_SET_PDEATHSIG, and meshrun is a child subreaper, so processes a rank
// leaves behind become meshrun's children and are killed and reaped at the end.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "hosts.h"
#include "options.h"
#include "output.h"

extern char** environ;

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultGraceS = 3.0;
// Per destination: beyond this much queued output, stop reading rank pipes so
// that ranks block on their writes instead of meshrun growing without bound.
constexpr size_t kMaxQueued = 4u << 20;
constexpr int kMaxPollMs = 1000;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int ms_until(Clock::time_point t) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  if (d <= 0) return 0;
  return d > kMaxPollMs ? kMaxPollMs : static_cast<int>(d);
}

std::string errstr(int err) { return std::strerror(err); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  std::string s = abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
  return s;
}

// Exit status a shell would report for a wait status.
int shell_status(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

// Resolves prog the way execvp would. Returns "" and sets *status (127: not
// found, 126: found but not executable) on failure.
std::string resolve_program(const std::string& prog, int* status) {
  auto executable = [](const std::string& p, bool* exists) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return false;
    *exists = true;
    return ::access(p.c_str(), X_OK) == 0;
  };
  bool exists = false;
  if (prog.find('/') != std::string::npos) {
    if (executable(prog, &exists)) return prog;
  } else {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
    size_t start = 0;
    while (start <= dirs.size()) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      std::string dir = dirs.substr(start, end - start);
      std::string cand = (dir.empty() ? std::string(".") : dir) + "/" + prog;
      if (executable(cand, &exists)) return cand;
      start = end + 1;
    }
  }
  *status = exists ? 126 : 127;
  return "";
}

// The children of this process right now (ranks and orphans adopted as
// subreaper), from /proc.
std::vector<pid_t> child_pids() {
  std::vector<pid_t> out;
  pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[512];
    ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    // The command name is in parentheses and may contain anything; the parent
    // pid is the second field after the last ')'.
    char* rp = std::strrchr(buf, ')');
    char state = 0;
    int ppid = 0;
    if (rp && std::sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == self) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

void remove_tree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string p = path + "/" + name;
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
      else ::unlink(p.c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

// NAME=VALUE entries, later settings replacing earlier ones in place.
class EnvBlock {
 public:
  explicit EnvBlock(char** env) {
    for (char** e = env; e && *e; ++e) vars_.emplace_back(*e);
  }
  void set(const std::string& name, const std::string& value) {
    std::string entry = name + "=" + value;
    for (auto& v : vars_) {
      if (v.size() > name.size() && v.compare(0, name.size(), name) == 0 && v[name.size()] == '=') {
        v = std::move(entry);
        return;
      }
    }
    vars_.push_back(std::move(entry));
  }
  const std::vector<std::string>& vars() const { return vars_; }

 private:
  std::vector<std::string> vars_;
};

std::string rank_prefix(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "[%d] ", rank);
  return buf;
}

struct Rank {
  explicit Rank(int r) : rank(r), out(rank_prefix(r)), err(rank_prefix(r)) {}
  int rank;
  pid_t pid = -1;
  bool running = false;
  int out_fd = -1;  // read ends of the rank's pipes; -1 when closed or unused
  int err_fd = -1;
  LineSplitter out;
  LineSplitter err;
};

class Job {
 public:
  Job(Options opt, double grace_s) : opt_(std::move(opt)), grace_s_(grace_s) {}
  ~Job();
  int run();

 private:
  bool setup();
  bool spawn(Rank& r, const std::string& path, const std::vector<std::string>& env);
  std::vector<std::string> rank_env(int rank) const;
  void loop();
  void shutdown();
  void handle_signals();
  void reap();
  void drain(Rank& r);
  bool read_pipe(Rank& r, bool err);
  // Adds a POLLIN entry per open rank pipe (only for destinations that are not
  // backed up when throttle is set) to fds, and its owner to pipes_.
  void poll_pipes(std::vector<pollfd>& fds, bool throttle);
  void signal_all(int sig);
  void stop(int status, const std::string& message, int sig);
  void note(const std::string& line) { err_q_.push("meshrun: " + line + "\n"); }
  Rank* find(pid_t pid);

  Options opt_;
  double grace_s_;
  std::vector<Rank> ranks_;
  std::vector<Placement> place_;    // per rank
  std::vector<std::string> hosts_;  // network namespace per host; empty: none
  std::vector<int> netns_fds_;      // open namespace per host
  std::vector<Binding> bindings_;   // per rank; empty: not pinned
  int running_ = 0;
  std::string tmpdir_;
  int sigfd_ = -1;
  int devnull_ = -1;
  sigset_t old_mask_{};
  OutQueue out_q_{STDOUT_FILENO};
  OutQueue err_q_{STDERR_FILENO};
  bool stopping_ = false;  // the job's outcome is decided; ranks are being stopped
  int status_ = 0;
  int failed_status_ = 0;  // --keep-going: the first failed rank's status
  int signals_seen_ = 0;
  std::vector<std::pair<Rank*, bool>> pipes_;  // (rank, is stderr) per polled pipe
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> kill_deadline_;
};

Job::~Job() {
  for (auto& r : ranks_) {
    if (r.out_fd >= 0) ::close(r.out_fd);
    if (r.err_fd >= 0) ::close(r.err_fd);
  }
  if (sigfd_ >= 0) ::close(sigfd_);
  if (devnull_ >= 0) ::close(devnull_);
  for (int fd : netns_fds_) ::close(fd);
  if (!tmpdir_.empty()) remove_tree(tmpdir_);
}

std::vector<std::string> Job::rank_env(int rank) const {
  EnvBlock env(environ);
  const Placement& p = place_[rank];
  if (opt_.hostid_per_rank > 0) env.set("MESHCCL_HOSTID", "host" + std::to_string(p.host));
  env.set("MESHCCL_RANK", std::to_string(rank));
  env.set("MESHCCL_NRANKS", std::to_string(opt_.nranks));
  env.set("MESHCCL_LOCAL_RANK", std::to_string(p.local_rank));
  env.set("MESHCCL_LOCAL_SIZE", std::to_string(p.local_size));
  env.set("MESHCCL_COMM_FILE", tmpdir_ + "/comm.id");
  for (const auto& [name, value] : opt_.env) env.set(name, value);
  return env.vars();
}

bool Job::setup() {
  // Hosts: network namespaces (--cluster, --hosts), MESHCCL_HOSTID groups
  // (--hostid-per-rank), or this machine alone.
  std::string err = resolve_hosts(opt_, &hosts_);
  if (err.empty()) err = open_namespaces(hosts_, &netns_fds_);
  int nhosts = 1, per_host = 0;
  if (!hosts_.empty()) {
    nhosts = static_cast<int>(hosts_.size());
    per_host = opt_.ranks_per_host;
  } else if (opt_.hostid_per_rank > 0) {
    per_host = opt_.hostid_per_rank;
    nhosts = (opt_.nranks + per_host - 1) / per_host;
  }
  if (err.empty()) err = place_ranks(opt_.nranks, nhosts, per_host, &place_);
  if (err.empty()) err = compute_bindings(opt_.bind, place_, &bindings_);
  if (!err.empty()) {
    note(err);
    return false;
  }
  if (opt_.report_bindings) {
    for (int r = 0; r < opt_.nranks; ++r) {
      std::string line = "rank " + std::to_string(r);
      if (!hosts_.empty()) line += " on " + hosts_[place_[r].host];
      line += bindings_.empty() ? " not bound" : " bound to " + bindings_[r].where;
      note(line);
    }
  }

  // Two pipe ends per rank stay open in meshrun.
  rlimit rl{};
  rlim_t need = static_cast<rlim_t>(opt_.nranks) * 2 + 64;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
    rl.rlim_cur = std::min(need, rl.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < need && opt_.prefix) {
      note("-n " + std::to_string(opt_.nranks) + " needs " + std::to_string(need) + " open files but the limit is " +
           std::to_string(rl.rlim_cur) + " (ulimit -n)");
      return false;
    }
  }

  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/meshrun-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {
    note("cannot create a temporary directory " + templ + ": " + errstr(errno));
    return false;
  }
  tmpdir_ = buf.data();

  devnull_ = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull_ < 0) {
    note("cannot open /dev/null: " + errstr(errno));
    return false;
  }

  // Signals are consumed through the signalfd; blocking them first also means
  // none is lost between fork and the first poll.
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&mask, s);
  ::sigprocmask(SIG_BLOCK, &mask, &old_mask_);
  sigfd_ = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigfd_ < 0) {
    note("signalfd: " + errstr(errno));
    return false;
  }
  ::signal(SIGPIPE, SIG_IGN);  // a reader of our stdout going away is not fatal
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  return true;
}

bool Job::spawn(Rank& r, const std::string& path, const std::vector<std::string>& env) {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  if (opt_.prefix) {
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]})
        if (fd >= 0) ::close(fd);
      note("cannot start rank " + std::to_string(r.rank) + ": pipe: " + errstr(e));
      return false;
    }
  }
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : opt_.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int in_fd = (r.rank == 0 && !::isatty(STDIN_FILENO)) ? STDIN_FILENO : devnull_;
  pid_t parent = ::getpid();
  int netns_fd = hosts_.empty() ? -1 : netns_fds_[place_[r.rank].host];
  const cpu_set_t* cpus = bindings_.empty() ? nullptr : &bindings_[r.rank].cpus;

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) ::close(fd);
    note("cannot start rank " + std::to_string(r.rank) + ": fork: " + errstr(e));
    return false;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // meshrun died before the prctl
    if (in_fd != STDIN_FILENO) ::dup2(in_fd, STDIN_FILENO);
    if (opt_.prefix) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
    }
    auto say = [](const char* s) {
      if (::write(STDERR_FILENO, s, std::strlen(s)) < 0) ::_exit(127);
    };
    if (netns_fd >= 0) {
      const char* step = "";
      if (int e = enter_netns(netns_fd, &step); e != 0) {
        say("meshrun: cannot enter the host's network namespace: ");
        say(step);
        say(": ");
        say(std::strerror(e));
        say("\n");
        ::_exit(126);
      }
    }
    if (cpus != nullptr && ::sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
      say("meshrun: cannot pin the rank (--bind): ");
      say(std::strerror(errno));
      say("\n");
      ::_exit(126);
    }
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    ::execve(path.c_str(), argv.data(), envp.data());
    say("meshrun: exec failed: ");
    say(std::strerror(errno));
    say("\n");
    ::_exit(127);
  }
  // Also set from this side so the group exists before we might signal it.
  ::setpgid(pid, pid);
  r.pid = pid;
  r.running = true;
  ++running_;
  if (opt_.prefix) {
    ::close(out[1]);
    ::close(err[1]);
    r.out_fd = out[0];
    r.err_fd = err[0];
    ::fcntl(r.out_fd, F_SETFL, O_NONBLOCK);
    ::fcntl(r.err_fd, F_SETFL, O_NONBLOCK);
  }
  return true;
}

Rank* Job::find(pid_t pid) {
  for (auto& r : ranks_)
    if (r.pid == pid) return &r;
  return nullptr;
}

// Sends sig to every running rank's process group and to every orphan we
// adopted. A running rank's pid cannot be reused, so its group id is safe to
// signal; the groups of reaped ranks are not, and their leftovers are reached
// as adopted orphans instead.
void Job::signal_all(int sig) {
  for (auto& r : ranks_)
    if (r.running) ::kill(-r.pid, sig);
  for (pid_t pid : child_pids())
    if (!find(pid)) ::kill(pid, sig);
}

void Job::stop(int status, const std::string& message, int sig) {
  if (!stopping_) {
    stopping_ = true;
    status_ = status;
    note(message);
  }
  signal_all(sig);
  if (sig == SIGKILL) kill_deadline_.reset();
  else if (!kill_deadline_) kill_deadline_ = after(grace_s_);
}

// Returns false at end of file or on error (the pipe is then closed).
bool Job::read_pipe(Rank& r, bool err) {
  int& fd = err ? r.err_fd : r.out_fd;
  LineSplitter& split = err ? r.err : r.out;
  OutQueue& q = err ? err_q_ : out_q_;
  char buf[65536];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n > 0) {
    q.push(split.feed(buf, static_cast<size_t>(n)));
    return true;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  q.push(split.finish());
  ::close(fd);
  fd = -1;
  return false;
}

// What a rank wrote before exiting is already in its pipes; reading it now
// puts the failure message after the rank's last words.
void Job::drain(Rank& r) {
  for (bool err : {false, true}) {
    for (int i = 0; i < 64; ++i) {
      int fd = err ? r.err_fd : r.out_fd;
      if (fd < 0) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      if (!read_pipe(r, err)) break;
    }
  }
}

void Job::reap() {
  int ws = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &ws, WNOHANG)) > 0) {
    Rank* r = find(pid);
    if (!r || !r->running) continue;  // an adopted orphan
    r->running = false;
    --running_;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) continue;
    if (stopping_) continue;  // expected: we are stopping the job
    drain(*r);
    std::string how = WIFEXITED(ws)
                          ? "exited with status " + std::to_string(WEXITSTATUS(ws))
                          : "was killed by " + signal_name(WTERMSIG(ws)) + " (" + strsignal(WTERMSIG(ws)) + ")";
    const std::string who = "rank " + std::to_string(r->rank) + " (pid " + std::to_string(pid) + ") " + how;
    if (opt_.keep_going) {
      // The survivors carry on (ncclCommShrink, elastic training); the job
      // exits with the first failure's status once every rank has ended.
      if (failed_status_ == 0) failed_status_ = shell_status(ws);
      note(who + "; the other ranks keep going (--keep-going)");
      continue;
    }
    stop(shell_status(ws), who + "; terminating the other ranks", SIGTERM);
  }
}

void Job::handle_signals() {
  signalfd_siginfo si{};
  while (::read(sigfd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGCHLD) {
      reap();
      continue;
    }
    if (++signals_seen_ == 1) {
      // Forward the signal itself: the ranks decide how to stop; SIGKILL
      // follows after the grace period.
      stop(128 + sig, "received " + signal_name(sig) + "; forwarding it to the ranks", sig);
    } else {
      stop(128 + sig, "received " + signal_name(sig) + " again; killing the ranks", SIGKILL);
    }
  }
  reap();  // SIGCHLDs coalesce; a reap per wake-up catches every exit
}

void Job::poll_pipes(std::vector<pollfd>& fds, bool throttle) {
  pipes_.clear();
  for (auto& r : ranks_) {
    if (r.out_fd >= 0 && !(throttle && out_q_.size() >= kMaxQueued)) {
      fds.push_back({r.out_fd, POLLIN, 0});
      pipes_.emplace_back(&r, false);
    }
    if (r.err_fd >= 0 && !(throttle && err_q_.size() >= kMaxQueued)) {
      fds.push_back({r.err_fd, POLLIN, 0});
      pipes_.emplace_back(&r, true);
    }
  }
}

void Job::loop() {
  std::vector<pollfd> fds;
  while (running_ > 0) {
    fds.clear();
    poll_pipes(fds, true);
    size_t npipes = fds.size();
    fds.push_back({sigfd_, POLLIN, 0});
    OutQueue* queues[2] = {nullptr, nullptr};
    size_t nq = 0;
    for (OutQueue* q : {&out_q_, &err_q_}) {
      if (q->empty()) continue;
      fds.push_back({q->fd(), POLLOUT, 0});
      queues[nq++] = q;
    }

    int timeout = kMaxPollMs;
    if (job_deadline_) timeout = std::min(timeout, ms_until(*job_deadline_));
    if (kill_deadline_) timeout = std::min(timeout, ms_until(*kill_deadline_));
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      stop(1, "poll: " + errstr(errno) + "; killing the job", SIGKILL);
      ::usleep(10000);  // poll failing again must not spin
    }
    if (n > 0) {
      for (size_t i = 0; i < npipes; ++i)
        if (fds[i].revents) read_pipe(*pipes_[i].first, pipes_[i].second);
      for (size_t i = 0; i < nq; ++i)
        if (fds[npipes + 1 + i].revents) queues[i]->write_some();
      if (fds[npipes].revents) handle_signals();
    }

    if (job_deadline_ && Clock::now() >= *job_deadline_) {
      job_deadline_.reset();
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", opt_.timeout_s);
      stop(124, std::string("timeout: the job ran longer than ") + secs + " s; killing it", SIGTERM);
    }
    if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
      kill_deadline_.reset();
      signal_all(SIGKILL);
    }
  }
}

// After the last rank exited: kill what the ranks left behind, take the rest of
// their output, and reap everything, each step bounded.
void Job::shutdown() {
  auto deadline = after(std::max(2.0, grace_s_));
  bool noted = false;
  std::vector<pollfd> fds;
  while (Clock::now() < deadline) {
    std::vector<pid_t> kids = child_pids();
    fds.clear();
    poll_pipes(fds, false);
    if (kids.empty() && fds.empty()) break;
    if (!kids.empty() && !noted && !stopping_) {
      note("killing " + std::to_string(kids.size()) + " process(es) the ranks left running");
      noted = true;
    }
    for (pid_t pid : kids) ::kill(pid, SIGKILL);
    if (fds.empty()) {
      ::usleep(1000);
    } else if (::poll(fds.data(), fds.size(), 10) > 0) {
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents) read_pipe(*pipes_[i].first, pipes_[i].second);
    }
    int ws;
    while (::waitpid(-1, &ws, WNOHANG) > 0) {}
  }
  // Whatever still holds a pipe open could not be killed; keep what we have.
  for (auto& r : ranks_) {
    if (r.out_fd >= 0) {
      out_q_.push(r.out.finish());
      ::close(r.out_fd);
      r.out_fd = -1;
    }
    if (r.err_fd >= 0) {
      err_q_.push(r.err.finish());
      ::close(r.err_fd);
      r.err_fd = -1;
    }
  }
  out_q_.flush(5000);
  err_q_.flush(5000);
}

int Job::run() {
  int status = 0;
  std::string path = resolve_program(opt_.command[0], &status);
  if (path.empty()) {
    std::fprintf(stderr, "meshrun: %s: %s\n", opt_.command[0].c_str(),
                 status == 127 ? "command not found" : "permission denied");
    return status;
  }
  if (!setup()) {
    err_q_.flush(1000);
    return 1;
  }
  ranks_.reserve(opt_.nranks);
  for (int i = 0; i < opt_.nranks; ++i) ranks_.emplace_back(i);
  for (auto& r : ranks_) {
    if (!spawn(r, path, rank_env(r.rank))) {
      stop(1, "could not start all ranks; stopping the job", SIGKILL);
      break;
    }
  }
  if (opt_.timeout_s > 0) job_deadline_ = after(opt_.timeout_s);
  loop();
  shutdown();
  return status_ != 0 ? status_ : failed_status_;
}

}  // namespace
}  // namespace meshrun

int main(int argc, char** argv) {
  // With stdin, stdout or stderr closed, the descriptors meshrun opens would
  // take their numbers and be handed to the ranks as such.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", O_RDWR) < 0) return 1;
  }
  meshrun::Options opt;
  std::string err = meshrun::parse_options(argc, argv, &opt);
  if (!err.empty()) {
    std::fprintf(stderr, "meshrun: %s\n(meshrun -h for usage)\n", err.c_str());
    return 2;
  }
  if (opt.help) {
    std::fputs(meshrun::usage().c_str(), stdout);
    return 0;
  }
  if (opt.version) {
    std::printf("meshrun (meshccl) %s\n", MESHRUN_VERSION);
    return 0;
  }
  double grace = meshrun::kDefaultGraceS;
  if (const char* g = std::getenv("MESHCCL_KILL_GRACE")) {
    if (!meshrun::parse_seconds(g, &grace)) {
      std::fprintf(stderr, "meshrun: MESHCCL_KILL_GRACE must be a number of seconds, got '%s'\n", g);
      return 2;
    }
  }
  meshrun::Job job(std::move(opt), grace);
  return job.run();
}
