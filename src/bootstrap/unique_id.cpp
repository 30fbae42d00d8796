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
#include "util/sha256.h"

namespace meshccl {

namespace {

// The rendezvous, on the wire (version 2: version 1 sent the secret itself).
// A rank opens with a Challenge; the root answers with a proof over the
// rank's nonce and one of its own; the rank checks it before it sends
// anything else, then proves itself over both nonces and what it claims
// (Hello). The root replies (Reply); on success the rank table follows,
// then a Seal binding it, the nonces and the communicator's random value.
constexpr uint32_t kProtocol = 2;
constexpr int kNonceBytes = 16;
constexpr int kProofBytes = 32;

struct Challenge {
  uint32_t magic;
  uint32_t version;
  uint8_t nonce[kNonceBytes];
};

struct Answer {
  uint32_t magic;
  uint8_t nonce[kNonceBytes];
  uint8_t proof[kProofBytes];
};

struct Hello {
  uint8_t proof[kProofBytes];  // over both nonces and the rest of this struct
  int32_t nranks;
  int32_t rank;
  PeerInfo info;
};

struct Reply {
  int32_t status;  // ncclResult_t
  char message[200];
};

struct Seal {
  uint8_t session[kSecretBytes];  // drawn by the root for this communicator
  uint8_t mac[kProofBytes];
};

// The nonces of one connection: the rank's (from its Challenge), the root's.
struct Nonces {
  uint8_t rank[kNonceBytes];
  uint8_t root[kNonceBytes];
};

// Each proof has its own label, so none can stand in for another.
Digest root_proof(const uint8_t* secret, const Nonces& n) {
  static const char label[] = "meshccl bootstrap root proof";
  return hmac_sha256(secret, kSecretBytes, {{label, sizeof label}, {n.rank, kNonceBytes}, {n.root, kNonceBytes}});
}

Digest rank_proof(const uint8_t* secret, const Nonces& n, const Hello& h) {
  static const char label[] = "meshccl bootstrap rank proof";
  const auto* claims = reinterpret_cast<const uint8_t*>(&h) + kProofBytes;
  return hmac_sha256(
      secret, kSecretBytes,
      {{label, sizeof label}, {n.root, kNonceBytes}, {n.rank, kNonceBytes}, {claims, sizeof(Hello) - kProofBytes}});
}

Digest table_seal(const uint8_t* secret, const Nonces& n, const uint8_t* session, const std::vector<PeerInfo>& table) {
  static const char label[] = "meshccl bootstrap rank table";
  Sha256 h;
  h.update(table.data(), table.size() * sizeof(PeerInfo));
  const Digest digest = h.finish();
  return hmac_sha256(secret, kSecretBytes,
                     {{label, sizeof label},
                      {n.rank, kNonceBytes},
                      {n.root, kNonceBytes},
                      {session, kSecretBytes},
                      {digest.data(), digest.size()}});
}

void session_key(const uint8_t* secret, const uint8_t* session, uint8_t key[kSecretBytes]) {
  static const char label[] = "meshccl communicator key";
  const Digest d = hmac_sha256(secret, kSecretBytes, {{label, sizeof label}, {session, kSecretBytes}});
  std::memcpy(key, d.data(), kSecretBytes);
}

bool random_bytes(uint8_t* out, size_t n) { return getrandom(out, n, 0) == static_cast<ssize_t>(n); }

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
// A root answers a challenge at once; a listener that does not is no root.
constexpr double kAnswerSeconds = 10;

// A connection whose challenge or hello is still arriving.
struct Pending {
  Socket sock;
  bool answered = false;  // its challenge was answered; its hello is arriving
  Challenge challenge{};
  Hello hello{};
  Nonces nonces{};
  size_t got = 0;
  double deadline_us = 0;
};

// A complete challenge gets its answer; false drops the connection.
bool answer(Pending& p, const uint8_t* secret) {
  if (p.challenge.magic != kIdMagic || p.challenge.version != kProtocol) {
    MC_WARN("bootstrap root: dropped a connection that did not open with a meshccl challenge (version %u)",
            p.challenge.magic == kIdMagic ? p.challenge.version : 0u);
    return false;
  }
  std::memcpy(p.nonces.rank, p.challenge.nonce, kNonceBytes);
  if (!random_bytes(p.nonces.root, kNonceBytes)) return false;
  Answer a{};
  a.magic = kIdMagic;
  std::memcpy(a.nonce, p.nonces.root, kNonceBytes);
  const Digest proof = root_proof(secret, p.nonces);
  std::memcpy(a.proof, proof.data(), kProofBytes);
  // A fresh connection's send buffer takes it whole.
  if (::send(p.sock.fd(), &a, sizeof a, MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof a)) return false;
  p.answered = true;
  p.got = 0;
  return true;
}

// Serves one rendezvous, then exits. Runs detached: it owns its sockets.
// Messages are read from all connections at once, so a stray connection
// that sends little or nothing never holds up the real ranks.
void root_main(Socket listener, std::array<uint8_t, kSecretBytes> secret) {
  Deadline dl = Deadline::from_timeout_param();
  std::vector<Socket> conns;
  std::vector<PeerInfo> infos;
  std::vector<Nonces> nonces;
  std::vector<Pending> pending;
  int nranks = -1;
  int joined = 0;
  // Admits a proven hello; false when the rendezvous cannot succeed.
  auto admit = [&](Pending& p) -> bool {
    const Hello& h = p.hello;
    const Digest want = rank_proof(secret.data(), p.nonces, h);
    if (!equal_in_constant_time(h.proof, want.data(), kProofBytes)) {
      MC_WARN("bootstrap root: refused a connection that did not prove it holds this id's secret");
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
      nonces.resize(nranks);
    }
    if (err.empty() && conns[h.rank].valid()) err = "rank " + std::to_string(h.rank) + " joined twice";
    if (!err.empty()) {
      MC_WARN("bootstrap root: %s", err.c_str());
      send_reply(p.sock, ncclInvalidUsage, err);
      for (auto& other : conns)
        if (other.valid()) send_reply(other, ncclInvalidUsage, err);
      return false;
    }
    conns[h.rank] = std::move(p.sock);
    infos[h.rank] = h.info;
    infos[h.rank].rank = h.rank;
    nonces[h.rank] = p.nonces;
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
        auto* into = p.answered ? reinterpret_cast<char*>(&p.hello) : reinterpret_cast<char*>(&p.challenge);
        const size_t want = p.answered ? sizeof(Hello) : sizeof(Challenge);
        ssize_t n = ::recv(p.sock.fd(), into + p.got, want - p.got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          MC_WARN("bootstrap root: dropped a connection that closed before a full greeting");
          continue;
        }
        if (n > 0) p.got += static_cast<size_t>(n);
        if (p.got == want && !p.answered) {
          if (!answer(p, secret.data())) continue;
        } else if (p.got == want) {
          if (!admit(p)) return;
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
        Pending p;
        p.sock = Socket(fd);
        p.deadline_us = now + 10e6;
        pending.push_back(std::move(p));
      }
    }
  }
  // Every rank joined: nobody else may connect. Closing now, before any rank
  // holds its table, makes a reuse of the id meet a refused connection
  // instead of a backlog the root would never answer.
  listener.close();
  pending.clear();
  Seal seal{};
  if (!random_bytes(seal.session, kSecretBytes)) {
    MC_WARN("bootstrap root: getrandom failed; the ranks see the rendezvous fail");
    return;
  }
  for (int r = 0; r < nranks; ++r) {
    Reply ok{};
    ok.status = ncclSuccess;
    const Digest mac = table_seal(secret.data(), nonces[r], seal.session, infos);
    std::memcpy(seal.mac, mac.data(), kProofBytes);
    if (!socket_send_all(conns[r], &ok, sizeof(ok), Deadline::after(30), nullptr).ok() ||
        !socket_send_all(conns[r], infos.data(), sizeof(PeerInfo) * nranks, Deadline::after(30), nullptr).ok() ||
        !socket_send_all(conns[r], &seal, sizeof(seal), Deadline::after(30), nullptr).ok())
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
      warn_once("MESHCCL_COMM_ID",
                "MESHCCL_COMM_ID without MESHCCL_COMM_SECRET: another job cannot join by mistake, "
                "but anyone who can read this job's environment or guess its id can; set MESHCCL_COMM_SECRET");
      return out;
    }
  }
  warn_once("MESHCCL_COMM_ID",
            "MESHCCL_COMM_ID without MESHCCL_COMM_SECRET or a launcher job id: anyone who can "
            "reach that address can join the communicator; set MESHCCL_COMM_SECRET to a random string");
  return "";
}

