// A minimal transport host for plugin tests, and helpers to drive a
// transport by hand: connect a pair, wait on requests with a deadline, run a
// peer in a forked child, count descriptors and mappings.
#ifndef MESHCCL_TESTS_PLUGINS_TEST_HOST_H_
#define MESHCCL_TESTS_PLUGINS_TEST_HOST_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "meshccl/transport.h"

namespace meshccl::test {

// Logger printing to stderr (WARN always, INFO/TRACE when
// MESHCCL_TEST_VERBOSE is set) and remembering every line; get_param reads
// the environment; find_shared describes SharedBuffers.
const meshccl_transport_host_v1_t* test_host();
bool logged(const std::string& needle);  // some line of this process contains needle
size_t count_logged(const std::string& needle);
void clear_log();

// Memory in a memfd that test_host()'s find_shared reports as mappable.
class SharedBuffer {
 public:
  explicit SharedBuffer(size_t bytes);
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

constexpr double kTimeoutS = 30.0;

// A built-in transport by name, or a loadable one from
// $MESHCCL_TEST_PLUGIN_DIR/libmeshccl-transport-<name>.so. NULL with *why
// set when it is not there (not built) or does not load.
const meshccl_transport_v1_t* load_transport(const std::string& name, std::string* why);
// The optional probe (transport.h) of a transport load_transport found, or NULL.
meshccl_transport_v1_probe_t load_probe(const std::string& name);
// The transport's optional wait descriptor (transport.h), or nullptr.
meshccl_transport_v1_wait_fd_t load_wait_fd(const std::string& name);

// Polls test() until done or the deadline. Returns the request's result, or
// -1 when it did not finish in time.
int wait_request(const meshccl_transport_v1_t* t, void* req, size_t* size = nullptr, double timeout_s = kTimeoutS);

// Polls several requests round-robin (as a host does) until all finished.
// results[i] receives each result; false on timeout.
bool wait_all(const meshccl_transport_v1_t* t, std::vector<void*> reqs, std::vector<int>* results,
              std::vector<size_t>* sizes = nullptr, double timeout_s = kTimeoutS);

// listen on rctx, connect from sctx (may be the same context), accept.
// Returns MESHCCL_T_SUCCESS or the first error; -1 on timeout.
int connect_pair(const meshccl_transport_v1_t* t, void* sctx, void* rctx, void** scomm, void** rcomm);
// The two halves, for peers in different processes.
int accept_loop(const meshccl_transport_v1_t* t, void* lcomm, void** rcomm);
int connect_loop(const meshccl_transport_v1_t* t, void* ctx, const void* handle, void** scomm);

// The same with the handle carried over fd to or from a peer process: the
// receiving end listens, writes the handle and accepts; the sending end reads
// the handle and connects.
int accept_peer(const meshccl_transport_v1_t* t, void* ctx, int fd, void** rcomm);
int connect_peer(const meshccl_transport_v1_t* t, void* ctx, int fd, void** scomm);

// Deterministic content: fill with a pattern derived from seed; check returns
// the index of the first wrong byte, or SIZE_MAX when all match.
void fill(void* buf, size_t n, uint64_t seed);
size_t check(const void* buf, size_t n, uint64_t seed);

size_t count_fds();
size_t count_maps();
std::set<std::string> dev_shm_entries();
// Entries of /dev/shm now that `before` did not have. (Other processes on
// the machine may remove theirs meanwhile: a test compares what appeared.)
std::set<std::string> dev_shm_added(const std::set<std::string>& before);

// A forked peer with a bidirectional byte pipe to the parent. The child runs
// body(pipe) and exits with its return value (0 = success), so a failing
// child never returns into the test framework.
struct Child {
  pid_t pid = -1;
  int fd = -1;  // parent's end of the pipe
};
Child spawn(const std::function<int(int fd)>& body);
// Exit status of the child (128+signal when killed), -1 when it did not exit
// within the timeout (it is then killed).
int reap(Child& c, double timeout_s = kTimeoutS);
// Removes the libfabric shm provider's region files of process `pid`
// (/dev/shm/<pid>:...) but those named in `keep`: what a process killed by a
// signal left (reap calls it), or a region libfabric keeps with a context
// the plugin could not close.
void remove_shm_regions(pid_t pid, const std::set<std::string>& keep = {});
bool write_all(int fd, const void* buf, size_t n);
bool read_all(int fd, void* buf, size_t n, double timeout_s = kTimeoutS);

// In a child: print a message and give a non-zero code when cond fails.
#define CHILD_CHECK(cond)                                                                                    \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      std::fprintf(stderr, "child %d: %s:%d: check failed: %s\n", (int)getpid(), __FILE__, __LINE__, #cond); \
      return 1;                                                                                              \
    }                                                                                                        \
  } while (0)

}  // namespace meshccl::test

#endif  // MESHCCL_TESTS_PLUGINS_TEST_HOST_H_
