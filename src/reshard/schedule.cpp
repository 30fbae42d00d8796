#include "reshard/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace meshccl::reshard {

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::Auto: return "auto";
    case Strategy::SendRecv: return "send_recv";
    case Strategy::LocalAllGather: return "send_recv_allgather";
    case Strategy::Broadcast: return "broadcast";
  }
  return "?";
}

int Placement::nhosts() const {
  int n = 0;
  for (int h : host) n = std::max(n, h + 1);
  return n;
}

namespace {

double us_per_byte(const LinkCost& c) { return c.bw_gbs > 0 ? 1e-3 / c.bw_gbs : 0.0; }

bool holds(const Slice& s, int rank) { return std::find(s.senders.begin(), s.senders.end(), rank) != s.senders.end(); }

// Receivers that do not hold the slice already.
std::vector<int> remote_receivers(const Slice& s) {
  std::vector<int> out;
  for (int r : s.receivers)
    if (!holds(s, r)) out.push_back(r);
  return out;
}

// Picks the candidate with the least bytes assigned so far (ties: one on
// `prefer_host`, then the first); Balance::None takes the first.
int pick_sender(const std::vector<int>& cands, const Placement& pl, int prefer_host, Balance b,
                std::vector<double>* load) {
  int best = cands[0];
  if (b != Balance::None)
    for (int c : cands) {
      const double lc = (*load)[c], lb = (*load)[best];
      if (lc < lb || (lc == lb && pl.host[c] == prefer_host && pl.host[best] != prefer_host)) best = c;
    }
  return best;
}

// Time each link class is busy under the schedule, and the latency of its
// longest chain: the prediction. Between hosts a hop loads the sender's and
// the receiver's network links. Within a host the receiver copies the bytes
// out of the sender's memory (the shm transport's rendezvous: the receiver
// reads the sender's buffer), so a hop loads the receiver only, and a source
// with several receivers on its host is not a bottleneck. A chain forwards
// chunk by chunk: each hop after the first adds one chunk's time before the
// last rank has the first bytes. Each rank also copies on its own CPU: a
// slice it sends that is not one run of its source tile is packed once (a
// step per run), one it receives that is not one run of its destination tile
// is unpacked once, and local copies run run by run; send/recv packs a slice
// on every replica it sends from, broadcast on one.
void predict(const Layout& src, const Layout& dst, const Placement& pl, size_t elem, Schedule* s) {
  const int nh = pl.nhosts(), nr = static_cast<int>(pl.host.size());
  std::vector<double> nic_out(nh, 0), nic_in(nh, 0), rank_in(nr, 0);  // rank_in: the rank's copies
  std::vector<int> msgs(nr, 0);
  const double bn = us_per_byte(pl.net), bs = us_per_byte(pl.shm);
  double latency = 0;
  s->net_bytes = 0;
  std::set<std::pair<int, int>> flows;  // rank pairs that cross hosts
  auto hop = [&](int a, int b, size_t bytes) {
    ++msgs[a];
    ++msgs[b];
    if (pl.host[a] != pl.host[b]) {
      flows.insert({a, b});
      nic_out[pl.host[a]] += bytes * bn;
      nic_in[pl.host[b]] += bytes * bn;
      s->net_bytes += bytes;
    } else {
      rank_in[b] += bytes * bs;
    }
  };
  std::set<std::pair<int, int>> packed, unpacked;  // (rank, slice)
  auto repack = [&](int rank, int slice, bool pack) {
    const Slice& sl = s->slices[slice];
    if (!(pack ? packed : unpacked).insert({rank, slice}).second) return;
    const size_t runs = pack ? run_count(sl.box, src.tile_box(sl.src_tile), sl.box)
                             : run_count(sl.box, sl.box, dst.tile_box(sl.dst_tile));
    if (runs > 1) rank_in[rank] += (sl.box.elems() * elem + runs * pl.copy_step_bytes) * bs;
  };
  const double chunk = static_cast<double>(std::max<size_t>(pl.chunk_bytes, 1));
  for (const Xfer& x : s->xfers) {
    repack(x.chain[0], x.slice, true);
    for (size_t j = 1; j < x.chain.size(); ++j) repack(x.chain[j], x.slice, false);
    const size_t bytes = (x.hi - x.lo) * elem;
    const double step = std::min(chunk, static_cast<double>(bytes));
    double lat = 0;
    for (size_t j = 0; j + 1 < x.chain.size(); ++j) {
      hop(x.chain[j], x.chain[j + 1], bytes);
      const bool net = pl.host[x.chain[j]] != pl.host[x.chain[j + 1]];
      lat += net ? pl.net.alpha_us : pl.shm.alpha_us;
      if (j > 0) lat += step * (net ? bn : bs);
    }
    latency = std::max(latency, lat);
  }
  for (const Gather& g : s->gathers)
    for (size_t i = 0; i < g.group.size(); ++i) {
      repack(g.group[i], g.slice, false);
      for (size_t m = 0; m < g.group.size(); ++m)
        if (m != i) hop(g.group[i], g.group[m], (g.cuts[i + 1] - g.cuts[i]) * elem);
    }
  for (const LocalCopy& c : s->copies) {
    const Slice& sl = s->slices[c.slice];
    const size_t runs = run_count(sl.box, src.tile_box(sl.src_tile), dst.tile_box(sl.dst_tile));
    rank_in[c.rank] += (sl.box.elems() * elem + runs * pl.copy_step_bytes) * bs;
  }
  double busiest = 0;
  for (double t : nic_out) busiest = std::max(busiest, t);
  for (double t : nic_in) busiest = std::max(busiest, t);
  for (double t : rank_in) busiest = std::max(busiest, t);
  const int most = *std::max_element(msgs.begin(), msgs.end());
  std::vector<int> out_flows(nh, 0), in_flows(nh, 0);
  for (const auto& [a, b] : flows) {
    ++out_flows[pl.host[a]];
    ++in_flows[pl.host[b]];
  }
  s->host_flows = 0;
  for (int h = 0; h < nh; ++h) s->host_flows = std::max({s->host_flows, out_flows[h], in_flows[h]});
  s->link_us = busiest;
  s->predicted_us = busiest + latency + most * pl.shm.alpha_us;
}

void schedule_send_recv(const Placement& pl, Balance b, Schedule* s) {
  std::vector<double> load(pl.host.size(), 0);
  for (size_t i = 0; i < s->slices.size(); ++i) {
    const Slice& sl = s->slices[i];
    const size_t n = sl.box.elems();
    for (int r : remote_receivers(sl)) {
      const int snd = pick_sender(sl.senders, pl, pl.host[r], b, &load);
      load[snd] += static_cast<double>(n);
      s->xfers.push_back({static_cast<int>(i), 0, n, {snd, r}});
    }
  }
}

// Receivers grouped by host, hosts in order of first appearance.
std::vector<std::vector<int>> by_host(const std::vector<int>& ranks, const Placement& pl) {
  std::vector<std::vector<int>> groups;
  std::map<int, size_t> index;
  for (int r : ranks) {
    auto [it, fresh] = index.emplace(pl.host[r], groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(r);
  }
  return groups;
}

void schedule_allgather(const Placement& pl, Balance b, Schedule* s) {
  std::vector<double> load(pl.host.size(), 0);
  for (size_t i = 0; i < s->slices.size(); ++i) {
    const Slice& sl = s->slices[i];
    const size_t n = sl.box.elems();
    for (const std::vector<int>& g : by_host(remote_receivers(sl), pl)) {
      const size_t k = g.size();
      Gather gather{static_cast<int>(i), g, {}};
      for (size_t j = 0; j <= k; ++j) gather.cuts.push_back(chunk_bound(n, k, j));
      for (size_t j = 0; j < k; ++j) {
        const size_t lo = gather.cuts[j], hi = gather.cuts[j + 1];
        if (hi == lo) continue;
        const int snd = pick_sender(sl.senders, pl, pl.host[g[j]], b, &load);
        load[snd] += static_cast<double>(hi - lo);
        s->xfers.push_back({static_cast<int>(i), lo, hi, {snd, g[j]}});
      }
      if (k > 1) s->gathers.push_back(std::move(gather));
    }
  }
}

void schedule_broadcast(const Placement& pl, Balance b, size_t elem, Schedule* s) {
  // One work per slice with remote receivers; workers are hosts.
  std::vector<Work> works;
  std::vector<int> which;
  const double bn = us_per_byte(pl.net), bs = us_per_byte(pl.shm);
  for (size_t i = 0; i < s->slices.size(); ++i) {
    const Slice& sl = s->slices[i];
    const std::vector<int> rem = remote_receivers(sl);
    if (rem.empty()) continue;
    Work w;
    std::set<int> sh, rh;
    for (int r : sl.senders) sh.insert(pl.host[r]);
    for (int r : rem) rh.insert(pl.host[r]);
    w.senders.assign(sh.begin(), sh.end());
    w.receivers.assign(rh.begin(), rh.end());
    const bool local = rh.size() == 1 && sh.count(*rh.begin()) > 0;
    w.duration = static_cast<double>(sl.box.elems() * elem) * (local ? bs : bn);
    works.push_back(std::move(w));
    which.push_back(static_cast<int>(i));
  }
  const Solution sol = solve(works, pl.nhosts(), b);
  std::vector<double> load(pl.host.size(), 0);
  for (int wi : sol.order) {
    const int i = which[wi];
    const Slice& sl = s->slices[i];
    const int host = sol.sender[wi];
    std::vector<int> cands;
    for (int r : sl.senders)
      if (pl.host[r] == host) cands.push_back(r);
    const int snd = pick_sender(cands, pl, host, b == Balance::None ? Balance::None : Balance::Size, &load);
    load[snd] += static_cast<double>(sl.box.elems());
    // The chain: the sender's host first, then each host's receivers in turn,
    // so each host boundary is crossed once.
    std::vector<int> chain{snd};
    const std::vector<int> rem = remote_receivers(sl);
    for (int r : rem)
      if (pl.host[r] == host) chain.push_back(r);
    for (const std::vector<int>& g : by_host(rem, pl))
      if (pl.host[g[0]] != host) chain.insert(chain.end(), g.begin(), g.end());
    s->xfers.push_back({i, 0, sl.box.elems(), chain});
  }
}

}  // namespace

Schedule make_schedule(const Layout& src, const Layout& dst, const Placement& pl, size_t elem, Strategy strategy,
                       Balance balance) {
  Schedule s;
  s.strategy = strategy;
  s.slices = make_slices(src, dst);
  for (size_t i = 0; i < s.slices.size(); ++i)
    for (int r : s.slices[i].receivers)
      if (holds(s.slices[i], r)) s.copies.push_back({static_cast<int>(i), r});
  switch (strategy) {
    case Strategy::SendRecv: schedule_send_recv(pl, balance, &s); break;
    case Strategy::LocalAllGather: schedule_allgather(pl, balance, &s); break;
    case Strategy::Broadcast:
    case Strategy::Auto:
      s.strategy = Strategy::Broadcast;
      schedule_broadcast(pl, balance, elem, &s);
      break;
  }
  predict(src, dst, pl, elem, &s);
  return s;
}

Schedule choose_schedule(const Layout& src, const Layout& dst, const Placement& pl, size_t elem, Strategy strategy,
                         Balance balance) {
  if (strategy != Strategy::Auto) return make_schedule(src, dst, pl, elem, strategy, balance);
  std::vector<Schedule> cands;
  for (Strategy s : {Strategy::Broadcast, Strategy::LocalAllGather, Strategy::SendRecv})
    cands.push_back(make_schedule(src, dst, pl, elem, s, balance));
  double lowest = cands[0].predicted_us;
  for (const Schedule& c : cands) lowest = std::min(lowest, c.predicted_us);
  // The first of the smallest keys: in the 2% window, fewest flows, lowest prediction.
  auto key = [lowest](const Schedule& c) {
    return std::make_tuple(c.predicted_us > lowest * 1.02, c.host_flows, c.predicted_us);
  };
  auto best = std::min_element(cands.begin(), cands.end(),
                               [&](const Schedule& a, const Schedule& b) { return key(a) < key(b); });
  return std::move(*best);
}

double lower_bound_us(const Layout& src, const Layout& dst, const Placement& pl, size_t elem) {
  const std::vector<Slice> slices = make_slices(src, dst);
  const int nh = pl.nhosts(), nr = static_cast<int>(pl.host.size());
  std::vector<double> in(nh, 0), out(nh, 0), rank_in(nr, 0);
  const double bn = us_per_byte(pl.net);
  const double best_bw = std::max(pl.net.bw_gbs, pl.shm.bw_gbs);
  const double bbest = best_bw > 0 ? 1e-3 / best_bw : 0.0;
  for (const Slice& s : slices) {
    const double bytes = static_cast<double>(s.box.elems() * elem);
    std::set<int> sh, rh;
    for (int r : s.senders) sh.insert(pl.host[r]);
    for (int r : s.receivers) {
      rh.insert(pl.host[r]);
      if (!holds(s, r)) rank_in[r] += bytes * bbest;
    }
    for (int h : rh)
      if (!sh.count(h)) in[h] += bytes * bn;
    // Held on one host only and needed on another: it leaves that host once.
    if (sh.size() == 1)
      for (int h : rh)
        if (h != *sh.begin()) {
          out[*sh.begin()] += bytes * bn;
          break;
        }
  }
  double lb = 0;
  for (double t : in) lb = std::max(lb, t);
  for (double t : out) lb = std::max(lb, t);
  for (double t : rank_in) lb = std::max(lb, t);
  return lb;
}

}  // namespace meshccl::reshard
