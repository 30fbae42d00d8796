// socket-specific behaviour: the listener refuses connections that do not
// present its nonce, interface selection (NCCL's IFNAME syntax), and frames
// larger than 4 GiB.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "plugins/builtin.h"
#include "plugins/socket/socket_comm.h"
#include "plugins/common/socket_iface.h"
#include "tests/plugins/test_host.h"

namespace meshccl::test {
namespace {

namespace ps = meshccl::plugin::socket;
const meshccl_transport_v1_t* const t = &meshccl_transport_socket;

// A plain TCP connection to the address in a socket handle.
int raw_connect(const unsigned char* handle_bytes) {
  ps::Handle h;
  std::memcpy(&h, handle_bytes, sizeof(h));
  sockaddr_storage sa{};
  socklen_t len;
  if (h.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&sa);
    in->sin_family = AF_INET;
    in->sin_port = h.port;
    std::memcpy(&in->sin_addr, h.addr, 4);
    len = sizeof(*in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = h.port;
    std::memcpy(&in6->sin6_addr, h.addr, 16);
    len = sizeof(*in6);
  }
  int fd = socket(h.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the peer closed fd within the timeout.
bool closed_by_peer(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

TEST(Socket, StrayConnectionsAreRefused) {
  clear_log();
  void* ctx = nullptr;
  ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
  unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
  void* lcomm = nullptr;
  ASSERT_EQ(t->listen(ctx, 0, handle, &lcomm), MESHCCL_T_SUCCESS);

  int garbage = raw_connect(handle);
  int wrong_nonce = raw_connect(handle);
  int silent = raw_connect(handle);
  ASSERT_GE(garbage, 0);
  ASSERT_GE(wrong_nonce, 0);
  ASSERT_GE(silent, 0);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send(garbage, junk, sizeof(junk), 0), static_cast<ssize_t>(sizeof(junk)));
  ps::Hello hello{ps::kHelloMagic, 12345};
  ASSERT_EQ(send(wrong_nonce, &hello, sizeof(hello), 0), static_cast<ssize_t>(sizeof(hello)));
  void* rcomm = nullptr;
  for (int i = 0; i < 2000 && !(closed_by_peer(garbage, 0) && closed_by_peer(wrong_nonce, 0)); ++i) {
    ASSERT_EQ(t->accept(lcomm, &rcomm), MESHCCL_T_SUCCESS);
    ASSERT_EQ(rcomm, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(closed_by_peer(garbage, 1000));
  EXPECT_TRUE(closed_by_peer(wrong_nonce, 1000));
  EXPECT_TRUE(logged("refused connection"));

  // The real sender still gets in; the silent stray is dropped then.
  void* scomm = nullptr;
  void* other = nullptr;
  ASSERT_EQ(t->init(test_host(), &other), MESHCCL_T_SUCCESS);
  ASSERT_EQ(connect_loop(t, other, handle, &scomm), MESHCCL_T_SUCCESS);
  ASSERT_EQ(accept_loop(t, lcomm, &rcomm), MESHCCL_T_SUCCESS);
  EXPECT_TRUE(closed_by_peer(silent, 1000));
  char msg[] = "hello", buf[16] = {};
  void *s, *r;
  ASSERT_EQ(t->isend(scomm, msg, sizeof(msg), 1, nullptr, &s), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(rcomm, buf, sizeof(buf), 1, nullptr, &r), MESHCCL_T_SUCCESS);
  std::vector<int> res;
  ASSERT_TRUE(wait_all(t, {s, r}, &res));
  EXPECT_EQ(res[1], MESHCCL_T_SUCCESS);
  EXPECT_STREQ(buf, "hello");
  close(garbage);
  close(wrong_nonce);
  close(silent);
  t->close_send(scomm);
  t->close_recv(rcomm);
  t->close_listen(lcomm);
  t->finalize(other);
  t->finalize(ctx);
}

TEST(Socket, ConnectToAClosedListenerFails) {
  void* ctx = nullptr;
  ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
  unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
  void* lcomm = nullptr;
  ASSERT_EQ(t->listen(ctx, 0, handle, &lcomm), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->close_listen(lcomm), MESHCCL_T_SUCCESS);
  void* scomm = nullptr;
  EXPECT_EQ(connect_loop(t, ctx, handle, &scomm), MESHCCL_T_REMOTE_ERROR);
  EXPECT_EQ(scomm, nullptr);
  EXPECT_EQ(t->finalize(ctx), MESHCCL_T_SUCCESS);
}

ps::Iface iface(const char* name, int family, const char* addr, bool up = true) {
  ps::Iface i;
  i.name = name;
  i.family = family;
  i.up = up;
  i.loopback = std::strncmp(name, "lo", 2) == 0;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&i.addr);
    in->sin_family = AF_INET;
    inet_pton(AF_INET, addr, &in->sin_addr);
    i.addr_len = sizeof(*in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&i.addr);
    in6->sin6_family = AF_INET6;
    inet_pton(AF_INET6, addr, &in6->sin6_addr);
    i.addr_len = sizeof(*in6);
  }
  return i;
}

TEST(Socket, InterfaceSelection) {
  std::vector<ps::Iface> all = {
      iface("lo", AF_INET, "127.0.0.1"),         // 0
      iface("docker0", AF_INET, "172.17.0.1"),   // 1
      iface("ib0", AF_INET, "10.1.0.2", false),  // 2 (down)
      iface("eth0", AF_INET6, "fd00::2"),        // 3
      iface("eth0", AF_INET, "10.0.0.2"),        // 4
      iface("eth10", AF_INET, "10.0.1.2"),       // 5
      iface("ib1", AF_INET6, "fd01::3"),         // 6
      iface("lo", AF_INET6, "::1"),              // 7
  };
  EXPECT_EQ(ps::pick_iface(all, nullptr), 4);  // up, not loopback, not docker, IPv4
  EXPECT_EQ(ps::pick_iface(all, ""), 4);
  EXPECT_EQ(ps::pick_iface(all, "eth"), 4);     // prefix: eth0 before eth10
  EXPECT_EQ(ps::pick_iface(all, "eth1"), 5);    // "eth1" is a prefix of eth10
  EXPECT_EQ(ps::pick_iface(all, "=eth1"), -1);  // but not its exact name
  EXPECT_EQ(ps::pick_iface(all, "=eth10"), 5);
  EXPECT_EQ(ps::pick_iface(all, "ib0"), -1);  // down
  EXPECT_EQ(ps::pick_iface(all, "ib"), 6);    // only ib1 is up, IPv6 only
  EXPECT_EQ(ps::pick_iface(all, "docker,ib"), 1);
  EXPECT_EQ(ps::pick_iface(all, "^eth,docker,lo"), 6);
  EXPECT_EQ(ps::pick_iface(all, "^=eth0"), 0);  // exclusion does not imply skipping loopback
  EXPECT_EQ(ps::pick_iface(all, "^lo,docker"), 4);
  EXPECT_EQ(ps::pick_iface(all, "lo"), 0);
  EXPECT_EQ(ps::pick_iface(all, "nothere"), -1);

  std::vector<ps::Iface> lonely = {iface("docker0", AF_INET, "172.17.0.1"), iface("lo", AF_INET, "127.0.0.1")};
  EXPECT_EQ(ps::pick_iface(lonely, nullptr), 1);  // loopback as a last resort
  std::vector<ps::Iface> v6 = {iface("lo", AF_INET6, "::1"), iface("eth0", AF_INET6, "fd00::2")};
  EXPECT_EQ(ps::pick_iface(v6, nullptr), 0);  // default wants IPv4; loopback is what is left
  EXPECT_EQ(ps::pick_iface(v6, "eth"), 1);

  // MESHCCL_SOCKET_FAMILY narrows both the default rule and a name list.
  EXPECT_EQ(ps::pick_iface(all, nullptr, AF_INET6), 3);  // eth0's IPv6 address
  EXPECT_EQ(ps::pick_iface(all, "eth", AF_INET6), 3);
  EXPECT_EQ(ps::pick_iface(all, "lo", AF_INET6), 7);
  EXPECT_EQ(ps::pick_iface(all, "eth10", AF_INET6), -1);
  EXPECT_EQ(ps::pick_iface(all, "ib", AF_INET), -1);
  EXPECT_EQ(ps::pick_iface(v6, nullptr, AF_INET6), 1);
}

TEST(Socket, IfnameSetting) {
  {
    ScopedEnv e("MESHCCL_SOCKET_IFNAME", "=lo");
    void* ctx = nullptr;
    ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
    meshccl_transport_props_v1_t p{};
    ASSERT_EQ(t->properties(ctx, 0, &p), MESHCCL_T_SUCCESS);
    EXPECT_STREQ(p.name, "lo");
    void *s, *r;
    ASSERT_EQ(connect_pair(t, ctx, ctx, &s, &r), MESHCCL_T_SUCCESS);
    t->close_send(s);
    t->close_recv(r);
    t->finalize(ctx);
  }
  {
    clear_log();
    ScopedEnv e("MESHCCL_SOCKET_IFNAME", "=nosuchif0");
    void* ctx = nullptr;
    EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SYSTEM_ERROR);
    EXPECT_EQ(ctx, nullptr);
    EXPECT_TRUE(logged("nosuchif0"));
  }
  {
    ScopedEnv e("MESHCCL_SOCKET_FAMILY", "IPX");
    void* ctx = nullptr;
    EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_INVALID_USAGE);
  }
  {
    // IPv6 over loopback, end to end.
    ScopedEnv e("MESHCCL_SOCKET_IFNAME", "lo");
    ScopedEnv f("MESHCCL_SOCKET_FAMILY", "AF_INET6");
    void* ctx = nullptr;
    ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
    unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
    void* lcomm = nullptr;
    ASSERT_EQ(t->listen(ctx, 0, handle, &lcomm), MESHCCL_T_SUCCESS);
    ps::Handle h;
    std::memcpy(&h, handle, sizeof(h));
    EXPECT_EQ(h.family, AF_INET6);
    void *s, *r;
    ASSERT_EQ(t->close_listen(lcomm), MESHCCL_T_SUCCESS);
    ASSERT_EQ(connect_pair(t, ctx, ctx, &s, &r), MESHCCL_T_SUCCESS);
    char msg[] = "v6", buf[4] = {};
    void *sq, *rq;
    ASSERT_EQ(t->isend(s, msg, sizeof(msg), 1, nullptr, &sq), MESHCCL_T_SUCCESS);
    ASSERT_EQ(t->irecv(r, buf, sizeof(buf), 1, nullptr, &rq), MESHCCL_T_SUCCESS);
    std::vector<int> res;
    ASSERT_TRUE(wait_all(t, {sq, rq}, &res));
    EXPECT_STREQ(buf, "v6");
    t->close_send(s);
    t->close_recv(r);
    t->finalize(ctx);
  }
}

// A buffer of `bytes` virtual bytes backed by one `period`-byte memfd mapped
// over and over, so a >4 GiB message costs `period` bytes of memory.
class Repeated {
 public:
  Repeated(size_t bytes, size_t period) : period_(period) {
    fd_ = memfd_create("meshccl-test-repeat", MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(period)) != 0) std::abort();
    size_ = (bytes + period - 1) / period * period;
    void* base = mmap(nullptr, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) std::abort();
    base_ = static_cast<unsigned char*>(base);
    for (size_t off = 0; off < size_; off += period) {
      if (mmap(base_ + off, period, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_, 0) == MAP_FAILED) std::abort();
    }
  }
  ~Repeated() {
    munmap(base_, size_);
    close(fd_);
  }
  unsigned char* data() const { return base_; }
  size_t period() const { return period_; }

