#include "tests/plugins/test_host.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "plugins/builtin.h"

namespace meshccl::test {
namespace {

std::mutex g_mu;
std::vector<std::string> g_log;

struct Shared {
  const unsigned char* base;
  size_t size;
  int fd;
};
std::vector<Shared> g_shared;

void log_fn(int level, const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  static const bool verbose = std::getenv("MESHCCL_TEST_VERBOSE") != nullptr;
  const char* name = level == MESHCCL_LOG_WARN ? "WARN" : level == MESHCCL_LOG_INFO ? "INFO" : "TRACE";
  if (level == MESHCCL_LOG_WARN || verbose) std::fprintf(stderr, "[%d] %s %s:%d %s\n", getpid(), name, file, line, msg);
  std::lock_guard<std::mutex> lock(g_mu);
  g_log.emplace_back(msg);
}

const char* get_param(const char* name) { return std::getenv(name); }

int find_shared(const void* ptr, size_t size, meshccl_shared_region_v1_t* out) {
  auto* p = static_cast<const unsigned char*>(ptr);
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Shared& s : g_shared) {
    if (p >= s.base && p + size <= s.base + s.size) {
      out->pid = getpid();
      out->fd = s.fd;
      out->offset = static_cast<uint64_t>(p - s.base);
      out->size = s.size - out->offset;
      return 1;
    }
  }
  return 0;
}

const meshccl_transport_host_v1_t g_host = {
    .version = MESHCCL_TRANSPORT_V1,
    .log = log_fn,
    .get_param = get_param,
    .find_shared = find_shared,
    .rank = 0,
    .nranks = 2,
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

const meshccl_transport_host_v1_t* test_host() { return &g_host; }

size_t count_logged(const std::string& needle) {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t n = 0;
  for (const std::string& l : g_log)
    if (l.find(needle) != std::string::npos) ++n;
  return n;
}

bool logged(const std::string& needle) { return count_logged(needle) > 0; }

void clear_log() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_log.clear();
}

SharedBuffer::SharedBuffer(size_t bytes) : size_(bytes) {
  fd_ = memfd_create("meshccl-test", MFD_CLOEXEC);
  if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes)) != 0) std::abort();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) std::abort();
  data_ = static_cast<unsigned char*>(p);
  std::lock_guard<std::mutex> lock(g_mu);
  g_shared.push_back({data_, size_, fd_});
}

SharedBuffer::~SharedBuffer() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (size_t i = 0; i < g_shared.size(); ++i)
      if (g_shared[i].base == data_) g_shared.erase(g_shared.begin() + static_cast<long>(i));
  }
  munmap(data_, size_);
  close(fd_);
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) {
    had_ = true;
    old_ = old;
  }
  if (value != nullptr) setenv(name, value, 1);
  else unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
  if (had_) setenv(name_.c_str(), old_.c_str(), 1);
  else unsetenv(name_.c_str());
}

int wait_request(const meshccl_transport_v1_t* t, void* req, size_t* size, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (unsigned spins = 0;; ++spins) {
    int done = 0;
    size_t n = 0;
    int rc = t->test(req, &done, &n);
    if (rc != MESHCCL_T_SUCCESS) return rc;
    if (done) {
      if (size != nullptr) *size = n;
      return rc;
    }
    if ((spins & 255) == 255) {
      if (now_s() > deadline) return -1;
      std::this_thread::yield();  // oversubscribed machine: let the peer run
    }
  }
}

bool wait_all(const meshccl_transport_v1_t* t, std::vector<void*> reqs, std::vector<int>* results,
              std::vector<size_t>* sizes, double timeout_s) {
  results->assign(reqs.size(), -1);
  if (sizes != nullptr) sizes->assign(reqs.size(), 0);
  size_t left = reqs.size();
  double deadline = now_s() + timeout_s;
  for (unsigned spins = 0; left > 0; ++spins) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      int done = 0;
      size_t n = 0;
      int rc = t->test(reqs[i], &done, &n);
      if (rc != MESHCCL_T_SUCCESS || done) {
        (*results)[i] = rc;
        if (sizes != nullptr) (*sizes)[i] = n;
        reqs[i] = nullptr;
        --left;
      }
    }
    if ((spins & 63) == 63) {
      if (now_s() > deadline) return false;
      std::this_thread::yield();
    }
  }
  return true;
}

