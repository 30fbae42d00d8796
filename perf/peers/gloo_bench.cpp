// The Gloo peer (Debian libgloo-dev): allreduce, broadcast, allgather and
// alltoall through Gloo's options API, reduce-scatter through its
// halving-doubling algorithm, over TCP on loopback with a file-store
// rendezvous. Rank and size come from the launcher (mpirun, meshrun, srun).
//   mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 gloo_bench --store /tmp/x -C all
//
// Gloo is driven as torch's ProcessGroupGloo drives it: the TCP device with
// asynchronous pairs, one collective after another on the calling thread, and
// a fresh tag for every collective (torch's nextTag()). Two things decide
// whether that measures Gloo or the scheduler:
//  - Ranks must not be pinned one core each (perf/compare starts this peer
//    with --bind-to none). Gloo's device thread handles the socket with a
//    try-lock on the pair; when it wakes on the calling thread's core while
//    that thread holds the pair's lock, it spins on epoll_wait (level
//    triggered, data left unread) until the kernel preempts it at the end of
//    its slice: one scheduler tick, 4 ms at 250 Hz, for nearly every call.
//  - Reduce-scatter runs on a second context whose pairs are in Gloo's sync
//    mode. ReduceScatterHalvingDoubling does not wait for its sends before it
//    moves a rank's block to the front of the same buffer; on an async pair a
//    send the socket did not take at once is still being written from there,
//    and the peer receives the overwritten data (wrong results from 64 KiB).
//    On a sync pair every send is written out before send() returns. A
//    blocking write only completes at once while the socket's send buffer
//    holds it (Gloo sizes it to the message, the kernel caps it at
//    net.core.wmem_max); larger, both ranks of a pair block in writes to each
//    other and time out, so buffers above that size go back to the async
//    context, where the overwrite was not seen (the check counts it if so).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "peer_common.h"

namespace {

int EnvInt(const char* const* names, int fallback) {
  for (const char* const* n = names; *n; n++)
    if (const char* v = getenv(*n)) return atoi(v);
  return fallback;
}

class GlooBackend final : public peer::Backend {
 public:
  GlooBackend(int rank, int size, const std::string& store_dir) : rank_(rank), size_(size) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(store_dir);
    gloo::rendezvous::PrefixStore store("gloo_bench", file_store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->connectFullMesh(store, dev);
    ctx_ = ctx;
    // Reduce-scatter's own context, sync pairs (see the top of the file);
    // blocking reads, not busy polling, as the async pairs wait too.
    gloo::rendezvous::PrefixStore rs_store("gloo_bench_rs", file_store);
    auto rs_ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    rs_ctx->connectFullMesh(rs_store, dev);
    for (int i = 0; i < size; i++)
      if (i != rank) rs_ctx->getPair(i)->setSync(true, false);
    rs_ctx_ = rs_ctx;
    if (FILE* f = fopen("/proc/sys/net/core/wmem_max", "r")) {
      unsigned long v = 0;
      if (fscanf(f, "%lu", &v) == 1) sync_max_bytes_ = v;
      fclose(f);
    }
  }
  const char* name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Barrier() override {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(NextTag());
    gloo::barrier(opts);
  }
  void SumDoubles(double* v, int n) override {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(v, static_cast<size_t>(n));
    opts.setTag(NextTag());
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    gloo::allreduce(opts);
  }
  void Prepare(peer::Coll c, const peer::Sizes& s, float* send, float*) override {
    rs_.reset();
    if (c != peer::Coll::kReduceScatter || s.count == 0) return;
    rs_send_ = send;
    rs_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
        s.send_count * sizeof(float) <= sync_max_bytes_ ? rs_ctx_ : ctx_, std::vector<float*>{send},
        static_cast<int>(s.send_count), std::vector<int>(size_, static_cast<int>(s.count)));
  }
  void Run(peer::Coll c, const peer::Sizes& s, float* send, float* recv) override {
    if (s.count == 0) return;
    switch (c) {
      case peer::Coll::kAllReduce: {
        gloo::AllreduceOptions opts(ctx_);
        opts.setTag(NextTag());
        opts.setInput(send, s.count);
        opts.setOutput(recv, s.count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(opts);
        break;
      }
      case peer::Coll::kBroadcast: {
        gloo::BroadcastOptions opts(ctx_);
        opts.setTag(NextTag());
        opts.setOutput(recv, s.count);
        opts.setRoot(0);
        gloo::broadcast(opts);
        break;
      }
      case peer::Coll::kAllGather: {
        gloo::AllgatherOptions opts(ctx_);
        opts.setTag(NextTag());
        opts.setInput(send, s.count);
        opts.setOutput(recv, s.recv_count);
        gloo::allgather(opts);
        break;
      }
      case peer::Coll::kReduceScatter:
        // Reduces in place in the buffer bound at Prepare and leaves the
        // rank's block at its start; copied out as an out-of-place call
        // would deliver it.
        rs_->run();
        memcpy(recv, rs_send_, s.count * sizeof(float));
        break;
      case peer::Coll::kAlltoAll: {
        gloo::AlltoallOptions opts(ctx_);
        opts.setTag(NextTag());
        opts.setInput(send, s.send_count);
        opts.setOutput(recv, s.recv_count);
        gloo::alltoall(opts);
        break;
      }
    }
  }

 private:
  // Every rank calls the same collectives in the same order, so the tags
  // agree; a fresh one per call keeps a late message of one call from ever
  // sharing a slot with the next call's (torch's ProcessGroupGloo does this).
  uint32_t NextTag() { return tag_++; }

  int rank_, size_;
  uint32_t tag_ = 0;
  std::shared_ptr<gloo::Context> ctx_;
  std::shared_ptr<gloo::Context> rs_ctx_;
  size_t sync_max_bytes_ = 4u << 20;  // net.core.wmem_max, read at start
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs_;
  float* rs_send_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  peer::Options o;
  std::string err;
  if (!peer::ParseOptions(argc, argv, &o, &err)) {
    fprintf(stderr, "%s\n", err.c_str());
    return 2;
  }
  static const char* const kRank[] = {"OMPI_COMM_WORLD_RANK", "MESHCCL_RANK", "PMI_RANK", "SLURM_PROCID", nullptr};
  static const char* const kSize[] = {"OMPI_COMM_WORLD_SIZE", "MESHCCL_NRANKS", "PMI_SIZE", "SLURM_NTASKS", nullptr};
  const int rank = EnvInt(kRank, 0), size = EnvInt(kSize, 1);
  if (o.store.empty()) {
    fprintf(stderr, "gloo_bench needs --store DIR (an empty directory shared by all ranks)\n");
    return 2;
  }
  GlooBackend b(rank, size, o.store);
  return peer::RunSweep(b, o);
}
