// Settings that act process-wide are applied from the registry when a
// communicator is created: MESHCCL_KERNEL_ISA chooses the reduction kernels
// (the kernels themselves read no settings).
#include <gtest/gtest.h>

#include <cstdlib>

#include "kernels/reduce.h"
#include "nccl.h"

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
