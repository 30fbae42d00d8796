// Building blocks of a tag-matching message engine shared by the transports:
// intrusive FIFO lists (posted receives, unexpected messages, send queues),
// object pools for requests, and a size-class pool for unexpected payloads.
//
// Matching rule (transport.h): a message matches the oldest posted receive
// with its tag; a receive matches the oldest unexpected message with its tag.
// Because both lists are kept in arrival/posting order, "oldest with this tag"
// is the first hit of a front-to-back scan. The scan is linear: the number of
// outstanding operations per connection is small (tens), where a scan over a
// contiguous-ish list beats a hash map and allocates nothing.
#ifndef MESHCCL_PLUGINS_COMMON_MSG_ENGINE_H_
#define MESHCCL_PLUGINS_COMMON_MSG_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace meshccl::plugin {

// Base for objects kept in a List. An object is in at most one list at a time.
template <class T>
struct Linked {
  T* prev = nullptr;
  T* next = nullptr;
};

template <class T>
class List {
 public:
  bool empty() const { return head_ == nullptr; }
  size_t size() const { return n_; }
  T* front() const { return head_; }

  void push_back(T* e) {
    e->prev = tail_;
    e->next = nullptr;
    if (tail_ != nullptr) tail_->next = e;
    else head_ = e;
    tail_ = e;
    ++n_;
  }
  void remove(T* e) {
    if (e->prev != nullptr) e->prev->next = e->next;
    else head_ = e->next;
    if (e->next != nullptr) e->next->prev = e->prev;
    else tail_ = e->prev;
    e->prev = e->next = nullptr;
    --n_;
  }
  T* pop_front() {
    T* e = head_;
    if (e != nullptr) remove(e);
    return e;
  }
  // Removes and returns the oldest element whose `tag` equals tag.
  T* take_tag(uint64_t tag) {
    for (T* e = head_; e != nullptr; e = e->next) {
      if (e->tag == tag) {
        remove(e);
        return e;
      }
    }
    return nullptr;
  }
  // Whether an element's `tag` equals tag.
  bool has_tag(uint64_t tag) const {
    for (const T* e = head_; e != nullptr; e = e->next)
      if (e->tag == tag) return true;
    return false;
  }
  // Calls f on every element; f may remove the element it is given.
  template <class F>
  void for_each(F&& f) {
    for (T* e = head_; e != nullptr;) {
      T* next = e->next;
      f(e);
      e = next;
    }
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
  size_t n_ = 0;
};

// Fixed-type object pool: storage grows in chunks and is only returned to the
// system when the pool dies, so the steady state allocates nothing. Objects
// must be trivially destructible because the pool may die with some in use
// (a comm closed with requests in flight).
template <class T>
class Pool {
  static_assert(std::is_trivially_destructible_v<T>, "pooled objects are dropped without a destructor");

 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // nullptr when memory is exhausted.
  T* get() {
    if (free_.empty() && !grow()) return nullptr;
    void* slot = free_.back();
    free_.pop_back();
    return new (slot) T();
  }
  void put(T* p) { free_.push_back(p); }

 private:
  static constexpr size_t kChunk = 64;
  struct alignas(T) Slot {
    unsigned char bytes[sizeof(T)];
  };
  bool grow() {
    std::unique_ptr<Slot[]> chunk(new (std::nothrow) Slot[kChunk]);
    if (chunk == nullptr) return false;
    free_.reserve(free_.size() + kChunk);
    for (size_t i = kChunk; i-- > 0;) free_.push_back(&chunk[i]);
    chunks_.push_back(std::move(chunk));
    return true;
  }
  std::vector<std::unique_ptr<Slot[]>> chunks_;
  std::vector<void*> free_;
};

// Payload buffers for unexpected messages. Small sizes come from power-of-two
// classes kept on free lists; large ones are allocated to size and a few are
// kept for reuse (first touch of fresh memory is slow), within a byte budget.
class BufferPool {
 public:
  struct Buf {
    void* ptr = nullptr;
    size_t cap = 0;
  };
  explicit BufferPool(size_t cache_budget) : budget_(cache_budget) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of at least n bytes; ptr == nullptr on allocation failure when
  // n > 0. n == 0 yields an empty Buf.
  Buf get(size_t n);
  void put(Buf b);
  size_t cached_bytes() const { return cached_; }

 private:
  static constexpr int kClasses = 15;  // 64 B .. 1 MiB
  static constexpr size_t kMinClass = 64;
  static constexpr size_t kMaxClassBytes = kMinClass << (kClasses - 1);
  static constexpr size_t kBigGranule = 1u << 16;
  static constexpr size_t kMaxBigKept = 4;
  static int class_of(size_t n);

  std::vector<void*> free_[kClasses];
  std::vector<Buf> big_;
  size_t budget_;
  size_t cached_ = 0;
};

}  // namespace meshccl::plugin

#endif  // MESHCCL_PLUGINS_COMMON_MSG_ENGINE_H_
