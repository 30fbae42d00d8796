#include "bootstrap/unique_id.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

struct Hello {
  uint32_t magic;
  uint8_t secret[kSecretBytes];
  int32_t nranks;
  int32_t rank;
  PeerInfo info;
};

struct Reply {
  int32_t status;  // ncclResult_t
  char message[200];
};

void addr_to_id(const SockAddr& a, IdContents* c) {
  c->family = a.ss.ss_family;
  if (a.ss.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a.ss);
    c->port = s->sin_port;
    std::memcpy(c->addr, &s->sin_addr, 4);
  } else {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    c->port = s->sin6_port;
    std::memcpy(c->addr, &s->sin6_addr, 16);
  }
}

void send_reply(const Socket& s, ncclResult_t code, const std::string& msg) {
  Reply r{};
  r.status = code;
  std::strncpy(r.message, msg.c_str(), sizeof(r.message) - 1);
  (void)socket_send_all(s, &r, sizeof(r), Deadline::after(5), nullptr);
}

constexpr size_t kMaxPending = 256;
constexpr double kRootGoneSeconds = 5;

// A connection whose greeting is still arriving.
struct Pending {
  Socket sock;
  Hello hello{};
  size_t got = 0;
  double deadline_us = 0;
};

// Serves one rendezvous, then exits. Runs detached: it owns its sockets.
// Greetings are read from all connections at once, so a stray connection
// that sends little or nothing never holds up the real ranks.
void root_main(Socket listener, std::array<uint8_t, kSecretBytes> secret) {
  Deadline dl = Deadline::from_timeout_param();
  std::vector<Socket> conns;
  std::vector<PeerInfo> infos;
  std::vector<Pending> pending;
  int nranks = -1;
  int joined = 0;
  // Admits a complete greeting; false when the rendezvous cannot succeed.
  auto admit = [&](Socket c, const Hello& h) -> bool {
    if (h.magic != kIdMagic || std::memcmp(h.secret, secret.data(), kSecretBytes) != 0) {
      MC_WARN("bootstrap root: refused a connection that did not present this id's secret");
      // A rank of another job (another MESHCCL_COMM_SECRET) learns why at
      // once; the reply tells a stranger nothing it did not send.
      if (h.magic == kIdMagic)
        send_reply(c, ncclInvalidUsage, "the bootstrap root at this address serves another communicator (wrong "
                                        "secret: a different ncclUniqueId, or a different MESHCCL_COMM_SECRET)");
      return true;
    }
    std::string err;
    if (h.nranks <= 0 || h.nranks > (1 << 20)) err = "invalid nranks " + std::to_string(h.nranks);
    else if (nranks >= 0 && h.nranks != nranks)
      err = "rank " + std::to_string(h.rank) + " passed nranks=" + std::to_string(h.nranks) +
            " but other ranks passed " + std::to_string(nranks);
    else if (h.rank < 0 || h.rank >= h.nranks)
      err = "rank " + std::to_string(h.rank) + " out of range for nranks " + std::to_string(h.nranks);
    if (err.empty() && nranks < 0) {
      nranks = h.nranks;
      conns.resize(nranks);
      infos.resize(nranks);
    }
    if (err.empty() && conns[h.rank].valid()) err = "rank " + std::to_string(h.rank) + " joined twice";
    if (!err.empty()) {
      MC_WARN("bootstrap root: %s", err.c_str());
      send_reply(c, ncclInvalidUsage, err);
      for (auto& other : conns)
        if (other.valid()) send_reply(other, ncclInvalidUsage, err);
      return false;
    }
    conns[h.rank] = std::move(c);
    infos[h.rank] = h.info;
    infos[h.rank].rank = h.rank;
    ++joined;
    return true;
  };
  while (nranks < 0 || joined < nranks) {
    if (dl.expired()) {
      MC_WARN("bootstrap root: only %d of %d ranks joined before MESHCCL_TIMEOUT", joined, nranks);
      return;  // sockets close; waiting ranks see the error
    }
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
      MC_WARN("bootstrap root: poll failed: %s", strerror(errno));
      return;
    }
    const double now = now_us();
    std::vector<Pending> still;
    for (size_t k = 0; k < pending.size(); ++k) {
      Pending& p = pending[k];
      if (fds[k + 1].revents != 0) {
        ssize_t n = ::recv(p.sock.fd(), reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got,
                           MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          MC_WARN("bootstrap root: dropped a connection that closed before a full greeting");
          continue;
        }
        if (n > 0) p.got += static_cast<size_t>(n);
        if (p.got == sizeof(Hello)) {
          if (!admit(std::move(p.sock), p.hello)) return;
          continue;
        }
      }
      if (now > p.deadline_us) {
        MC_WARN("bootstrap root: dropped a connection that sent no complete greeting within 10 s");
        continue;
      }
      still.push_back(std::move(p));
    }
    pending.swap(still);
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        if (pending.size() >= kMaxPending) {  // the oldest stranger makes room
          MC_WARN("bootstrap root: more than %zu connections without a greeting; dropped the oldest", kMaxPending);
          pending.erase(pending.begin());
        }
        pending.push_back(Pending{Socket(fd), Hello{}, 0, now + 10e6});
      }
    }
  }
  for (int r = 0; r < nranks; ++r) {
    Reply ok{};
    ok.status = ncclSuccess;
    if (!socket_send_all(conns[r], &ok, sizeof(ok), Deadline::after(30), nullptr).ok() ||
        !socket_send_all(conns[r], infos.data(), sizeof(PeerInfo) * nranks, Deadline::after(30), nullptr).ok())
      MC_WARN("bootstrap root: could not send the rank table to rank %d", r);
  }
  MC_INFO(kBootstrap, "bootstrap root: %d ranks joined", nranks);
}

}  // namespace

