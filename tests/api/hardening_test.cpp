// Hostile and careless callers: each case here once crashed, read freed
// memory, let a stranger join, or reported the wrong thing (docs/security.md).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/harness.h"

using meshccl_test::run_ranks;
using meshccl_test::ScopedEnv;

namespace {

// One communicator of one rank, made without a rendezvous thread left behind.
struct Solo {
  ncclComm_t comm = nullptr;
  Solo() {
    ncclComm_t c[1];
    EXPECT_EQ(ncclCommInitAll(c, 1, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    comm = c[0];
  }
  ~Solo() {
    if (comm != nullptr) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
};

// What the library writes on stderr while body runs.
template <typename F>
std::string capture_stderr(F body) {
  char path[] = "/tmp/meshccl-stderr-XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  std::fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  unlink(path);
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

TEST(NullPointers, InitRejectsNullCommAndClearsItOnError) {
  ncclUniqueId id{};
  EXPECT_EQ(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankConfig(nullptr, 1, id, 0, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankScalable(nullptr, 1, 0, 1, &id, nullptr), ncclInvalidArgument);
  auto junk = reinterpret_cast<ncclComm_t>(uintptr_t{0x1});
  ncclComm_t comm = junk;
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  comm = junk;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclInvalidArgument);  // not an id
  EXPECT_EQ(comm, nullptr);
  comm = junk;
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 1, 0, 0, &id, nullptr), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
}

// The group must not touch a communicator destroyed while it held
// operations on it (heap-use-after-free under ASan before).
TEST(Groups, DestroyOrAbortWithOperationsPendingInTheGroup) {
  for (bool abort : {false, true}) {
    ncclComm_t c[1];
    ASSERT_EQ(ncclCommInitAll(c, 1, nullptr), ncclSuccess);
    int x = 1, y = 0;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, c[0], nullptr), ncclSuccess);
    ASSERT_EQ(abort ? ncclCommAbort(c[0]) : ncclCommDestroy(c[0]), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("destroyed"), std::string::npos) << ncclGetLastError(nullptr);
    EXPECT_EQ(y, 0);
  }
}

// Another thread destroys (or aborts) a communicator while this thread's
// open group holds operations on it: ncclGroupEnd must not touch the freed
// communicator (heap-use-after-free under ASan before). The group fails and
// says why; the other communicator's work is not run either (a failed group
// runs nothing).
TEST(Groups, DestroyOrAbortFromAnotherThreadWhileTheGroupHoldsOperations) {
  for (bool abort : {false, true}) {
    ncclComm_t gone[1], kept[1];
    ASSERT_EQ(ncclCommInitAll(gone, 1, nullptr), ncclSuccess);
    ASSERT_EQ(ncclCommInitAll(kept, 1, nullptr), ncclSuccess);
    int x = 1, y = 0, z = 0;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, gone[0], nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(&x, &z, 1, ncclInt, ncclSum, kept[0], nullptr), ncclSuccess);
    ncclResult_t destroyed = ncclInternalError;
    std::thread other([&] { destroyed = abort ? ncclCommAbort(gone[0]) : ncclCommDestroy(gone[0]); });
    other.join();
    ASSERT_EQ(destroyed, ncclSuccess);
    // A new communicator may reuse the freed one's address: the group must
    // still know its work was for the old one.
    ncclComm_t reuse[1];
    ASSERT_EQ(ncclCommInitAll(reuse, 1, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("destroyed (by another thread)"), std::string::npos)
        << ncclGetLastError(nullptr);
    EXPECT_EQ(y, 0);
    EXPECT_EQ(z, 0);
    // Both remaining communicators still work.
    EXPECT_EQ(ncclAllReduce(&x, &z, 1, ncclInt, ncclSum, kept[0], nullptr), ncclSuccess);
    EXPECT_EQ(z, 1);
    EXPECT_EQ(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, reuse[0], nullptr), ncclSuccess);
    EXPECT_EQ(y, 1);
    EXPECT_EQ(ncclCommDestroy(kept[0]), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(reuse[0]), ncclSuccess);
  }
}

// Same with ncclGroupSimulateEnd, which asks each communicator's tuner.
TEST(Groups, SimulateEndAfterAnotherThreadDestroyedTheCommunicator) {
  ncclComm_t c[1];
  ASSERT_EQ(ncclCommInitAll(c, 1, nullptr), ncclSuccess);
  int x = 1, y = 0;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, c[0], nullptr), ncclSuccess);
  std::thread([&] { EXPECT_EQ(ncclCommDestroy(c[0]), ncclSuccess); }).join();
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclInvalidUsage);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);  // the group state was reset: a new group works
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
}

