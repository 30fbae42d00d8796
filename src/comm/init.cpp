// Communicator life: init (rendezvous, bootstrap, connections), split,
// finalize and free.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <limits.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "collectives/algorithms.h"
#include "kernels/reduce.h"
#include "comm/comm.h"
#include "meshccl_config.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/device_ops.h"
#endif
#include "topo/cost_model.h"
#include "meshccl_config.h"
#include "topo/exchange.h"
#include "transport/select.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

bool is_loopback(const SockAddr& a) {
  if (a.ss.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a.ss);
    return (ntohl(s->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    return IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
  }
  return false;
}

// Where this rank's bootstrap listens: next to the root when it is on
// loopback (a one-host job), else the configured interface.
Status bootstrap_listen_addr(const SockAddr& root, SockAddr* out) {
  if (is_loopback(root)) {
    *out = root;
    out->set_port(0);
    return kOk;
  }
  std::string ifname;
  return pick_interface(out, &ifname);
}

// The file this library was loaded from: which libnccl.so.2 a program runs
// is the first thing to know when two are installed.
std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&library_path), &info) == 0 || info.dli_fname == nullptr) return "?";
  char* real = realpath(info.dli_fname, nullptr);
  std::string path = real != nullptr ? real : info.dli_fname;
  std::free(real);
  return path;
}

// As NCCL: the version line once per process, from a communicator's rank 0.
void print_version_once(int rank) {
  if (rank != 0) return;
  static std::once_flag once;
  std::call_once(once, [] {
    if (log_level() >= LogLevel::Version)
      log_msg(LogLevel::Version, kInit, __FILE__, __LINE__, "NCCL version 2.28.9+meshccl-%s (%s)",
              MESHCCL_VERSION_STRING, library_path().c_str());
  });
}

}  // namespace

// Priority scheduling, on or off for the whole communicator: any rank's
// MESHCCL_PRIORITY=0 (or meshcclConfig_t.priority = 0) makes it FIFO.
bool priority_on(const ncclComm* comm) {
  return std::none_of(comm->peers.begin(), comm->peers.end(),
                      [](const PeerInfo& p) { return (p.flags & kPeerFifo) != 0; });
}

