#include "bootstrap/bootstrap.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "util/log.h"
#include "util/sha256.h"

namespace meshccl {

namespace {
// A connection's first bytes: who sends, to whom, and a proof over both and
// a fresh nonce under the communicator's key (never the key itself). The key
// is new for every communicator (unique_id.h), so a greeting of another
// communicator proves nothing here; within one, each peer connects once.
struct Greeting {
  uint32_t magic;
  int32_t from;
  int32_t to;
  uint8_t nonce[16];
  uint8_t proof[32];
};

Digest greeting_proof(const uint8_t* key, const Greeting& g) {
  static const char label[] = "meshccl bootstrap channel";
  return hmac_sha256(
      key, kSecretBytes,
      {{label, sizeof label}, {&g.from, sizeof g.from}, {&g.to, sizeof g.to}, {g.nonce, sizeof g.nonce}});
}
struct Frame {
  uint32_t tag;
  uint32_t size;
};
constexpr uint32_t kMaxFrame = 1u << 30;
// A peer sends its greeting as soon as it has connected.
constexpr double kGreetingSeconds = 2;
constexpr size_t kMaxPending = 64;
}  // namespace

int greeting_sender(const void* bytes, size_t size, const uint8_t key[kSecretBytes], int nranks, int me) {
  Greeting g;
  if (size != sizeof g) return -1;
  std::memcpy(&g, bytes, sizeof g);
  if (g.magic != kIdMagic || g.from < 0 || g.from >= nranks || g.to != me) return -1;
  const Digest want = greeting_proof(key, g);
  return equal_in_constant_time(g.proof, want.data(), sizeof g.proof) ? g.from : -1;
}

size_t greeting_size() { return sizeof(Greeting); }

void make_greeting(const uint8_t key[kSecretBytes], int from, int to, void* out) {
  Greeting g{};
  g.magic = kIdMagic;
  g.from = from;
  g.to = to;
  if (getrandom(g.nonce, sizeof g.nonce, 0) != static_cast<ssize_t>(sizeof g.nonce))
    std::memset(g.nonce, 0, sizeof g.nonce);  // the proof still binds key, from and to
  const Digest proof = greeting_proof(key, g);
  std::memcpy(g.proof, proof.data(), sizeof g.proof);
  std::memcpy(out, &g, sizeof g);
}

Bootstrap::Bootstrap(int rank, int nranks, Socket listener, std::vector<SockAddr> peers,
                     const uint8_t key[kSecretBytes], AbortFlag abort)
    : rank_(rank),
      nranks_(nranks),
      listener_(std::move(listener)),
      peers_(std::move(peers)),
      abort_(abort),
      send_(nranks),
      recv_(nranks) {
  std::memcpy(key_, key, kSecretBytes);
}

Status Bootstrap::send_conn(int peer, const Socket** out) {
  if (!send_[peer].valid()) {
    Deadline dl = Deadline::from_timeout_param();
    Socket s;
    MC_TRY(socket_connect(peers_[peer], dl, abort_, &s));
    Greeting g;
    make_greeting(key_, rank_, peer, &g);
    MC_TRY(socket_send_all(s, &g, sizeof(g), dl, abort_));
    send_[peer] = std::move(s);
  }
  *out = &send_[peer];
  return kOk;
}

Status Bootstrap::recv_conn(int peer, const Socket** out, Deadline dl) {
  while (!recv_[peer].valid()) {
    if (abort_ != nullptr && abort_->load(std::memory_order_relaxed))
      return MC_ERROR(ncclInvalidUsage, "rank %d: bootstrap interrupted: communicator aborted", rank_);
    if (dl.expired())
      return MC_ERROR(ncclRemoteError, "rank %d: bootstrap: rank %d never connected (MESHCCL_TIMEOUT=%.0f s)", rank_,
                      peer, timeout_seconds());
    std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
    for (const Pending& p : pending_) fds.push_back({p.sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR)
      return MC_ERROR(ncclSystemError, "rank %d: bootstrap: poll failed: %s", rank_, std::strerror(errno));
    const double now = now_us();
    std::vector<Pending> still;
    for (size_t k = 0; k < pending_.size(); ++k) {
      Pending& p = pending_[k];
      if (fds[k + 1].revents != 0) {
        unsigned char buf[sizeof(Greeting)];
        ssize_t n = ::recv(p.sock.fd(), buf, sizeof(Greeting) - p.got.size(), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) continue;  // closed before greeting
        if (n > 0) p.got.insert(p.got.end(), buf, buf + n);
        if (p.got.size() == sizeof(Greeting)) {
          const int from = greeting_sender(p.got.data(), p.got.size(), key_, nranks_, rank_);
          if (from < 0 || recv_[from].valid()) {
            MC_WARN("rank %d: bootstrap: refused a connection that did not prove it holds this communicator's key",
                    rank_);
          } else {
            recv_[from] = std::move(p.sock);
          }
          continue;
        }
      }
      if (now > p.deadline_us) {
        MC_WARN("rank %d: bootstrap: dropped a connection that sent no complete greeting within %.0f s", rank_,
                kGreetingSeconds);
        continue;
      }
      still.push_back(std::move(p));
    }
    pending_.swap(still);
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        if (pending_.size() >= kMaxPending) {  // the oldest stranger makes room
          MC_WARN("rank %d: bootstrap: more than %zu connections without a greeting; dropped the oldest", rank_,
                  kMaxPending);
          pending_.erase(pending_.begin());
        }
        pending_.push_back(Pending{Socket(fd), {}, now + kGreetingSeconds * 1e6});
      }
    }
  }
  *out = &recv_[peer];
  return kOk;
}

