#include "grid.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

std::string Grid::parse(const std::string& order, const std::vector<Dim>& sizes, Grid* out) {
  std::vector<std::string> names;
  std::string cur;
  for (size_t i = 0; i <= order.size(); i++) {
    if (i == order.size() || order[i] == '-') {
      if (cur.empty()) return "order '" + order + "' has an empty dimension name";
      names.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(order[i]);
    }
  }
  std::set<std::string> seen;
  for (const auto& n : names) {
    if (!seen.insert(n).second) return "order '" + order + "' names '" + n + "' twice";
  }
  std::vector<Dim> dims;
  for (const auto& n : names) {
    auto it = std::find_if(sizes.begin(), sizes.end(), [&](const Dim& d) { return d.name == n; });
    if (it == sizes.end()) return "order '" + order + "' names an unknown dimension '" + n + "'";
    if (it->size < 1) return "dimension '" + n + "' has size " + std::to_string(it->size);
    dims.push_back(*it);
  }
  for (const auto& d : sizes) {
    if (!seen.count(d.name)) return "order '" + order + "' leaves out dimension '" + d.name + "'";
  }
  *out = Grid(std::move(dims));
  return "";
}

int Grid::find(const std::string& name) const {
  for (int d = 0; d < ndims(); d++) {
    if (dims_[d].name == name) return d;
  }
  return -1;
}

int Grid::stride(const std::string& name) const {
  int s = 1;
  for (const auto& d : dims_) {
    if (d.name == name) return s;
    s *= d.size;
  }
  return 0;
}

int Grid::world() const {
  int w = 1;
  for (const auto& d : dims_) w *= d.size;
  return w;
}

std::vector<int> Grid::coords(int rank) const {
  std::vector<int> c(dims_.size());
  for (size_t d = 0; d < dims_.size(); d++) {
    c[d] = rank % dims_[d].size;
    rank /= dims_[d].size;
  }
  return c;
}

int Grid::rank(const std::vector<int>& c) const {
  int r = 0;
  for (int d = ndims() - 1; d >= 0; d--) r = r * dims_[d].size + c[d];
  return r;
}

int Grid::coord(int rank, const std::string& name) const {
  const int d = find(name);
  return d < 0 ? 0 : coords(rank)[d];
}

std::vector<bool> Grid::mask(const std::vector<std::string>& names) const {
  std::vector<bool> in(dims_.size(), false);
  for (const auto& n : names) {
    const int d = find(n);
    if (d >= 0) in[d] = true;
  }
  return in;
}

int Grid::group_color(int rank, const std::vector<std::string>& names) const {
  const auto in = mask(names);
  const auto c = coords(rank);
  int color = 0;
  for (int d = ndims() - 1; d >= 0; d--) {
    if (!in[d]) color = color * dims_[d].size + c[d];
  }
  return color;
}

int Grid::group_key(int rank, const std::vector<std::string>& names) const {
  const auto in = mask(names);
  const auto c = coords(rank);
  int key = 0;
  for (int d = ndims() - 1; d >= 0; d--) {
    if (in[d]) key = key * dims_[d].size + c[d];
  }
  return key;
}

int Grid::group_size(const std::vector<std::string>& names) const {
  const auto in = mask(names);
  int n = 1;
  for (int d = 0; d < ndims(); d++) {
    if (in[d]) n *= dims_[d].size;
  }
  return n;
}

std::vector<int> Grid::group_members(int rank, const std::vector<std::string>& names) const {
  const auto in = mask(names);
  const auto base = coords(rank);
  const int n = group_size(names);
  std::vector<int> out;
  out.reserve(n);
  for (int key = 0; key < n; key++) {
    std::vector<int> c = base;
    int k = key;
    for (int d = 0; d < ndims(); d++) {
      if (!in[d]) continue;
      c[d] = k % dims_[d].size;
      k /= dims_[d].size;
    }
    out.push_back(this->rank(c));
  }
  return out;
}

bool parse_tp_mode(const std::string& s, TpMode* out) {
  if (s == "1d") {
    *out = TpMode::OneD;
  } else if (s == "3d") {
    *out = TpMode::ThreeD;
  } else {
    return false;
  }
  return true;
}

const char* tp_mode_name(TpMode m) { return m == TpMode::ThreeD ? "3d" : "1d"; }

int Layout::cube() const {
  for (int q = 1; q * q * q <= tp; q++) {
    if (q * q * q == tp) return q;
  }
  return 0;
}

namespace {
const char* const kCubeDims[3] = {"tp3i", "tp3w", "tp3o"};
}

const char* cube_axis_dim(int axis) { return kCubeDims[axis]; }

std::vector<std::string> Layout::tp_dims() const {
  if (tp_mode == TpMode::ThreeD) return {kCubeDims[kAxisO], kCubeDims[kAxisI], kCubeDims[kAxisW]};
  return {"tp"};
}

