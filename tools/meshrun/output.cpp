#include "output.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

namespace meshrun {

std::string LineSplitter::feed(const char* data, size_t n) {
  std::string out;
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != '\n') continue;
    out += prefix_;
    out += partial_;
    out.append(data + start, i + 1 - start);
    partial_.clear();
    start = i + 1;
  }
  partial_.append(data + start, n - start);
  while (partial_.size() >= kMaxLine) {
    out += prefix_;
    out.append(partial_, 0, kMaxLine);
    out += '\n';
    partial_.erase(0, kMaxLine);
  }
  return out;
}

std::string LineSplitter::finish() {
  if (partial_.empty()) return "";
  std::string out = prefix_ + partial_ + '\n';
  partial_.clear();
  return out;
}

void OutQueue::push(const std::string& text) {
  if (broken_ || text.empty()) return;
  if (off_ > 0 && off_ == buf_.size()) {
    buf_.clear();
    off_ = 0;
  }
  buf_ += text;
}

bool OutQueue::write_some() {
  if (broken_) return false;
  if (empty()) return true;
  // PIPE_BUF bytes fit whenever poll reports a pipe writable, so a blocking
  // descriptor never blocks here; terminals and files take it at once anyway.
  size_t n = std::min<size_t>(size(), 4096);
  ssize_t w = ::write(fd_, buf_.data() + off_, n);
  if (w > 0) {
    off_ += static_cast<size_t>(w);
    if (off_ == buf_.size()) {
      buf_.clear();
      off_ = 0;
    }
    return true;
  }
  if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  broken_ = true;  // EPIPE, EBADF, ENOSPC...: nobody will read the rest
  buf_.clear();
  off_ = 0;
  return false;
}

void OutQueue::flush(int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  auto last_progress = Clock::now();
  while (!broken_ && !empty()) {
    auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_progress);
    int left = timeout_ms - static_cast<int>(idle.count());
    if (left <= 0) return;
    pollfd p{fd_, POLLOUT, 0};
    int r = ::poll(&p, 1, left);
    if (r < 0 && errno != EINTR) return;
    if (r <= 0) continue;
    size_t before = size();
    if (!write_some()) return;
    if (size() < before) last_progress = Clock::now();
  }
}

}  // namespace meshrun
