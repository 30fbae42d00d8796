// The progress engine of one communicator: it schedules runs (plans, and
// algorithms that keep their own state) by priority; plans post their
// transfers through Links and do their local work on an Executor; failures
// travel to the peers as Notices. Whoever waits drives progress (the calling
// thread for a NULL stream, a host stream's worker otherwise), one thread at
// a time, others back off. Steps of more urgent operations (lower priority
// value) are started first.
#pragma once

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sched/executor.h"
#include "sched/links.h"
#include "sched/notices.h"
#include "sched/plan.h"
#include "sched/scratch.h"
#include "transport/mesh.h"
#include "util/status.h"
#include "util/wait.h"

namespace meshccl {

// Completion of one submitted operation, shared by the engine and waiters.
struct OpHandle {
  std::atomic<bool> done{false};
  std::atomic<bool> settled{false};  // taken by the one thread that completes it
  Status status;                     // valid once done
  std::string message;               // the failure's text, valid once done with an error
};

class Engine;

// One submitted operation as the engine sees it: a plan being run, or an
// algorithm that keeps its own state (the shared-memory direct algorithms).
// Polled only by the thread driving the engine.
class Run {
 public:
  virtual ~Run() = default;
  // Called once, at submission.
  virtual void start(ScratchPool& /*pool*/) {}
  // Advances as far as possible without blocking; *moved when anything did.
  virtual Status poll(Engine* eng, bool* moved) = 0;
  virtual bool finished() const = 0;
  // After a failed poll: nothing of the operation is in flight (a signature
  // check that gates the data failed), so it can fail by itself and leave the
  // communicator usable.
  virtual bool can_end_alone() const { return false; }
  // A peer this operation waits for (for timeout messages), or -1.
  virtual int waiting_on() const { return -1; }
  // Whether the operation fails when peer has died. An operation that finds
  // out by itself which peers are gone and does without them (a receive from
  // any source still looking for its message) says no.
  virtual bool depends_on(int /*peer*/) const { return true; }
  // True once the operation's caller may go on although the run has not
  // finished: it reads and writes none of the caller's buffers any more (an
  // eager send whose data was copied aside). The engine then completes the
  // operation's handle and runs the rest in the background; a failure after
  // that fails the communicator, and the next call reports it.
  virtual bool let_go() const { return false; }
  // After a failed poll: the peer whose transfer failed, or -1.
  virtual int failed_peer() const { return -1; }
  // A collective plan: its signature and its number in the communicator's
  // sequence of collectives.
  virtual bool call(OpSignature* /*sig*/, uint64_t* /*seq*/) const { return false; }
  // Called once finished or failed and no longer referenced by transports.
  virtual void release(ScratchPool& /*pool*/) {}

  // The operation's name, for the trace.
  virtual const char* name() const { return "operation"; }
  int priority() const { return priority_; }
  // A run that drives runs of its own (an operation in phases) gives them
  // its priority before starting them.
  void inherit_priority(const Run& parent) { priority_ = parent.priority_; }
  const std::shared_ptr<OpHandle>& handle() const { return handle_; }

