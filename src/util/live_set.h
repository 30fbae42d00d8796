// The set of live objects of one kind (communicators, host streams), so an
// API call can tell a live handle from a destroyed or foreign one without
// dereferencing it.
//
// contains() is on every call's path: the first kFast objects also sit in a
// fixed array of atomic pointers that it scans without the lock (objects
// never move in it, so a scan misses no object that stays live meanwhile);
// the set under the lock answers only for objects beyond those.
#pragma once

#include <atomic>
#include <mutex>
#include <unordered_set>

namespace meshccl {

template <typename T>
class LiveSet {
 public:
  void add(const T* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
    for (size_t i = 0; i < kFast; ++i) {
      if (fast_[i].load(std::memory_order_relaxed) != nullptr) continue;
      fast_[i].store(p, std::memory_order_release);
      if (i >= fast_used_.load(std::memory_order_relaxed)) fast_used_.store(i + 1, std::memory_order_release);
      return;
    }
    overflow_.fetch_add(1, std::memory_order_release);
  }
  void remove(const T* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(p) != 0) forget(p);
  }
  // Removes p if it is live and pred(*p) holds, under the set's lock, so two
  // threads handing back the same object cannot both succeed.
  template <typename Pred>
  bool take_if(const void* p, Pred pred) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<const T*>(p));
    if (it == live_.end() || !pred(**it)) return false;
    live_.erase(it);
    forget(static_cast<const T*>(p));
    return true;
  }
  // Runs f(*p) under the set's lock if p is live (so p cannot be removed
  // meanwhile); returns f's result, or false when p is not live.
  template <typename F>
  bool with_live(const void* p, F f) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<const T*>(p));
    return it != live_.end() && f(const_cast<T&>(**it));
  }
  bool contains(const void* p) const {
    if (p == nullptr) return false;
    const size_t used = fast_used_.load(std::memory_order_acquire);
    for (size_t i = 0; i < used; ++i)
      if (fast_[i].load(std::memory_order_acquire) == p) return true;
    if (overflow_.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(static_cast<const T*>(p)) != 0;
  }

 private:
  static constexpr size_t kFast = 64;

  // Under mu_: p leaves the fast array, or the overflow count.
  void forget(const T* p) {
    for (size_t i = 0; i < kFast; ++i) {
      if (fast_[i].load(std::memory_order_relaxed) == p) {
        fast_[i].store(nullptr, std::memory_order_release);
        return;
      }
    }
    overflow_.fetch_sub(1, std::memory_order_release);
  }

  mutable std::mutex mu_;
  std::unordered_set<const T*> live_;
  std::atomic<const T*> fast_[kFast] = {};
  std::atomic<size_t> fast_used_{0};
  std::atomic<size_t> overflow_{0};
};

}  // namespace meshccl