TEST(Registration, GarbageAndRepeatedHandlesAreRefused) {
  Solo s;
  std::vector<char> buf(4096);
  void* handle = nullptr;
  ASSERT_EQ(ncclCommRegister(s.comm, buf.data(), buf.size(), &handle), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(s.comm, reinterpret_cast<void*>(uintptr_t{0x1234})), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDeregister(s.comm, buf.data()), ncclInvalidArgument);  // readable, but no handle
  EXPECT_EQ(ncclCommDeregister(s.comm, handle), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(s.comm, handle), ncclInvalidArgument);  // freed: looked up, not read
  EXPECT_EQ(ncclCommWindowDeregister(s.comm, reinterpret_cast<ncclWindow_t>(uintptr_t{0x5678})), ncclInvalidArgument);
}

TEST(Arguments, ByteSizesBeyondTheAddressSpaceAreRefused) {
  Solo s;
  char b[8] = {};
  EXPECT_EQ(ncclAllReduce(b, b, SIZE_MAX, ncclInt8, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(b, b, size_t{1} << 62, ncclInt8, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(b, b, size_t{1} << 61, ncclFloat64, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(b, b, SIZE_MAX / 2, ncclInt8, 0, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(b, SIZE_MAX, ncclInt8, 0, s.comm, nullptr), ncclInvalidArgument);
  // A range that wraps around the end of the address space.
  void* high = reinterpret_cast<void*>(UINTPTR_MAX - 16);
  EXPECT_EQ(ncclAllReduce(high, high, 64, ncclInt8, ncclSum, s.comm, nullptr), ncclInvalidArgument);
}

// Out-of-range enum values are read as integers and refused (UBSan's enum
// check flagged the old loads).
TEST(Arguments, OutOfRangeEnumsAreRefused) {
  Solo s;
  int x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(1000), ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(-3), ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt, static_cast<ncclRedOp_t>(-7), s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRedOpDestroy(static_cast<ncclRedOp_t>(-7), s.comm), ncclInvalidArgument);
  ncclRedOp_t op;
  float f = 1;
  EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &f, static_cast<ncclDataType_t>(99), ncclScalarHostImmediate, s.comm),
            ncclInvalidArgument);
  EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &f, ncclFloat, static_cast<ncclScalarResidence_t>(77), s.comm),
            ncclInvalidArgument);
}

