#include "plan_links.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/resource.h>

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

// The lower quartile of seconds per call of `op` on this rank's communicator
// `comm`, for each of the sizes (floats), and the cores this process kept busy during the
// calls of the last size. Every rank of `world` calls it at once, and every
// call starts after a barrier of the world, so that all groups run together,
// as a layout's groups do.
struct Timed {
  std::vector<double> t;
  double cpu = 0;
};

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

void barrier(ncclComm_t world) {
  float token = 0;
  check_nccl(ncclAllReduce(&token, &token, 1, ncclFloat32, ncclSum, world, nullptr), "ncclAllReduce", world);
}

Timed time_comm(ncclComm_t world, NcclComm& comm, const std::vector<size_t>& sizes, int reps,
                void (*op)(NcclComm&, float*, size_t)) {
  // Twice the largest size: exchanges receive into the second half.
  std::vector<float> buf(2 * *std::max_element(sizes.begin(), sizes.end()), 1.0f);
  Timed out;
  for (size_t k = 0; k < sizes.size(); k++) {
    op(comm, buf.data(), sizes[k]);  // warm-up: connections, first touch
    std::vector<double> t;
    double cpu = 0, wall = 0;
    for (int i = 0; i < reps; i++) {
      barrier(world);
      const double c0 = cpu_seconds(), t0 = now();
      op(comm, buf.data(), sizes[k]);
      t.push_back(now() - t0);
      cpu += cpu_seconds() - c0, wall += t.back();
    }
    out.cpu = cpu / std::max(1e-9, wall);
    // The lower quartile: other work on shared cores only slows a call down
    // (a descheduled rank turned a 0.1 ms exchange into 8 ms medians at a
    // load average of 10), and the groups still start together in every call.
    std::sort(t.begin(), t.end());
    out.t.push_back(t[t.size() / 4]);
  }
  return out;
}

// What a rank outside every measured group does meanwhile: the barriers.
Timed idle(ncclComm_t world, size_t sizes, int reps) {
  for (size_t k = 0; k < sizes * reps; k++) barrier(world);
  return Timed{std::vector<double>(sizes, 0.0), 0.0};
}

void all_reduce_op(NcclComm& c, float* b, size_t k) { c.all_reduce(b, k, ReduceOp::Sum, Urgency::critical()).wait(); }

// Both ranks of a pair send k floats to each other at once (the second half
// of b receives): with every pair of a stride doing the same, each link
// carries as many messages at once as a pipeline's boundary does.
void exchange_op(NcclComm& c, float* b, size_t k) {
  P2POp ops[2];
  ops[0].buf = b, ops[0].count = k, ops[0].peer = 1 - c.rank(), ops[0].send = true;
  ops[1].buf = b + k, ops[1].count = k, ops[1].peer = 1 - c.rank(), ops[1].send = false;
  c.exchange(ops, 2).wait();
}

// Ping-pong: each call is one round trip.
void ping_pong_op(NcclComm& c, float* b, size_t k) {
  P2POp op;
  op.buf = b, op.count = k, op.peer = 1 - c.rank();
  for (int turn = 0; turn < 2; turn++) {
    op.send = (turn == 0) == (c.rank() == 0);
    c.exchange(&op, 1).wait();
  }
}

}  // namespace

