// libFuzzer: what a peer controls in the socket transport: the handle it
// sends over the bootstrap (checked before anything connects), and the
// frames {tag, size} + payload it writes on a connection. The frames go
// through a socket pair into a real receiving end, with receives posted
// before and after, as the engine would.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "plugins/socket/socket_comm.h"

// A peer may announce a frame larger than memory: the receiver must then fail
// with "out of memory", which needs malloc to return NULL as it does outside
// the sanitizer.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace {
using namespace meshccl::plugin::socket;

void check_handle_bytes(const uint8_t* data, size_t size) {
  uint8_t bytes[MESHCCL_TRANSPORT_HANDLE_BYTES] = {};
  std::memcpy(bytes, data, std::min(size, sizeof bytes));
  Handle h;
  sockaddr_storage sa;
  socklen_t len = 0;
  if (parse_handle(bytes, &h, &sa, &len) != nullptr) return;
  // Accepted: a complete IPv4 or IPv6 address with a port.
  if (sa.ss_family != h.family || h.port == 0) __builtin_trap();
  if (len != (h.family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6))) __builtin_trap();
}

// Drives every request to completion; a request that never completes once
// the stream has ended is a hang.
void drive(std::vector<void*>& reqs, const std::vector<size_t>& caps) {
  for (int round = 0; round < 1000; ++round) {
    bool pending = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      int done = 0;
      size_t n = 0;
      auto* r = static_cast<Request*>(reqs[i]);
      meshccl_tresult_t res = recv_test(r, &done, &n);
      if (done == 0) {
        pending = true;
        continue;
      }
      if (res == MESHCCL_T_SUCCESS && n > caps[i]) __builtin_trap();  // more than the buffer holds
      reqs[i] = nullptr;
    }
    if (!pending) return;
  }
  __builtin_trap();
}

void check_stream(const uint8_t* data, size_t size) {
  if (size < 2) return;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  // Inputs are a few KiB (libFuzzer's -max_len): they fit the socket buffer.
  size_t off = 2;
  while (off < size) {
    ssize_t w = write(fds[1], data + off, size - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  close(fds[1]);
  static const meshccl_transport_host_v1_t host{};
  Ctx ctx;
  ctx.host = &host;
  auto* c = new RecvComm;
  c->ctx = &ctx;
  c->fd = fds[0];
  c->peer = "fuzz";
  const size_t cap = size_t{data[1]} * 8;
  const int before = data[0] % 5;
  std::vector<std::vector<unsigned char>> bufs(8 + static_cast<size_t>(before), std::vector<unsigned char>(cap + 1));
  std::vector<void*> reqs;
  std::vector<size_t> caps;
  // Receives waiting when the frames arrive (tags 0..before-1), then, once
  // the stream is over, receives that find what arrived unexpected.
  for (int pass = 0; pass < 2; ++pass) {
    const int n = pass == 0 ? before : 8;
    for (int t = 0; t < n; ++t) {
      void* r = nullptr;
      if (recv_post(c, bufs[reqs.size()].data(), cap, static_cast<uint64_t>(t), &r) == MESHCCL_T_SUCCESS) {
        reqs.push_back(r);
        caps.push_back(cap);
      }
    }
    drive(reqs, caps);
    reqs.clear();
    caps.clear();
  }
  close(c->fd);
  c->m.drain();
  delete c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_handle_bytes(data, size);
  check_stream(data, size);
  return 0;
}
