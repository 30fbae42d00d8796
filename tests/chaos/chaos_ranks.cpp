// One rank of a chaos job (tests/chaos/chaos.sh, under meshrun --keep-going):
// a long mixed workload (AllReduce, Broadcast, AllGather, ReduceScatter, a
// send/recv ring, split + AllReduce on the split), every op of random count
// and datatype drawn from a seed shared by all ranks, every element checked.
//
// While the harness injects faults, each op ends with a correct result or an
// error. After an error the rank reads $CHAOS_DIR/killed (the original ranks
// the harness SIGKILLed, written before the kill); if some of them are still
// members, the survivors shrink (NCCL_SHRINK_ABORT), agree on the first op
// any of them failed, and go on from there with the smaller communicator.
// Otherwise (a stopped rank, a link down past MESHCCL_TIMEOUT) the rank ends
// with the error.
//
//   chaos_ranks OPS SEED
//
// Last line: "chaos: rank R ops N errors E shrinks S wrong W result OUTCOME";
// exit 0 (every op done), 3 (ended with a clear error), 4 (a wrong answer).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Type {
  ncclDataType_t dt;
  size_t size;
};
const Type kTypes[] = {{ncclFloat32, 4}, {ncclInt32, 4}, {ncclFloat64, 8}, {ncclInt64, 8}};

void put(const Type& t, void* base, size_t i, double v) {
  char* p = static_cast<char*>(base) + i * t.size;
  switch (t.dt) {
    case ncclFloat32: *reinterpret_cast<float*>(p) = static_cast<float>(v); break;
    case ncclInt32: *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case ncclFloat64: *reinterpret_cast<double*>(p) = v; break;
    default: *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
  }
}
double get(const Type& t, const void* base, size_t i) {
  const char* p = static_cast<const char*>(base) + i * t.size;
  switch (t.dt) {
    case ncclFloat32: return *reinterpret_cast<const float*>(p);
    case ncclInt32: return *reinterpret_cast<const int32_t*>(p);
    case ncclFloat64: return *reinterpret_cast<const double*>(p);
    default: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
  }
}

// The value original rank `id` contributes at element e of op i: small
// integers, exact in every type and sum.
double value(int id, uint64_t i, size_t e) { return static_cast<double>((id * 7 + i * 3 + e) % 5 + 1); }

enum Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kRing, kSplit, kKinds };
const char* kKindNames[] = {"AllReduce", "Broadcast", "AllGather", "ReduceScatter", "SendRecv", "Split"};

struct OpSpec {
  Kind kind;
  Type type;
  size_t count;
};

OpSpec draw(uint64_t seed, uint64_t i) {
  std::mt19937_64 rng(seed * 1000003u + i);
  OpSpec s;
  s.kind = static_cast<Kind>(rng() % kKinds);
  s.type = kTypes[rng() % 4];
  const unsigned band = rng() % 10;
  s.count = band < 4 ? rng() % 65 : band < 8 ? rng() % 8193 : rng() % 262145;
  return s;
}

struct State {
  int rank;              // in the current communicator
  std::vector<int> ids;  // original rank of each member
  long wrong = 0;
};