int accept_loop(const meshccl_transport_v1_t* t, void* lcomm, void** rcomm) {
  double deadline = now_s() + kTimeoutS;
  *rcomm = nullptr;
  while (*rcomm == nullptr) {
    int rc = t->accept(lcomm, rcomm);
    if (rc != MESHCCL_T_SUCCESS) return rc;
    if (*rcomm == nullptr) {
      if (now_s() > deadline) return -1;
      std::this_thread::yield();
    }
  }
  return MESHCCL_T_SUCCESS;
}

int connect_loop(const meshccl_transport_v1_t* t, void* ctx, const void* handle, void** scomm) {
  double deadline = now_s() + kTimeoutS;
  *scomm = nullptr;
  while (*scomm == nullptr) {
    int rc = t->connect(ctx, 0, handle, scomm);
    if (rc != MESHCCL_T_SUCCESS) return rc;
    if (*scomm == nullptr) {
      if (now_s() > deadline) return -1;
      std::this_thread::yield();
    }
  }
  return MESHCCL_T_SUCCESS;
}

int connect_pair(const meshccl_transport_v1_t* t, void* sctx, void* rctx, void** scomm, void** rcomm) {
  unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
  void* lcomm = nullptr;
  *scomm = *rcomm = nullptr;
  int rc = t->listen(rctx, 0, handle, &lcomm);
  if (rc != MESHCCL_T_SUCCESS) return rc;
  double deadline = now_s() + kTimeoutS;
  while (rc == MESHCCL_T_SUCCESS && (*scomm == nullptr || *rcomm == nullptr)) {
    if (*scomm == nullptr) rc = t->connect(sctx, 0, handle, scomm);
    if (rc == MESHCCL_T_SUCCESS && *rcomm == nullptr) rc = t->accept(lcomm, rcomm);
    if (now_s() > deadline) rc = -1;
  }
  t->close_listen(lcomm);
  return rc;
}

int accept_peer(const meshccl_transport_v1_t* t, void* ctx, int fd, void** rcomm) {
  unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
  void* lcomm = nullptr;
  *rcomm = nullptr;
  int rc = t->listen(ctx, 0, handle, &lcomm);
  if (rc != MESHCCL_T_SUCCESS) return rc;
  rc = write_all(fd, handle, sizeof(handle)) ? accept_loop(t, lcomm, rcomm) : -1;
  t->close_listen(lcomm);
  return rc;
}

int connect_peer(const meshccl_transport_v1_t* t, void* ctx, int fd, void** scomm) {
  unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
  *scomm = nullptr;
  if (!read_all(fd, handle, sizeof(handle))) return -1;
  return connect_loop(t, ctx, handle, scomm);
}

void fill(void* buf, size_t n, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(buf);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(seed + i);
}

size_t check(const void* buf, size_t n, uint64_t seed) {
  auto* p = static_cast<const unsigned char*>(buf);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (std::memcmp(p + i, &x, 8) != 0) {
      for (size_t j = 0; j < 8; ++j)
        if (p[i + j] != reinterpret_cast<const unsigned char*>(&x)[j]) return i + j;
    }
  }
  for (; i < n; ++i)
    if (p[i] != static_cast<unsigned char>(seed + i)) return i;
  return SIZE_MAX;
}

size_t count_fds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