static std::string fixed_secret_material() {
  const std::string& secret = param_str(Param::CommSecret);
  if (!secret.empty()) {
    if (secret.size() < 16)
      warn_once("MESHCCL_COMM_SECRET", "MESHCCL_COMM_SECRET is shorter than 16 characters: easy to guess");
    return "secret:" + secret;
  }
  // The job's id as the launcher names it: the same in every rank of a job,
  // different between jobs.
  for (const char* var : {"SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
    if (const char* v = std::getenv(var)) {
      if (*v == '\0') continue;
      std::string out = std::string("job:") + var + "=" + v;
      if (std::strcmp(var, "SLURM_JOB_ID") == 0)
        if (const char* step = std::getenv("SLURM_STEP_ID")) out += std::string(".") + step;
      warn_once("MESHCCL_COMM_ID", "MESHCCL_COMM_ID without MESHCCL_COMM_SECRET: another job cannot join by mistake, "
                "but anyone who can read this job's environment or guess its id can; set MESHCCL_COMM_SECRET");
      return out;
    }
  }
  warn_once("MESHCCL_COMM_ID", "MESHCCL_COMM_ID without MESHCCL_COMM_SECRET or a launcher job id: anyone who can "
            "reach that address can join the communicator; set MESHCCL_COMM_SECRET to a random string");
  return "";
}

Status root_start(const SockAddr& at, const uint8_t secret[kSecretBytes], SockAddr* bound) {
  Socket listener;
  MC_TRY(socket_listen(at, &listener, bound));
  std::array<uint8_t, kSecretBytes> sec;
  std::memcpy(sec.data(), secret, kSecretBytes);
  std::thread(root_main, std::move(listener), sec).detach();
  return kOk;
}

Status id_create(ncclUniqueId* id) {
  param_refresh();
  MC_TRY(param_check());
  std::memset(id, 0, sizeof(*id));
  IdContents c{};
  c.magic = kIdMagic;
  c.version = 1;
  std::string fixed = param_str(Param::CommId);
  SockAddr addr;
  if (!fixed.empty()) {
    MC_TRY(parse_host_port(fixed, &addr));
    c.flags = kIdFixedAddress;
    // Every rank builds the same id from the same variables, so the secret
    // is derived rather than random: from MESHCCL_COMM_SECRET, else from the
    // launcher's job id, so that another job using the same address is
    // refused (it is no defence against a local attacker: see docs/security.md).
    std::string material = fixed_secret_material();
    std::string keyed = fixed + '\0' + material;
    uint64_t h1 = hash64(keyed.data(), keyed.size(), 1), h2 = hash64(keyed.data(), keyed.size(), 2);
    std::memcpy(c.secret, &h1, 8);
    std::memcpy(c.secret + 8, &h2, 8);
  } else {
    if (getrandom(c.secret, kSecretBytes, 0) != kSecretBytes)
      return MC_ERROR(ncclSystemError, "ncclGetUniqueId : getrandom failed");
    SockAddr at;
    std::string ifname;
    MC_TRY(pick_interface(&at, &ifname));
    MC_TRY(root_start(at, c.secret, &addr));
    MC_INFO(kBootstrap, "Bootstrap: root listening on %s:%s", ifname.c_str(), addr.str().c_str());
  }
  addr_to_id(addr, &c);
  std::memcpy(id->internal, &c, sizeof(c));
  return kOk;
}

Status id_decode(const ncclUniqueId& id, IdContents* out, SockAddr* root) {
  std::memcpy(out, id.internal, sizeof(*out));
  if (out->magic != kIdMagic || (out->family != AF_INET && out->family != AF_INET6))
    return MC_ERROR(ncclInvalidArgument, "invalid ncclUniqueId (not created by ncclGetUniqueId)");
  std::memset(&root->ss, 0, sizeof(root->ss));
  if (out->family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&root->ss);
    s->sin_family = AF_INET;
    s->sin_port = out->port;
    std::memcpy(&s->sin_addr, out->addr, 4);
    root->len = sizeof(sockaddr_in);
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&root->ss);
    s->sin6_family = AF_INET6;
    s->sin6_port = out->port;
    std::memcpy(&s->sin6_addr, out->addr, 16);
    root->len = sizeof(sockaddr_in6);
  }
  return kOk;
}