namespace {

// The plan-shaping settings of a new communicator: every rank's as they are
// now, rank 0's for all (a rank whose own differ says so once per setting).
Status agree_plan_settings(ncclComm* comm) {
  struct Wire {
    char algo[256];
    char sparse_algo[32];
    int64_t chunk_bytes;
    int64_t direct_max_bytes;
    int64_t hier_channels;
  };
  const PlanSettings mine = plan_settings_from_params();
  if (mine.algo.size() >= sizeof(Wire::algo) || mine.sparse_algo.size() >= sizeof(Wire::sparse_algo))
    return MC_ERROR(ncclInvalidArgument, "%s is longer than %zu characters", param_set_name(Param::Algo),
                    sizeof(Wire::algo) - 1);
  std::vector<Wire> all(comm->nranks);
  Wire& me = all[comm->rank];
  std::memset(&me, 0, sizeof(me));
  std::memcpy(me.algo, mine.algo.data(), mine.algo.size());
  std::memcpy(me.sparse_algo, mine.sparse_algo.data(), mine.sparse_algo.size());
  me.chunk_bytes = static_cast<int64_t>(mine.chunk_bytes);
  me.direct_max_bytes = mine.direct_max_bytes;
  me.hier_channels = mine.hier_channels;
  MC_TRY(comm->bootstrap->allgather(all.data(), sizeof(Wire)));
  const Wire& root = all[0];
  comm->settings = mine;
  comm->settings.algo.assign(root.algo, strnlen(root.algo, sizeof(root.algo)));
  comm->settings.sparse_algo.assign(root.sparse_algo, strnlen(root.sparse_algo, sizeof(root.sparse_algo)));
  comm->settings.chunk_bytes = static_cast<size_t>(root.chunk_bytes);
  comm->settings.direct_max_bytes = root.direct_max_bytes;
  comm->settings.hier_channels = static_cast<int>(root.hier_channels);
  auto differs = [&](const char* name, const std::string& here, const std::string& there) {
    if (here == there) return;
    warn_once(std::string("agree:") + name,
              "rank %d: %s is \"%s\" here but \"%s\" on rank 0: rank 0's applies to every communicator this "
              "rank shares with it (set it alike on every rank)",
              comm->rank, name, here.c_str(), there.c_str());
  };
  differs(param_set_name(Param::Algo), mine.algo, comm->settings.algo);
  differs("MESHCCL_SPARSE_ALGO", mine.sparse_algo, comm->settings.sparse_algo);
  differs("MESHCCL_CHUNKSIZE", std::to_string(mine.chunk_bytes), std::to_string(comm->settings.chunk_bytes));
  differs("MESHCCL_DIRECT_MAX_BYTES", std::to_string(mine.direct_max_bytes),
          std::to_string(comm->settings.direct_max_bytes));
  differs("MESHCCL_HIER_CHANNELS", std::to_string(mine.hier_channels), std::to_string(comm->settings.hier_channels));
  return kOk;
}

// Bytes per chunk on a link of a node-scope transport (shm) or a network one:
// MESHCCL_CHUNK_US of link time at the agreed model's bandwidth, a power of
// two. A send's
// completion must mean the peer has the data, or credits bound nothing: on
// shm, messages up to MESHCCL_SHM_EAGER (64 KiB by default) complete once
// copied into the ring, so chunks there start above it (a constant, as both
// ends must cut alike). On the network, unless MESHCCL_CHUNK_US is set, a
// chunk also lasts at least kNetChunkAlphas of the agreed per-message
// latency: each chunk is a message of its own, and shorter chunks cost more
// in messages than ordering wins (meshtrain dp 2 x pp 2 on 4 emulated hosts
// at 10 Gbit/s: 64 KiB chunks 0.80-0.84x FIFO's steps/s, 256 KiB 1.02x).
constexpr double kNetChunkAlphas = 16;

size_t chunk_bytes_for(const TuneModel& tune, bool shm) {
  double chunk_us = static_cast<double>(std::max<int64_t>(param_int(Param::ChunkUs), 1));
  if (!shm && param_env(Param::ChunkUs) == nullptr) chunk_us = std::max(chunk_us, kNetChunkAlphas * tune.net.alpha_us);
  const double bw_gbs = shm ? tune.shm.bw_gbs : tune.net.bw_gbs;
  size_t chunk = shm ? size_t{128} << 10 : size_t{16} << 10;
  const double want = chunk_us * 1e3 * (bw_gbs > 0 ? bw_gbs : 1.0);  // bytes
  while (chunk < (size_t{8} << 20) && static_cast<double>(chunk * 2) <= want) chunk *= 2;
  return chunk;
}

// Priority scheduling of the engine's links: chunk sizes from the agreed model
// (so both ends of a link cut transfers alike), credits shared by every
// communicator of this process on the same link.
void configure_links(ncclComm* comm, const TuneModel& tune) {
  LinkPolicy policy;
  policy.priority = priority_on(comm);
  // Credit: 2 chunks on network links, whose chunks in flight are bytes in
  // socket buffers and on the wire ahead of an urgent message; 8 on
  // shared-memory links, whose chunks in flight are descriptors the receiver
  // copies from when it tests them, urgent transfers first (sched/links.cpp).
  // With 2 a sender that waits a chunk's copy time between posts adds its
  // wake-up to every chunk: 1-4 MiB send/recv took 1.15-1.25x as long as with
  // FIFO on shm, 1.00-1.04x with 8 (perf/priority_perf -s).
  const int64_t credit = param_int(Param::LinkCredit);
  policy.window = static_cast<size_t>(std::max<int64_t>(param_int(Param::LinkWindow), 0));
  const PeerInfo& me = comm->peers[comm->rank];
  for (int p = 0; p < comm->nranks; ++p) {
    if (p == comm->rank) continue;
    const std::string transport = Mesh::transport_for(comm->peers, comm->rank, p);
    const bool local = node_local(comm->peers, comm->rank, p);
    const size_t chunk = chunk_bytes_for(tune, local);
    const size_t credit_chunks = credit > 0 ? static_cast<size_t>(credit) : local ? 8 : 2;
    // The window bounds the chunks in flight without credit; on shared
    // memory those are descriptors, and a window there serialized a ring
    // all-reduce's phases (64 MiB through a plan took 1.3x as long as with
    // FIFO). MESHCCL_LINK_WINDOW, when set, applies to every link.
    const bool windowed = !local || param_env(Param::LinkWindow) != nullptr;
    const PeerInfo& peer = comm->peers[p];
    const std::string key = transport + ":" + std::to_string(peer.machine_hash) + ":" + std::to_string(peer.pid) +
                            (me.machine_hash == peer.machine_hash ? "" : std::string(":") + peer.host_id);
    comm->engine->links().configure(policy, p, chunk, credit_chunks, windowed, link_share(key + ":send"),
                                    link_share(key + ":recv"));
  }
  if (!policy.priority) {
    MC_INFO(kInit,
            "comm %p rank %d: FIFO scheduling, whole transfers in the order posted (priority "
            "scheduling needs MESHCCL_PRIORITY=1 on every rank)",
            static_cast<void*>(comm), comm->rank);
    return;
  }
  const int next = (comm->rank + 1) % comm->nranks;
  MC_INFO(kInit,
          "comm %p rank %d: priority scheduling: transfers cut into chunks of %zu bytes (to rank %d), "
          "%zu chunks of credit per link",
          static_cast<void*>(comm), comm->rank, next == comm->rank ? 0 : comm->engine->links().chunk_bytes(next), next,
          next == comm->rank ? 0 : comm->engine->links().credit_chunks(next));
}

// The shared region of a single-host communicator. With priority scheduling
// it has a lane per stream priority level, each with slots of
// MESHCCL_DIRECT_SLOT_BYTES (a lane's pages are touched only once an
// operation of its level runs): between two rounds of an operation, more
// urgent lanes go first. Rounds one link chunk long (256 KiB here) made 4
// ranks on 2 cores 1.7-3x slower at 256 KiB-64 MiB ReduceScatter and
// AlltoAll (perf/ab, priority against FIFO), every round synchronizing the
// ranks.
Status create_node_region(ncclComm* comm) {
  // With checks every collective is a plan whose signature exchange comes
  // first: the direct algorithms check too, but a mismatch there fails the
  // communicator, and a rank whose call went to a plan instead is never seen.
  size_t slot_bytes = comm->checks ? 0 : static_cast<size_t>(param_int(Param::DirectSlotBytes));
  int lanes = 1;
  if (priority_on(comm) && slot_bytes > 0) lanes = NodeRegion::kPriorityLanes;
  return NodeRegion::create(*comm->bootstrap, comm->peers, slot_bytes, lanes, &comm->node);
}

}  // namespace

