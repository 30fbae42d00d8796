// Priority scheduling (docs/priority.md): chunk order on a link, that no
// transfer starves or deadlocks on credit, and that every collective is
// correct while it overtakes a bulk operation chunk by chunk. Ranks are
// threads of this process; plans only (no shared region), the smallest chunks
// (128 KiB on shm, 16 KiB on sockets).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <cstdio>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "comm/comm.h"
#include "sched/engine.h"
#include "sched/links.h"
#include "sched/stream.h"
#include "tests/common/harness.h"
#include "tests/common/priority_streams.h"

namespace {

using meshccl_test::run_ranks;
using meshccl_test::ScopedEnv;

using meshccl_test::cu;
using meshccl_test::Streams;

// Pumps one rank's links until `done` holds, at most 30 s.
template <class F>
bool pump_until(meshccl::Links& links, F done, const std::function<void()>& after_pump = {}) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    bool moved = false;
    links.pump(&moved);
    if (after_pump) after_pump();
    if (std::chrono::steady_clock::now() > end) return false;
  }
  return true;
}

class LinkOrder : public ::testing::TestWithParam<std::string> {};

// An urgent transfer posted behind a bulk one on the same link: while it has
// bytes left to post, the bulk transfer posts at most one chunk per pass (only
// when it has none in flight: the credit goes to the urgent one), and the
// urgent one finishes first.
TEST_P(LinkOrder, UrgentOvertakesBulkChunkByChunk) {
  // The network's bandwidth is pinned: the smallest chunk must not depend on a measurement.
  ScopedEnv env({{"MESHCCL_TRANSPORT", GetParam()},
                 {"MESHCCL_CHUNK_US", "1"},
                 {"MESHCCL_LINK_CREDIT", "4"},
                 {"MESHCCL_PRIORITY", "1"},
                 {"MESHCCL_TUNE_NET_BW_GBS", "1"}});
  constexpr uint64_t kBulkTag = (uint64_t{1} << 61) | 1, kUrgentTag = (uint64_t{1} << 61) | 2;
  run_ranks(2, [&](ncclComm_t comm, int rank) {
    meshccl::Links& links = comm->engine->links();
    const int peer = 1 - rank;
    const size_t chunk = links.chunk_bytes(peer);
    ASSERT_EQ(chunk, GetParam() == "shm" ? size_t{128} << 10 : size_t{16} << 10);
    const size_t bulk_bytes = 64 * chunk, urgent_bytes = 12 * chunk;
    std::vector<unsigned char> bulk(bulk_bytes), urgent(urgent_bytes);
    if (rank == 0) {
      for (size_t i = 0; i < bulk_bytes; ++i) bulk[i] = static_cast<unsigned char>(i * 7 + 1);
      for (size_t i = 0; i < urgent_bytes; ++i) urgent[i] = static_cast<unsigned char>(i * 13 + 5);
    }
    meshccl::Xfer b, u;
    b.peer = u.peer = peer;
    b.send = u.send = rank == 0;
    b.ptr = reinterpret_cast<char*>(bulk.data());
    u.ptr = reinterpret_cast<char*>(urgent.data());
    b.bytes = bulk_bytes;
    u.bytes = urgent_bytes;
    b.tag = kBulkTag;
    u.tag = kUrgentTag;
    links.post(&b, 0);
    bool moved = false;
    links.pump(&moved);
    EXPECT_LE(b.chunks.size(), 4u);  // credit: four chunks
    links.post(&u, -3);
    size_t bulk_posts = b.nposts, bad_posts = 0;
    bool bulk_left_when_urgent_done = false;
    ASSERT_TRUE(pump_until(
        links, [&] { return b.finished && u.finished; },
        [&] {
          // The urgent transfer waited through the whole pass.
          const bool urgent_waits = !u.finished && u.posted < u.bytes;
          if (urgent_waits && b.nposts > bulk_posts + 1) ++bad_posts;
          bulk_posts = b.nposts;
          if (u.finished && !b.finished && b.posted < b.bytes) bulk_left_when_urgent_done = true;
        }));
    EXPECT_TRUE(b.error.ok() && u.error.ok());
    EXPECT_EQ(bad_posts, 0u);
    if (rank == 0) EXPECT_TRUE(bulk_left_when_urgent_done);
    if (rank == 1) {
      EXPECT_EQ(b.got, bulk_bytes);
      EXPECT_EQ(u.got, urgent_bytes);
      for (size_t i = 0; i < bulk_bytes; i += 4093) ASSERT_EQ(bulk[i], static_cast<unsigned char>(i * 7 + 1));
      for (size_t i = 0; i < urgent_bytes; i += 101) ASSERT_EQ(urgent[i], static_cast<unsigned char>(i * 13 + 5));
    }
  });
}