 private:
  friend class Engine;
  int priority_ = 0;
  double submitted_us_ = 0;           // for the trace
  std::shared_ptr<OpHandle> handle_;  // made at submission
  Status error_;                      // set when it failed by itself
  bool let_go_ = false;               // its handle completed before it finished
};

// A run of `plan`, whose messages carry tag_base (unique per operation and
// identical on every rank, see api/enqueue) in their upper bits.
std::unique_ptr<Run> make_plan_run(std::unique_ptr<Plan> plan, uint64_t tag_base);

// The engines one waiting thread polls and blocks for, claimed for the
// length of its idle stretch: one thread at a time per engine. Several
// threads wait on one engine when several host streams run work of one
// communicator, and each polled through its own stretch after every chunk
// and woke for every packet (meshtrain with priority scheduling, 2 hosts at
// 100 Mbit/s: its three stream threads used 0.28-0.34 of a core between
// them, where FIFO's one used 0.01-0.02). The others sleep in steps; the
// one that holds the claim drives the engine, and with it their runs.
class FdClaims {
 public:
  FdClaims() = default;
  FdClaims(const FdClaims&) = delete;
  FdClaims& operator=(const FdClaims&) = delete;
  ~FdClaims() { release(); }
  // Claims an engine's flag (true when this thread holds it already); false,
  // and other() from then on, when another thread holds it.
  bool take(std::atomic<bool>* flag) {
    if (std::find(held_.begin(), held_.end(), flag) != held_.end()) return true;
    bool expected = false;
    if (!flag->compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      other_ = true;
      return false;
    }
    held_.push_back(flag);
    return true;
  }
  // Lets go of every claim.
  void release() {
    for (std::atomic<bool>* f : held_) f->store(false, std::memory_order_release);
    held_.clear();
  }
  // And forgets other().
  void reset() {
    release();
    other_ = false;
  }
  bool held() const { return !held_.empty(); }
  bool other() const { return other_; }
  // A transport answered "not now" to the last gather: it has events that
  // its next test takes in (UCX's ucp_worker_arm says busy), after which it
  // can be armed.
  void not_now() { not_now_ = true; }
  bool said_not_now() const { return not_now_; }
  void clear_not_now() { not_now_ = false; }

 private:
  std::vector<std::atomic<bool>*> held_;
  bool other_ = false;
  bool not_now_ = false;
};

// The idle step of a wait that drives engines (after a pass that moved
// nothing). At the first idle step after progress it claims its engines
// (gather: their wait descriptors, and FdClaims); while another thread holds
// one of them, it sleeps in steps and asks again. Once its backoff would
// sleep, or it has polled for policy.fd_after_ns since its last progress, and
// MESHCCL_WAIT_FD allows, it blocks in ppoll for at most kMaxNs on the wait
// descriptors its engines' transfers give (gather fills them; false: some
// transfer has none, e.g. on shared memory, which stays on the polling path,
// or another thread holds the engine; gather is then asked again after
// another fd_after_ns), else backoff.idle(). After kFruitless wakes in a row
// that moved nothing (a descriptor ready for something no transfer waits for,
// or another thread took what woke this one) the wait sleeps in steps until
// its next progress. A transport that answers "not now" (events pending that
// its next test takes in) gets that test at once and is asked again, without
// a sleep, up to kNotNow times in a row; a sleep step there made every
// transfer of a rank whose UCX worker had events pending wait up to 1 ms
// (ucx between all ranks, hierarchical AllReduce on a stream, 2 hosts x 2
// ranks: 7.7 ms per 32 KiB AllReduce against 1.55 ms over sockets).
// A wait whose recent idle stretches (Backoff::gap_ns, smoothed) lasted at
// least kPacedPolls x the poll time blocks at its first idle step: polling
// would rarely see the next progress, which a network link paces (2 hosts at
// 100 Mbit/s, meshtrain's gradient buckets under priority scheduling:
// 0.64-0.66 of a core per rank before, 0.56-0.59 after, same ms/step).
// Claims last until moved() or the waiter's end.
class FdWaiter {
 public:
  static constexpr long kMaxNs = 5000000;
  static constexpr int kFruitless = 8;
  static constexpr int kNotNow = 64;
  static constexpr long kPacedPolls = 10;
  void moved() {
    woke_ = false;
    fruitless_ = 0;
    not_now_ = 0;
    retry_ns_ = 0;
    asked_ = false;
    claims_.reset();
  }
  template <class Gather>
  void idle(Backoff& backoff, const WaitPolicy& policy, Gather&& gather) {
    if (woke_) ++fruitless_;
    woke_ = false;
    if (policy.fd && (!asked_ || claims_.other())) {
      asked_ = true;
      claims_.reset();
      fds_.clear();
      if (!gather(&fds_, &claims_)) claims_.release();
      if (claims_.other()) {
        backoff.idle_sleeping();
        return;
      }
    }
    const bool sleeps = backoff.sleeps_next();
    const long idle_ns = sleeps ? 0 : backoff.idle_ns();
    // Polled long enough: for the poll time, or not at all when the recent
    // stretches were far longer than it (a poll would not see the next
    // progress).
    const bool polled = idle_ns >= policy.fd_after_ns || backoff.gap_ns() >= kPacedPolls * policy.fd_after_ns;
    if (policy.fd && fruitless_ < kFruitless && (sleeps || (polled && idle_ns >= retry_ns_))) {
      fds_.clear();
      claims_.clear_not_now();
      if (gather(&fds_, &claims_)) {
        not_now_ = 0;
        int n = 0;
        backoff.idle_by([&] { n = block(); });
        woke_ = n > 0;
        return;
      }
      if (claims_.other()) {
        backoff.idle_sleeping();
        return;
      }
      if (claims_.said_not_now() && not_now_ < kNotNow) {
        ++not_now_;
        backoff.yield_only();  // the next poll tests, then this asks again
        return;
      }
      retry_ns_ = idle_ns + policy.fd_after_ns;
    }
    backoff.idle();
  }

