// The communicator. Each subsystem owns its state in its own object; the
// communicator holds them and the little that is shared (rank, config,
// sequence numbers, error state).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/plan_settings.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "nccl.h"
#include "sched/engine.h"
#include "sched/launch.h"
#include "sched/p2p_seq.h"
#include "topo/cost_model.h"
#include "topo/topology.h"
#include "transport/mesh.h"
#include "transport/node_region.h"
#include "util/status.h"
#include "util/wait.h"

namespace meshccl {

struct CommConfig {
  bool blocking = true;
  bool split_share = false;
  std::string name;
  std::string net_name;
  int timeout_s = 0;            // meshcclConfig_t.timeoutSeconds; 0: MESHCCL_TIMEOUT
  int priority = -1;            // meshcclConfig_t.priority; -1: MESHCCL_PRIORITY
  bool priority_given = false;  // priority was set by this call's config (not inherited)
};

// Reduction operators made by ncclRedOpCreatePreMulSum.
struct DynamicOp {
  bool in_use = false;
  ncclDataType_t dtype = ncclFloat32;
  ncclScalarResidence_t residence = ncclScalarHostImmediate;
  alignas(8) unsigned char value[8] = {};  // host-immediate scalar
  const void* ptr = nullptr;               // device-residence scalar, read at each use
};

}  // namespace meshccl

struct ncclComm {
  enum class State { Initializing, Ready, Finalized, Failed };

  int rank = -1;
  int nranks = 0;
  int cuda_dev = -1;
  uint64_t comm_hash = 0;    // for logs: same on every rank
  bool checks = false;       // MESHCCL_CHECKS on any rank at init: every collective checks signatures
  int local_ranks = 0;       // ranks on this machine's cores (at least the parent's, for a split child)
  meshccl::WaitPolicy wait;  // how this communicator's waits poll
  meshccl::CommConfig config;
  // The plan-shaping settings, frozen at creation (rank 0's; a split or
  // shrink child's are its parent's).
  meshccl::PlanSettings settings;
  // How long an operation may make no progress: the config's timeout, else
  // MESHCCL_TIMEOUT as it is now.
  double timeout_s() const { return config.timeout_s > 0 ? config.timeout_s : meshccl::timeout_seconds(); }
  const char* timeout_source() const {
    return config.timeout_s > 0 ? "meshcclConfig_t.timeoutSeconds" : "MESHCCL_TIMEOUT";
  }
  std::atomic<State> state{State::Initializing};
  std::atomic<int> async_error{ncclSuccess};  // ncclInProgress while a non-blocking call runs
  std::atomic<bool> abort_flag{false};
  uint64_t serial = 0;       // unique per registration: a new comm at a freed one's address differs
  meshccl::CommSched sched;  // engine, algorithms and in-flight counts, as the scheduler sees them

  std::vector<meshccl::PeerInfo> peers;
  std::unique_ptr<meshccl::Bootstrap> bootstrap;
  std::unique_ptr<meshccl::Mesh> mesh;
  std::unique_ptr<meshccl::NodeRegion> node;  // null unless every rank is on this host
  std::unique_ptr<meshccl::Engine> engine;
  std::unique_ptr<meshccl::RunMaker> algorithms;  // the agreed cost model and the direct-or-plan decision
  meshccl::SystemGraph topo;                      // hosts, rank placement, link classes; agreed by every rank at init
  meshccl::TuneModel tune;                        // the agreed link costs (the algorithms hold their own copy)
  // A split or shrink child: its parent's agreed link costs, which its
  // setup takes instead of measuring the links again.
  std::optional<meshccl::TuneModel> parent_tune;
  std::thread async_thread;  // non-blocking init/split/finalize

  // Ordered on every rank the same way, so they name operations identically.
  uint64_t coll_seq = 0;
  meshccl::P2PSeq p2p_seq;  // point-to-point, per peer (and user tag)
  uint32_t split_seq = 0;
  uint32_t shrink_seq = 0;  // ncclCommShrink calls made on this communicator

  std::mutex ops_mu;
  std::vector<meshccl::DynamicOp> dyn_ops;

  // The message of the last call on this communicator that failed
  // (ncclGetLastError(comm)); guarded by error_mu.
  std::mutex error_mu;
  std::string last_error;

  // Known-dead peers, checked while operations wait.
  meshccl::Status check_peers(int* dead, const std::function<bool(int)>& matters);
};

namespace meshccl {

// Registry of live communicators, so a destroyed handle is recognised.
void comm_register(ncclComm* c);
void comm_unregister(ncclComm* c);
bool comm_is_live(const ncclComm* c);
// Holds c (sched.users, which destroy/abort wait for) if it is still the live
// communicator registered as `serial`; false when it was destroyed meanwhile,
// also by another thread. comm_unpin releases the hold.
bool comm_pin(ncclComm* c, uint64_t serial);
void comm_unpin(ncclComm* c);

// Init paths (collective). Blocking.
// Reads the settings again and checks them (MESHCCL_ALGO too): a refused
// value fails the communicator's creation, naming the variable set.
Status settings_refresh();
Status comm_init_rank(ncclComm* comm, int nranks, const ncclUniqueId& id, int rank);
Status comm_split(ncclComm* parent, int color, int key, ncclComm* child /* may be null: NOCOLOR */);
// ncclCommShrink on a survivor: child gets every rank of parent not in
// `excluded` (sorted, unique, without this rank). Agreement among the
// survivors only (src/comm/shrink.cpp), bounded by MESHCCL_TIMEOUT.
// Checks ncclCommShrink's exclude list (in range, no duplicates, not the
// caller, not every rank) and returns it sorted.
Status shrink_exclude_list(const ncclComm* comm, const int* list, int count, std::vector<int>* out);
Status comm_shrink(ncclComm* parent, const std::vector<int>& excluded, bool abort_parent, ncclComm* child);
// Connections, shared region, engine and tuning of a communicator whose
// rank, peers and bootstrap are set (init, split, shrink).
Status comm_finish_setup(ncclComm* comm);
Status comm_finalize(ncclComm* comm);
// Drives progress until every enqueued operation has completed (true) or the
// deadline passes (false).
bool comm_wait_idle(ncclComm* comm, Deadline dl);
// Frees everything without talking to peers.
void comm_free(ncclComm* comm);
// Applies the config rules of NCCL (size/version/magic, ranges, env overrides).
Status parse_config(const ncclConfig_t* in, CommConfig* out, const CommConfig* inherit);
// Priority scheduling, on or off for the whole communicator.
bool priority_on(const ncclComm* comm);
// A split or shrink child's config leaves its scheduling as its parent's.
inline bool child_priority_ok(const ncclComm* parent, const ncclComm* child) {
  return !child->config.priority_given || (child->config.priority != 0) == priority_on(parent);
}

}  // namespace meshccl
