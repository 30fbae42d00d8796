#include "plan_links.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "nccl_comm.h"

namespace meshtrain {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median seconds per call of `op` on rank 0 of an n-rank communicator, for
// each of the sizes (floats).
std::vector<double> time_on(int n, const std::vector<size_t>& sizes, int reps, void (*op)(NcclComm&, float*, size_t)) {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<double> out(sizes.size(), 0.0);
  std::string error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++) {
    threads.emplace_back([&, r] {
      try {
        ncclComm_t c = nullptr;
        check_nccl(ncclCommInitRank(&c, n, id, r), "ncclCommInitRank");
        NcclComm comm(c, comm_priority(CommSched::Priority, CommKind::Pipeline));  // the most urgent
        std::vector<float> buf(*std::max_element(sizes.begin(), sizes.end()), 1.0f);
        for (size_t k = 0; k < sizes.size(); k++) {
          op(comm, buf.data(), sizes[k]);  // warm-up: connections, first touch
          std::vector<double> t;
          for (int i = 0; i < reps; i++) {
            const double t0 = now();
            op(comm, buf.data(), sizes[k]);
            t.push_back(now() - t0);
          }
          std::sort(t.begin(), t.end());
          if (r == 0) out[k] = t[t.size() / 2];
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!error.empty()) throw std::runtime_error("measuring links: " + error);
  return out;
}

// t = alpha + bytes * beta through two points, clamped at zero.
LinkModel::Fit fit(int ranks, double b0, double t0, double b1, double t1) {
  LinkModel::Fit f;
  f.ranks = ranks;
  f.beta = std::max(0.0, (t1 - t0) / (b1 - b0));
  f.alpha = std::max(0.0, t0 - b0 * f.beta);
  return f;
}

}  // namespace

LinkModel measure_links(int world, int reps) {
  LinkModel m;
  const std::vector<size_t> sizes = {256, size_t(1) << 18};  // 1 KiB and 1 MiB
  for (int n = 2; n <= world; n++) {
    if (world % n) continue;
    const auto t = time_on(n, sizes, reps, [](NcclComm& c, float* b, size_t k) {
      c.all_reduce(b, k, ReduceOp::Sum, Urgency::critical()).wait();
    });
    const double v = 2.0 * (n - 1) / n * sizeof(float);
    m.collective.push_back(fit(n, v * sizes[0], t[0], v * sizes[1], t[1]));
  }
  if (world >= 2) {
    // Ping-pong: half a round trip per message.
    const auto t = time_on(2, sizes, reps, [](NcclComm& c, float* b, size_t k) {
      P2POp op;
      op.buf = b, op.count = k, op.peer = 1 - c.rank();
      for (int turn = 0; turn < 2; turn++) {
        op.send = (turn == 0) == (c.rank() == 0);
        c.exchange(&op, 1).wait();
      }
    });
    m.p2p = fit(2, sizes[0] * 4.0, t[0] / 2, sizes[1] * 4.0, t[1] / 2);
  }
  return m;
}

}  // namespace meshtrain
