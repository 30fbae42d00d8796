// Runs N ranks as threads of this process over the real transports.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshccl.h"

namespace meshccl_test {

// Sets environment variables for one scope and restores them after. Settings
// are read when a communicator is created, so set them before run_ranks.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::string>> vars) {
    for (const auto& [key, value] : vars) {
      const char* old = std::getenv(key);
      saved_.push_back({key, old != nullptr ? std::string(old) : std::string(), old != nullptr});
      setenv(key, value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const Saved& s : saved_) s.had ? (void)setenv(s.key, s.value.c_str(), 1) : (void)unsetenv(s.key);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  struct Saved {
    const char* key;
    std::string value;
    bool had;
  };
  std::vector<Saved> saved_;
};

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
