// What loading the network transports leaves in a process (docs/transports.md,
// "Loading a plugin"), over every transport, with ranks as forked processes:
//   - a network plugin is loaded only when a pair of ranks on different hosts
//     needs one;
//   - the signal dispositions the program set survive communicators;
//   - a rank sent SIGTERM while idle, inside a collective or while exiting
//     dies of it at once;
//   - libucs reads no ./ucx.conf; libfabric is asked only for the ofi
//     plugin's providers; an abort after a peer died prints no UCX mpool
//     warnings;
//   - the settings of UCX and libfabric the plugins choose, and those of the
//     user they keep.
// ucx and ofi pairs run between emulated hosts (MESHCCL_HOSTID per rank,
// NCCL_NET naming the transport) on loopback. MESHCCL_PLUGIN_PATH names the
// build's plugins; a case whose plugin was not built is skipped.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "meshccl.h"
#include "tests/common/procs.h"

namespace {

using namespace meshccl_test;

constexpr double kDeadline = 40;  // per forked rank

bool plugin_built(const std::string& name) {
  const char* dir = std::getenv("MESHCCL_PLUGIN_PATH");
  std::string path = std::string(dir != nullptr ? dir : ".") + "/libmeshccl-transport-" + name + ".so";
  return access(path.c_str(), F_OK) == 0;
}

// Sets this rank's environment for a job over `transport`: shm within one
// host, socket forced, or ucx/ofi asked for between emulated hosts.
void use_transport(const std::string& transport, int rank) {
  if (transport == "socket") setenv("MESHCCL_TRANSPORT", "socket", 1);
  if (transport == "ucx" || transport == "ofi") {
    setenv("NCCL_NET", transport.c_str(), 1);
    setenv("MESHCCL_HOSTID", ("host" + std::to_string(rank)).c_str(), 1);
  }
}

ncclResult_t init_and_reduce(SharedArray<SharedId>& sid, int n, int rank, ncclComm_t* comm) {
  if (ncclResult_t r = shared_init(sid, n, rank, comm); r != ncclSuccess) return r;
  std::vector<float> v(70000, 1.0f);
  return ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, *comm, nullptr);
}

// The libraries of network transports mapped into this process.
std::set<std::string> network_libraries() {
  std::set<std::string> found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        for (const char* lib : {"libmeshccl-transport-", "libucs.", "libucp.", "libfabric.", "libinfinipath."})
          if (name.find(lib) != std::string::npos) static_cast<std::set<std::string>*>(arg)->insert(lib);
        return 0;
      },
      &found);
  return found;
}

void note(Slot& s, const std::string& text) { std::snprintf(s.message, sizeof(s.message), "%s", text.c_str()); }

void expect_all_ok(const std::vector<Child>& kids, SharedSlots& slots) {
  for (const Child& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k) << ": " << slots[k.rank].message;
}

// ---------------------------------------------------------------------------

struct LoadCase {
  const char* name;
  bool two_hosts;
  const char* var;  // an environment variable for every rank, or nullptr
  const char* value;
  const char* needs;  // a plugin the case needs built, or nullptr
  std::set<std::string> loaded;
};

void PrintTo(const LoadCase& c, std::ostream* os) { *os << c.name; }

class NetworkPlugins : public ::testing::TestWithParam<LoadCase> {};