size_t count_maps() {
  // File mappings only (shared segments, peers' regions): anonymous ones come
  // and go with the allocator, a sanitizer's above all.
  std::ifstream f("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(f, line);)
    if (line.find('/') != std::string::npos || line.find("memfd:") != std::string::npos) ++n;
  return n;
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

std::set<std::string> dev_shm_added(const std::set<std::string>& before) {
  std::set<std::string> out;
  for (const std::string& name : dev_shm_entries())
    if (before.count(name) == 0) out.insert(name);
  return out;
}

Child spawn(const std::function<int(int fd)>& body) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    close(sv[0]);
    int rc = 1;
    try {
      rc = body(sv[1]);
    } catch (...) { rc = 2; }
    std::fflush(nullptr);
    _exit(rc);
  }
  close(sv[1]);
  return Child{pid, sv[0]};
}

// libfabric's shm provider names its region /dev/shm/<pid>:<n>:<n> and
// unlinks it when the endpoint closes; a child killed by a signal cannot,
// so the test that killed it removes what it left.
void remove_shm_regions(pid_t pid, const std::set<std::string>& keep) {
  const std::string prefix = std::to_string(pid) + ":";
  for (const std::string& name : dev_shm_entries())
    if (name.compare(0, prefix.size(), prefix) == 0 && keep.count(name) == 0) unlink(("/dev/shm/" + name).c_str());
}

int reap(Child& c, double timeout_s) {
  if (c.pid <= 0) return -1;
  double deadline = now_s() + timeout_s;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) break;
    if (r < 0 || now_s() > deadline) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      close(c.fd);
      c.pid = -1;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  close(c.fd);
  const pid_t pid = c.pid;
  c.pid = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  remove_shm_regions(pid);
  return 128 + WTERMSIG(status);
}

bool write_all(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* buf, size_t n, double timeout_s) {
  auto* p = static_cast<char*>(buf);
  double deadline = now_s() + timeout_s;
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int left_ms = static_cast<int>((deadline - now_s()) * 1000);
    if (left_ms <= 0 || poll(&pf, 1, left_ms) <= 0) return false;
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

const meshccl_transport_v1_t* load_transport(const std::string& name, std::string* why) {
  if (name == "shm") return &meshccl_transport_shm;
  if (name == "socket") return &meshccl_transport_socket;
  const char* dir = std::getenv("MESHCCL_TEST_PLUGIN_DIR");
  std::string path = std::string(dir != nullptr ? dir : ".") + "/libmeshccl-transport-" + name + ".so";
  if (access(path.c_str(), F_OK) != 0) {
    *why = path + " is not built (its library was not found at configure time)";
    return nullptr;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process
  if (h == nullptr) {
    *why = std::string("cannot load ") + path + ": " + dlerror();
    return nullptr;
  }
  auto* t = static_cast<const meshccl_transport_v1_t*>(dlsym(h, "meshccl_transport_v1"));
  if (t == nullptr) *why = path + " exports no meshccl_transport_v1";
  return t;
}

meshccl_transport_v1_probe_t load_probe(const std::string& name) {
  if (name == "shm") return meshccl_transport_shm_probe;
  if (name == "socket") return meshccl_transport_socket_probe;
  const char* dir = std::getenv("MESHCCL_TEST_PLUGIN_DIR");
  std::string path = std::string(dir != nullptr ? dir : ".") + "/libmeshccl-transport-" + name + ".so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) return nullptr;
  auto* probe = reinterpret_cast<meshccl_transport_v1_probe_t>(dlsym(h, "meshccl_transport_v1_probe"));
  dlclose(h);  // drops only the NOLOAD reference
  return probe;
}

meshccl_transport_v1_wait_fd_t load_wait_fd(const std::string& name) {
  if (name == "shm") return nullptr;
  if (name == "socket") return meshccl_transport_socket_wait_fd;
  const char* dir = std::getenv("MESHCCL_TEST_PLUGIN_DIR");
  std::string path = std::string(dir != nullptr ? dir : ".") + "/libmeshccl-transport-" + name + ".so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h == nullptr) return nullptr;
  auto* f = reinterpret_cast<meshccl_transport_v1_wait_fd_t>(dlsym(h, "meshccl_transport_v1_wait_fd"));
  dlclose(h);  // drops only the NOLOAD reference
  return f;
}

}  // namespace meshccl::test
