// The Gloo peer (Debian libgloo-dev): allreduce, broadcast, allgather and
// alltoall through Gloo's options API, reduce-scatter through its
// halving-doubling algorithm, over TCP on loopback with a file-store
// rendezvous. Rank and size come from the launcher (mpirun, meshrun, srun).
//   mpirun --oversubscribe --allow-run-as-root -np 2 gloo_bench --store /tmp/x -C all
#include <unistd.h>

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
  }
  const char* name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Barrier() override {
    gloo::BarrierOptions opts(ctx_);
    gloo::barrier(opts);
  }
  void SumDoubles(double* v, int n) override {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(v, static_cast<size_t>(n));
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    gloo::allreduce(opts);
  }
  void Prepare(peer::Coll c, const peer::Sizes& s, float* send, float*) override {
    rs_.reset();
    if (c != peer::Coll::kReduceScatter || s.count == 0) return;
    rs_send_ = send;
    rs_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
        ctx_, std::vector<float*>{send}, static_cast<int>(s.send_count),
        std::vector<int>(size_, static_cast<int>(s.count)));
  }
  void Run(peer::Coll c, const peer::Sizes& s, float* send, float* recv) override {
    if (s.count == 0) return;
    switch (c) {
      case peer::Coll::kAllReduce: {
        gloo::AllreduceOptions opts(ctx_);
        opts.setInput(send, s.count);
        opts.setOutput(recv, s.count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(opts);
        break;
      }
      case peer::Coll::kBroadcast: {
        gloo::BroadcastOptions opts(ctx_);
        opts.setOutput(recv, s.count);
        opts.setRoot(0);
        gloo::broadcast(opts);
        break;
      }
      case peer::Coll::kAllGather: {
        gloo::AllgatherOptions opts(ctx_);
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
        opts.setInput(send, s.send_count);
        opts.setOutput(recv, s.recv_count);
        gloo::alltoall(opts);
        break;
      }
    }
  }

 private:
  int rank_, size_;
  std::shared_ptr<gloo::Context> ctx_;
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