 private:
  int block();
  std::vector<pollfd> fds_;
  FdClaims claims_;
  bool asked_ = false;  // claims_ asked for in this idle stretch
  bool woke_ = false;
  int fruitless_ = 0;  // wakes in a row that moved nothing
  int not_now_ = 0;    // "not now" answers in a row
  long retry_ns_ = 0;  // idle time before gather is asked again (it found no descriptors for all)
};

class Engine {
 public:
  // liveness: called when an operation makes no progress for a while; returns
  // an error (and sets its first argument to the rank) when a peer is known
  // dead, among the peers for which its second argument says true.
  using Liveness = std::function<Status(int*, const std::function<bool(int)>&)>;
  Engine(int rank, Mesh* mesh, std::atomic<bool>* abort, Liveness liveness, WaitPolicy wait = WaitPolicy::standalone());
  ~Engine();

  // How long an operation may make no progress before it fails: the
  // communicator's own timeout (0: MESHCCL_TIMEOUT as it is now), and where
  // it came from, for the message. Before any operation.
  void set_timeout(double seconds, const char* source) {
    timeout_s_ = seconds;
    timeout_source_ = source;
  }
  double timeout() const;

  std::shared_ptr<OpHandle> submit(std::unique_ptr<Run> run, int priority);
  // One pass over the active operations; false when nothing moved or another
  // thread holds the engine.
  bool progress();
  // Drives progress until op completes, with timeout and liveness checks.
  Status wait(OpHandle& op);

