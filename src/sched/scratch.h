// Reusable scratch buffers of one communicator's plans.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace meshccl {

// Reusable scratch buffers: allocated once, kept for the communicator's life.
class ScratchPool {
 public:
  std::vector<unsigned char>* acquire(size_t bytes);
  void release(std::vector<unsigned char>* buf);
  ~ScratchPool();

 private:
  std::mutex mu_;
  std::vector<std::vector<unsigned char>*> free_;
};

}  // namespace meshccl