// NCCL's rule: a call that fails inside a group fails the group, and none of
// its operations run (the receive buffers stay untouched).
TEST(Groups, GroupEndReturnsTheFirstError) {
  run_ranks(2, [](ncclComm_t comm, int rank) {
    int a = rank + 1, b = 0, c = 0;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(&a, &b, 1, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(&a, &c, 1, static_cast<ncclDataType_t>(77), ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(&a, &c, 1, ncclInt, 5, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("invalid type 77"), std::string::npos)
        << ncclGetLastError(nullptr);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(ncclAllReduce(&a, &b, 1, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(b, 3);
  });
}

TEST(Arguments, CheckPointersRefusesMemoryThatIsNotThere) {
  ScopedEnv env({{"MESHCCL_CHECK_POINTERS", "1"}});
  Solo s;
  const long page = sysconf(_SC_PAGESIZE);
  void* none = mmap(nullptr, 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* ro = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  ASSERT_NE(ro, MAP_FAILED);
  munmap(static_cast<char*>(none) + page, page);  // a hole after a PROT_NONE page
  std::vector<int> ok(16, 1), out(16, 0);
  auto bogus = reinterpret_cast<void*>(uintptr_t{0x10});
  EXPECT_EQ(ncclAllReduce(bogus, out.data(), 16, ncclInt, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(s.comm)).find("MESHCCL_CHECK_POINTERS"), std::string::npos);
  EXPECT_EQ(ncclAllReduce(ok.data(), bogus, 16, ncclInt, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(none, out.data(), 16, ncclInt, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(ok.data(), ro, 16, ncclInt, ncclSum, s.comm, nullptr), ncclInvalidArgument);
  // The last valid byte of a buffer followed by a hole.
  EXPECT_EQ(ncclAllReduce(ok.data(), static_cast<char*>(none) + page - 8, 4, ncclInt, ncclSum, s.comm, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(ro, out.data(), 16, ncclInt, ncclSum, s.comm, nullptr), ncclSuccess);  // read-only source
  EXPECT_EQ(ncclAllReduce(ok.data(), out.data(), 16, ncclInt, ncclSum, s.comm, nullptr), ncclSuccess);
  EXPECT_EQ(out, ok);
  munmap(none, page);
  munmap(ro, page);
}

// A refused value fails every call that makes an id or a communicator, and is
// printed on stderr once per value; a misspelt name is reported once.
TEST(Settings, MalformedAndUnknownSettingsWarnOnceOnStderr) {
  ncclUniqueId id;
  std::string err = capture_stderr([&] {
    for (int i = 0; i < 2; ++i) {
      {
        ScopedEnv env({{"MESHCCL_TIMEOUT", "0"}});
        ASSERT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
      }
      {
        ScopedEnv env({{"MESHCCL_TIMEOUT", "-5"}});
        ASSERT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
      }
      {
        ScopedEnv env({{"MESHCCL_TIMEOUT", "ten"}, {"MESHCCL_TIMEOUTT", "5"}});
        ASSERT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
      }
      {
        ScopedEnv env({{"MESHCCL_TIMEOUTT", "5"}});
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
      }
      {
        // The perf tools' own variables are not settings, and no typo.
        ScopedEnv env({{"MESHCCL_PERF_NETDEV", "eth0"}});
        ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
      }
    }
  });
  EXPECT_EQ(count_of(err, "MESHCCL_TIMEOUT=\"0\" is outside 1..31536000"), 1u) << err;
  EXPECT_EQ(count_of(err, "MESHCCL_TIMEOUT=\"-5\" is outside 1..31536000"), 1u) << err;
  EXPECT_EQ(count_of(err, "MESHCCL_TIMEOUT=\"ten\" is not an integer"), 1u) << err;
  EXPECT_EQ(count_of(err, "MESHCCL_TIMEOUTT is not a meshccl setting"), 1u) << err;
  EXPECT_EQ(count_of(err, "MESHCCL_PERF_NETDEV"), 0u) << err;
}

TEST(Errors, LastErrorBelongsToItsCommunicatorAndThread) {
  ncclComm_t c[2];
  ASSERT_EQ(ncclCommInitAll(c, 2, nullptr), ncclSuccess);
  int x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(55), ncclSum, c[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(&x, &x, 1, ncclInt, 9, c[1], nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c[0])).find("invalid type 55"), std::string::npos) << ncclGetLastError(c[0]);
  EXPECT_NE(std::string(ncclGetLastError(c[1])).find("invalid root 9"), std::string::npos) << ncclGetLastError(c[1]);
  // Another thread's error is not this thread's.
  std::thread([] { EXPECT_EQ(ncclCommCount(nullptr, nullptr), ncclInvalidArgument); }).join();
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("invalid root 9"), std::string::npos)
      << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (ncclComm_t comm : c) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
}

// The text ncclGetLastError returns stays readable after the next call, as
// NCCL's does: it was a string the next call reallocated, so a pointer kept
// from before read freed memory (valgrind: invalid read).
TEST(Errors, LastErrorTextOutlivesTheNextCall) {
  EXPECT_EQ(ncclCommCount(nullptr, nullptr), ncclInvalidArgument);
  const char* first = ncclGetLastError(nullptr);
  const size_t first_len = std::strlen(first);
  ncclUniqueId junk{};
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, junk, 0), ncclInvalidArgument);  // a longer message
  const char* second = ncclGetLastError(nullptr);
  ASSERT_GT(std::strlen(second), first_len) << second;
  EXPECT_EQ(first, second) << "the text moved: the pointer returned first now points at freed memory";
  EXPECT_STREQ(first, second);
  Solo solo;
  EXPECT_EQ(ncclGetLastError(solo.comm), first) << "one buffer per thread, whichever communicator is asked";
}

// Each ncclUniqueId serves one communicator: using it again says so at once
// instead of waiting for MESHCCL_TIMEOUT.
TEST(Bootstrap, ReusedIdIsReportedAsSuch) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("used already"), std::string::npos)
      << ncclGetLastError(nullptr);
}

// Two jobs with the same MESHCCL_COMM_ID but different secrets: the second
// job's rank is refused with a reason (it used to join the first job's
// communicator); the first job completes.
TEST(Bootstrap, FixedAddressNeedsTheJobsSecret) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  ncclUniqueId job_a, job_b;
  {
    ScopedEnv env({{"MESHCCL_COMM_ID", addr}, {"MESHCCL_COMM_SECRET", "job-a-5f1c0e7d9b2a4c3e"}});
    ASSERT_EQ(ncclGetUniqueId(&job_a), ncclSuccess);
  }
  {
    ScopedEnv env({{"MESHCCL_COMM_ID", addr}, {"MESHCCL_COMM_SECRET", "job-b-0a9e8d7c6b5a4f3e"}});
    ASSERT_EQ(ncclGetUniqueId(&job_b), ncclSuccess);
  }
  ncclComm_t a0 = nullptr, a1 = nullptr, b1 = nullptr;
  ncclResult_t ra0 = ncclInternalError, ra1 = ncclInternalError;
  std::thread t0([&] { ra0 = ncclCommInitRank(&a0, 2, job_a, 0); });
  ncclResult_t rb1 = ncclCommInitRank(&b1, 2, job_b, 1);
  std::string why = ncclGetLastError(nullptr);
  std::thread t1([&] { ra1 = ncclCommInitRank(&a1, 2, job_a, 1); });
  t0.join();
  t1.join();
  EXPECT_EQ(rb1, ncclInvalidUsage);
  EXPECT_EQ(b1, nullptr);
  EXPECT_NE(why.find("wrong secret"), std::string::npos) << why;
  ASSERT_EQ(ra0, ncclSuccess);
  ASSERT_EQ(ra1, ncclSuccess);
  int v0 = 1, v1 = 2;
  std::thread u([&] { EXPECT_EQ(ncclAllReduce(&v1, &v1, 1, ncclInt, ncclSum, a1, nullptr), ncclSuccess); });
  EXPECT_EQ(ncclAllReduce(&v0, &v0, 1, ncclInt, ncclSum, a0, nullptr), ncclSuccess);
  u.join();
  EXPECT_EQ(v0, 3);
  EXPECT_EQ(v1, 3);
  EXPECT_EQ(ncclCommDestroy(a0), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(a1), ncclSuccess);
}

// At the descriptor limit ncclGetUniqueId says so, not "no usable network
// interface".
TEST(Errors, DescriptorExhaustionIsNamed) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 1024);  // a quick fill
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> held;
  for (int fd; (fd = dup(0)) >= 0 && held.size() < 4096;) held.push_back(fd);
  const int err = errno;
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  std::string why = ncclGetLastError(nullptr);
  for (int fd : held) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_EQ(err, EMFILE);
  EXPECT_EQ(r, ncclSystemError);
  EXPECT_NE(why.find("out of file descriptors"), std::string::npos) << why;
}

// Transport libraries are not loaded from where other users can write.
TEST(Settings, PluginsInWorldWritableDirectoriesAreRefused) {
  char dir[] = "/tmp/meshccl-plugins-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(chmod(dir, 0777), 0);
  const std::string lib = std::string(dir) + "/libmeshccl-transport-planted.so";
  FILE* f = std::fopen(lib.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not a library", f);
  std::fclose(f);
  {
    ScopedEnv env({{"MESHCCL_PLUGIN_PATH", dir}, {"MESHCCL_TRANSPORT", "planted"}});
    ncclComm_t c[2] = {};
    EXPECT_NE(ncclCommInitAll(c, 2, nullptr), ncclSuccess);
    std::string why = ncclGetLastError(nullptr);
    EXPECT_NE(why.find("refused: its directory is writable by other users"), std::string::npos) << why;
  }
  unlink(lib.c_str());
  rmdir(dir);
}

}  // namespace