// MESHCCL_PRIORITY=0: transfers go whole, in the order posted.
TEST_P(LinkOrder, FifoSendsWhole) {
  ScopedEnv env({{"MESHCCL_TRANSPORT", GetParam()}, {"MESHCCL_CHUNK_US", "1"}, {"MESHCCL_PRIORITY", "0"}});
  run_ranks(2, [&](ncclComm_t comm, int rank) {
    meshccl::Links& links = comm->engine->links();
    EXPECT_FALSE(links.policy().priority);
    EXPECT_EQ(links.chunk_bytes(1 - rank), 0u);
    std::vector<int> v(100000, rank);
    meshccl::Xfer x;
    x.peer = 1 - rank;
    x.send = rank == 0;
    x.ptr = reinterpret_cast<char*>(v.data());
    x.bytes = v.size() * sizeof(int);
    x.tag = (uint64_t{1} << 61) | 3;
    links.post(&x, -3);
    ASSERT_TRUE(pump_until(links, [&] { return x.finished; }));
    EXPECT_EQ(x.nposts, 1u);
    EXPECT_EQ(v[99999], 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, LinkOrder, ::testing::Values("shm", "socket"));

// A run of the engine that records its polls. Each poll loops over passes as
// a plan's does (up to 8, stopping early while Engine::urgent_waiting), after
// submitting `submit_during_poll` to the engine as another thread would.
class ScriptedRun final : public meshccl::Run {
 public:
  ScriptedRun(std::vector<std::string>* log, std::string name) : log_(log), name_(std::move(name)) {}
  std::unique_ptr<meshccl::Run> submit_during_poll;
  int submit_priority = meshccl::kLeastPriority;
  bool done_after_poll = false;
  bool done = false;
  int passes = 0;  // of the last poll
  meshccl::Status poll(meshccl::Engine* eng, bool* moved) override {
    log_->push_back(name_);
    *moved = true;
    if (submit_during_poll) eng->submit(std::move(submit_during_poll), submit_priority);
    for (passes = 1; passes < 8 && !eng->urgent_waiting(priority()); ++passes) {}
    done = done || done_after_poll;
    return meshccl::kOk;
  }
  bool finished() const override { return done; }

 private:
  std::vector<std::string>* log_;
  std::string name_;
};

// An urgent run submitted while a bulk run polls (by another thread, in a
// real job) is polled within the same engine pass, before the bulk's next
// poll, and the bulk's poll stops after the pass it was in. Before, the
// urgent run waited for the whole poll (up to 8 plan passes, 20-50 ms of a
// 64 MiB all-reduce over loopback sockets) and then for the next pass.
TEST(EngineOrder, UrgentRunSubmittedDuringABulkPollGoesNext) {
  meshccl::Engine eng(0, nullptr, nullptr, nullptr);
  std::vector<std::string> log;
  auto bulk = std::make_unique<ScriptedRun>(&log, "bulk");
  auto urgent = std::make_unique<ScriptedRun>(&log, "urgent");
  urgent->done_after_poll = true;
  ScriptedRun* b = bulk.get();
  b->submit_during_poll = std::move(urgent);
  b->submit_priority = meshccl::kGreatestPriority;
  auto hb = eng.submit(std::move(bulk), meshccl::kLeastPriority);
  EXPECT_TRUE(eng.progress());
  EXPECT_EQ(log, (std::vector<std::string>{"bulk", "urgent", "bulk"}));
  EXPECT_EQ(b->passes, 1);  // its second poll, in the pass where the urgent run finished
  // The urgent run retired: the bulk polls alone, all its passes.
  log.clear();
  EXPECT_TRUE(eng.progress());
  EXPECT_EQ(b->passes, 8);
  EXPECT_EQ(log, (std::vector<std::string>{"bulk"}));
  b->done = true;
  eng.progress();
  EXPECT_TRUE(hb->done.load());
}

// A run of the same urgency submitted meanwhile waits for the next pass, and
// the running poll keeps all its passes.
TEST(EngineOrder, EqualPriorityRunWaitsForTheNextPass) {
  meshccl::Engine eng(0, nullptr, nullptr, nullptr);
  std::vector<std::string> log;
  auto first = std::make_unique<ScriptedRun>(&log, "first");
  ScriptedRun* f = first.get();
  f->submit_during_poll = std::make_unique<ScriptedRun>(&log, "second");
  eng.submit(std::move(first), meshccl::kLeastPriority);
  eng.progress();
  EXPECT_EQ(f->passes, 8);
  EXPECT_EQ(log, (std::vector<std::string>{"first"}));
  log.clear();
  eng.progress();
  EXPECT_EQ(log, (std::vector<std::string>{"first", "second"}));
}

// Starvation-freedom: a bulk all-reduce completes while every rank keeps
// issuing urgent all-reduces for as long as it runs.
TEST(Priority, BulkProgressesUnderEndlessUrgentTraffic) {
  ScopedEnv env({{"MESHCCL_DIRECT_SLOT_BYTES", "0"}, {"MESHCCL_CHUNK_US", "1"}, {"MESHCCL_PRIORITY", "1"}});
  run_ranks(3, meshccl_test::bulk_completes_under_endless_urgent_calls);
}

// Credits shared across communicators never deadlock: rank 1 receives the
// urgent message (communicator B) before it even posts the bulk receive
// (communicator A) that rank 0 has been sending all along.
TEST(Priority, NoCreditDeadlockAcrossCommunicators) {
  ScopedEnv env({{"MESHCCL_DIRECT_SLOT_BYTES", "0"},
                 {"MESHCCL_CHUNK_US", "1"},
                 {"MESHCCL_LINK_CREDIT", "1"},
                 {"MESHCCL_PRIORITY", "1"}});
  run_ranks(2, [](ncclComm_t a, int rank) {
    ncclComm_t b = nullptr;
    ASSERT_EQ(ncclCommSplit(a, 0, rank, &b, nullptr), ncclSuccess);
    Streams s;
    std::vector<float> bulk(1 << 19, rank == 0 ? 2.5f : 0.f);
    std::vector<float> urgent(20011, rank == 0 ? 7.f : 0.f);
    if (rank == 0) {
      ASSERT_EQ(ncclSend(bulk.data(), bulk.size(), ncclFloat, 1, a, cu(s.lo)), ncclSuccess);
      ASSERT_EQ(ncclSend(urgent.data(), urgent.size(), ncclFloat, 1, b, cu(s.hi)), ncclSuccess);
    } else {
      ASSERT_EQ(ncclRecv(urgent.data(), urgent.size(), ncclFloat, 0, b, cu(s.hi)), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      EXPECT_EQ(urgent[20010], 7.f);
      ASSERT_EQ(ncclRecv(bulk.data(), bulk.size(), ncclFloat, 0, a, cu(s.lo)), ncclSuccess);
    }
    ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess);
    EXPECT_EQ(bulk[bulk.size() - 1], 2.5f);
    EXPECT_EQ(ncclCommDestroy(b), ncclSuccess);
  });
}

// Every collective on the urgent stream, correct while a bulk all-reduce is
// in flight on the same communicator, with scheduling on and off.
// The fourth parameter forces algorithms (MESHCCL_ALGO; "hier" places the
// ranks on two fake hosts): every one is deadlock-free under the window.
class Preemption : public ::testing::TestWithParam<std::tuple<int, std::string, std::string, std::string>> {};

// A topology file placing the first half of n ranks on one host, the rest on
// another; returns its path.
std::string two_hosts_file(int n) {
  std::string xml = "<meshccl_topology version=\"1\">\n";
  for (int h = 0; h < 2; ++h)
    xml += "  <host name=\"fake" + std::to_string(h) + "\">\n    <numa id=\"0\" cpus=\"0-1\"/>\n  </host>\n";
  for (int r = 0; r < n; ++r)
    xml += "  <rank id=\"" + std::to_string(r) + "\" host=\"" + std::to_string(r < n / 2 ? 0 : 1) + "\" numa=\"0\"/>\n";
  xml += "</meshccl_topology>\n";
  const char* dir = std::getenv("TMPDIR");
  const std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/meshccl_prio_hosts_" + std::to_string(getpid()) + ".xml";
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f != nullptr) {
    std::fputs(xml.c_str(), f);
    std::fclose(f);
  }
  return path;
}

TEST_P(Preemption, EveryCollectiveOvertakingBulk) {
  const auto [n, transport, priority, algo] = GetParam();
  const bool hier = algo == "hier";
  ScopedEnv env(
      {{"MESHCCL_DIRECT_SLOT_BYTES", "0"},
       {"MESHCCL_CHUNK_US", "1"},
       {"MESHCCL_TRANSPORT", transport},
       {"MESHCCL_PRIORITY", priority},
       {"MESHCCL_ALGO", hier ? "allreduce:hier;allgather:hier;reducescatter:hier;broadcast:hier;reduce:hier" : algo},
       {"MESHCCL_TOPO_FILE", hier ? two_hosts_file(n) : std::string()}});
  run_ranks(n, [n = n](ncclComm_t comm, int rank) {
    Streams s;
    // Bulk: 1 MiB of int32 per rank (64 chunks of 16 KiB), low priority.
    std::vector<int> bulk(1 << 18);
    std::iota(bulk.begin(), bulk.end(), rank);
    std::vector<int> bulk_out(bulk.size(), -1);
    ASSERT_EQ(ncclAllReduce(bulk.data(), bulk_out.data(), bulk.size(), ncclInt, ncclSum, comm, cu(s.lo)), ncclSuccess);
    const int sum_ranks = n * (n - 1) / 2;
    // Urgent, each larger than two chunks somewhere and prime-sized.
    for (size_t count : {size_t{0}, size_t{1}, size_t{1009}, size_t{12289}}) {
      std::vector<int> in(count * n), out(count * n, -1), small(count, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i % 9973) + rank * 3;
      const int root = 1 % n;
      auto hi = cu(s.hi);
      ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt, ncclSum, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], n * static_cast<int>(i % 9973) + 3 * sum_ranks);
      ASSERT_EQ(ncclBroadcast(in.data(), out.data(), count, ncclInt, root, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<int>(i % 9973) + root * 3);
      std::fill(out.begin(), out.end(), -1);
      ASSERT_EQ(ncclReduce(in.data(), out.data(), count, ncclInt, ncclMax, root, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      if (rank == root)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<int>(i % 9973) + (n - 1) * 3);
      ASSERT_EQ(ncclAllGather(in.data(), out.data(), count, ncclInt, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r * count + i], static_cast<int>(i % 9973) + r * 3);
      ASSERT_EQ(ncclReduceScatter(in.data(), small.data(), count, ncclInt, ncclSum, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(small[i], n * static_cast<int>((rank * count + i) % 9973) + 3 * sum_ranks);
      ASSERT_EQ(ncclAlltoAll(in.data(), out.data(), count, ncclInt, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(out[r * count + i], static_cast<int>((rank * count + i) % 9973) + r * 3);
      ASSERT_EQ(ncclGather(in.data(), out.data(), count, ncclInt, root, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      if (rank == root)
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r * count + i], static_cast<int>(i % 9973) + r * 3);
      ASSERT_EQ(ncclScatter(in.data(), small.data(), count, ncclInt, root, comm, hi), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(small[i], static_cast<int>((rank * count + i) % 9973) + root * 3);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(in.data(), count, ncclInt, (rank + 1) % n, comm, hi), ncclSuccess);
      ASSERT_EQ(ncclRecv(small.data(), count, ncclInt, (rank + n - 1) % n, comm, hi), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(small[i], static_cast<int>(i % 9973) + ((rank + n - 1) % n) * 3);
    }
    ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess);
    for (size_t i = 0; i < bulk.size(); i += 997) ASSERT_EQ(bulk_out[i], n * static_cast<int>(i) + sum_ranks);
    ASSERT_EQ(bulk_out.back(), n * static_cast<int>(bulk.size() - 1) + sum_ranks);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Preemption,
                         ::testing::Values(std::make_tuple(2, "shm", "1", ""), std::make_tuple(3, "shm", "1", ""),
                                           std::make_tuple(4, "shm", "1", ""), std::make_tuple(2, "socket", "1", ""),
                                           std::make_tuple(3, "socket", "1", ""), std::make_tuple(3, "shm", "0", "")));

// Every algorithm forced, for the bulk all-reduce and the urgent collectives
// alike: the two-tree all-reduce (whose two ends make transfers ready in
// different orders), ring/chain, halving-doubling, the hierarchical ones.
INSTANTIATE_TEST_SUITE_P(Algorithms, Preemption,
                         ::testing::Values(std::make_tuple(3, "shm", "1", "tree"),
                                           std::make_tuple(4, "shm", "1", "tree"),
                                           std::make_tuple(5, "socket", "1", "tree"),
                                           std::make_tuple(4, "socket", "1", "ring;broadcast:chain;reduce:chain"),
                                           std::make_tuple(4, "shm", "1", "halving_doubling"),
                                           std::make_tuple(3, "shm", "1", "halving_doubling"),
                                           std::make_tuple(3, "socket", "1", "recursive_doubling"),
                                           std::make_tuple(4, "shm", "1", "recursive_doubling"),
                                           std::make_tuple(4, "shm", "1", "hier"),
                                           std::make_tuple(5, "socket", "1", "hier")));

// The window bounds what an urgent transfer finds ahead of it on a link: a
// pipelined bulk all-reduce makes many transfers to the same peer ready at
// once; with the window (MESHCCL_LINK_WINDOW=1) at most window + credit of
// its chunks are in flight there while an urgent transfer waits to post.
// Without it (0: every ready transfer keeps a chunk in flight) there are far
// more on shm, where a send completes only once the peer has read it: the
// bound is what makes the difference. (On sockets a chunk completes once the
// kernel took it, so few stay in flight either way.)
class WindowBound : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(WindowBound, UrgentFindsFewBulkChunksAhead) {
  const auto [transport, window] = GetParam();
  ScopedEnv env({{"MESHCCL_DIRECT_SLOT_BYTES", "0"},
                 {"MESHCCL_CHUNK_US", "1"},
                 {"MESHCCL_TRANSPORT", transport},
                 {"MESHCCL_PRIORITY", "1"},
                 {"MESHCCL_LINK_CREDIT", "2"},
                 {"MESHCCL_LINK_WINDOW", window},
                 {"MESHCCL_ALGO", "ring"}});
  std::vector<size_t> ahead(2, 0);
  run_ranks(2, [&](ncclComm_t comm, int rank) {
    Streams s;
    meshccl::Links& links = comm->engine->links();
    const int peer = 1 - rank;
    // Many pipeline chunks (MESHCCL_CHUNKSIZE, 512 KiB) per ring step, each
    // several link chunks long.
    const size_t count = (transport == "shm" ? size_t{64} : size_t{8}) << 20 >> 2;
    std::vector<float> bulk(count, 1.0f + static_cast<float>(rank));
    ASSERT_EQ(ncclAllReduce(bulk.data(), bulk.data(), count, ncclFloat, ncclSum, comm, cu(s.lo)), ncclSuccess);
    std::vector<float> msg(16384, static_cast<float>(rank));
    // Urgent exchanges while the bulk runs on both ranks (they agree when to stop).
    for (int i = 0, running = 1; i < 40 && running == 1; ++i) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(msg.data(), msg.size(), ncclFloat, peer, comm, cu(s.hi)), ncclSuccess);
      ASSERT_EQ(ncclRecv(msg.data(), msg.size(), ncclFloat, peer, comm, cu(s.hi)), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      running = meshcclStreamQuery(s.lo) == ncclSuccess ? 0 : 1;
      ASSERT_EQ(ncclAllReduce(&running, &running, 1, ncclInt, ncclMin, comm, cu(s.hi)), ncclSuccess);
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
    }
    ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess);
    EXPECT_EQ(bulk[count - 1], 3.0f);
    ahead[rank] = links.take_max_ahead(peer);
  });
  const size_t most = std::max(ahead[0], ahead[1]);
  std::printf("most bulk chunks ahead of an urgent transfer: %zu (%s, window %s)\n", most, transport.c_str(),
              window.c_str());
  if (window == "1") EXPECT_LE(most, 3u) << "window 1 + credit 2 chunks";
  else EXPECT_GT(most, 3u) << "without the window every ready transfer keeps a chunk in flight";
}

INSTANTIATE_TEST_SUITE_P(Windows, WindowBound,
                         ::testing::Values(std::make_tuple("shm", "1"), std::make_tuple("shm", "0"),
                                           std::make_tuple("socket", "1")));

}  // namespace