TEST_P(NetworkPlugins, LoadedOnlyWhenAPairOfHostsNeedsThem) {
  const LoadCase& c = GetParam();
  if (c.needs != nullptr && !plugin_built(c.needs)) GTEST_SKIP() << c.needs << " plugin not built";
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kDeadline, [&](int rank) {
    if (c.var != nullptr) setenv(c.var, c.value, 1);
    if (c.two_hosts) setenv("MESHCCL_HOSTID", ("host" + std::to_string(rank)).c_str(), 1);
    ncclComm_t comm = nullptr;
    ncclResult_t r = init_and_reduce(sid, n, rank, &comm);
    if (r != ncclSuccess) return fail(10, rank, "init and AllReduce", r);
    std::string got;
    for (const std::string& lib : network_libraries()) got += lib + " ";
    std::string want;
    for (const std::string& lib : c.loaded) want += lib + " ";
    ncclCommDestroy(comm);
    if (got == want) return 0;
    note(slots[rank], "loaded: [" + got + "], expected: [" + want + "]");
    return 11;
  });
  expect_all_ok(kids, slots);
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, NetworkPlugins,
    ::testing::Values(LoadCase{"one_host", false, nullptr, nullptr, nullptr, {}},
                      LoadCase{"forced_shm", false, "MESHCCL_TRANSPORT", "shm", nullptr, {}},
                      LoadCase{"one_host_net_ucx", false, "NCCL_NET", "ucx", "ucx", {}},
                      LoadCase{"two_hosts_forced_socket", true, "MESHCCL_TRANSPORT", "socket", nullptr, {}},
                      LoadCase{"two_hosts_net_ofi",
                               true,
                               "NCCL_NET",
                               "ofi",
                               "ofi",
                               {"libmeshccl-transport-", "libfabric.", "libinfinipath."}}),
    [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------

const char* kTransports[] = {"shm", "socket", "ucx", "ofi"};

void program_handler(int) {}

// handler and flags of every signal, as sigaction reports them, but for
// SA_RESTORER: glibc adds its return trampoline to every disposition it sets,
// so a signal never set reads without it and the same disposition set back
// reads with it.
std::vector<std::pair<void*, int>> dispositions() {
  constexpr int kSaRestorer = 0x04000000;
  std::vector<std::pair<void*, int>> all(NSIG, {nullptr, 0});
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    if (sigaction(s, nullptr, &sa) == 0) all[s] = {reinterpret_cast<void*>(sa.sa_handler), sa.sa_flags & ~kSaRestorer};
  }
  return all;
}

std::string changed_since(const std::vector<std::pair<void*, int>>& before) {
  std::vector<std::pair<void*, int>> now = dispositions();
  std::string out;
  for (int s = 1; s < NSIG; ++s) {
    if (now[s] == before[s]) continue;
    Dl_info info{};
    const char* lib = dladdr(now[s].first, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "?";
    out += std::string(" SIG") + (sigabbrev_np(s) != nullptr ? sigabbrev_np(s) : "?") + " (" + lib + ")";
  }
  return out;
}

class Signals : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string t = GetParam();
    if ((t == "ucx" || t == "ofi") && !plugin_built(t)) GTEST_SKIP() << t << " plugin not built";
  }
};

TEST_P(Signals, TheProgramsDispositionsSurviveACommunicator) {
  const std::string transport = GetParam();
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kDeadline, [&](int rank) {
    use_transport(transport, rank);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = program_handler;
    for (int s : {SIGTERM, SIGSEGV, SIGCHLD}) sigaction(s, &sa, nullptr);
    signal(SIGINT, SIG_IGN);
    signal(SIGBUS, SIG_DFL);
    const auto before = dispositions();
    ncclComm_t comm = nullptr;
    ncclResult_t r = init_and_reduce(sid, n, rank, &comm);
    if (r != ncclSuccess) return fail(10, rank, "init and AllReduce", r);
    std::string changed = changed_since(before);
    if ((r = ncclCommDestroy(comm)) != ncclSuccess) return fail(11, rank, "ncclCommDestroy", r);
    changed += changed_since(before);
    if (changed.empty()) return 0;
    note(slots[rank], "dispositions changed:" + changed);
    return 12;
  });
  expect_all_ok(kids, slots);
}

// When rank 0 gets SIGTERM: idle after a collective, blocked inside one
// (rank 1 never joins), or in an exit handler after exit() was called.
enum class When { kIdle, kInCollective, kExiting };

struct Stage {
  volatile int pid = 0;
  volatile int reached = 0;  // rank 0 is where it should be signalled
  volatile int release = 0;  // rank 1 may go
};
Stage* g_stage = nullptr;

