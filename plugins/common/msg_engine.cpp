#include "plugins/common/msg_engine.h"

#include <cstdint>
#include <cstdlib>

namespace meshccl::plugin {

BufferPool::~BufferPool() {
  for (auto& list : free_)
    for (void* p : list) std::free(p);
  for (Buf& b : big_) std::free(b.ptr);
}

int BufferPool::class_of(size_t n) {
  int c = 0;
  size_t cap = kMinClass;
  while (cap < n) {
    cap <<= 1;
    ++c;
  }
  return c;
}

BufferPool::Buf BufferPool::get(size_t n) {
  if (n == 0) return {};
  if (n <= kMaxClassBytes) {
    int c = class_of(n);
    size_t cap = kMinClass << c;
    if (!free_[c].empty()) {
      void* p = free_[c].back();
      free_[c].pop_back();
      cached_ -= cap;
      return {p, cap};
    }
    return {std::malloc(cap), cap};
  }
  // Smallest kept buffer that fits without wasting more than half of it.
  size_t best = big_.size();
  for (size_t i = 0; i < big_.size(); ++i) {
    if (big_[i].cap >= n && big_[i].cap / 2 <= n && (best == big_.size() || big_[i].cap < big_[best].cap)) best = i;
  }
  if (best != big_.size()) {
    Buf b = big_[best];
    big_[best] = big_.back();
    big_.pop_back();
    cached_ -= b.cap;
    return b;
  }
  if (n > SIZE_MAX - kBigGranule) return {};  // a size no allocation can have (from a peer's header)
  size_t cap = (n + kBigGranule - 1) / kBigGranule * kBigGranule;
  return {std::malloc(cap), cap};
}

void BufferPool::put(Buf b) {
  if (b.ptr == nullptr) return;
  if (cached_ + b.cap > budget_) {
    std::free(b.ptr);
    return;
  }
  if (b.cap <= kMaxClassBytes) {
    free_[class_of(b.cap)].push_back(b.ptr);
  } else {
    if (big_.size() >= kMaxBigKept) {
      std::free(b.ptr);
      return;
    }
    big_.push_back(b);
  }
  cached_ += b.cap;
}

}  // namespace meshccl::plugin