 private:
  int fd_ = -1;
  unsigned char* base_ = nullptr;
  size_t size_ = 0;
  size_t period_ = 0;
};

TEST(Socket, MessagesLargerThan4GiB) {
  constexpr size_t kPeriod = 2u << 20;
  constexpr size_t kSize = (4ull << 30) + 1000;
  Repeated src(kSize, kPeriod), dst(kSize, kPeriod);
  fill(src.data(), kPeriod, 42);
  void* ctx = nullptr;
  ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
  void *scomm, *rcomm;
  ASSERT_EQ(connect_pair(t, ctx, ctx, &scomm, &rcomm), MESHCCL_T_SUCCESS);
  char tail_src[] = "after the big one", tail_dst[32] = {};
  void *s1, *s2, *r1, *r2;
  ASSERT_EQ(t->irecv(rcomm, dst.data(), kSize, 7, nullptr, &r1), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->isend(scomm, src.data(), kSize, 7, nullptr, &s1), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->isend(scomm, tail_src, sizeof(tail_src), 7, nullptr, &s2), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(rcomm, tail_dst, sizeof(tail_dst), 7, nullptr, &r2), MESHCCL_T_SUCCESS);
  std::vector<int> res;
  std::vector<size_t> sizes;
  ASSERT_TRUE(wait_all(t, {s1, r1, s2, r2}, &res, &sizes, 300));
  for (int r : res) EXPECT_EQ(r, MESHCCL_T_SUCCESS);
  EXPECT_EQ(sizes[0], kSize);
  EXPECT_EQ(sizes[1], kSize);
  EXPECT_EQ(sizes[3], sizeof(tail_src));
  EXPECT_STREQ(tail_dst, "after the big one");
  // Every period of the source holds the same bytes, so every period of the
  // destination must too, whatever order they landed in.
  EXPECT_EQ(check(dst.data(), kPeriod, 42), SIZE_MAX);
  t->close_send(scomm);
  t->close_recv(rcomm);
  t->finalize(ctx);
}

}  // namespace
}  // namespace meshccl::test