void wait_in_exit() {
  __atomic_store_n(&g_stage->reached, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 2000; ++i) usleep(5000);  // 10 s at most; SIGTERM ends it
}

int sigterm_rank(SharedArray<SharedId>& sid, Stage* stage, int rank, When when) {
  const int n = 2;
  ncclComm_t comm = nullptr;
  ncclResult_t r = init_and_reduce(sid, n, rank, &comm);
  if (r != ncclSuccess) return fail(10, rank, "init and AllReduce", r);
  if (rank == 1) {
    for (int i = 0; i < 3000 && __atomic_load_n(&stage->release, __ATOMIC_ACQUIRE) == 0; ++i) usleep(5000);
    return 0;  // _exit: nothing to wait for
  }
  stage->pid = getpid();
  if (when == When::kExiting) {
    g_stage = stage;
    std::atexit(wait_in_exit);
    std::exit(0);
  }
  if (when == When::kInCollective) {
    __atomic_store_n(&stage->reached, 1, __ATOMIC_RELEASE);
    std::vector<float> v(1000, 1.0f);
    ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, nullptr);
    return 20;  // only after MESHCCL_TIMEOUT: SIGTERM should have ended the process
  }
  __atomic_store_n(&stage->reached, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < 2000; ++i) usleep(5000);
  return 21;
}

class Sigterm : public ::testing::TestWithParam<std::tuple<const char*, When>> {};

TEST_P(Sigterm, EndsTheRankAtOnce) {
  const std::string transport = std::get<0>(GetParam());
  const When when = std::get<1>(GetParam());
  if ((transport == "ucx" || transport == "ofi") && !plugin_built(transport))
    GTEST_SKIP() << transport << " plugin not built";
  SharedArray<SharedId> sid(1);
  SharedArray<Stage> stage(1);
  SharedArray<double> took(1);
  took[0] = -1;
  // A third process plays the launcher: it sends SIGTERM once rank 0 is
  // where the case wants it, and measures until rank 0 is gone.
  auto kids = run_procs(3, kDeadline, [&](int rank) {
    if (rank < 2) {
      use_transport(transport, rank);
      return sigterm_rank(sid, &stage[0], rank, when);
    }
    auto t0 = Clock::now();
    while (__atomic_load_n(&stage[0].reached, __ATOMIC_ACQUIRE) == 0 && since(t0) < 30) usleep(2000);
    if (stage[0].reached == 0) return 30;
    usleep(200000);  // well inside the collective or the exit handler
    const pid_t victim = stage[0].pid;
    auto t1 = Clock::now();
    kill(victim, SIGTERM);
    // Gone once the parent reaped it (it polls every 5 ms).
    while (kill(victim, 0) == 0 && since(t1) < 20) usleep(1000);
    took[0] = since(t1);
    __atomic_store_n(&stage[0].release, 1, __ATOMIC_RELEASE);
    return 0;
  });
  ASSERT_EQ(kids.size(), 3u);
  const Child& victim = kids[0];
  const bool died_of_sigterm =
      !victim.killed_at_deadline && WIFSIGNALED(victim.status) && WTERMSIG(victim.status) == SIGTERM;
  EXPECT_TRUE(died_of_sigterm) << describe(victim);
  EXPECT_GE(took[0], 0) << describe(kids[2]);
  EXPECT_LT(took[0], 3.0) << "seconds from SIGTERM until rank 0 was gone";
}

INSTANTIATE_TEST_SUITE_P(Transports, Signals, ::testing::ValuesIn(kTransports),
                         [](const auto& info) { return std::string(info.param); });

INSTANTIATE_TEST_SUITE_P(Transports, Sigterm,
                         ::testing::Combine(::testing::ValuesIn(kTransports),
                                            ::testing::Values(When::kIdle, When::kInCollective, When::kExiting)),
                         [](const auto& info) {
                           const When w = std::get<1>(info.param);
                           return std::string(std::get<0>(info.param)) + (w == When::kIdle           ? "_idle"
                                                                          : w == When::kInCollective ? "_in_collective"
                                                                                                     : "_exiting");
                         });

