// Launcher integration: meshcclGetLaunchInfo and meshcclCommInitFromEnv.
//
// Who this process is comes from the launcher's variables (meshrun, Open MPI,
// MPICH/PMI, Slurm, in that order). How rank 0's ncclUniqueId reaches the
// others: with MESHCCL_COMM_ID every rank builds the same id itself (the
// address is fixed, rank 0 hosts the root there); otherwise rank 0 publishes
// the id in a file (MESHCCL_COMM_FILE, or a per-job file in a private
// directory: see default_id_location) that the other ranks poll for. Only the
// public NCCL API is used to create the communicator, so this file is exactly
// what a user would write by hand.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "comm/id_text.h"
#include "meshccl.h"
#include "util/log.h"
#include "util/param.h"
#include "util/status.h"

namespace meshccl {
namespace {

struct LaunchInfo {
  int rank = 0;
  int nranks = 1;
  int local_rank = 0;
  const char* launcher = "none";
};

// The variables each launcher sets, in order of preference: meshrun's come
// first so that a meshrun job started inside an MPI or Slurm allocation still
// sees its own ranks.
struct LauncherVars {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
};
constexpr LauncherVars kLaunchers[] = {
    {"meshrun", "MESHCCL_RANK", "MESHCCL_NRANKS", "MESHCCL_LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI (MPICH)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

constexpr int kDefaultTimeoutS = 300;

bool parse_int(const char* text, int* value) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v > 1 << 30) return false;
  *value = static_cast<int>(v);
  return true;
}

Status launch_info(LaunchInfo* out) {
  for (const LauncherVars& l : kLaunchers) {
    const char* rank_s = std::getenv(l.rank);
    if (rank_s == nullptr) continue;
    const char* size_s = std::getenv(l.size);
    if (size_s == nullptr)
      return MC_ERROR(ncclInvalidUsage, "%s is set (%s) but %s is not: cannot tell the job size", l.rank, l.name,
                      l.size);
    LaunchInfo info;
    info.launcher = l.name;
    if (!parse_int(size_s, &info.nranks) || info.nranks < 1)
      return MC_ERROR(ncclInvalidUsage, "%s=\"%s\" is not a valid number of ranks (%s)", l.size, size_s, l.name);
    if (!parse_int(rank_s, &info.rank) || info.rank >= info.nranks)
      return MC_ERROR(ncclInvalidUsage, "%s=\"%s\" is not a rank in [0, %d) (%s)", l.rank, rank_s, info.nranks, l.name);
    // A launcher that does not say which ranks share the host: every rank is
    // then taken to be on one host, which is right for single-host jobs.
    info.local_rank = info.rank;
    if (const char* local_s = std::getenv(l.local_rank)) {
      if (!parse_int(local_s, &info.local_rank) || info.local_rank >= info.nranks)
        return MC_ERROR(ncclInvalidUsage, "%s=\"%s\" is not a local rank in [0, %d) (%s)", l.local_rank, local_s,
                        info.nranks, l.name);
    }
    *out = info;
    return kOk;
  }
  *out = LaunchInfo{};
  return kOk;
}

std::string file_safe(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) c = '_';
  }
  return out;
}

// Start time of a process in clock ticks since boot, "" if unknown. Together
// with the pid it names a process uniquely even after the pid is reused.
std::string process_start_time(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return "";
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Fields after the command name (which may hold spaces and parentheses):
  // state is field 3, starttime field 22.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return "";
  ++p;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p + 1, ' ');
    if (p == nullptr) return "";
  }
  ++p;
  size_t len = std::strspn(p, "0123456789");
  return std::string(p, len);
}

// Names the job the same way in every rank on a host.
std::string job_key() {
  if (const char* v = std::getenv("OMPI_MCA_ess_base_jobid")) return "ompi-" + file_safe(v);
  if (const char* v = std::getenv("PMIX_NAMESPACE")) return "pmix-" + file_safe(v);
  if (const char* v = std::getenv("SLURM_JOB_ID")) {
    const char* step = std::getenv("SLURM_STEP_ID");
    return "slurm-" + file_safe(v) + "." + file_safe(step ? step : "0");
  }
  // Ranks started by one launcher process on this host share their parent.
  pid_t ppid = ::getppid();
  std::string start = process_start_time(ppid);
  return "ppid-" + std::to_string(ppid) + (start.empty() ? "" : "-" + start);
}

