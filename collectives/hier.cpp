// Shared pieces of the hierarchical algorithms (see hier.h).
#include "collectives/hier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace meshccl::hier {

HostGroups layout(const BuildCtx& ctx) {
  std::vector<int> id(static_cast<size_t>(ctx.nranks));
  for (int p = 0; p < ctx.nranks; ++p) id[p] = ctx.model.host_of(ctx.ranks != nullptr ? ctx.ranks[p] : p);
  return host_groups(id);
}

Tags tag_ranges(int ranges) { return Tags{kControlTag / static_cast<uint32_t>(std::max(ranges, 1))}; }

OpDesc sub_op(const OpDesc& op, OpKind kind, const void* in, void* out, size_t count, int group_size, int ranges) {
  OpDesc s = op;
  s.kind = kind;
  s.sendbuff = in;
  s.recvbuff = out;
  s.count = count;
  s.avg = false;
  s.premul = false;
  // The builders keep (tag ranges they use) x chunks below kControlTag; here
  // it must stay below one range: at most 4 ranges per rank of the group.
  const size_t phases = 4 * static_cast<size_t>(group_size) + 8;
  const size_t min_chunk = count * phases * static_cast<size_t>(ranges) / kControlTag + 1;
  s.chunk_bytes = std::max(op.chunk_bytes, min_chunk * op.elem());
  return s;
}

Status build_sub(const BuildCtx& ctx, BuildFn build, const std::vector<int>& members, int me, uint32_t tag_base,
                 const OpDesc& sub, Plan::StepId after, Plan* plan, Plan::StepId* done) {
  std::vector<int> ranks(members.size());
  for (size_t i = 0; i < members.size(); ++i) ranks[i] = ctx.ranks != nullptr ? ctx.ranks[members[i]] : members[i];
  const BuildCtx in{ctx.model, me, static_cast<int>(members.size()), ranks.data(), ctx.tag_base + tag_base};
  const Plan::StepId first = static_cast<Plan::StepId>(plan->size());
  MC_TRY(build_in(in, build, sub, plan));
  const Plan::StepId end = static_cast<Plan::StepId>(plan->size());
  // A step of no bytes that waits for all of them.
  static char nothing;
  *done = plan->copy(&nothing, &nothing, 0, {after});
  for (Plan::StepId s = first; s < end; ++s) {
    plan->add_dep(s, after);
    plan->add_dep(*done, s);
  }
  return kOk;
}

TuneModel net_model(const TuneModel& model, int hosts, int channels) {
  LinkCost net = model.net;
  net.bw_gbs = model.host_net_gbs(channels) / std::max(channels, 1);
  std::vector<int> host(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) host[h] = h;
  TuneModel m = with_hosts(make_tune_model(hosts, true, model.shm, net, model.reduce_gbs), host);
  m.cross_numa = model.cross_numa;
  m.cpu_share = model.cpu_share;
  return m;
}

TuneModel local_model(const TuneModel& model, int ranks) {
  TuneModel m = make_tune_model(ranks, false, model.shm, model.net, model.reduce_gbs);
  m.cross_numa = model.cross_numa;
  m.cross_numa_links = model.cross_numa_links;
  m.cpu_share = model.cpu_share;
  return m;
}

Choice cheapest(const TuneModel& model, int nranks, const OpDesc& op, OpKind kind,
                std::initializer_list<const char*> candidates) {
  Choice best;
  const BuildCtx ctx{model, 0, nranks};
  OpDesc o = op;
  o.kind = kind;
  for (const Algorithm& a : algorithm_table()) {
    if (a.kind != kind || a.build == nullptr) continue;
    if (std::none_of(candidates.begin(), candidates.end(), [&](const char* c) { return std::string(c) == a.name; }))
      continue;
    const double us = a.cost(ctx, o);
    if (prefer(a, us, best.algorithm, best.us, model.network)) best = Choice{&a, us};
  }
  return best;
}

int channels(const BuildCtx& ctx, const OpDesc& op, const HostGroups& g) {
  const int set = settings_of(op).hier_channels;
  return std::clamp(set > 0 ? set : ctx.model.rails, 1, std::max(g.widest, 1));
}

int gateway(const HostGroups& g, int channels, int p, int on) {
  const std::vector<int>& hg = g.members[on];
  return hg[(g.local[p] % channels) % static_cast<int>(hg.size())];
}

Plan::StepId reduce_from(Plan* plan, const std::vector<int>& from, uint32_t tag, const void* in, void* dst,
                         size_t count, size_t es, Plan::StepId after) {
  Plan::StepId prev = after;
  const void* acc = in;
  for (int p : from) {
    void* tmp = plan->scratch(count * es);
    Plan::StepId got = plan->recv(p, tag, tmp, count * es);
    prev = plan->reduce(dst, acc, tmp, count, {got, prev});
    acc = dst;
  }
  if (acc != dst && in != dst) prev = plan->copy(dst, in, count * es, {after});
  return prev;
}

double gateway_ring_us(const BuildCtx& ctx, const HostGroups& g, int channels, double block, int* blocks) {
  int smallest = ctx.nranks;
  for (const auto& hg : g.members) smallest = std::min(smallest, static_cast<int>(hg.size()));
  *blocks = ctx.nranks - smallest;
  const TuneModel& t = ctx.model;
  const int hosts = static_cast<int>(g.members.size());
  return (hosts - 1) * t.net.alpha_us + *blocks * block * 1e-3 / t.host_net_gbs(channels);
}

int segments(const OpDesc& op, size_t bytes, int shares) {
  const size_t per = std::max<size_t>(op.chunk_bytes, 1) * static_cast<size_t>(std::max(shares, 1));
  return static_cast<int>(std::clamp<size_t>(bytes / per, 1, 8));
}

}  // namespace meshccl::hier