// ---------------------------------------------------------------------------

// A scratch directory, removed with what it holds.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/meshccl-plugin-load.XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  std::string read(const std::string& name) const {
    std::ifstream f(path + "/" + name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path + "/" + name) << text; }
};

// stdout and stderr of this rank into dir/rank<r>.log
void capture_output(const TempDir& dir, int rank) {
  int fd = open((dir.path + "/rank" + std::to_string(rank) + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
}

// Two forked ranks over `transport`, each logging into dir/rank<r>.log:
// env() sets a rank's environment, then it makes a communicator and runs one
// AllReduce; check(rank, slot), when given, tests more before the
// communicator is destroyed (non-zero: the rank's exit code, with a note).
void logged_allreduce(const TempDir& dir, const std::string& transport, const std::function<void()>& env,
                      const std::function<int(int, Slot&)>& check = nullptr) {
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kDeadline, [&](int rank) {
    capture_output(dir, rank);
    env();
    use_transport(transport, rank);
    ncclComm_t comm = nullptr;
    ncclResult_t r = init_and_reduce(sid, n, rank, &comm);
    if (r != ncclSuccess) return fail(10, rank, "init and AllReduce", r);
    if (check != nullptr)
      if (int code = check(rank, slots[rank]); code != 0) return code;
    ncclCommDestroy(comm);
    return 0;
  });
  expect_all_ok(kids, slots);
}

// Another user who can write the working directory (/tmp, a shared folder)
// must not steer UCX: libucs reads ./ucx.conf when it loads.
TEST(WorkingDirectory, UcxConfThereIsNotRead) {
  if (!plugin_built("ucx")) GTEST_SKIP() << "ucx plugin not built";
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  dir.write("victim", "precious");
  dir.write("ucx.conf", "UCX_LOG_FILE=" + dir.path + "/victim\nUCX_LOG_LEVEL=info\n");
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kDeadline, [&](int rank) {
    if (chdir(dir.path.c_str()) != 0) return 9;
    use_transport("ucx", rank);
    ncclComm_t comm = nullptr;
    ncclResult_t r = init_and_reduce(sid, n, rank, &comm);
    if (r != ncclSuccess) return fail(10, rank, "init and AllReduce", r);
    if (network_libraries().count("libucs.") == 0) {
      note(slots[rank], "libucs was not loaded: the case tests nothing");
      return 11;
    }
    ncclCommDestroy(comm);
    return 0;
  });
  expect_all_ok(kids, slots);
  EXPECT_EQ(dir.read("victim"), "precious") << "UCX_LOG_FILE from ./ucx.conf was obeyed";
}

// Without MESHCCL_OFI_PROVIDER or FI_PROVIDER, libfabric is asked for the
// plugin's providers only: its log shows no other provider's discovery
// (psm's loads libinfinipath's hardware probe).
TEST(Ofi, AsksLibfabricOnlyForItsProviders) {
  if (!plugin_built("ofi")) GTEST_SKIP() << "ofi plugin not built";
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const int n = 2;
  logged_allreduce(dir, "ofi", [] {
    unsetenv("FI_PROVIDER");
    unsetenv("MESHCCL_OFI_PROVIDER");
    setenv("FI_LOG_LEVEL", "info", 1);
  });
  const std::regex asked("fi_getinfo: provider (\\S+) returned|:(psmx\\w*|verbs\\w*|udp\\w*|sockets\\w*)_getinfo\\(");
  for (int r = 0; r < n; ++r) {
    const std::string log = dir.read("rank" + std::to_string(r) + ".log");
    EXPECT_NE(log.find("libfabric:"), std::string::npos) << "no libfabric log from rank " << r;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, asked)) continue;
      const std::string prov = m[1].matched ? m[1].str() : m[2].str();
      EXPECT_TRUE(prov == "tcp" || prov == "shm" || prov == "ofi_rxm") << "rank " << r << ": " << line;
    }
  }
}