LinkModel measure_links_on(ncclComm_t world, int reps, const std::vector<size_t>& at_floats) {
  int me = 0, n_world = 1;
  check_nccl(ncclCommUserRank(world, &me), "ncclCommUserRank", world);
  check_nccl(ncclCommCount(world, &n_world), "ncclCommCount", world);
  LinkModel m;
  // 1 KiB and 1 MiB for alpha and beta, and the sizes asked for in between.
  constexpr size_t kSmall = 256, kLarge = size_t(1) << 18;
  std::vector<size_t> sizes = {kSmall, kLarge};
  for (size_t k : at_floats) {
    if (k > kSmall && k < kLarge) sizes.push_back(k);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // The fit through 1 KiB and 1 MiB, with every measured point (bytes = unit x floats).
  auto curve = [&](int ranks, double unit, const std::vector<double>& t) {
    LinkModel::Fit f = fit(ranks, unit * kSmall, t.front(), unit * kLarge, t.back());
    if (sizes.size() > 2) {
      for (size_t i = 0; i < sizes.size(); i++) {
        f.at_bytes.push_back(unit * sizes[i]);
        f.at_seconds.push_back(t[i]);
      }
    }
    return f;
  };
  auto split = [&](int color, int key) {
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(world, color, key, &child, nullptr), "ncclCommSplit", world);
    return std::make_unique<NcclComm>(child, comm_priority(CommSched::Priority, CommKind::Pipeline));
  };
  // The slowest measuring rank's times go to every rank (a layout's step
  // waits for its slowest group), with the measuring ranks' mean CPU use.
  auto share = [&](const Timed& mine, bool measuring) {
    Timed all = mine;
    if (!measuring) std::fill(all.t.begin(), all.t.end(), 0.0);
    check_nccl(ncclAllReduce(all.t.data(), all.t.data(), all.t.size(), ncclFloat64, ncclMax, world, nullptr),
               "ncclAllReduce", world);
    double cpu[2] = {measuring ? mine.cpu : 0.0, measuring ? 1.0 : 0.0};
    check_nccl(ncclAllReduce(cpu, cpu, 2, ncclFloat64, ncclSum, world, nullptr), "ncclAllReduce", world);
    all.cpu = cpu[0] / std::max(1.0, cpu[1]);
    return all;
  };
  for (int n = 2; n <= n_world; n++) {
    if (n_world % n) continue;
    for (int s = 1; n * s <= n_world; s++) {
      if (n_world % (n * s)) continue;
      // Groups of n ranks s apart: block b = me / (n s) holds s groups.
      const int off = me % (n * s);
      auto comm = split((me / (n * s)) * s + off % s, off / s);
      const Timed t = share(time_comm(world, *comm, sizes, reps, all_reduce_op), true);
      LinkModel::Fit f = curve(n, 2.0 * (n - 1) / n * sizeof(float), t.t);
      f.stride = s;
      f.cpu = t.cpu;
      m.collective.push_back(f);
    }
  }
  for (int s = 1; 2 * s <= n_world; s++) {
    if (n_world % (2 * s)) continue;
    // Pairs s apart: the rows u = r / s and u + 1 with u - phase even (phase
    // 1 leaves the first and the last row without a partner).
    const int rows = n_world / s, u = me / s;
    for (int phase = 0; phase < (rows >= 4 ? 2 : 1); phase++) {
      const int v = u - phase;
      const bool paired = v >= 0 && (v % 2 == 1 || u + 1 < rows);
      std::unique_ptr<NcclComm> comm;
      if (paired) {
        comm = split((v / 2) * s + me % s, v % 2);
      } else {
        ncclComm_t none = nullptr;
        check_nccl(ncclCommSplit(world, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr), "ncclCommSplit", world);
      }
      const Timed mine = comm ? time_comm(world, *comm, sizes, reps, exchange_op) : idle(world, sizes.size(), reps);
      const Timed t = share(mine, comm != nullptr);
      LinkModel::Fit f = curve(2, sizeof(float), t.t);
      f.stride = s;
      f.phase = phase;
      f.cpu = t.cpu;
      m.p2p_strided.push_back(f);
      if (s == 1 && phase == 0) m.p2p = f;
    }
  }
  return m;
}

LinkModel measure_links(int world, int reps) {
  LinkModel m;
  const std::vector<size_t> sizes = {256, size_t(1) << 18};  // 1 KiB and 1 MiB
  for (int n = 2; n <= world; n++) {
    if (world % n) continue;
    const auto t = time_on(n, sizes, reps, all_reduce_op);
    const double v = 2.0 * (n - 1) / n * sizeof(float);
    m.collective.push_back(fit(n, v * sizes[0], t[0], v * sizes[1], t[1]));
  }
  if (world >= 2) {
    // Ping-pong: half a round trip per message.
    const auto t = time_on(2, sizes, reps, ping_pong_op);
    m.p2p = fit(2, sizes[0] * 4.0, t[0] / 2, sizes[1] * 4.0, t[1] / 2);
  }
  return m;
}

}  // namespace meshtrain