Status Bootstrap::send(int peer, uint32_t tag, const void* data, size_t size) {
  if (peer < 0 || peer >= nranks_ || size > kMaxFrame)
    return MC_ERROR(ncclInternalError, "bootstrap send: bad peer %d or size %zu", peer, size);
  const Socket* s = nullptr;
  MC_TRY(send_conn(peer, &s));
  Deadline dl = Deadline::from_timeout_param();
  Frame f{tag, static_cast<uint32_t>(size)};
  MC_TRY(socket_send_all(*s, &f, sizeof(f), dl, abort_));
  if (size > 0) MC_TRY(socket_send_all(*s, data, size, dl, abort_));
  return kOk;
}

Status Bootstrap::recv(int peer, uint32_t tag, void* data, size_t size) {
  if (peer < 0 || peer >= nranks_) return MC_ERROR(ncclInternalError, "bootstrap recv: bad peer %d", peer);
  auto key = std::make_pair(peer, tag);
  auto it = unexpected_.find(key);
  if (it != unexpected_.end() && !it->second.empty()) {
    std::vector<char> msg = std::move(it->second.front());
    it->second.pop_front();
    if (msg.size() != size)
      return MC_ERROR(ncclInvalidUsage, "bootstrap: rank %d sent %zu bytes, expected %zu (mismatched calls?)", peer,
                      msg.size(), size);
    std::memcpy(data, msg.data(), size);
    return kOk;
  }
  Deadline dl = Deadline::from_timeout_param();
  const Socket* s = nullptr;
  MC_TRY(recv_conn(peer, &s, dl));
  for (;;) {
    Frame f{};
    Status st = socket_recv_all(*s, &f, sizeof(f), dl, abort_);
    if (!st.ok()) return MC_ERROR(st.code(), "rank %d: bootstrap: lost rank %d", rank_, peer);
    if (f.size > kMaxFrame) return MC_ERROR(ncclRemoteError, "bootstrap: malformed frame from rank %d", peer);
    if (f.tag == tag) {
      if (f.size != size)
        return MC_ERROR(ncclInvalidUsage, "bootstrap: rank %d sent %u bytes, expected %zu (mismatched calls?)", peer,
                        f.size, size);
      if (size > 0) MC_TRY(socket_recv_all(*s, data, size, dl, abort_));
      return kOk;
    }
    std::vector<char> msg(f.size);
    if (f.size > 0) MC_TRY(socket_recv_all(*s, msg.data(), f.size, dl, abort_));
    unexpected_[std::make_pair(peer, f.tag)].push_back(std::move(msg));
  }
}

Status Bootstrap::allgather(void* all, size_t block) {
  uint32_t tag = collective_tag_++;
  if (nranks_ == 1) return kOk;
  char* base = static_cast<char*>(all);
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  for (int step = 0; step < nranks_ - 1; ++step) {
    int send_block = (rank_ - step + nranks_) % nranks_;
    int recv_block = (rank_ - step - 1 + 2 * nranks_) % nranks_;
    MC_TRY(send(next, tag, base + send_block * block, block));
    MC_TRY(recv(prev, tag, base + recv_block * block, block));
  }
  return kOk;
}

Status Bootstrap::barrier() {
  std::vector<char> bytes(nranks_);
  return allgather(bytes.data(), 1);
}

bool Bootstrap::peer_closed(int peer) const {
  if (peer < 0 || peer >= nranks_) return false;
  return (recv_[peer].valid() && socket_peer_closed(recv_[peer]));
}

Status Bootstrap::new_listener(Socket* out, SockAddr* addr) const {
  SockAddr at = peers_[rank_];
  at.set_port(0);
  return socket_listen(at, out, addr);
}

}  // namespace meshccl