// Over tcp;ofi_rxm the plugin raises rxm's eager limit to its message size
// unless the user set FI_OFI_RXM_EAGER_LIMIT (docs/transports.md, "ofi"):
// libfabric's own log states the limits each endpoint got (16384 before:
// every payload message went by rendezvous), and the variable is gone from
// the environment again once the communicator is made.
TEST(Ofi, RxmEagerLimitIsTheMessageSizeUnlessTheUserSetIt) {
  if (!plugin_built("ofi")) GTEST_SKIP() << "ofi plugin not built";
  for (const std::string user : {"", "65536"}) {
    SCOPED_TRACE("FI_OFI_RXM_EAGER_LIMIT=" + user);
    TempDir dir;
    ASSERT_FALSE(dir.path.empty());
    const int n = 2;
    logged_allreduce(
        dir, "ofi",
        [&] {
          for (const char* v : {"FI_PROVIDER", "MESHCCL_OFI_PROVIDER", "MESHCCL_OFI_MAX_MSG", "FI_OFI_RXM_EAGER_LIMIT"})
            unsetenv(v);
          if (!user.empty()) setenv("FI_OFI_RXM_EAGER_LIMIT", user.c_str(), 1);
          setenv("FI_LOG_LEVEL", "info", 1);
          setenv("MESHCCL_DEBUG", "INFO", 1);
          setenv("MESHCCL_DEBUG_SUBSYS", "NET", 1);
        },
        [&](int, Slot& slot) {
          const char* left = std::getenv("FI_OFI_RXM_EAGER_LIMIT");
          if (user.empty() && left != nullptr) {
            note(slot, std::string("FI_OFI_RXM_EAGER_LIMIT was left set to ") + left);
            return 11;
          }
          if (!user.empty() && (left == nullptr || user != left)) {
            note(slot, "the user's FI_OFI_RXM_EAGER_LIMIT changed");
            return 12;
          }
          return 0;
        });
    const std::string limit = user.empty() ? "131072" : user;
    for (int r = 0; r < n; ++r) {
      const std::string log = dir.read("rank" + std::to_string(r) + ".log");
      EXPECT_NE(log.find("Protocol limits: Eager: " + limit + ","), std::string::npos) << "rank " << r << ":\n" << log;
      EXPECT_EQ(log.find("Protocol limits: Eager: 16384,"), std::string::npos) << "rank " << r;
      EXPECT_NE(log.find("messages of up to " + limit + " bytes"), std::string::npos) << "rank " << r;
      EXPECT_NE(log.find(user.empty() ? "FI_OFI_RXM_EAGER_LIMIT=131072 chosen"
                                      : "FI_OFI_RXM_EAGER_LIMIT=65536 (set by the user)"),
                std::string::npos)
          << "rank " << r;
    }
  }
}

// Whether UCX could carry data over RDMA here (the ucx plugin then leaves
// UCX's choices alone).
bool has_rdma_device() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

