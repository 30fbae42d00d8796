// The program meshrun starts in the launcher tests. Each mode exercises one
// behaviour; processes record their pid in a directory given on the command
// line so the test can check afterwards that none survived, and a "done" file
// when they run to completion so the test can tell they were stopped early.
//
//   env [NAME...]          print this rank's launch environment, the cpus it may
//                          run on (as a list: 0-3,8) and NAMEs
//   lines K                K numbered lines on stdout and on stderr
//   partial                a line without its newline
//   stdin                  echo stdin, then "eof"
//   exit CODE              every rank exits with CODE
//   fail R CODE DIR        once all ranks run, rank R exits with CODE, the others sleep
//   kill R SIG DIR         once all ranks run, rank R raises SIG, the others sleep
//   sleep S DIR            sleep S seconds
//   ignore-term DIR        ignore SIGTERM and sleep
//   trap-int DIR           wait for SIGINT, report it and exit 0
//   orphan MODE DIR        start a grandchild that sleeps; MODE: exit (the rank
//                          exits 0 at once), setsid (the grandchild leaves the
//                          rank's process group; the rank sleeps), sleep
//   commfile               rank 0 publishes a file at MESHCCL_COMM_FILE, the others read it
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

const char* env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(unset)";
}

// The cpus this process may run on, as ranges: "0-3,8".
std::string allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int end = c;
    while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) ++end;
    if (!out.empty()) out += ",";
    out += std::to_string(c);
    if (end > c) out += "-" + std::to_string(end);
    c = end;
  }
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s: %s\n", tmp.c_str(), std::strerror(errno));
    std::exit(90);
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

void record(const std::string& dir, const char* what, int rank) {
  write_file(dir + "/" + what + "." + std::to_string(rank), std::to_string(::getpid()) + "\n");
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Waits (bounded) until every rank has recorded its pid.
void wait_all(const std::string& dir, int nranks) {
  for (int tries = 0; tries < 4000; ++tries) {
    int n = 0;
    for (int r = 0; r < nranks; ++r) n += exists(dir + "/pid." + std::to_string(r));
    if (n == nranks) return;
    sleep_s(0.005);
  }
  std::fprintf(stderr, "not all ranks started\n");
  std::exit(91);
}

// Sleeps long enough that the test's guard fires first if the launcher failed to
// stop us, then leaves the evidence.
void sleep_then_done(const std::string& dir, const char* what, int rank, double s = 30) {
  sleep_s(s);
  record(dir, what, rank);
}

volatile sig_atomic_t got_int = 0;
void on_int(int) { got_int = 1; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: launcher_helper MODE ...\n");
    return 64;
  }
  std::string mode = argv[1];
  int rank = env_int("MESHCCL_RANK");
  int nranks = env_int("MESHCCL_NRANKS");
  auto arg = [&](int i) -> std::string {
    if (i >= argc) {
      std::fprintf(stderr, "launcher_helper %s: missing argument %d\n", mode.c_str(), i);
      std::exit(64);
    }
    return argv[i];
  };

  if (mode == "env") {
    std::string comm = env_str("MESHCCL_COMM_FILE");
    std::string dir = comm.substr(0, comm.rfind('/'));
    std::printf("rank=%s nranks=%s local_rank=%s local_size=%s hostid=%s commdir=%s commdir_exists=%d cpus=%s\n",
                env_str("MESHCCL_RANK"), env_str("MESHCCL_NRANKS"), env_str("MESHCCL_LOCAL_RANK"),
                env_str("MESHCCL_LOCAL_SIZE"), env_str("MESHCCL_HOSTID"), dir.c_str(), static_cast<int>(exists(dir)),
                allowed_cpus().c_str());
    for (int i = 2; i < argc; ++i) std::printf("%s=%s\n", argv[i], env_str(argv[i]));
    return 0;
  }
  if (mode == "lines") {
    int k = std::atoi(arg(2).c_str());
    for (int i = 0; i < k; ++i) {
      std::printf("out %d %d\n", rank, i);
      std::fflush(stdout);
      std::fprintf(stderr, "err %d %d\n", rank, i);
    }
    return 0;
  }
  if (mode == "partial") {
    std::printf("tail-%d", rank);
    return 0;
  }
  if (mode == "stdin") {
    char buf[256];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) std::fwrite(buf, 1, n, stdout);
    std::printf("eof\n");
    return 0;
  }
  if (mode == "exit") return std::atoi(arg(2).c_str());
  if (mode == "fail" || mode == "kill") {
    int who = std::atoi(arg(2).c_str());
    int value = std::atoi(arg(3).c_str());
    std::string dir = arg(4);
    record(dir, "pid", rank);
    wait_all(dir, nranks);
    if (rank == who) {
      std::printf("rank %d failing\n", rank);
      std::fflush(stdout);
      if (mode == "kill") std::raise(value);
      return value;
    }
    // An optional fifth argument: how long the others run (default 30 s).
    sleep_then_done(dir, "done", rank, argc > 5 ? std::atof(argv[5]) : 30);
    return 0;
  }
  if (mode == "sleep") {
    double s = std::atof(arg(2).c_str());
    std::string dir = arg(3);
    record(dir, "pid", rank);
    sleep_then_done(dir, "done", rank, s);
    return 0;
  }
  if (mode == "ignore-term") {
    std::string dir = arg(2);
    std::signal(SIGTERM, SIG_IGN);
    record(dir, "pid", rank);
    sleep_then_done(dir, "done", rank);
    return 0;
  }
  if (mode == "trap-int") {
    std::string dir = arg(2);
    std::signal(SIGINT, on_int);
    record(dir, "pid", rank);
    for (int i = 0; i < 30000 && !got_int; ++i) sleep_s(0.001);
    if (!got_int) return 1;
    std::printf("rank %d got SIGINT\n", rank);
    return 0;
  }
  if (mode == "orphan") {
    std::string how = arg(2);
    std::string dir = arg(3);
    pid_t pid = ::fork();
    if (pid == 0) {
      if (how == "setsid") ::setsid();
      record(dir, "child", rank);
      sleep_then_done(dir, "child-done", rank);
      _exit(0);
    }
    for (int i = 0; i < 4000 && !exists(dir + "/child." + std::to_string(rank)); ++i) sleep_s(0.005);
    record(dir, "pid", rank);
    if (how == "exit") return 0;
    sleep_then_done(dir, "done", rank);
    return 0;
  }
  if (mode == "commfile") {
    const char* env_path = std::getenv("MESHCCL_COMM_FILE");
    if (!env_path) return 2;
    std::string path = env_path;
    std::string dir = path.substr(0, path.rfind('/'));
    if (rank == 0) {
      write_file(path, "published\n");
    } else {
      for (int i = 0; i < 4000 && !exists(path); ++i) sleep_s(0.005);
    }
    char buf[64] = {};
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return 3;
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = '\0';
    std::fclose(f);
    std::printf("%s", buf);
    std::fflush(stdout);
    // Nobody leaves before everyone has read it.
    record(dir, "read", rank);
    for (int i = 0; i < 4000; ++i) {
      int n = 0;
      for (int r = 0; r < nranks; ++r) n += exists(dir + "/read." + std::to_string(r));
      if (n == nranks) break;
      sleep_s(0.005);
    }
    return 0;
  }
  std::fprintf(stderr, "launcher_helper: unknown mode '%s'\n", mode.c_str());
  return 64;
}
