#include <numeric>

#include "tests/common/harness.h"

using meshccl_test::run_ranks;

TEST(Smoke, AllReduceFloat) {
  for (int n : {1, 2, 3}) {
    run_ranks(n, [n](ncclComm_t comm, int rank) {
      std::vector<float> buf(1000);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(rank + i);
      ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr), ncclSuccess)
          << ncclGetLastError(nullptr);
      for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], float(n * i + n * (n - 1) / 2)) << i;
    });
  }
}
