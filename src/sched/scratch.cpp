#include "sched/scratch.h"

namespace meshccl {

std::vector<unsigned char>* ScratchPool::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // Best fit among kept buffers; grow the smallest one otherwise.
  std::vector<unsigned char>* best = nullptr;
  size_t best_i = 0;
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->size() >= bytes && (best == nullptr || free_[i]->size() < best->size())) {
      best = free_[i];
      best_i = i;
    }
  }
  if (best == nullptr && !free_.empty()) {
    best_i = 0;
    best = free_[0];
    best->resize(bytes);
  }
  if (best == nullptr) return new std::vector<unsigned char>(bytes);
  free_.erase(free_.begin() + static_cast<long>(best_i));
  return best;
}

void ScratchPool::release(std::vector<unsigned char>* buf) {
  if (buf == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(buf);
}

ScratchPool::~ScratchPool() {
  for (auto* b : free_) delete b;
}

}  // namespace meshccl
