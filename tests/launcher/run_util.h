// Test support shared by the launcher tests: running meshrun (or any program)
// with captured output and a hang guard, and a scratch directory where test
// processes leave their pids.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace launcher_test {

// Paths of the binaries under test, from the environment (set by meson).
inline std::string g_meshrun;
inline std::string g_helper;

using Clock = std::chrono::steady_clock;

// A guard against a launcher that hangs, not a measure of speed: every job
// here finishes in a few seconds when meshrun works.
constexpr int kHangGuardS = 60;

struct Result {
  int status = -1;  // as a shell reports it: exit code, or 128 + signal
  std::string out;
  std::string err;
};

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

class Process {
 public:
  // Starts program with args; env entries are NAME=VALUE set in its
  // environment (NAME alone unsets NAME); input (if any) is its stdin.
  Process(const std::string& program, const std::vector<std::string>& args, const std::vector<std::string>& env = {},
          const std::string& input = "") {
    int out[2], err[2], in[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
    std::vector<std::string> argv_s = {program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const auto& e : env) {
        auto eq = e.find('=');
        if (eq == std::string::npos) ::unsetenv(e.c_str());
        else ::setenv(e.substr(0, eq).c_str(), e.c_str() + eq + 1, 1);
      }
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(program.c_str(), argv.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    ::close(in[0]);
    if (!input.empty()) { EXPECT_EQ(::write(in[1], input.data(), input.size()), static_cast<ssize_t>(input.size())); }
    ::close(in[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  pid_t pid() const { return pid_; }

  Result wait() {
    Result res;
    auto guard = Clock::now() + std::chrono::seconds(kHangGuardS);
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(guard - Clock::now()).count());
      if (left <= 0) {
        ADD_FAILURE() << "the process did not finish within " << kHangGuardS << " s; killing it";
        ::kill(pid_, SIGKILL);
        guard = Clock::now() + std::chrono::seconds(5);
        continue;
      }
      if (::poll(fds, 2, left) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        int& fd = i == 0 ? out_fd_ : err_fd_;
        if (fd < 0 || !fds[i].revents) continue;
        char buf[4096];
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) {
          (i == 0 ? res.out : res.err).append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          ::close(fd);
          fd = -1;
        }
      }
    }
    int ws = 0;
    EXPECT_EQ(::waitpid(pid_, &ws, 0), pid_);
    res.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    return res;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

class Meshrun : public Process {
 public:
  Meshrun(const std::vector<std::string>& args, const std::vector<std::string>& env = {}, const std::string& input = "")
      : Process(g_meshrun, args, env, input) {}
};

inline Result run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                  const std::string& input = "") {
  return Meshrun(args, env, input).wait();
}

// A scratch directory for the pid and done files of one test.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/meshrun-test-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    EXPECT_NE(::mkdtemp(buf.data()), nullptr);
    path_ = buf.data();
  }
  ~ScratchDir() {
    ::nftw(
        path_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }

  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') out.emplace_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }
  int count(const std::string& prefix) const {
    int n = 0;
    for (const auto& f : files())
      if (f.rfind(prefix + ".", 0) == 0 && f.find(".tmp") == std::string::npos) ++n;
    return n;
  }
  // Pids recorded by ranks and their children.
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& f : files()) {
      if ((f.rfind("pid.", 0) != 0 && f.rfind("child.", 0) != 0) || f.find(".tmp") != std::string::npos) continue;
      std::ifstream in(path_ + "/" + f);
      long pid = 0;
      if (in >> pid && pid > 0) out.push_back(static_cast<pid_t>(pid));
    }
    return out;
  }
  // Waits (bounded) until n files with prefix exist.
  bool wait_for(const std::string& prefix, int n) const {
    for (int i = 0; i < 4000; ++i) {
      if (count(prefix) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

 private:
  std::string path_;
};

inline void expect_all_gone(const ScratchDir& dir) {
  for (pid_t pid : dir.pids()) {
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "process " << pid << " outlived meshrun";
    EXPECT_EQ(errno, ESRCH);
  }
}

}  // namespace launcher_test