// Without an RDMA device the ucx plugin chooses UCX's settings for TCP
// (docs/transports.md, "ucx"), except those the user set, by variable or in
// a ucx.conf: UCX's log of an endpoint's lanes shows the transports it was
// allowed (the user's UCX_TLS=tcp: TCP even between ranks of one machine).
TEST(Ucx, ChoosesSettingsForTcpUnlessTheUserDid) {
  if (!plugin_built("ucx")) GTEST_SKIP() << "ucx plugin not built";
  if (has_rdma_device()) GTEST_SKIP() << "an RDMA device is present: the plugin leaves UCX's choices alone";
  for (const std::string how : {"default", "variable", "ucx.conf"}) {
    SCOPED_TRACE(how);
    TempDir dir;
    ASSERT_FALSE(dir.path.empty());
    if (how == "ucx.conf") dir.write("ucx.conf", "UCX_TLS=tcp\nUCX_RNDV_THRESH=64K\n");
    const int n = 2;
    logged_allreduce(dir, "ucx", [&] {
      for (const char* v : {"UCX_TLS", "UCX_RNDV_THRESH", "UCX_CONFIG_DIR"}) unsetenv(v);
      if (how == "variable") setenv("UCX_TLS", "tcp", 1);
      if (how == "ucx.conf") setenv("UCX_CONFIG_DIR", dir.path.c_str(), 1);
      setenv("UCX_LOG_LEVEL", "info", 1);
      setenv("MESHCCL_DEBUG", "INFO", 1);
      setenv("MESHCCL_DEBUG_SUBSYS", "NET", 1);
    });
    for (int r = 0; r < n; ++r) {
      const std::string log = dir.read("rank" + std::to_string(r) + ".log");
      // UCX_NET_DEVICES=lo comes from the test's environment.
      const std::string want =
          how == "default"    ? "chose UCX_TLS=tcp,sm,self UCX_RNDV_THRESH=inf; kept the user's UCX_NET_DEVICES=lo"
          : how == "variable" ? "chose UCX_RNDV_THRESH=inf; kept the user's UCX_TLS=tcp UCX_NET_DEVICES=lo"
                              : "chose nothing; kept the user's UCX_TLS=tcp UCX_RNDV_THRESH=64K UCX_NET_DEVICES=lo";
      EXPECT_NE(log.find("ucx: no RDMA device, so TCP between hosts: " + want + "\n"), std::string::npos)
          << "rank " << r << ":\n"
          << log;
      // UCX names every chosen setting it did not apply to any of its parts.
      EXPECT_EQ(log.find("invalid configuration"), std::string::npos) << "rank " << r << ":\n" << log;
      std::smatch lanes;
      ASSERT_TRUE(std::regex_search(log, lanes, std::regex("ep_cfg\\[\\d+\\]: tag\\(([^)]*)\\)")))
          << "rank " << r << ":\n"
          << log;
      if (how == "default") EXPECT_EQ(lanes[1].str().find("tcp/"), std::string::npos) << lanes[0];
      else EXPECT_EQ(lanes[1].str(), "tcp/lo") << lanes[0];
    }
  }
}

// A rank whose peer on the same host died while a large send waited for it:
// the abort destroys the UCX worker, which still holds that send. UCX's
// warnings about it do not reach the output.
TEST(Ucx, AbortAfterAPeerDiedPrintsNoMpoolWarnings) {
  if (!plugin_built("ucx")) GTEST_SKIP() << "ucx plugin not built";
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedArray<Stage> stage(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kDeadline, [&](int rank) {
    capture_output(dir, rank);
    unsetenv("UCX_LOG_LEVEL");
    setenv("MESHCCL_TRANSPORT", "ucx", 1);
    ncclComm_t comm = nullptr;
    ncclResult_t r = init_and_reduce(sid, n, rank, &comm);
    if (r != ncclSuccess) return fail(10, rank, "init and AllReduce", r);
    if (rank == 1) {
      for (int i = 0; i < 4000 && __atomic_load_n(&stage[0].reached, __ATOMIC_ACQUIRE) == 0; ++i) usleep(5000);
      usleep(100000);
      kill(getpid(), SIGKILL);
    }
    std::vector<char> big(8 << 20, 1);
    __atomic_store_n(&stage[0].reached, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 3 && r == ncclSuccess; ++i) r = ncclSend(big.data(), big.size(), ncclChar, 1, comm, nullptr);
    if (r == ncclSuccess) {
      note(slots[rank], "the sends to a dead peer succeeded");
      return 12;
    }
    ncclCommAbort(comm);
    return 0;
  });
  EXPECT_TRUE(exited_ok(kids[0])) << describe(kids[0]) << ": " << slots[0].message;
  const std::string log = dir.read("rank0.log");
  EXPECT_EQ(log.find("not returned to mpool"), std::string::npos) << log;
}

}  // namespace
