// Settings that act process-wide are applied from the registry when a
// communicator is created: MESHCCL_KERNEL_ISA chooses the reduction kernels
// (the kernels themselves read no settings).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/reduce.h"
#include "nccl.h"
#include "util/file_check.h"
#include "util/log.h"
#include "util/param.h"

namespace {

std::string slurp_file(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void make_comm() {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Settings, KernelIsaAppliesAtCommunicatorCreation) {
  for (const char* isa : {"portable", "avx2", "avx512"}) {
    if (!meshccl::kernels::isa_supported(isa)) continue;
    setenv("MESHCCL_KERNEL_ISA", isa, 1);
    make_comm();
    EXPECT_STREQ(meshccl::kernels::isa_name(), isa);
  }
  setenv("MESHCCL_KERNEL_ISA", "auto", 1);
  make_comm();
  const char* best = meshccl::kernels::isa_supported("avx512") ? "avx512"
                     : meshccl::kernels::isa_supported("avx2") ? "avx2"
                                                               : "portable";
  EXPECT_STREQ(meshccl::kernels::isa_name(), best);
  // An unknown name is refused: the communicator is not made, the choice stays.
  ASSERT_TRUE(meshccl::kernels::select_isa("portable"));
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  setenv("MESHCCL_KERNEL_ISA", "sse9", 1);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument);
  EXPECT_STREQ(meshccl::kernels::isa_name(), "portable");
  unsetenv("MESHCCL_KERNEL_ISA");
}

// Every setting is checked where communicators and ids are made: a value its
// check refuses fails the call with ncclInvalidArgument, and the message names
// the variable the user set (the NCCL_ alias when that was the one).
struct Refused {
  const char* var;
  const char* value;
};

TEST(Settings, RefusedValuesFailCreationNamingTheVariableSet) {
  const Refused cases[] = {
      {"NCCL_DEBUG", "foo"},
      {"MESHCCL_DEBUG_SUBSYS", "XYZ"},
      {"MESHCCL_KERNEL_ISA", "sse9"},
      {"MESHCCL_SOCKET_FAMILY", "AF_UNIX"},
      {"MESHCCL_SPARSE_ALGO", "sparse"},
      {"MESHCCL_CHUNKSIZE", "-1"},
      {"MESHCCL_CHUNKSIZE", "-9223372036854775808"},
      {"MESHCCL_CHUNKSIZE", "64"},
      {"MESHCCL_DIRECT_SLOT_BYTES", "9223372036854775807"},
      {"MESHCCL_DIRECT_SLOT_BYTES", "-5"},
      {"MESHCCL_COMM_BLOCKING", "abc"},
      {"NCCL_COMM_BLOCKING", "2"},
      {"MESHCCL_SHM_BUFFSIZE", "abc"},
      {"NCCL_BUFFSIZE", "1"},
      {"MESHCCL_SHM_EAGER", "lots"},
      {"MESHCCL_SHM_CMA", "yes"},
      {"MESHCCL_OFI_MAX_MSG", "1"},
      {"MESHCCL_TIMEOUT", "abc"},
      {"MESHCCL_TIMEOUT", "0"},
      {"MESHCCL_TUNE_NET_BW_GBS", "fast"},
      {"NCCL_ALGO", "bogus"},
      {"NCCL_ALGO", "allreduce:^ring,tree,halving_doubling,recursive_doubling,hier,direct_shm"},
  };
  for (const Refused& c : cases) {
    SCOPED_TRACE(std::string(c.var) + "=" + c.value);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    setenv(c.var, c.value, 1);
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument) << ncclGetLastError(nullptr);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find(c.var), std::string::npos) << ncclGetLastError(nullptr);
    ncclUniqueId id2;
    EXPECT_NE(ncclGetUniqueId(&id2), ncclSuccess);
    unsetenv(c.var);
    make_comm();  // the next communicator is made once the value is gone
  }
}

TEST(Settings, SizesTakeSuffixesAndRangesHold) {
  setenv("MESHCCL_CHUNKSIZE", "64K", 1);
  meshccl::param_refresh();
  EXPECT_TRUE(meshccl::param_check().ok());
  EXPECT_EQ(meshccl::param_int(meshccl::Param::ChunkSize), 65536);
  setenv("MESHCCL_CHUNKSIZE", "1", 1);
  meshccl::param_refresh();
  EXPECT_FALSE(meshccl::param_check().ok());
  EXPECT_EQ(meshccl::param_int(meshccl::Param::ChunkSize), 524288);  // readers get the default meanwhile
  EXPECT_EQ(meshccl::param_str(meshccl::Param::ChunkSize), "524288");
  EXPECT_EQ(meshccl::param_raw(meshccl::Param::ChunkSize), "1");
  EXPECT_EQ(meshccl::param_env(meshccl::Param::ChunkSize), nullptr);
  unsetenv("MESHCCL_CHUNKSIZE");
  setenv("NCCL_DEBUG_SUBSYS", "^init,coll", 1);
  meshccl::param_refresh();
  EXPECT_TRUE(meshccl::param_check().ok());
  EXPECT_STREQ(meshccl::param_set_name(meshccl::Param::DebugSubsys), "NCCL_DEBUG_SUBSYS");
  unsetenv("NCCL_DEBUG_SUBSYS");
  meshccl::param_refresh();
}