Status root_exchange(const SockAddr& root, const uint8_t secret[kSecretBytes], int nranks, int rank,
                     const PeerInfo& mine, std::vector<PeerInfo>* all, AbortFlag abort, bool fixed_address) {
  Deadline dl = Deadline::from_timeout_param();
  Socket s;
  if (fixed_address) {
    MC_TRY(socket_connect(root, dl, abort, &s));  // rank 0 may start its root later
  } else {
    // ncclGetUniqueId started the root before the id existed: if nobody
    // listens now, nobody will.
    const double t = timeout_seconds();
    Status st = socket_connect(root, Deadline::after(t > 0 && t < kRootGoneSeconds ? t : kRootGoneSeconds), abort, &s);
    if (st.code() != ncclRemoteError) MC_TRY(st);
    if (!st.ok())
      return MC_ERROR(ncclInvalidArgument, "rank %d: nobody serves this ncclUniqueId at %s: each id serves one communicator (was it used "
                      "already?), and the process that created it must still run", rank, root.str().c_str());
  }
  Hello h{};
  h.magic = kIdMagic;
  std::memcpy(h.secret, secret, kSecretBytes);
  h.nranks = nranks;
  h.rank = rank;
  h.info = mine;
  MC_TRY(socket_send_all(s, &h, sizeof(h), dl, abort));
  Reply r{};
  Status st = socket_recv_all(s, &r, sizeof(r), dl, abort);
  if (!st.ok())
    return MC_ERROR(st.code(), "rank %d: bootstrap rendezvous with %s failed (not all %d ranks joined?)",
                    rank, root.str().c_str(), nranks);
  if (r.status != ncclSuccess) {
    r.message[sizeof(r.message) - 1] = '\0';
    return MC_ERROR(static_cast<ncclResult_t>(r.status), "bootstrap: %s", r.message);
  }
  all->resize(nranks);
  MC_TRY(socket_recv_all(s, all->data(), sizeof(PeerInfo) * nranks, dl, abort));
  return check_peer_table(all, nranks);
}

Status check_peer_table(std::vector<PeerInfo>* all, int nranks) {
  if (nranks < 1 || all->size() != static_cast<size_t>(nranks))
    return MC_ERROR(ncclInternalError, "bootstrap: the rank table has %zu entries for %d ranks", all->size(), nranks);
  for (int r = 0; r < nranks; ++r) {
    PeerInfo& p = (*all)[r];
    p.host_id[sizeof(p.host_id) - 1] = '\0';
    const int family = p.bootstrap_addr.ss_family;
    if (p.rank != r || (family != AF_INET && family != AF_INET6))
      return MC_ERROR(ncclRemoteError, "bootstrap: malformed rank table from the root (entry %d: rank %d, address "
                      "family %d)", r, p.rank, family);
  }
  return kOk;
}

}  // namespace meshccl
