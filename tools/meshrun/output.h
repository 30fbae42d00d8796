// Output plumbing of meshrun: rank output is cut into lines and prefixed, and
// everything meshrun writes goes through a queue per destination so that a
// slow reader of meshrun's stdout never blocks the event loop (timeouts and
// signals keep working while output is backed up).
#pragma once

#include <cstddef>
#include <string>

namespace meshrun {

// Turns a byte stream into whole lines, each prefixed. Pure: returns the text
// to write.
class LineSplitter {
 public:
  // A line longer than this is cut, so that one rank that never writes a
  // newline cannot make meshrun buffer without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  explicit LineSplitter(std::string prefix) : prefix_(std::move(prefix)) {}

  // Returns every line completed by data, each as prefix + line + '\n'.
  std::string feed(const char* data, size_t n);
  // Returns the unfinished last line (newline added), or "" if none.
  std::string finish();
  size_t pending() const { return partial_.size(); }

 private:
  std::string prefix_;
  std::string partial_;
};

// Bytes waiting to be written to one file descriptor.
class OutQueue {
 public:
  explicit OutQueue(int fd) : fd_(fd) {}

  int fd() const { return fd_; }
  void push(const std::string& text);
  size_t size() const { return buf_.size() - off_; }
  bool empty() const { return size() == 0; }

  // Writes what the descriptor takes without blocking for long: at most one
  // pipe buffer per call, after poll said it is writable. Returns false once
  // the reader is gone (EPIPE and the like); later output is dropped.
  bool write_some();
  // Writes everything, waiting at most timeout_ms without progress.
  void flush(int timeout_ms);

 private:
  int fd_;
  bool broken_ = false;
  std::string buf_;
  size_t off_ = 0;
};

}  // namespace meshrun