Status comm_finish_setup(ncclComm* comm) {
  // Settings that act process-wide, as they are now.
  if (!kernels::select_isa(param_str(Param::KernelIsa).c_str()))
    MC_WARN("MESHCCL_KERNEL_ISA=%s is not one of auto, portable, avx2, avx512 supported by this CPU; using %s",
            param_str(Param::KernelIsa).c_str(), kernels::isa_name());
  // Ranks sharing this machine's cores (emulated hosts included) decide how
  // long this communicator's waits may poll; a split child keeps its
  // parent's count, as its processes still share the cores.
  int local = 0;
  for (const PeerInfo& p : comm->peers) local += p.machine_hash == comm->peers[comm->rank].machine_hash;
  comm->local_ranks = std::max(comm->local_ranks, local);
  comm->wait = WaitPolicy::for_local_ranks(comm->local_ranks);
  // A split child already has its parent's graph, restricted to its members.
  const bool from_split = comm->topo.nranks() == comm->nranks;
  if (!from_split) MC_TRY(topo_init(comm->rank, *comm->bootstrap, comm->peers, comm->cuda_dev, &comm->topo));
  MC_TRY(topo_publish(comm->rank, comm->topo, comm->comm_hash, from_split));
  MC_TRY(agree_on_networks(*comm->bootstrap, &comm->peers));
  MC_TRY(Mesh::connect_all(*comm->bootstrap, comm->peers, &comm->abort_flag, &comm->mesh));
  // A rank's connections are made when its own connects and accepts are,
  // not yet its peers'. A new communicator's link measurement (tune_init)
  // then syncs the ranks; a split or shrink child inherits its parent's
  // constants and skips it, so without this barrier a rank could finish
  // init, run an empty operation and destroy the child while a peer still
  // waited to accept its connection (over ofi the connection's first message
  // was then lost, and that peer failed with "connections to peers not
  // established within MESHCCL_TIMEOUT").
  if (comm->parent_tune) MC_TRY(comm->bootstrap->barrier());
  comm->checks = std::any_of(comm->peers.begin(), comm->peers.end(),
                             [](const PeerInfo& p) { return (p.flags & kPeerChecks) != 0; });
  comm->engine = std::make_unique<Engine>(
      comm->rank, comm->mesh.get(), &comm->abort_flag,
      [comm](int* dead, const std::function<bool(int)>& matters) { return comm->check_peers(dead, matters); },
      comm->wait);
  comm->engine->set_timeout(comm->config.timeout_s, comm->timeout_source());
  // A split or shrink child has its parent's settings already.
  if (!comm->parent_tune) MC_TRY(agree_plan_settings(comm));
  TuneModel tune;
  MC_TRY(tune_init(comm->rank, *comm->bootstrap, *comm->mesh, *comm->engine, comm->peers, comm->topo,
                   comm->parent_tune ? &*comm->parent_tune : nullptr, &tune));
  comm->tune = tune;
  MC_TRY(create_node_region(comm));
  comm->algorithms = make_algorithms(comm->rank, tune, comm->node.get(), comm->wait, &comm->settings);
  configure_links(comm, tune);
  comm->sched.engine = comm->engine.get();
  comm->sched.runs = comm->algorithms.get();
  comm->sched.abort = &comm->abort_flag;
  comm->p2p_seq.init(comm->nranks);
  comm->state.store(ncclComm::State::Ready);
  MC_INFO(kInit, "comm %p rank %d nranks %d host %s commId 0x%llx%s - Init COMPLETE", static_cast<void*>(comm),
          comm->rank, comm->nranks, comm->peers[comm->rank].host_id, static_cast<unsigned long long>(comm->comm_hash),
          comm->checks ? " checks on" : "");
  return kOk;
}