// Where the default id file lives: the same place for every rank of a job
// on a host, and one that another user cannot have made or changed:
//  1. $XDG_RUNTIME_DIR, when it is a directory of this user closed to others;
//  2. else /tmp/meshccl-<uid>, made 0700 by this user's first job;
//  3. else (another user made that name first, or it is open to others: it
//     is not trusted, and this user cannot remove it) rank 0 publishes in a
//     fresh directory /tmp/meshccl-<uid>-XXXXXX (mkdtemp: 0700, ours by
//     construction), and the other ranks look for the job's file in the
//     directories of that name that are this user's and closed to others.
struct IdLocation {
  std::string path;     // the id file; empty until rank 0 has made the fresh directory (3)
  std::string name;     // the file's name: <job key>.id
  std::string fresh;    // (3): the fresh directory rank 0 made, removed with the file
  bool search = false;  // (3)
};

constexpr const char* kTmpPrefix = "/tmp/meshccl-";

// Empty when dir is a directory of this user that nobody else may enter,
// else what is wrong with it.
std::string private_dir_problem(const std::string& dir, bool follow) {
  struct stat st {};
  if ((follow ? ::stat(dir.c_str(), &st) : ::lstat(dir.c_str(), &st)) != 0) return std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  if (st.st_uid != ::geteuid()) return "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  if ((st.st_mode & 077) != 0) return "is open to other users";
  return "";
}

std::string shared_tmp_dir() { return kTmpPrefix + std::to_string(::geteuid()); }

void default_id_location(IdLocation* out) {
  out->name = job_key() + ".id";
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && *xdg == '/' && private_dir_problem(xdg, true).empty()) {
    out->path = std::string(xdg) + "/meshccl-" + out->name;
    return;
  }
  const std::string dir = shared_tmp_dir();
  (void)::mkdir(dir.c_str(), 0700);
  const std::string problem = private_dir_problem(dir, false);
  if (problem.empty()) {
    out->path = dir + "/" + out->name;
    return;
  }
  warn_once("meshccl-id-dir",
            "%s %s: not used for id files; they go to a fresh private directory %s-XXXXXX "
            "instead (set XDG_RUNTIME_DIR or MESHCCL_COMM_FILE to choose the place)",
            dir.c_str(), problem.c_str(), dir.c_str());
  out->search = true;
}

// Rank 0 in case (3): the fresh directory.
Status make_fresh_dir(IdLocation* loc) {
  std::string templ = shared_tmp_dir() + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    return MC_ERROR(ncclSystemError,
                    "meshcclCommInitFromEnv: cannot create a private directory %s: %s (set "
                    "MESHCCL_COMM_FILE to a private path)",
                    templ.c_str(), std::strerror(errno));
  loc->fresh = templ;
  loc->path = templ + "/" + loc->name;
  return kOk;
}

// The other ranks in case (3): the job's files in the fresh directories of
// this user (a non-blocking init's file stays until exit, so there may be
// several; the generation inside tells them apart).
std::vector<std::string> files_in_fresh_dirs(const std::string& name) {
  const std::string prefix = "meshccl-" + std::to_string(::geteuid()) + "-";
  std::vector<std::string> found;
  DIR* tmp = ::opendir("/tmp");
  if (tmp == nullptr) return found;
  while (dirent* e = ::readdir(tmp)) {
    const std::string entry = e->d_name;
    if (entry.rfind(prefix, 0) != 0) continue;
    const std::string dir = "/tmp/" + entry;
    if (!private_dir_problem(dir, false).empty()) continue;
    if (::access((dir + "/" + name).c_str(), F_OK) == 0) found.push_back(dir + "/" + name);
  }
  ::closedir(tmp);
  return found;
}

void comm_file_path(IdLocation* out) {
  const char* v = param_env(Param::CommFile);
  if (v != nullptr && *v != '\0') {
    out->path = v;
    return;
  }
  default_id_location(out);
}

int timeout_s() {
  int64_t t = param_int(Param::Timeout);
  return t > 0 ? static_cast<int>(std::min<int64_t>(t, 1 << 30)) : kDefaultTimeoutS;
}

// Every rank counts its meshcclCommInitFromEnv calls; the count travels in
// the file so that a rank creating its second communicator never picks up
// the id of the first one, still on disk while rank 0 finishes that init.
std::atomic<unsigned long> g_generation{0};