// Returns ncclSuccess or the op's error; a wrong element counts in st->wrong.
ncclResult_t run_op(ncclComm_t comm, State* st, uint64_t i, const OpSpec& op) {
  const int n = static_cast<int>(st->ids.size()), r = st->rank, me = st->ids[r];
  const Type& t = op.type;
  const size_t c = op.count;
  std::vector<char> in, out;
  auto check = [&](size_t e, double want) {
    double got = get(t, out.data(), e);
    if (got != want) {
      if (st->wrong++ < 5)
        std::fprintf(stderr, "rank %d: WRONG %s op %llu element %zu of %zu: %g, want %g\n", me, kKindNames[op.kind],
                     static_cast<unsigned long long>(i), e, c, got, want);
    }
  };
  ncclResult_t res = ncclSuccess;
  switch (op.kind) {
    case kAllReduce: {
      in.resize(c * t.size);
      out.resize(c * t.size);
      for (size_t e = 0; e < c; ++e) put(t, in.data(), e, value(me, i, e));
      res = ncclAllReduce(in.data(), out.data(), c, t.dt, ncclSum, comm, nullptr);
      if (res == ncclSuccess)
        for (size_t e = 0; e < c; ++e) {
          double want = 0;
          for (int k : st->ids) want += value(k, i, e);
          check(e, want);
        }
      break;
    }
    case kBroadcast: {
      const int root = static_cast<int>(i % static_cast<uint64_t>(n));
      out.resize(c * t.size);
      for (size_t e = 0; e < c; ++e) put(t, out.data(), e, r == root ? value(me, i, e) : -1);
      res = ncclBroadcast(out.data(), out.data(), c, t.dt, root, comm, nullptr);
      if (res == ncclSuccess)
        for (size_t e = 0; e < c; ++e) check(e, value(st->ids[root], i, e));
      break;
    }
    case kAllGather: {
      const size_t per = c / static_cast<size_t>(n) + 1;
      in.resize(per * t.size);
      out.resize(per * n * t.size);
      for (size_t e = 0; e < per; ++e) put(t, in.data(), e, value(me, i, e));
      res = ncclAllGather(in.data(), out.data(), per, t.dt, comm, nullptr);
      if (res == ncclSuccess)
        for (int k = 0; k < n; ++k)
          for (size_t e = 0; e < per; ++e) check(k * per + e, value(st->ids[k], i, e));
      break;
    }
    case kReduceScatter: {
      const size_t per = c / static_cast<size_t>(n) + 1;
      in.resize(per * n * t.size);
      out.resize(per * t.size);
      for (size_t e = 0; e < per * n; ++e) put(t, in.data(), e, value(me, i, e));
      res = ncclReduceScatter(in.data(), out.data(), per, t.dt, ncclSum, comm, nullptr);
      if (res == ncclSuccess)
        for (size_t e = 0; e < per; ++e) {
          double want = 0;
          for (int k : st->ids) want += value(k, i, r * per + e);
          check(e, want);
        }
      break;
    }
    case kRing: {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      in.resize(c * t.size);
      out.resize(c * t.size);
      for (size_t e = 0; e < c; ++e) put(t, in.data(), e, value(me, i, e));
      ncclGroupStart();
      ncclResult_t rs = ncclSend(in.data(), c, t.dt, next, comm, nullptr);
      ncclResult_t rr = ncclRecv(out.data(), c, t.dt, prev, comm, nullptr);
      res = ncclGroupEnd();
      if (res == ncclSuccess) res = rs != ncclSuccess ? rs : rr;
      if (res == ncclSuccess)
        for (size_t e = 0; e < c; ++e) check(e, value(st->ids[prev], i, e));
      break;
    }
    case kSplit: {
      ncclComm_t sub = nullptr;
      const int color = me % 2;
      res = ncclCommSplit(comm, color, r, &sub, nullptr);
      if (res != ncclSuccess) break;
      in.resize(c * t.size);
      out.resize(c * t.size);
      for (size_t e = 0; e < c; ++e) put(t, in.data(), e, value(me, i, e));
      res = ncclAllReduce(in.data(), out.data(), c, t.dt, ncclSum, sub, nullptr);
      if (res == ncclSuccess)
        for (size_t e = 0; e < c; ++e) {
          double want = 0;
          for (int k : st->ids)
            if (k % 2 == color) want += value(k, i, e);
          check(e, want);
        }
      if (res == ncclSuccess) res = ncclCommDestroy(sub);
      else ncclCommAbort(sub);
      break;
    }
    default: break;
  }
  return res;
}