Status settings_refresh() {
  param_refresh();
  MC_TRY(param_check());
  return check_algo_setting();
}

Status comm_init_rank(ncclComm* comm, int nranks, const ncclUniqueId& id, int rank) {
  MC_TRY(settings_refresh());
  ScopedTimeout timeout(comm->config.timeout_s);
  print_version_once(rank);
  IdContents c{};
  SockAddr root;
  MC_TRY(id_decode(id, &c, &root));
  comm->rank = rank;
  comm->nranks = nranks;
  MC_INFO(kInit, "ncclCommInitRank comm %p rank %d nranks %d - Init START", static_cast<void*>(comm), rank, nranks);
  if ((c.flags & kIdFixedAddress) && rank == 0) {
    SockAddr bound;
    MC_TRY(root_start(root, c.secret, &bound, true));
  }
  SockAddr at, bound;
  MC_TRY(bootstrap_listen_addr(root, &at));
  Socket listener;
  MC_TRY(socket_listen(at, &listener, &bound));
  PeerInfo mine = local_peer_info();
  mine.rank = rank;
  if (comm->config.priority == 0) mine.flags |= kPeerFifo;
  if (comm->config.priority == 1) mine.flags &= ~kPeerFifo;
  MC_TRY(fill_transport_request(comm->config.net_name, &mine));
  std::memcpy(&mine.bootstrap_addr, &bound.ss, sizeof(bound.ss));
  uint8_t key[kSecretBytes];
  MC_TRY(root_exchange(root, c.secret, nranks, rank, mine, &comm->peers, key, &comm->abort_flag,
                       (c.flags & kIdFixedAddress) != 0));
  comm->comm_hash = key_id(key);
  std::vector<SockAddr> addrs(nranks);
  for (int r = 0; r < nranks; ++r) {
    std::memcpy(&addrs[r].ss, &comm->peers[r].bootstrap_addr, sizeof(sockaddr_storage));
    addrs[r].len = addrs[r].ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  }
  comm->bootstrap =
      std::make_unique<Bootstrap>(rank, nranks, std::move(listener), std::move(addrs), key, &comm->abort_flag);
  return comm_finish_setup(comm);
}