Status root_start(const SockAddr& at, const uint8_t secret[kSecretBytes], SockAddr* bound, bool fixed_address) {
  Socket listener;
  Status st = socket_listen(at, &listener, bound);
  if (!st.ok() && fixed_address)
    return MC_ERROR(ncclSystemError,
                    "MESHCCL_COMM_ID=%s: rank 0 cannot host the bootstrap root there: the port is "
                    "taken (another process listens on it: an earlier job still running, or another user's program); "
                    "choose another port",
                    at.str().c_str());
  MC_TRY(st);
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
    const std::string keyed = std::string("meshccl fixed id") + '\0' + fixed + '\0' + fixed_secret_material();
    Sha256 h;
    h.update(keyed.data(), keyed.size());
    const Digest d = h.finish();
    std::memcpy(c.secret, d.data(), kSecretBytes);
  } else {
    if (!random_bytes(c.secret, kSecretBytes)) return MC_ERROR(ncclSystemError, "ncclGetUniqueId : getrandom failed");
    SockAddr at;
    std::string ifname;
    MC_TRY(pick_interface(&at, &ifname));
    MC_TRY(root_start(at, c.secret, &addr, false));
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

namespace {

// The rank's half of the challenge-response: nothing but a nonce goes out
// until the root has proved it holds the secret.
Status prove_root(const Socket& s, const SockAddr& root, const uint8_t* secret, int rank, Deadline dl, AbortFlag abort,
                  bool fixed_address, Nonces* n) {
  Challenge ch{};
  ch.magic = kIdMagic;
  ch.version = kProtocol;
  if (!random_bytes(n->rank, kNonceBytes))
    return MC_ERROR(ncclSystemError, "rank %d: bootstrap: getrandom failed", rank);
  std::memcpy(ch.nonce, n->rank, kNonceBytes);
  MC_TRY(socket_send_all(s, &ch, sizeof ch, dl, abort));
  const double left = dl.seconds_left();
  Answer a{};
  const Deadline answer_by = Deadline::after(left > 0 && left < kAnswerSeconds ? left : kAnswerSeconds);
  Status st = socket_recv_all(s, &a, sizeof a, answer_by, abort);
  if (st.code() == ncclInvalidUsage) return st;  // aborted
  const char* who = fixed_address ? "MESHCCL_COMM_ID" : "the ncclUniqueId";
  if (!st.ok() && !answer_by.expired() && !fixed_address)
    // The root closed the connection unanswered: it ended (its communicator
    // formed) between our connect and its last accept.
    return MC_ERROR(ncclInvalidArgument,
                    "rank %d: the root of this ncclUniqueId at %s closed the connection without answering: each id "
                    "serves one communicator (was it used already?)",
                    rank, root.str().c_str());
  if (!st.ok() && !answer_by.expired())
    return MC_ERROR(ncclRemoteError,
                    "rank %d: the process at %s (MESHCCL_COMM_ID) closed the connection without answering the "
                    "bootstrap challenge: its communicator formed already, or it is not a meshccl bootstrap root",
                    rank, root.str().c_str());
  if (!st.ok())
    return MC_ERROR(ncclRemoteError,
                    "rank %d: the process at %s (%s) did not answer the bootstrap challenge within "
                    "%.0f s: it is not a meshccl bootstrap root (another program holds that port?)",
                    rank, root.str().c_str(), who, kAnswerSeconds);
  std::memcpy(n->root, a.nonce, kNonceBytes);
  const Digest want = root_proof(secret, *n);
  if (a.magic != kIdMagic || !equal_in_constant_time(a.proof, want.data(), kProofBytes))
    return MC_ERROR(ncclInvalidUsage,
                    "rank %d: the process at %s (%s) did not prove it holds this communicator's "
                    "secret (wrong secret: it serves another communicator, with a different ncclUniqueId or "
                    "MESHCCL_COMM_SECRET, or another program holds that port); nothing secret was sent to it",
                    rank, root.str().c_str(), who);
  return kOk;
}

}  // namespace

Status root_exchange(const SockAddr& root, const uint8_t secret[kSecretBytes], int nranks, int rank,
                     const PeerInfo& mine, std::vector<PeerInfo>* all, uint8_t key[kSecretBytes], AbortFlag abort,
                     bool fixed_address) {
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
      return MC_ERROR(ncclInvalidArgument,
                      "rank %d: nobody serves this ncclUniqueId at %s: each id serves one communicator (was it used "
                      "already?), and the process that created it must still run",
                      rank, root.str().c_str());
  }
  Nonces n{};
  MC_TRY(prove_root(s, root, secret, rank, dl, abort, fixed_address, &n));
  Hello h{};
  h.nranks = nranks;
  h.rank = rank;
  h.info = mine;
  const Digest proof = rank_proof(secret, n, h);
  std::memcpy(h.proof, proof.data(), kProofBytes);
  MC_TRY(socket_send_all(s, &h, sizeof(h), dl, abort));
  Reply r{};
  Status st = socket_recv_all(s, &r, sizeof(r), dl, abort);
  if (!st.ok())
    return MC_ERROR(st.code(), "rank %d: bootstrap rendezvous with %s failed (not all %d ranks joined?)", rank,
                    root.str().c_str(), nranks);
  if (r.status != ncclSuccess) {
    r.message[sizeof(r.message) - 1] = '\0';
    return MC_ERROR(static_cast<ncclResult_t>(r.status), "bootstrap: %s", r.message);
  }
  all->resize(nranks);
  Seal seal{};
  MC_TRY(socket_recv_all(s, all->data(), sizeof(PeerInfo) * nranks, dl, abort));
  MC_TRY(socket_recv_all(s, &seal, sizeof seal, dl, abort));
  const Digest mac = table_seal(secret, n, seal.session, *all);
  if (!equal_in_constant_time(seal.mac, mac.data(), kProofBytes))
    return MC_ERROR(ncclRemoteError, "rank %d: bootstrap: the rank table from %s fails its seal (altered on the way?)",
                    rank, root.str().c_str());
  session_key(secret, seal.session, key);
  return check_peer_table(all, nranks);
}

