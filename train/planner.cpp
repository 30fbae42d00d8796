#include "planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace meshtrain {

const MicroProfile* Profile::find(int micro_batch) const {
  for (const auto& m : micro) {
    if (m.micro_batch == micro_batch) return &m;
  }
  return nullptr;
}

double LinkModel::Fit::time(double bytes) const {
  const size_t n = std::min(at_bytes.size(), at_seconds.size());
  if (n < 2) return alpha + bytes * beta;
  size_t i = 1;  // the segment [i - 1, i] that holds bytes, or the end one
  while (i + 1 < n && at_bytes[i] < bytes) i++;
  const double x0 = at_bytes[i - 1], x1 = at_bytes[i], y0 = at_seconds[i - 1], y1 = at_seconds[i];
  const double y = x1 > x0 ? y0 + (bytes - x0) * (y1 - y0) / (x1 - x0) : y1;
  return std::max(0.0, y);
}

const LinkModel::Fit& LinkModel::coll(int n, int stride) const {
  for (const auto& f : collective) {
    if (stride > 0 && f.ranks == n && f.stride == stride) return f;
  }
  const Fit* best = nullptr;
  for (const auto& f : collective) {
    if (f.ranks >= n && (!best || f.ranks < best->ranks)) best = &f;
  }
  if (best) return *best;
  for (const auto& f : collective) {
    if (!best || f.ranks > best->ranks) best = &f;
  }
  static const Fit none;
  return best ? *best : none;
}

const LinkModel::Fit& LinkModel::pair(int stride, int phase) const {
  const Fit* other = nullptr;
  for (const auto& f : p2p_strided) {
    if (stride > 0 && f.stride == stride && f.phase == phase) return f;
    if (stride > 0 && f.stride == stride && !other) other = &f;
  }
  return other ? *other : p2p;
}

std::string Candidate::describe() const {
  char buf[256];
  std::string split;
  for (size_t i = 0; i < layout.stages.size(); i++) { split += (i ? "," : "") + std::to_string(layout.stages[i]); }
  std::snprintf(buf, sizeof buf, "dp %d x pp %d x tp %d (%s)%s%s, micro-batch %d x %d", layout.dp, layout.pp, layout.tp,
                tp_mode_name(layout.tp_mode), split.empty() ? "" : " stages ", split.c_str(), micro_batch, grad_accum);
  return buf;
}