Grid Layout::grid() const {
  Grid g;
  const std::string e = Grid::parse(order, {{"tp", tp}, {"pp", pp}, {"dp", dp}}, &g);
  if (!e.empty()) throw std::invalid_argument("--order: " + e);
  if (tp_mode != TpMode::ThreeD) return g;
  const int q = cube();
  if (q == 0) throw std::invalid_argument("--tp-mode 3d needs tp = q^3");
  std::vector<Grid::Dim> dims;
  for (int d = 0; d < g.ndims(); d++) {
    if (g.dim(d).name == "tp") {
      for (const auto& n : tp_dims()) dims.push_back({n, q});
    } else {
      dims.push_back(g.dim(d));
    }
  }
  return Grid(std::move(dims));
}

CubeCoords cube_coords(int tp_rank, int q) {
  CubeCoords c;
  c.o = tp_rank % q;
  c.i = (tp_rank / q) % q;
  c.w = tp_rank / (q * q);
  return c;
}

int Layout::replica() const {
  if (!hetero()) return pp * tp;
  int n = 0;
  for (int t : stage_tp) n += t;
  return n;
}

int Layout::stage_offset(int stage) const {
  if (!hetero()) return stage * tp;
  int n = 0;
  for (int s = 0; s < stage; s++) n += stage_tp[s];
  return n;
}

Layout Layout::stage_view(int stage) const {
  Layout v = *this;
  v.tp = tp_of(stage);
  v.stage_tp.clear();
  return v;
}

Coords coords_of(int rank, const Layout& l) {
  if (l.hetero()) {
    Coords c;
    c.dp = rank / l.replica();
    int r = rank % l.replica();
    while (c.pp < l.pp - 1 && r >= l.stage_tp[c.pp]) r -= l.stage_tp[c.pp++];
    c.tp = r;
    return c;
  }
  const Grid g = l.grid();
  Coords c;
  c.dp = g.coord(rank, "dp");
  c.pp = g.coord(rank, "pp");
  c.tp = g.group_key(rank, l.tp_dims());
  return c;
}

int rank_of(const Coords& c, const Layout& l) {
  if (l.hetero()) return c.dp * l.replica() + l.stage_offset(c.pp) + c.tp;
  const Grid g = l.grid();
  std::vector<int> v(g.ndims(), 0);
  v[g.find("dp")] = c.dp;
  v[g.find("pp")] = c.pp;
  if (l.tp_mode == TpMode::ThreeD) {
    const CubeCoords cc = cube_coords(c.tp, l.cube());
    for (int a = 0; a < 3; a++) v[g.find(cube_axis_dim(a))] = cc.axis(a);
  } else {
    v[g.find("tp")] = c.tp;
  }
  return g.rank(v);
}

int tp_color(const Coords& c, const Layout& l) { return l.grid().group_color(rank_of(c, l), l.tp_dims()); }
int pp_color(const Coords& c, const Layout& l) { return l.grid().group_color(rank_of(c, l), {"pp"}); }
int dp_color(const Coords& c, const Layout& l) { return l.grid().group_color(rank_of(c, l), {"dp"}); }

int cube_axis_color(const Coords& c, const Layout& l, int axis) {
  return l.grid().group_color(rank_of(c, l), {cube_axis_dim(axis)});
}

int embed_color(const Coords& c, const Layout& l, bool tied) {
  if (!tied || l.pp == 1) return -1;
  if (c.pp != 0 && c.pp != l.pp - 1) return -1;
  return pp_color(c, l);
}

LayerRange stage_layers(int layers, int pp, int stage) {
  const int base = layers / pp, extra = layers % pp;
  LayerRange r;
  r.lo = stage * base + (stage < extra ? stage : extra);
  r.hi = r.lo + base + (stage < extra ? 1 : 0);
  return r;
}

LayerRange stage_layers(const Layout& l, int layers, int stage) {
  if (l.stages.empty()) return stage_layers(layers, l.pp, stage);
  LayerRange r;
  for (int s = 0; s < stage; s++) r.lo += l.stages[s];
  r.hi = r.lo + l.stages[stage];
  return r;
}

int padded_vocab(int vocab, int tp) {
  const int q = 8 * tp;
  return (vocab + q - 1) / q * q;
}

