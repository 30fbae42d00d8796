// The Gloo peer (Debian libgloo-dev): allreduce, broadcast, allgather,
// alltoall and reduce-scatter through Gloo's options API, over TCP on loopback
// with a file-store rendezvous. Rank and size come from the launcher (mpirun,
// meshrun, srun).
//   mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 gloo_bench --store /tmp/x -C all
//
// Gloo is driven as torch's ProcessGroupGloo drives it: the TCP device with
// asynchronous pairs, one collective after another on the calling thread, and
// a fresh tag for every collective (torch's nextTag()). Things that decide
// whether that measures Gloo or the harness:
//  - Ranks must not be pinned one core each (perf/compare starts this peer
//    with --bind-to none). Gloo's device thread handles the socket with a
//    try-lock on the pair; when it wakes on the calling thread's core while
//    that thread holds the pair's lock, it spins on epoll_wait (level
//    triggered, data left unread) until the kernel preempts it at the end of
//    its slice: one scheduler tick, 4 ms at 250 Hz, for nearly every call.
//    Unpinned, the same polling still shows from 64 KiB (about 120
//    epoll_wait per AllReduce) and a loaded machine still costs some calls a
//    tick; torch's Gloo behaves the same, and the means carry it.
//  - Reduce-scatter is torch's (reduce_scatter_tensor_coalesced): an
//    allreduce of the whole input, then a copy of the rank's block. Gloo's
//    ReduceScatterHalvingDoubling is not usable: its last phase copies the
//    rank's block to the front of the buffer that its sends may still be
//    reading (it never waits for them), so on async pairs a peer receives
//    overwritten data once a send does not fit the socket at once (from
//    64 KiB here); on sync pairs both ranks block writing to each other once
//    a message exceeds the socket's send buffer (net.core.wmem_max).
//  - Pairs stay asynchronous for every collective: the options API only
//    runs on async pairs (Gloo enforces it), as in torch.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
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
  void Prepare(peer::Coll c, const peer::Sizes& s, float*, float*) override {
    // The allreduce's output (torch allreduces a clone of the input);
    // allocated and faulted in here, outside the timings.
    if (c == peer::Coll::kReduceScatter && rs_buf_.size() < s.send_count) rs_buf_.resize(s.send_count);
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
      case peer::Coll::kReduceScatter: {
        gloo::AllreduceOptions opts(ctx_);
        opts.setTag(NextTag());
        opts.setInput(send, s.send_count);
        opts.setOutput(rs_buf_.data(), s.send_count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(opts);
        memcpy(recv, rs_buf_.data() + static_cast<size_t>(rank_) * s.count, s.count * sizeof(float));
        break;
      }
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
  std::vector<float> rs_buf_;  // reduce-scatter: the whole reduced input
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