// NCCL_DEBUG_SUBSYS=ENV echoes every variable as NCCL does, under the name
// that was set, and says which NCCL settings have no effect here.
TEST(Settings, EnvSubsystemEchoesEverySettingUnderItsName) {
  char dir[] = "/tmp/meshccl-settings-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/log";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "ENV", 1);
  setenv("MESHCCL_DEBUG_FILE", log.c_str(), 1);
  setenv("NCCL_PROTO", "LL128", 1);
  setenv("NCCL_BUFFSIZE", "4194304", 1);
  setenv("MESHCCL_SPIN_COUNT", "40", 1);
  meshccl::param_refresh();
  meshccl::log_reset();
  make_comm();
  for (const char* v :
       {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "MESHCCL_DEBUG_FILE", "NCCL_PROTO", "NCCL_BUFFSIZE", "MESHCCL_SPIN_COUNT"})
    unsetenv(v);
  meshccl::param_refresh();
  meshccl::log_reset();
  const std::string text = slurp_file(log);
  EXPECT_NE(text.find("NCCL_DEBUG set by environment to INFO"), std::string::npos) << text;
  EXPECT_NE(text.find("NCCL_BUFFSIZE set by environment to 4194304"), std::string::npos) << text;
  EXPECT_NE(text.find("MESHCCL_SPIN_COUNT set by environment to 40"), std::string::npos) << text;
  EXPECT_NE(text.find("NCCL_PROTO set by environment to LL128: no effect in meshccl"), std::string::npos) << text;
  std::remove(log.c_str());
  rmdir(dir);
}

}  // namespace

// Files named by settings (MESHCCL_DEBUG_FILE, MESHCCL_TRACE, the topology
// dump's temporary file) are written only as the user's own regular files,
// never through a planted symbolic link (docs/security.md).
namespace {
std::string slurp(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST(FileCheck, OutputsRefuseLinksFifosAndOtherUsersFiles) {
  char dir[] = "/tmp/meshccl_out_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d(dir), victim = d + "/victim", link = d + "/trace.json", fifo = d + "/fifo";
  { std::ofstream(victim) << "precious"; }
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  std::string why;
  EXPECT_EQ(meshccl::open_private_output(link, &why), -1);
  EXPECT_EQ(why, "it is a symbolic link");
  EXPECT_EQ(slurp(victim), "precious");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(meshccl::open_private_output(fifo, &why), -1);  // no reader: refused, not blocked
  EXPECT_EQ(why, "not a regular file");
  if (geteuid() == 0) {
    ASSERT_EQ(chown(victim.c_str(), 65534, 65534), 0);
    EXPECT_EQ(meshccl::open_private_output(victim, &why), -1);
    EXPECT_EQ(why, "owned by another user");
    EXPECT_EQ(slurp(victim), "precious");  // refused before it was truncated
    ASSERT_EQ(chown(victim.c_str(), 0, 0), 0);
  }
  int fd = meshccl::open_private_output(victim, &why);  // the user's own file: truncated and written
  ASSERT_GE(fd, 0) << why;
  ASSERT_EQ(write(fd, "new", 3), 3);
  close(fd);
  EXPECT_EQ(slurp(victim), "new");
  fd = meshccl::open_private_output(d + "/fresh", &why);
  ASSERT_GE(fd, 0) << why;
  close(fd);
  for (const std::string& p : {victim, link, fifo, d + "/fresh"}) unlink(p.c_str());
  rmdir(dir);
}

TEST(FileCheck, TrustedInputsMustBeTheUsersOwnRegularFiles) {
  char dir[] = "/tmp/meshccl_in_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d(dir), file = d + "/in", fifo = d + "/fifo";
  { std::ofstream(file) << "x"; }
  std::string why;
  ASSERT_EQ(chmod(file.c_str(), 0664), 0);
  int fd = meshccl::open_trusted_input(file, &why);
  EXPECT_GE(fd, 0) << why;
  if (fd >= 0) close(fd);
  ASSERT_EQ(chmod(file.c_str(), 0646), 0);
  EXPECT_EQ(meshccl::open_trusted_input(file, &why), -1);
  EXPECT_EQ(why, "writable by other users");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(meshccl::open_trusted_input(fifo, &why), -1);
  EXPECT_EQ(why, "not a regular file");
  EXPECT_EQ(meshccl::open_trusted_input(d + "/missing", &why), -1);
  EXPECT_EQ(why, std::strerror(ENOENT));
  unlink(file.c_str());
  unlink(fifo.c_str());
  rmdir(dir);
}

// A link another user planted in a sticky directory (/tmp): the kernel
// refuses it with EACCES even under O_NOFOLLOW, which read "Permission
// denied"; the refusal now says what the name is.
TEST(FileCheck, AnotherUsersLinkInAStickyDirectoryIsNamedALink) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a link to another user needs root";
  char dir[] = "/tmp/meshccl_sticky_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(chmod(dir, 01777), 0);
  const std::string d(dir), link = d + "/debug.log", target = d + "/target";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_EQ(lchown(link.c_str(), 65534, 65534), 0);
  std::string why;
  EXPECT_EQ(meshccl::open_private_output(link, &why), -1);
  EXPECT_EQ(why, "it is a symbolic link");
  EXPECT_NE(access(target.c_str(), F_OK), 0);
  unlink(link.c_str());
  rmdir(dir);
}
