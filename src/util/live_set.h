// The set of live objects of one kind (communicators, host streams), so an
// API call can tell a live handle from a destroyed or foreign one without
// dereferencing it.
#pragma once

#include <mutex>
#include <unordered_set>

namespace meshccl {

template <typename T>
class LiveSet {
 public:
  void add(const T* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
  }
  void remove(const T* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(p);
  }
  // Removes p if it is live and pred(*p) holds, under the set's lock, so two
  // threads handing back the same object cannot both succeed.
  template <typename Pred>
  bool take_if(const void* p, Pred pred) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<const T*>(p));
    if (it == live_.end() || !pred(**it)) return false;
    live_.erase(it);
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
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(static_cast<const T*>(p)) != 0;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<const T*> live_;
};

}  // namespace meshccl
