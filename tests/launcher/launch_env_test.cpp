// meshcclGetLaunchInfo and meshcclCommInitFromEnv: the launcher variables they
// read, their errors, and real jobs started by meshrun and by an emulation of
// what mpirun, mpiexec (hydra) and srun set.
#include <arpa/inet.h>
#include <ftw.h>
#include <glob.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshccl.h"
#include "nccl.h"
#include "run_util.h"

namespace {

using namespace launcher_test;

std::string g_env_helper;

// Every variable meshcclGetLaunchInfo / meshcclCommInitFromEnv look at; the
// fixture clears them so the tests mean the same under any launcher.
const char* const kLaunchVars[] = {
    "MESHCCL_RANK",
    "MESHCCL_NRANKS",
    "MESHCCL_LOCAL_RANK",
    "MESHCCL_LOCAL_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "MESHCCL_COMM_FILE",
    "MESHCCL_COMM_ID",
    "NCCL_COMM_ID",
    "MESHCCL_TIMEOUT",
    "XDG_RUNTIME_DIR",
};

class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kLaunchVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kLaunchVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }

  struct Info {
    ncclResult_t res;
    int rank, nranks, local;
  };
  static Info info() {
    Info i{ncclInternalError, -7, -7, -7};
    i.res = meshcclGetLaunchInfo(&i.rank, &i.nranks, &i.local);
    return i;
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(LaunchEnv, NoLauncherIsRankZeroOfOne) {
  Info i = info();
  ASSERT_EQ(i.res, ncclSuccess);
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.nranks, 1);
  EXPECT_EQ(i.local, 0);
  EXPECT_EQ(meshcclGetLaunchInfo(nullptr, nullptr, nullptr), ncclSuccess);
}

TEST_F(LaunchEnv, ReadsEachLauncher) {
  struct Case {
    const char *rank, *size, *local;
  };
  for (Case c :
       {Case{"MESHCCL_RANK", "MESHCCL_NRANKS", "MESHCCL_LOCAL_RANK"},
        Case{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        Case{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"}, Case{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}}) {
    set(c.rank, "5");
    set(c.size, "8");
    set(c.local, "1");
    Info i = info();
    ASSERT_EQ(i.res, ncclSuccess) << c.rank;
    EXPECT_EQ(i.rank, 5) << c.rank;
    EXPECT_EQ(i.nranks, 8) << c.rank;
    EXPECT_EQ(i.local, 1) << c.rank;
    // Without the local rank, all ranks are taken to share one host.
    ::unsetenv(c.local);
    i = info();
    EXPECT_EQ(i.local, 5) << c.rank;
    ::unsetenv(c.rank);
    ::unsetenv(c.size);
  }
}

TEST_F(LaunchEnv, MeshrunVariablesWinOverEnclosingLaunchers) {
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "1");
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "4");
  Info i = info();
  EXPECT_EQ(i.rank, 3);  // Open MPI before Slurm
  EXPECT_EQ(i.nranks, 4);
  set("MESHCCL_RANK", "2");
  set("MESHCCL_NRANKS", "6");
  i = info();
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.nranks, 6);
}

TEST_F(LaunchEnv, RejectsInconsistentVariables) {
  struct Case {
    const char *rank, *size, *local, *mentions;
  };
  for (Case c : {Case{"1", nullptr, nullptr, "MESHCCL_NRANKS"}, Case{"4", "4", nullptr, "MESHCCL_RANK"},
                 Case{"x", "4", nullptr, "MESHCCL_RANK"}, Case{"-1", "4", nullptr, "MESHCCL_RANK"},
                 Case{"0", "0", nullptr, "MESHCCL_NRANKS"}, Case{"0", "4k", nullptr, "MESHCCL_NRANKS"},
                 Case{"1", "4", "9", "MESHCCL_LOCAL_RANK"}, Case{"1", "4", "", "MESHCCL_LOCAL_RANK"}}) {
    ::unsetenv("MESHCCL_NRANKS");
    ::unsetenv("MESHCCL_LOCAL_RANK");
    set("MESHCCL_RANK", c.rank);
    if (c.size) set("MESHCCL_NRANKS", c.size);
    if (c.local) set("MESHCCL_LOCAL_RANK", c.local);
    Info i = info();
    EXPECT_EQ(i.res, ncclInvalidUsage) << c.mentions;
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find(c.mentions), std::string::npos) << ncclGetLastError(nullptr);
    ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
    EXPECT_EQ(meshcclCommInitFromEnv(&comm, nullptr), ncclInvalidUsage);
    EXPECT_EQ(comm, nullptr);
  }
}