Status comm_split(ncclComm* parent, int color, int key, ncclComm* child) {
  MC_TRY(settings_refresh());
  ScopedTimeout timeout(child != nullptr ? child->config.timeout_s : parent->config.timeout_s);
  struct Entry {
    int32_t color;
    int32_t key;
    int32_t valid;
    int32_t bad_priority;   // this rank's config asked the child for other scheduling
    int32_t bad_transport;  // this rank could not make its transport record for the child
    sockaddr_storage addr;
    TransportRecord transport;  // for the child (its config's netName)
  };
  const int n = parent->nranks;
  std::vector<Entry> all(n);
  Entry& me = all[parent->rank];
  std::memset(&me, 0, sizeof(me));
  me.color = color;
  me.key = key;
  me.valid = color >= 0 || color == NCCL_SPLIT_NOCOLOR;
  // A child keeps its parent's scheduling: a config asking for another is
  // refused on every rank.
  me.bad_priority = child != nullptr && !child_priority_ok(parent, child) ? 1 : 0;
  Status transport_made = color >= 0 ? transport_request(child->config.net_name, &me.transport) : kOk;
  me.bad_transport = transport_made.ok() ? 0 : 1;
  Socket listener;
  SockAddr addr;
  if (color >= 0) {
    MC_TRY(parent->bootstrap->new_listener(&listener, &addr));
    std::memcpy(&me.addr, &addr.ss, sizeof(addr.ss));
  }
  MC_TRY(parent->bootstrap->allgather(all.data(), sizeof(Entry)));
  uint32_t seq = parent->split_seq++;
  for (int r = 0; r < n; ++r) {
    if (!all[r].valid) {
      if (r == parent->rank)
        return MC_ERROR(ncclInvalidArgument, "ncclCommSplit : invalid color %d (must be >= 0 or NCCL_SPLIT_NOCOLOR)",
                        color);
      return MC_ERROR(ncclInvalidUsage, "ncclCommSplit : rank %d passed an invalid color %d", r, all[r].color);
    }
  }
  for (int r = 0; r < n; ++r)
    if (all[r].bad_priority != 0)
      return MC_ERROR(ncclInvalidArgument,
                      "ncclCommSplit : %s asked for %s scheduling in a child of a communicator with %s: a split "
                      "child keeps its parent's (meshcclConfig_t.priority is read at ncclCommInitRankConfig)",
                      r == parent->rank ? "this rank" : ("rank " + std::to_string(r)).c_str(),
                      priority_on(parent) ? "FIFO" : "priority", priority_on(parent) ? "priority" : "FIFO");
  if (color < 0) return kOk;
  MC_TRY(transport_made);
  for (int r = 0; r < n; ++r)
    if (all[r].color == color && all[r].bad_transport != 0)
      return MC_ERROR(ncclInvalidUsage,
                      "ncclCommSplit : rank %d could not make its transport record for the child (its log says why)",
                      r);
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (all[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[a].key < all[b].key; });  // ties keep parent order
  const int cn = static_cast<int>(members.size());
  int crank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank) - members.begin());
  child->rank = crank;
  child->nranks = cn;
  child->local_ranks = parent->local_ranks;
  child->parent_tune = parent->tune;
  child->settings = parent->settings;
  uint8_t secret[kSecretBytes];
  derive_key(parent->bootstrap->key(), "meshccl split", seq, static_cast<uint64_t>(color), secret);
  child->comm_hash = key_id(secret);
  std::vector<SockAddr> addrs(cn);
  child->peers.resize(cn);
  child->topo = parent->topo.subset(members);
  for (int i = 0; i < cn; ++i) {
    int pr = members[i];
    std::memcpy(&addrs[i].ss, &all[pr].addr, sizeof(sockaddr_storage));
    addrs[i].len = addrs[i].ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    child->peers[i] = parent->peers[pr];
    child->peers[i].rank = i;
    MC_TRY(apply_transport_request(all[pr].transport, pr, &child->peers[i]));
    if (parent->checks) child->peers[i].flags |= kPeerChecks;  // the child keeps its parent's checks
    std::memcpy(&child->peers[i].bootstrap_addr, &all[pr].addr, sizeof(sockaddr_storage));
  }
  child->bootstrap =
      std::make_unique<Bootstrap>(crank, cn, std::move(listener), std::move(addrs), secret, &child->abort_flag);
  MC_INFO(kInit, "ncclCommSplit comm %p color %d key %d -> rank %d of %d", static_cast<void*>(parent), color, key,
          crank, cn);
  return comm_finish_setup(child);
}