void derive_key(const uint8_t parent[kSecretBytes], const char* label, uint64_t a, uint64_t b,
                uint8_t out[kSecretBytes]) {
  const Digest d = hmac_sha256(parent, kSecretBytes, {{label, std::strlen(label) + 1}, {&a, sizeof a}, {&b, sizeof b}});
  std::memcpy(out, d.data(), kSecretBytes);
}

uint64_t key_id(const uint8_t key[kSecretBytes]) {
  static const char label[] = "meshccl communicator id";
  const Digest d = hmac_sha256(key, kSecretBytes, {{label, sizeof label}});
  uint64_t id;
  std::memcpy(&id, d.data(), sizeof id);
  return id;
}

Status check_peer_table(std::vector<PeerInfo>* all, int nranks) {
  if (nranks < 1 || all->size() != static_cast<size_t>(nranks))
    return MC_ERROR(ncclInternalError, "bootstrap: the rank table has %zu entries for %d ranks", all->size(), nranks);
  for (int r = 0; r < nranks; ++r) {
    PeerInfo& p = (*all)[r];
    p.host_id[sizeof(p.host_id) - 1] = '\0';
    const int family = p.bootstrap_addr.ss_family;
    if (p.rank != r || (family != AF_INET && family != AF_INET6))
      return MC_ERROR(ncclRemoteError,
                      "bootstrap: malformed rank table from the root (entry %d: rank %d, address "
                      "family %d)",
                      r, p.rank, family);
    std::string why;
    if (!check_transport_record(p.transports, &why))
      return MC_ERROR(ncclRemoteError, "bootstrap: malformed rank table from the root (entry %d: %s)", r, why.c_str());
  }
  return kOk;
}

}  // namespace meshccl