TEST_F(LaunchEnv, InitFromEnvRejectsNullComm) {
  EXPECT_EQ(meshcclCommInitFromEnv(nullptr, nullptr), ncclInvalidArgument);
}

// A rank other than 0 reads the id file; these cases fail before any
// communicator is created.
class IdFile : public LaunchEnv {
 protected:
  void SetUp() override {
    LaunchEnv::SetUp();
    path_ = dir_.path() + "/job.id";
    set("MESHCCL_RANK", "1");
    set("MESHCCL_NRANKS", "2");
    set("MESHCCL_COMM_FILE", path_.c_str());
    set("MESHCCL_TIMEOUT", "1");
  }
  void write(const std::string& text) { std::ofstream(path_) << text; }
  ncclResult_t init() {
    ncclComm_t comm = nullptr;
    ncclResult_t r = meshcclCommInitFromEnv(&comm, nullptr);
    EXPECT_EQ(comm, nullptr);
    return r;
  }
  std::string last_error() { return ncclGetLastError(nullptr); }

  ScratchDir dir_;
  std::string path_;
};

TEST_F(IdFile, NoRankZeroTimesOut) {
  EXPECT_EQ(init(), ncclSystemError);
  EXPECT_NE(last_error().find(path_), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("MESHCCL_TIMEOUT"), std::string::npos) << last_error();
}