// Written to a temporary file and renamed, so readers see all of it or nothing.
Status publish_id(const std::string& path, unsigned long generation, const ncclUniqueId& id) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::string text = id_text(generation, id);
  // 0600: the id carries the job's secret. A new file, never one that was
  // there (or a link planted in its name).
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return MC_ERROR(ncclSystemError,
                    "meshcclCommInitFromEnv: cannot create %s: %s (set MESHCCL_COMM_FILE to a "
                    "writable path)",
                    tmp.c_str(), std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return MC_ERROR(ncclSystemError, "meshcclCommInitFromEnv: cannot write %s: %s", tmp.c_str(), std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return MC_ERROR(ncclSystemError, "meshcclCommInitFromEnv: cannot publish the id in %s: %s", path.c_str(),
                    std::strerror(e));
  }
  return kOk;
}

enum class ReadResult { kReady, kAbsent, kStale };

// Reads the id file once. A file from an earlier communicator of this job
// counts as stale (rank 0 replaces it); a file from a later one, or one that
// is not an id file at all, is an error.
Status read_id(const std::string& path, unsigned long generation, ncclUniqueId* id, ReadResult* result) {
  *result = ReadResult::kAbsent;
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return kOk;
    return MC_ERROR(ncclSystemError, "meshcclCommInitFromEnv: cannot read %s: %s%s", path.c_str(), std::strerror(errno),
                    errno == ELOOP ? " (a symbolic link: refused)" : "");
  }
  // Only an id this user wrote, that no other user could have changed.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & S_IWOTH) != 0) {
    ::close(fd);
    return MC_ERROR(ncclInvalidUsage, "meshcclCommInitFromEnv: refusing the id file %s: %s", path.c_str(),
                    !S_ISREG(st.st_mode)       ? "not a regular file"
                    : st.st_uid != ::geteuid() ? "owned by another user"
                                               : "writable by other users");
  }
  char buf[512] = {};
  ssize_t got = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  std::string text(buf, got > 0 ? static_cast<size_t>(got) : 0);
  unsigned long gen = 0;
  if (!parse_id_text(text, &gen, id))
    return MC_ERROR(ncclInvalidUsage,
                    "meshcclCommInitFromEnv: %s is not a meshccl id file (remove it, or point "
                    "MESHCCL_COMM_FILE elsewhere)",
                    path.c_str());
  if (gen < generation) {
    *result = ReadResult::kStale;
    return kOk;
  }
  if (gen > generation)
    return MC_ERROR(ncclInvalidUsage,
                    "meshcclCommInitFromEnv: %s holds the id of communicator #%lu of this job "
                    "but this rank is creating #%lu: every rank must call meshcclCommInitFromEnv the same number "
                    "of times",
                    path.c_str(), gen, generation);
  *result = ReadResult::kReady;
  return kOk;
}

Status wait_for_id(IdLocation* loc, unsigned long generation, int rank, ncclUniqueId* id) {
  using Clock = std::chrono::steady_clock;
  const int limit = timeout_s();
  const auto deadline = Clock::now() + std::chrono::seconds(limit);
  // Rank 0 usually publishes within milliseconds; back off to a gentle poll
  // for jobs whose ranks start far apart.
  auto pause = std::chrono::milliseconds(1);
  const auto max_pause = std::chrono::milliseconds(50);
  bool stale = false;
  for (;;) {
    const std::vector<std::string> paths = loc->search ? files_in_fresh_dirs(loc->name) : std::vector{loc->path};
    for (const std::string& path : paths) {
      ReadResult r = ReadResult::kAbsent;
      MC_TRY(read_id(path, generation, id, &r));
      if (r == ReadResult::kReady) {
        loc->path = path;
        return kOk;
      }
      stale = stale || r == ReadResult::kStale;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, max_pause);
  }
  const std::string where =
      loc->search ? shared_tmp_dir() + "-XXXXXX/" + loc->name + " (a fresh private directory)" : loc->path;
  return MC_ERROR(ncclSystemError,
                  "meshcclCommInitFromEnv: rank %d waited %d s (MESHCCL_TIMEOUT) for rank 0 to "
                  "publish the id in %s%s; is rank 0 running, and do all ranks see that path? (multi-host jobs: "
                  "set MESHCCL_COMM_ID or a shared MESHCCL_COMM_FILE)",
                  rank, limit, where.c_str(), stale ? " (only an earlier communicator's id was there)" : "");
}