std::vector<int> best_split(int layers, int pp, double layer, double first_extra, double last_extra) {
  // cost[s][j]: the best bottleneck for layers [0, j) on stages [0, s].
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> cost(pp, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(pp, std::vector<int>(layers + 1, 0));
  auto stage_time = [&](int s, int n) {
    return n * layer + (s == 0 ? first_extra : 0) + (s == pp - 1 ? last_extra : 0);
  };
  for (int j = 1; j <= layers; j++) cost[0][j] = stage_time(0, j);
  for (int s = 1; s < pp; s++) {
    for (int j = s + 1; j <= layers; j++) {
      for (int k = s; k < j; k++) {  // stage s takes layers [k, j)
        const double c = std::max(cost[s - 1][k], stage_time(s, j - k));
        // Ties go to the later cut, which keeps the first stages no larger.
        if (c < cost[s][j] - 1e-15) cost[s][j] = c, cut[s][j] = k;
      }
    }
  }
  std::vector<int> out(pp);
  int j = layers;
  for (int s = pp - 1; s > 0; s--) {
    out[s] = j - cut[s][j];
    j = cut[s][j];
  }
  out[0] = j;
  return out;
}

namespace {

// Parameters of one transformer layer, and of the embedding/head tables.
double layer_params(int C) { return 12.0 * C * C + 13.0 * C; }

// Parameters one rank of stage s holds.
double stage_params(const ModelConfig& m, const Layout& l, int s) {
  const double C = m.d_model, Vp = padded_vocab(m.vocab, l.tp);
  double n = stage_layers(l, m.layers, s).count() * layer_params(m.d_model);
  if (s == 0) n += (Vp + m.seq) * C;
  if (s == l.pp - 1) n += 2 * C + ((!m.tied || l.pp > 1) ? Vp * C : 0);
  return n / l.tp;
}

// World-rank distance between neighbours along dimension `dim` ("tp", "pp"
// or "dp") of a layout (Grid::stride); 0 when the order does not parse.
int dim_stride(const Layout& l, const std::string& dim) {
  Grid g;
  if (!Grid::parse(l.order, {{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}}, &g).empty()) return 0;
  return g.stride(dim);
}

// The mean of fits (3D tensor parallelism runs collectives along three axes
// of its cube, each with its own stride).
LinkModel::Fit mean_fit(const std::vector<LinkModel::Fit>& fits) {
  LinkModel::Fit m;
  m.cpu = 0;
  for (const auto& f : fits) {
    m.alpha += f.alpha / fits.size(), m.beta += f.beta / fits.size(), m.cpu += f.cpu / fits.size();
  }
  // The mean curve where every fit has the same measured points.
  bool same = !fits.empty();
  for (const auto& f : fits) same = same && f.at_bytes == fits.front().at_bytes;
  if (same && !fits.front().at_bytes.empty()) {
    m.at_bytes = fits.front().at_bytes;
    m.at_seconds.assign(m.at_bytes.size(), 0.0);
    for (const auto& f : fits) {
      for (size_t i = 0; i < m.at_seconds.size() && i < f.at_seconds.size(); i++) {
        m.at_seconds[i] += f.at_seconds[i] / fits.size();
      }
    }
  }
  m.ranks = fits.empty() ? 0 : fits.front().ranks;
  return m;
}

}  // namespace

double memory_bytes(const ModelConfig& m, const Layout& l, int micro_batch, int grad_accum) {
  // Parameters, gradients and AdamW moments, and the activations of the
  // micro-batches in flight (1F1B: pp - s on stage s).
  const double N = static_cast<double>(micro_batch) * m.seq, C = m.d_model;
  const double t = l.tp, M = grad_accum;
  const bool three = l.tp_mode == TpMode::ThreeD;
  const int q = three ? l.cube() : 0;
  const double Vp = padded_vocab(m.vocab, l.tp);
  const int pp = l.pp;
  double mem = 0;
  for (int s = 0; s < pp; s++) {
    const LayerRange lr = stage_layers(l, m.layers, s);
    const double slots = std::max(pp > 1 ? 2.0 : 1.0, std::min<double>(pp - s, M));
    const double heads_l = static_cast<double>(m.heads) / (three ? q : t);
    const double seqs = micro_batch / (three ? q * q : 1.0);
    const double width_r = three ? C / q : C;
    const double Nr = seqs * m.seq;
    double per_layer =
        Nr * (5 * width_r + 4) + Nr * (3 * C + C + 8 * C) / (three ? q : t) + seqs * heads_l * m.seq * m.seq;
    if (three) per_layer += (N / q) * (C + C + C + 4 * C) / q + 12 * C * C / (q * q);
    double act = slots * (Nr * width_r + lr.count() * per_layer);
    if (s == pp - 1) act += slots * Nr * (Vp / (three ? q : t) + width_r + 8);
    mem = std::max(mem, 4 * (4 * stage_params(m, l, s) + act));
  }
  return mem;
}

void predict(const PlanRequest& r, const Profile& p, const LinkModel& links, Candidate* c) {
  const Layout& l = c->layout;
  const ModelConfig& m = r.model;
  const MicroProfile* mp = p.find(c->micro_batch);
  if (!mp) {
    c->step_s = std::numeric_limits<double>::infinity();
    return;
  }
  const double N = static_cast<double>(c->micro_batch) * m.seq, C = m.d_model;
  const double t = l.tp, M = c->grad_accum;
  const bool three = l.tp_mode == TpMode::ThreeD;
  const int q = three ? l.cube() : 0;
  const double slow = std::max(1.0, static_cast<double>(r.world) / std::max(1, p.cores));
  const double Vp = padded_vocab(m.vocab, l.tp);

  // Tensor-parallel communication per micro-batch: per layer, and for the
  // embedding and the head.
  double tp_layer = 0, tp_embed = 0, tp_head = 0, tp_cpu = 1;
  const int tp_stride = dim_stride(l, "tp"), pp_stride = dim_stride(l, "pp"), dp_stride = dim_stride(l, "dp");
  if (l.tp > 1 && !three) {
    const LinkModel::Fit& f = links.coll(l.tp, tp_stride);
    tp_cpu = f.cpu;
    const double ar = f.time(2 * (t - 1) / t * N * C * 4);
    tp_layer = 4 * ar;
    tp_embed = ar;
    tp_head = ar + 2 * f.time(2 * (t - 1) / t * 1.5 * N * 4);  // two all-reduces of 1.5 N floats each
  } else if (three) {
    // The cube's axes o, i, w are tp_stride x 1, q and q^2 apart.
    const LinkModel::Fit f =
        mean_fit({links.coll(q, tp_stride), links.coll(q, tp_stride * q), links.coll(q, tp_stride * q * q)});
    tp_cpu = f.cpu;
    auto lin = [&](double IC, double OC) {
      return 6 * f.time(2.0 * (q - 1) / (q * q * q) * (N * IC + N * OC + IC * OC) * 4 / 6);
    };
    const double ln = 3 * f.alpha;  // statistics: tiny all-reduces
    tp_layer = lin(C, 3 * C) + lin(C, C) + lin(C, 4 * C) + lin(4 * C, C) + 2 * ln;
    tp_embed = 4 * f.time(2.0 * (q - 1) * (N / q + N / (q * q)) * C / q * 4 / 4);
    tp_head = lin(C, Vp) + ln + 4 * f.alpha;
  }

  // Stage times per micro-batch (forward + backward), compute and tensor-parallel.
  const int pp = l.pp;
  std::vector<double> T(pp), B(pp), params(pp);
  c->compute_s = c->tp_comm_s = 0;
  double stage_sum = 0, block = 0, work = 0;
  const double act_bytes = N * C * 4 / (three ? t : 1);
  // One message across the boundary after stage s (s, s + 1 are pp_stride
  // world ranks apart; even and odd boundaries pair ranks differently).
  std::vector<double> p2p(std::max(0, pp - 1)), p2p_cpu(p2p.size());
  for (int s = 0; s + 1 < pp; s++) {
    const LinkModel::Fit& pf = links.pair(pp_stride, s % 2);
    p2p[s] = pf.time(act_bytes);
    p2p_cpu[s] = p2p[s] * pf.cpu;
  }
  double boundaries = 0;
  for (double x : p2p) boundaries += 2 * x;
  for (int s = 0; s < pp; s++) {
    const LayerRange lr = stage_layers(l, m.layers, s);
    double comp = lr.count() * (mp->layer_fwd + mp->layer_bwd);
    double back = lr.count() * mp->layer_bwd;
    double comm = lr.count() * tp_layer;
    params[s] = stage_params(m, l, s);
    if (s == 0) comp += mp->embed_fb, back += mp->embed_fb / 2, comm += tp_embed;
    if (s == pp - 1) comp += mp->head_fb, back += mp->head_fb / 2, comm += tp_head;
    comp = comp / t;
    back = back / t;
    // In the steady state a stage sends one micro-batch's activations and
    // receives another's gradient over a boundary in one group (1F1B's
    // send_forward_recv_backward): one two-way exchange per boundary, which
    // is what the pairs' fit measures.
    const double msgs = (s > 0 ? p2p[s - 1] : 0) + (s < pp - 1 ? p2p[s] : 0);
    const double msgs_cpu = (s > 0 ? p2p_cpu[s - 1] : 0) + (s < pp - 1 ? p2p_cpu[s] : 0);
    // Every rank's busy time: its compute, and the share of its communication
    // time its core was busy (all of it on shared memory, where waiting spins
    // and the peers must be scheduled; little of it across a slow network).
    work += (comp + comm * tp_cpu + msgs_cpu) * M * t * l.dp;
    T[s] = comp + comm;
    B[s] = back;
    stage_sum += T[s];
    block = std::max(block, T[s] + msgs);
    c->compute_s = std::max(c->compute_s, comp * M);
    c->tp_comm_s = std::max(c->tp_comm_s, comm * M);
  }
  // DAPPLE's latency: one micro-batch through every stage and boundary, then
  // M - 1 more at the pace of the slowest stage.
  const double latency = stage_sum + boundaries + (M - 1) * block;
  c->pp_comm_s = boundaries + (pp > 1 ? (M - 1) * (block - *std::max_element(T.begin(), T.end())) : 0);
  c->bubble_s = pp > 1 ? latency - M * *std::max_element(T.begin(), T.end()) - c->pp_comm_s : 0;
  // Data-parallel all-reduce of each stage's gradients, overlapped with the
  // last backward pass; what is left over is exposed.
  c->dp_exposed_s = 0;
  double most_params = 0;
  for (int s = 0; s < pp; s++) {
    most_params = std::max(most_params, params[s]);
    if (l.dp > 1) {
      const LinkModel::Fit& f = links.coll(l.dp, dp_stride);
      const double ar = f.time(2.0 * (l.dp - 1) / l.dp * params[s] * 4);
      c->dp_exposed_s = std::max(c->dp_exposed_s, ar - B[s]);
    }
  }
  c->dp_exposed_s = std::max(0.0, c->dp_exposed_s);
  const double update = p.update_per_param * most_params * slow;
  // With more ranks than cores the step is also bounded by all ranks' busy
  // time shared among the cores (a rank waiting for a pipeline peer leaves its
  // core to the others).
  c->cpu_bound_s = work / std::max(1, p.cores);
  c->step_s = std::max(latency, c->cpu_bound_s) + c->dp_exposed_s + update;

  c->mem_bytes = memory_bytes(m, l, c->micro_batch, c->grad_accum);
}

std::vector<Candidate> search(const PlanRequest& r, const Profile& p, const LinkModel& links) {
  std::vector<Candidate> out;
  for (int tp = 1; tp <= r.world; tp++) {
    if (r.world % tp) continue;
    for (int pp = 1; pp * tp <= r.world; pp++) {
      if ((r.world / tp) % pp) continue;
      const int dp = r.world / (tp * pp);
      for (TpMode mode : {TpMode::OneD, TpMode::ThreeD}) {
        if (mode == TpMode::ThreeD && (!r.allow_3d || tp == 1)) continue;
        if (r.global_batch % dp) continue;
        for (const MicroProfile& mp : p.micro) {
          const int b = mp.micro_batch;
          if ((r.global_batch / dp) % b) continue;
          Candidate c;
          c.layout.dp = dp, c.layout.pp = pp, c.layout.tp = tp, c.layout.tp_mode = mode;
          c.layout.order = r.order;
          c.micro_batch = b;
          c.grad_accum = r.global_batch / (dp * b);
          if (!check_layout(r.model, c.layout, r.world, b, c.grad_accum).empty()) continue;
          if (pp > 1) {
            // Balance the stages with the embedding and head costs included.
            const double tt = tp, layer = (mp.layer_fwd + mp.layer_bwd) / tt;
            c.layout.stages = best_split(r.model.layers, pp, layer, mp.embed_fb / tt, mp.head_fb / tt);
          }
          predict(r, p, links, &c);
          if (r.mem_limit > 0 && c.mem_bytes > r.mem_limit) continue;
          out.push_back(c);
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.step_s < b.step_s; });
  return out;
}

std::string plan_check(double predicted_s, double measured_s) {
  const double off = measured_s / predicted_s - 1;
  char buf[512];
  std::snprintf(buf, sizeof buf, "plan: predicted %.1f ms/step, measured %.1f ms/step (%+.0f%%)", predicted_s * 1e3,
                measured_s * 1e3, 100 * off);
  std::string out = buf;
  if (std::fabs(off) > kPlanWarnRatio) {
    out += "\nwarning: the measured step time is " + std::string(off > 0 ? "above" : "below") +
           " the plan's prediction by more than " + std::to_string(static_cast<int>(kPlanWarnRatio * 100)) +
           "%: the plan may not be the fastest layout here (other load on the machine, or a --profile measured "
           "elsewhere or under other load; `meshtrain plan` lists the alternatives)";
  }
  return out;
}

}  // namespace meshtrain
