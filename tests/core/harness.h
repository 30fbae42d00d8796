// Runs N ranks as threads of this process over the real transports.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "meshccl.h"

namespace meshccl_test {

// body(comm, rank) runs on its own thread per rank with an initialised
// communicator; the communicator is destroyed afterwards.
inline void run_ranks(int n, const std::function<void(ncclComm_t, int)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      ncclResult_t res = ncclCommInitRank(&comm, n, id, r);
      EXPECT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
      if (res != ncclSuccess) return;
      body(comm, r);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace meshccl_test