// Id files of non-blocking inits cannot be removed when the call returns (the
// other ranks may not have read them yet): they go at exit.
std::mutex g_leftover_mu;
std::vector<std::string>* g_leftovers = nullptr;

void remove_leftovers() {
  std::lock_guard<std::mutex> lock(g_leftover_mu);
  if (g_leftovers == nullptr) return;
  for (const auto& p : *g_leftovers) std::remove(p.c_str());  // a file, or the fresh directory after it
  g_leftovers->clear();
}

void remove_at_exit(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_leftover_mu);
  if (g_leftovers == nullptr) {
    g_leftovers = new std::vector<std::string>();  // outlives static destructors run before atexit handlers
    std::atexit(remove_leftovers);
  }
  g_leftovers->push_back(path);
}

Status comm_init_from_env(ncclComm_t* comm, ncclConfig_t* config) {
  param_refresh();
  MC_TRY(param_check());
  if (comm == nullptr) return MC_ERROR(ncclInvalidArgument, "meshcclCommInitFromEnv: comm is NULL");
  *comm = nullptr;
  LaunchInfo info;
  MC_TRY(launch_info(&info));
  const unsigned long generation = ++g_generation;

  ncclUniqueId id{};
  const char* comm_id = param_env(Param::CommId);
  bool fixed_address = comm_id != nullptr && *comm_id != '\0';
  IdLocation loc;
  if (fixed_address || info.nranks == 1) {
    // The id encodes the fixed address, so every rank derives the same one.
    MC_TRY(ncclGetUniqueId(&id));
  } else {
    comm_file_path(&loc);
    if (info.rank == 0) {
      if (loc.search) MC_TRY(make_fresh_dir(&loc));
      MC_TRY(ncclGetUniqueId(&id));
      Status st = publish_id(loc.path, generation, id);
      if (!st.ok() && !loc.fresh.empty()) ::rmdir(loc.fresh.c_str());
      MC_TRY(st);
    } else {
      MC_TRY(wait_for_id(&loc, generation, info.rank, &id));
    }
  }
  const std::string& path = loc.path;
  std::string via = fixed_address  ? std::string("built from MESHCCL_COMM_ID")
                    : path.empty() ? std::string("not shared (one rank)")
                                   : "via file " + path;
  MC_INFO(kInit, "meshcclCommInitFromEnv: rank %d of %d (local rank %d) from %s; id %s", info.rank, info.nranks,
          info.local_rank, info.launcher, via.c_str());

  ncclResult_t res = ncclCommInitRankConfig(comm, info.nranks, id, info.rank, config);
  if (info.rank == 0 && !path.empty()) {
    // Once init completes every rank has read the id. A non-blocking init
    // returns before that, so its file goes at exit instead.
    if (res == ncclInProgress) {
      remove_at_exit(path);
      if (!loc.fresh.empty()) remove_at_exit(loc.fresh);
    } else {
      ::unlink(path.c_str());
      if (!loc.fresh.empty()) ::rmdir(loc.fresh.c_str());
    }
  }
  return res;
}

}  // namespace
}  // namespace meshccl

extern "C" __attribute__((visibility("default"))) ncclResult_t meshcclGetLaunchInfo(int* rank, int* nranks,
                                                                                    int* localRank) {
  try {
    meshccl::LaunchInfo info;
    meshccl::Status s = meshccl::launch_info(&info);
    if (!s.ok()) return s.code();
    if (rank != nullptr) *rank = info.rank;
    if (nranks != nullptr) *nranks = info.nranks;
    if (localRank != nullptr) *localRank = info.local_rank;
    return ncclSuccess;
  } catch (const std::bad_alloc&) {
    return MC_ERROR(ncclSystemError, "meshcclGetLaunchInfo: out of memory").code();
  } catch (...) { return MC_ERROR(ncclInternalError, "meshcclGetLaunchInfo: unexpected exception").code(); }
}

extern "C" __attribute__((visibility("default"))) ncclResult_t meshcclCommInitFromEnv(ncclComm_t* comm,
                                                                                      ncclConfig_t* config) {
  try {
    return meshccl::comm_init_from_env(comm, config).code();
  } catch (const std::bad_alloc&) {
    return MC_ERROR(ncclSystemError, "meshcclCommInitFromEnv: out of memory").code();
  } catch (...) { return MC_ERROR(ncclInternalError, "meshcclCommInitFromEnv: unexpected exception").code(); }
}
