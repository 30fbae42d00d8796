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

namespace {

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
  // An unknown name keeps the current choice (with a warning).
  ASSERT_TRUE(meshccl::kernels::select_isa("portable"));
  setenv("MESHCCL_KERNEL_ISA", "sse9", 1);
  make_comm();
  EXPECT_STREQ(meshccl::kernels::isa_name(), "portable");
  unsetenv("MESHCCL_KERNEL_ISA");
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