TEST_F(IdFile, GarbageIsNotAnId) {
  write("hello\n");
  EXPECT_EQ(init(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("not a meshccl id file"), std::string::npos) << last_error();
  write("meshccl-id 1 1 abcd\n");  // too short
  EXPECT_EQ(init(), ncclInvalidUsage);
  write("meshccl-id 1 1 " + std::string(256, 'g') + "\n");  // not hex
  EXPECT_EQ(init(), ncclInvalidUsage);
}

TEST_F(IdFile, IdOfALaterCommunicatorMeansMismatchedCalls) {
  write("meshccl-id 1 999999 " + std::string(256, '0') + "\n");
  EXPECT_EQ(init(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("same number of times"), std::string::npos) << last_error();
}

TEST_F(IdFile, IdOfAnEarlierCommunicatorIsNotUsed) {
  write("meshccl-id 1 0 " + std::string(256, '0') + "\n");
  EXPECT_EQ(init(), ncclSystemError);
  EXPECT_NE(last_error().find("earlier communicator"), std::string::npos) << last_error();
}

TEST_F(IdFile, UnwritableDirectoryFailsOnRankZero) {
  set("MESHCCL_RANK", "0");
  set("MESHCCL_COMM_FILE", (dir_.path() + "/no/such/dir/job.id").c_str());
  EXPECT_EQ(init(), ncclSystemError);
  EXPECT_NE(last_error().find("no/such/dir"), std::string::npos) << last_error();
}

// Id files another user could have planted or changed are refused, not
// trusted (a planted id once pulled a rank into a stranger's communicator).
TEST_F(IdFile, PlantedOrLinkedFilesAreRefused) {
  write("meshccl-id 1 1 " + std::string(256, '0') + "\n");
  ASSERT_EQ(::chmod(path_.c_str(), 0666), 0);
  EXPECT_EQ(init(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("writable by other users"), std::string::npos) << last_error();
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  if (::geteuid() == 0) {  // only root can give a file away
    ASSERT_EQ(::chown(path_.c_str(), 65534, 65534), 0);
    EXPECT_EQ(init(), ncclInvalidUsage);
    EXPECT_NE(last_error().find("owned by another user"), std::string::npos) << last_error();
  }
  std::string target = dir_.path() + "/target.id";
  ASSERT_EQ(::rename(path_.c_str(), target.c_str()), 0);
  ASSERT_EQ(::symlink(target.c_str(), path_.c_str()), 0);
  EXPECT_EQ(init(), ncclSystemError);
  EXPECT_NE(last_error().find("symbolic link"), std::string::npos) << last_error();
}

// Without MESHCCL_COMM_FILE (and no private XDG_RUNTIME_DIR) the id goes
// through /tmp/meshccl-<uid>, a 0700 directory of this user; one open to
// others is not used: the ranks turn to a fresh private directory instead.
TEST_F(IdFile, DefaultDirectoryIsPrivate) {
  ::unsetenv("MESHCCL_COMM_FILE");
  const std::string dir = "/tmp/meshccl-" + std::to_string(::geteuid());
  EXPECT_EQ(init(), ncclSystemError);  // nobody publishes: times out
  EXPECT_NE(last_error().find(dir + "/"), std::string::npos) << last_error();
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  EXPECT_EQ(init(), ncclSystemError);
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  EXPECT_NE(last_error().find(dir + "-XXXXXX/"), std::string::npos) << last_error();
}

// $XDG_RUNTIME_DIR is used when it is a private directory of this user.
TEST_F(IdFile, PrivateRuntimeDirectoryComesFirst) {
  ::unsetenv("MESHCCL_COMM_FILE");
  ScratchDir xdg;
  set("XDG_RUNTIME_DIR", xdg.path().c_str());
  ASSERT_EQ(::chmod(xdg.path().c_str(), 0700), 0);
  EXPECT_EQ(init(), ncclSystemError);
  EXPECT_NE(last_error().find(xdg.path() + "/meshccl-"), std::string::npos) << last_error();
  ASSERT_EQ(::chmod(xdg.path().c_str(), 0755), 0);  // open to others: not used
  EXPECT_EQ(init(), ncclSystemError);
  EXPECT_EQ(last_error().find(xdg.path()), std::string::npos) << last_error();
}

// --- real jobs -----------------------------------------------------------

void expect_ok(const Result& r, int nranks, const std::string& what) {
  EXPECT_EQ(r.status, 0) << what << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err;
  for (int i = 0; i < nranks; ++i) {
    std::string want = "ok rank " + std::to_string(i) + " of " + std::to_string(nranks);
    EXPECT_NE(r.out.find(want), std::string::npos) << what << ": no '" << want << "' in\n" << r.out << r.err;
  }
}

std::vector<std::string> glob_files(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

class Job : public LaunchEnv {};

TEST_F(Job, MeshrunWorldOfEverySize) {
  for (int n : {1, 2, 3, 4}) {
    Result r = run({"-n", std::to_string(n), g_env_helper, "allreduce"});
    expect_ok(r, n, "meshrun -n " + std::to_string(n));
  }
}

TEST_F(Job, SeveralCommunicatorsInARow) {
  expect_ok(run({"-n", "3", g_env_helper, "allreduce", "3"}), 3, "three communicators");
}

TEST_F(Job, EmulatedHosts) {
  expect_ok(run({"-n", "4", "--hostid-per-rank", "2", g_env_helper, "allreduce"}), 4, "2 hosts x 2 ranks");
}

TEST_F(Job, NonBlockingInit) {
  ScratchDir dir;
  std::string file = dir.path() + "/nb.id";
  expect_ok(run({"-n", "3", "-x", "MESHCCL_COMM_FILE=" + file, g_env_helper, "nonblocking"}), 3, "non-blocking");
  EXPECT_EQ(::access(file.c_str(), F_OK), -1) << file << " left behind";
}

TEST_F(Job, DefaultIdFileIsPerJobAndRemoved) {
  // An empty MESHCCL_COMM_FILE means unset: the id goes through
  // /tmp/meshccl-<uid>/ppid-<meshrun's pid>-<its start time>.id.
  Meshrun m({"-n", "3", "-x", "MESHCCL_COMM_FILE=", g_env_helper, "allreduce"});
  Result r = m.wait();
  expect_ok(r, 3, "default id file");
  EXPECT_TRUE(
      glob_files("/tmp/meshccl-" + std::to_string(::geteuid()) + "/ppid-" + std::to_string(m.pid()) + "-*").empty());
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST_F(Job, FixedRootAddressNeedsNoFile) {
  int port = free_port();
  ASSERT_GT(port, 0);
  ScratchDir dir;
  // No rank may touch the file when the address is fixed: point it somewhere
  // that cannot be written.
  std::string id = "MESHCCL_COMM_ID=127.0.0.1:" + std::to_string(port);
  Result r =
      run({"-n", "3", "-x", id, "-x", "MESHCCL_COMM_FILE=" + dir.path() + "/none/x.id", g_env_helper, "allreduce"});
  expect_ok(r, 3, id);
}

// Starts n processes of the helper directly, each with the variables `vars`
// returns for its rank, as another launcher would.
Result run_as(int n, const std::function<std::vector<std::string>(int)>& vars) {
  std::vector<std::unique_ptr<Process>> procs;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> env(std::begin(kLaunchVars), std::end(kLaunchVars));  // unset all
    for (auto& v : vars(i)) env.push_back(v);
    procs.push_back(std::make_unique<Process>(g_env_helper, std::vector<std::string>{"allreduce"}, env));
  }
  Result all;
  all.status = 0;
  for (auto& p : procs) {
    Result r = p->wait();
    if (r.status != 0) all.status = r.status;
    all.out += r.out;
    all.err += r.err;
  }
  return all;
}

// Two users no account uses (a job's owner and a stranger), and cleanup of
// what they leave in /tmp.
struct TwoStrangers {
  uid_t owner = 0, stranger = 0;
  TwoStrangers() {
    uid_t base = 61000 + static_cast<uid_t>(::getpid() % 1000) * 2;
    for (int i = 0; i < 1000 && (::getpwuid(base) != nullptr || ::getpwuid(base + 1) != nullptr); ++i) base += 2;
    owner = base;
    stranger = base + 1;
  }
  ~TwoStrangers() {
    std::vector<std::string> dirs = glob_files(shared_dir() + "-*");
    dirs.push_back(shared_dir());
    for (const std::string& d : dirs)
      ::nftw(
          d.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
          FTW_DEPTH | FTW_PHYS);
  }
  std::string shared_dir() const { return "/tmp/meshccl-" + std::to_string(owner); }
  // Runs fn as the stranger in a child process; false when it cannot be him.
  bool as_stranger(const std::function<bool()>& fn) const {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const bool ok = ::setgroups(0, nullptr) == 0 && ::setgid(stranger) == 0 && ::setuid(stranger) == 0 && fn();
      ::_exit(ok ? 0 : 1);
    }
    int ws = 0;
    return pid > 0 && ::waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
  }
  // A two-rank job of the owner, its ranks started as a launcher would.
  Result job(const std::vector<std::string>& extra, const std::vector<std::string>& args = {"allreduce"}) const {
    std::vector<std::unique_ptr<Process>> procs;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> env(std::begin(kLaunchVars), std::end(kLaunchVars));
      env.insert(env.end(), {"LAUNCH_ENV_HELPER_UID=" + std::to_string(owner), "MESHCCL_RANK=" + std::to_string(i),
                             "MESHCCL_NRANKS=2", "MESHCCL_TIMEOUT=30"});
      env.insert(env.end(), extra.begin(), extra.end());
      procs.push_back(std::make_unique<Process>(g_env_helper, args, env));
    }
    Result all;
    all.status = 0;
    for (auto& p : procs) {
      Result r = p->wait();
      if (r.status != 0) all.status = r.status;
      all.out += r.out;
      all.err += r.err;
    }
    return all;
  }
};

// Another user who makes /tmp/meshccl-<uid> first used to block every
// meshcclCommInitFromEnv of this user for good (the directory was refused,
// and its owner cannot remove it). Now the job goes to a fresh private
// directory, says why, and leaves nothing behind; a private XDG_RUNTIME_DIR
// is not affected at all.
TEST_F(Job, AnotherUsersDirectoryCannotBlockInit) {
  if (::geteuid() != 0) GTEST_SKIP() << "playing two other users needs root (setuid)";
  TwoStrangers users;
  const std::string squat = users.shared_dir();
  if (!users.as_stranger([&] { return ::mkdir(squat.c_str(), 0755) == 0; }))
    GTEST_SKIP() << "cannot run a process as uid " << users.stranger << " here";
  Result r = users.job({}, {"allreduce", "3"});  // three communicators in a row
  if (r.status == 77) GTEST_SKIP() << "the ranks cannot become uid " << users.owner << ": " << r.err;
  expect_ok(r, 2, "a job whose /tmp/meshccl-<uid> another user made");
  EXPECT_NE(r.err.find(squat + " belongs to another user (uid " + std::to_string(users.stranger) + ")"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(glob_files(squat + "-*").size(), 0u) << "a fresh directory was left behind";
  r = users.job({}, {"nonblocking"});
  expect_ok(r, 2, "a non-blocking init, the same");
  EXPECT_EQ(glob_files(squat + "-*").size(), 0u) << "a fresh directory was left behind at exit";
  struct stat st {};
  ASSERT_EQ(::lstat(squat.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, users.stranger);

  ScratchDir xdg;
  ASSERT_EQ(::chown(xdg.path().c_str(), users.owner, users.owner), 0);
  ASSERT_EQ(::chmod(xdg.path().c_str(), 0700), 0);
  r = users.job({"XDG_RUNTIME_DIR=" + xdg.path()});
  expect_ok(r, 2, "a job with a private XDG_RUNTIME_DIR");
  EXPECT_EQ(r.err.find("belongs to another user"), std::string::npos) << r.err;
  EXPECT_TRUE(xdg.files().empty());
}

// Output files the library will not write are named on stderr with the
// reason, whatever MESHCCL_DEBUG says (a refused trace file said nothing).
TEST_F(Job, RefusedOutputFilesAreNamedWithTheReason) {
  ScratchDir dir;
  const std::string target = dir.path() + "/target", link = dir.path() + "/out";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  std::vector<std::string> env(std::begin(kLaunchVars), std::end(kLaunchVars));
  env.push_back("MESHCCL_TRACE=" + link);
  Result r = Process(g_env_helper, {"allreduce"}, env).wait();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("MESHCCL_TRACE " + link + " refused: it is a symbolic link"), std::string::npos) << r.err;
  env.back() = "MESHCCL_DEBUG_FILE=" + link;
  env.push_back("MESHCCL_DEBUG=WARN");
  r = Process(g_env_helper, {"allreduce"}, env).wait();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("MESHCCL_DEBUG_FILE " + link + " refused: it is a symbolic link"), std::string::npos) << r.err;
  EXPECT_NE(::access(target.c_str(), F_OK), 0) << "written through the link";
}

TEST_F(Job, OpenMpiVariables) {
  std::string jobid = "meshccl-test-" + std::to_string(::getpid());
  Result r = run_as(3, [&](int i) {
    return std::vector<std::string>{"OMPI_COMM_WORLD_RANK=" + std::to_string(i), "OMPI_COMM_WORLD_SIZE=3",
                                    "OMPI_COMM_WORLD_LOCAL_RANK=" + std::to_string(i),
                                    "OMPI_MCA_ess_base_jobid=" + jobid};
  });
  expect_ok(r, 3, "Open MPI");
  EXPECT_TRUE(glob_files("/tmp/meshccl-" + std::to_string(::geteuid()) + "/ompi-" + jobid + "*").empty());
}

TEST_F(Job, PmiVariables) {
  // No job id: the ranks share their parent (this test), which names the file.
  Result r = run_as(2, [](int i) {
    return std::vector<std::string>{"PMI_RANK=" + std::to_string(i), "PMI_SIZE=2",
                                    "MPI_LOCALRANKID=" + std::to_string(i)};
  });
  expect_ok(r, 2, "PMI");
  EXPECT_TRUE(
      glob_files("/tmp/meshccl-" + std::to_string(::geteuid()) + "/ppid-" + std::to_string(::getpid()) + "-*").empty());
}

TEST_F(Job, SlurmVariables) {
  std::string job = std::to_string(::getpid());
  Result r = run_as(3, [&](int i) {
    return std::vector<std::string>{"SLURM_PROCID=" + std::to_string(i), "SLURM_NTASKS=3",
                                    "SLURM_LOCALID=" + std::to_string(i), "SLURM_JOB_ID=" + job, "SLURM_STEP_ID=4"};
  });
  expect_ok(r, 3, "Slurm");
  EXPECT_TRUE(glob_files("/tmp/meshccl-" + std::to_string(::geteuid()) + "/slurm-" + job + ".4*").empty());
}

std::string find_in_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start < dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string cand = dirs.substr(start, end - start) + "/" + prog;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

TEST_F(Job, RealOpenMpiMpirun) {
  std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun in PATH";
  const std::vector<std::string> flags = {"--allow-run-as-root", "--oversubscribe", "-n"};
  Result version = Process(mpirun, {"--version"}).wait();
  if (version.out.find("Open MPI") == std::string::npos) GTEST_SKIP() << "mpirun is not Open MPI's";
  std::vector<std::string> args = flags;
  args.insert(args.end(), {"2", "/bin/true"});
  Result probe = Process(mpirun, args).wait();
  if (probe.status != 0) GTEST_SKIP() << "mpirun cannot start processes here:\n" << probe.err;

  args = flags;
  args.insert(args.end(), {"3", g_env_helper, "allreduce", "2"});
  Result r = Process(mpirun, args).wait();
  expect_ok(r, 3, "mpirun");
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* m = std::getenv("MESHRUN");
  const char* h = std::getenv("LAUNCH_ENV_HELPER");
  if (!m || !h) {
    std::fprintf(stderr, "MESHRUN and LAUNCH_ENV_HELPER must name the meshrun and launch_env_helper binaries\n");
    return 1;
  }
  launcher_test::g_meshrun = m;
  g_env_helper = h;
  return RUN_ALL_TESTS();
}