  // For loops that drive several engines: fails op's communicator when it was
  // aborted, a peer is known dead, or nothing moved for MESHCCL_TIMEOUT.
  // Cheap unless nothing has moved for 100 ms.
  void check_stalled(OpHandle& op);
  // Takes in the stall probes peers sent (Probes::collect), at most once a
  // second and not during a stall (check_stalled does it then): also for a
  // rank whose operations complete without waiting. now: now_us().
  void collect_probes(double now);
  // Marks the communicator failed: every active and later operation ends with
  // `s`. first: the rank whose failure came first (-1: this one); a peer's
  // failure is named in the message ("rank F failed first"). Takes mu_.
  void fail_all(Status s, int first = -1);
  // Runs that let their callers go and have not finished (see Run::let_go).
  bool has_background() const { return background_.load(std::memory_order_acquire) > 0; }
  // Runs submitted and not finished, background runs included.
  bool busy() const { return nactive_.load(std::memory_order_acquire) > 0; }
  // One pass for the thread that finishes background runs: true only when
  // it held the engine and something moved.
  bool background_progress();
  // The background thread lets go of this engine (before its transports
  // close); background runs then move only when a caller drives the engine.
  void stop_background();
  Status fatal() const { return Status(static_cast<ncclResult_t>(fatal_.load())); }
  // For a run's poll that loops (passes of a plan): true when a more urgent
  // run than `priority` waits for the engine, submitted since the pass began
  // or active and unfinished. The run then returns after its current pass, so
  // that the engine polls the urgent one first: one poll of a bulk plan may
  // otherwise move many chunks and reduce them before an urgent operation
  // submitted meanwhile posts anything.
  bool urgent_waiting(int priority) const {
    return std::min(incoming_top_.load(std::memory_order_relaxed), active_top_) < priority;
  }
  ScratchPool& scratch() { return scratch_; }
  Links& links() { return links_; }  // only by the thread driving progress
  Executor& executor() { return *exec_; }
  Mesh* mesh() const { return mesh_; }
  int rank() const { return rank_; }
  const WaitPolicy& wait_policy() const { return wait_; }
  // Appends the armed wait descriptors of the transfers in flight
  // (Links::wait_fds) and claims the engine for the caller's wait; false
  // when the engine cannot wait on descriptors now: a transfer has none
  // (shared memory), another thread drives it, or another thread's wait
  // holds its claim (claims->other()).
  bool wait_fds(std::vector<pollfd>* out, FdClaims* claims);

 private:
  void progress_locked(bool* moved);
  // Completes run's handle with s (once).
  void settle(Run* run, Status s);
  // The run leaves the active set: its handle completes if it has not.
  void retire(Run* run, Status s);
  // fail_all with mu_ held: mark_failed, then end_runs.
  void fail_locked(Status s, int first = -1);
  // Records the communicator's failure (the first one wins) and its text.
  void mark_failed(Status s, int first);
  // Withdraws every transfer the transports still hold (the callers' buffers
  // may be freed once their handles complete), then completes every run's
  // handle with the failure (with mu_ held).
  void end_runs();
  // Fails the communicator and tells the peers (with mu_ held): the notices
  // leave before the runs end, while the callers' buffers are still theirs.
  void fail_and_notify(Status s, int first, bool suspect = false);
  void fail_suspecting(Status s);
  Status compare_with_peers();
  int rank_;
  Mesh* mesh_;
  std::atomic<bool>* abort_;
  Liveness liveness_;
  WaitPolicy wait_;
  Executor* exec_;
  ScratchPool scratch_;
  Links links_;      // with mu_ held
  Notices notices_;  // with mu_ held
  Probes probes_;    // with mu_ held
  std::mutex mu_;    // held by the thread driving progress
  std::mutex incoming_mu_;
  std::vector<std::unique_ptr<Run>> incoming_;
  // The most urgent priority in incoming_ (kNoRun when empty), and of the
  // unfinished active runs at the start of the pass (with mu_ held).
  static constexpr int kNoRun = 1 << 30;
  std::atomic<int> incoming_top_{kNoRun};
  int active_top_ = kNoRun;
  // Moves incoming_ into active_, in priority order (with mu_ held).
  void take_incoming();
  std::vector<std::unique_ptr<Run>> active_;  // sorted by priority, then submission
  std::atomic<size_t> nactive_{0};
  std::atomic<size_t> background_{0};
  bool wants_background_ = false;  // with mu_ held: a run was let go in this pass
  std::atomic<int> fatal_{ncclSuccess};
  double timeout_s_ = 0;
  const char* timeout_source_ = "MESHCCL_TIMEOUT";
  std::string fatal_text_;  // the failure's text, set once with fatal_ (under incoming_mu_)
  std::vector<std::unique_ptr<Run>> graveyard_;
  std::atomic<double> last_progress_us_{0};
  std::atomic<bool> fd_claimed_{false};  // a thread's wait polls and blocks for this engine (FdClaims)
  std::atomic<double> last_check_us_{0};
  std::atomic<double> last_collect_us_{0};  // Probes::collect outside a stall (check_stalled)
};

}  // namespace meshccl