// The original ranks the harness has killed (its file, read until it
// settles for a moment or `wait_s` passes).
std::vector<int> read_killed(double wait_s) {
  const char* dir = std::getenv("CHAOS_DIR");
  std::vector<int> out;
  if (dir == nullptr) return out;
  auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < wait_s) {
    out.clear();
    std::ifstream f(std::string(dir) + "/killed");
    int k;
    while (f >> k) out.push_back(k);
    if (!out.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: chaos_ranks OPS SEED\n");
    return 2;
  }
  const uint64_t ops = std::strtoull(argv[1], nullptr, 10);
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const char* rank_env = std::getenv("MESHCCL_RANK");
  const char* size_env = std::getenv("MESHCCL_NRANKS");
  if (!rank_env || !size_env) {
    std::fprintf(stderr, "chaos_ranks: run under meshrun\n");
    return 2;
  }
  const int id = std::atoi(rank_env), nranks = std::atoi(size_env);
  std::unique_ptr<std::string> progress;
  if (const char* dir = std::getenv("CHAOS_DIR")) {
    std::ofstream(std::string(dir) + "/pid." + std::to_string(id)) << getpid() << "\n";
    progress = std::make_unique<std::string>(std::string(dir) + "/progress." + std::to_string(id));
  }
  const std::string* progress_path = progress.get();
  ncclComm_t comm = nullptr;
  ncclResult_t res = meshcclCommInitFromEnv(&comm, nullptr);
  if (res != ncclSuccess) {
    std::printf("chaos: rank %d ops 0 errors 1 shrinks 0 wrong 0 result init-error: %s\n", id,
                ncclGetLastError(nullptr));
    return 3;
  }
  State st;
  st.rank = id;
  for (int k = 0; k < nranks; ++k) st.ids.push_back(k);
  long done = 0, errors = 0, shrinks = 0;
  std::string outcome = "ok";
  int code = 0;
  for (uint64_t i = 0; i < ops;) {
    const OpSpec op = draw(seed, i);
    auto t0 = Clock::now();
    res = run_op(comm, &st, i, op);
    if (st.wrong > 0) {
      outcome = "WRONG";
      code = 4;
      break;
    }
    if (res == ncclSuccess) {
      ++done;
      ++i;
      // The harness tells a slow job from a hung one by this count.
      if (done % 25 == 0 && progress_path != nullptr) std::ofstream(*progress_path) << done << "\n";
      continue;
    }
    ++errors;
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "rank %d: op %llu %s count %zu failed after %.2f s: %s: %s\n", id,
                 static_cast<unsigned long long>(i), kKindNames[op.kind], op.count, took, ncclGetErrorString(res),
                 ncclGetLastError(nullptr));
    std::vector<int> killed = read_killed(2.0);
    std::vector<int> excl;
    for (int k : killed) {
      auto it = std::find(st.ids.begin(), st.ids.end(), k);
      if (it != st.ids.end() && k != id) excl.push_back(static_cast<int>(it - st.ids.begin()));
    }
    if (excl.empty()) {
      outcome = std::string("error: ") + ncclGetErrorString(res);
      code = 3;
      break;
    }
    ncclComm_t child = nullptr;
    res = ncclCommShrink(comm, excl.data(), static_cast<int>(excl.size()), &child, nullptr, NCCL_SHRINK_ABORT);
    ncclCommAbort(comm);
    comm = nullptr;
    if (res != ncclSuccess) {
      std::fprintf(stderr, "rank %d: ncclCommShrink failed: %s: %s\n", id, ncclGetErrorString(res),
                   ncclGetLastError(nullptr));
      outcome = std::string("shrink-error: ") + ncclGetErrorString(res);
      code = 3;
      break;
    }
    comm = child;
    ++shrinks;
    std::vector<int> ids;
    for (size_t k = 0; k < st.ids.size(); ++k)
      if (std::find(excl.begin(), excl.end(), static_cast<int>(k)) == excl.end()) ids.push_back(st.ids[k]);
    st.ids = ids;
    ncclCommUserRank(comm, &st.rank);
    // Resume at the first op that any survivor failed (some may have
    // finished it, or even failed the next one).
    int64_t at = static_cast<int64_t>(i), first = 0;
    res = ncclAllReduce(&at, &first, 1, ncclInt64, ncclMin, comm, nullptr);
    if (res != ncclSuccess) {
      outcome = std::string("error after shrink: ") + ncclGetErrorString(res);
      code = 3;
      break;
    }
    std::fprintf(stderr, "rank %d: shrunk to %zu ranks (rank %d), resuming at op %lld\n", id, st.ids.size(), st.rank,
                 static_cast<long long>(first));
    i = static_cast<uint64_t>(first);
  }
  if (comm != nullptr) {
    if (code == 0) res = ncclCommDestroy(comm);
    else ncclCommAbort(comm);
    if (code == 0 && res != ncclSuccess) {
      outcome = std::string("destroy-error: ") + ncclGetErrorString(res);
      code = 3;
    }
  }
  std::printf("chaos: rank %d ops %ld errors %ld shrinks %ld wrong %ld result %s\n", id, done, errors, shrinks,
              st.wrong, outcome.c_str());
  std::fflush(stdout);
  return code;
}