// Enqueued operations and eager sends still in the background (their data
// must reach receivers that wait for it) finish first; an aborted
// communicator drops the background ones.
bool comm_wait_idle(ncclComm* comm, Deadline dl) {
  Backoff backoff(comm->wait);
  auto busy = [comm] {
    return comm->sched.pending_ops.load() > 0 ||
           (comm->engine && comm->engine->busy() && !comm->abort_flag.load(std::memory_order_relaxed));
  };
  while (busy() && !dl.expired()) {
    if (comm->engine && comm->engine->progress()) backoff.progress();
    else backoff.idle();
  }
  return !busy();
}

Status comm_finalize(ncclComm* comm) {
  bool idle = comm_wait_idle(comm, Deadline::after(comm->timeout_s()));
  if (comm->abort_flag.load()) return MC_ERROR(ncclInvalidUsage, "ncclCommFinalize : communicator aborted");
  if (!idle) return MC_ERROR(ncclRemoteError, "ncclCommFinalize : operations still pending after MESHCCL_TIMEOUT");
  if (comm->engine) MC_TRY(comm->engine->fatal());
  if (comm->bootstrap) MC_TRY(comm->bootstrap->barrier());
  comm->state.store(ncclComm::State::Finalized);
  return kOk;
}

void comm_free(ncclComm* comm) {
  if (comm->async_thread.joinable()) comm->async_thread.join();
#if MESHCCL_HAVE_CUDA
  cuda::release(&comm->sched);  // the device proxy: drained (bounded) before the transports close
#endif
  if (comm->engine) comm->engine->stop_background();  // before the transports it drives close
  comm->mesh.reset();  // closes transports first: nothing can touch our buffers after this
  comm->engine.reset();
  comm->bootstrap.reset();
  delete comm;
}

}  // namespace meshccl