std::string check_layout(const ModelConfig& m, const Layout& l, int world_size, int micro_batch, int grad_accum) {
  std::ostringstream e;
  Grid g;
  const std::string order_error = Grid::parse(l.order, {{"tp", 1}, {"pp", 1}, {"dp", 1}}, &g);
  const int q = l.cube();
  if (l.hetero()) {
    // One tensor-parallel degree per stage: 1D, the default order, and a tied
    // embedding only between stages of equal degree.
    int heads_bad = 0;
    for (int t : l.stage_tp) heads_bad = t >= 1 && m.heads % t != 0 ? t : heads_bad;
    if (l.dp < 1 || l.pp < 1 || static_cast<int>(l.stage_tp.size()) != l.pp ||
        *std::min_element(l.stage_tp.begin(), l.stage_tp.end()) < 1) {
      e << "--tp lists " << l.stage_tp.size() << " degree(s) for " << l.pp
        << " stage(s); give one degree of at least 1 per stage";
    } else if (l.tp_mode != TpMode::OneD) {
      e << "per-stage tensor-parallel degrees (--tp a,b,...) work with --tp-mode 1d only";
    } else if (l.order != "tp-pp-dp") {
      e << "per-stage tensor-parallel degrees (--tp a,b,...) use the order tp-pp-dp, got " << l.order;
    } else if (l.world() != world_size) {
      e << "dp x (sum of the stages' tp) = " << l.dp << " x " << l.replica() << " = " << l.world()
        << " but the job has " << world_size << " rank(s)";
    } else if (heads_bad != 0) {
      e << "heads " << m.heads << " is not divisible by a stage's tp " << heads_bad;
    } else if (m.tied && l.pp > 1 && l.stage_tp.front() != l.stage_tp.back()) {
      e << "a tied embedding needs the first and last stage to have the same tp (got " << l.stage_tp.front() << " and "
        << l.stage_tp.back() << "); use --untied";
    }
    if (!e.str().empty()) return e.str();
    return check_layout(m, l.stage_view(0), l.dp * l.pp * l.tp_of(0), micro_batch, grad_accum);
  }
  if (l.dp < 1 || l.pp < 1 || l.tp < 1) {
    e << "--dp, --pp and --tp must be at least 1 (got " << l.dp << "x" << l.pp << "x" << l.tp << ")";
  } else if (!order_error.empty()) {
    e << "--order: " << order_error << " (a permutation of tp, pp and dp, fastest first)";
  } else if (l.world() != world_size) {
    e << "dp x pp x tp = " << l.dp << " x " << l.pp << " x " << l.tp << " = " << l.world() << " but the job has "
      << world_size << " rank(s)";
  } else if (m.layers < 1 || m.d_model < 1 || m.heads < 1 || m.seq < 1 || m.vocab < 2) {
    e << "layers, d-model, heads and seq must be positive and the vocabulary at least 2";
  } else if (m.d_model > kMaxDModel || m.layers > kMaxLayers || m.seq > kMaxSeq) {
    e << "--d-model " << m.d_model << ", --layers " << m.layers << ", --seq " << m.seq << ": at most " << kMaxDModel
      << ", " << kMaxLayers << " and " << kMaxSeq << " (each tensor's rows and columns must stay countable)";
  } else if (static_cast<int64_t>(micro_batch) * m.seq > kMaxTokens) {
    e << "--micro-batch " << micro_batch << " x --seq " << m.seq << " = " << static_cast<int64_t>(micro_batch) * m.seq
      << " tokens per micro-batch; at most " << kMaxTokens;
  } else if (m.d_model % m.heads != 0) {
    e << "d-model " << m.d_model << " is not divisible by heads " << m.heads;
  } else if (l.tp_mode == TpMode::OneD && m.heads % l.tp != 0) {
    e << "heads " << m.heads << " is not divisible by tp " << l.tp << " (each tensor-parallel rank owns whole heads)";
  } else if (l.tp_mode == TpMode::ThreeD && q == 0) {
    e << "--tp-mode 3d needs tp to be a cube q^3 (1, 8, 27, ...), got " << l.tp;
  } else if (l.tp_mode == TpMode::ThreeD && m.heads % q != 0) {
    e << "heads " << m.heads << " is not divisible by the cube side " << q
      << " (each rank of a cube row owns whole heads)";
  } else if (l.tp_mode == TpMode::ThreeD && m.d_model % (q * q) != 0) {
    e << "d-model " << m.d_model << " is not divisible by q^2 = " << q * q
      << " (3D weights are cut q^2 ways along one dimension)";
  } else if (l.tp_mode == TpMode::ThreeD && micro_batch % (q * q) != 0) {
    e << "--micro-batch " << micro_batch << " is not divisible by q^2 = " << q * q
      << " (3D activations are cut into q^2 blocks of whole sequences)";
  } else if (l.pp > m.layers) {
    e << "pp " << l.pp << " asks for more pipeline stages than the " << m.layers << " layer(s)";
  } else if (!l.stages.empty() && static_cast<int>(l.stages.size()) != l.pp) {
    e << "--stages names " << l.stages.size() << " stage(s) but pp is " << l.pp;
  } else if (!l.stages.empty() && (*std::min_element(l.stages.begin(), l.stages.end()) < 1 ||
                                   std::accumulate(l.stages.begin(), l.stages.end(), 0) != m.layers)) {
    e << "--stages must give every stage at least one layer and " << m.layers << " layer(s) in all";
  } else if (micro_batch < 1 || grad_accum < 1) {
    e << "--micro-batch and --grad-accum must be at least 1";
  }
  return e.str();
}

}  // namespace meshtrain
