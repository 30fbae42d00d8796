#include "grid.h"

#include <sstream>

namespace meshtrain {

Coords coords_of(int rank, const Layout& l) {
  Coords c;
  c.tp = rank % l.tp;
  c.pp = (rank / l.tp) % l.pp;
  c.dp = rank / (l.tp * l.pp);
  return c;
}

int rank_of(const Coords& c, const Layout& l) { return (c.dp * l.pp + c.pp) * l.tp + c.tp; }

int tp_color(const Coords& c, const Layout& l) { return c.dp * l.pp + c.pp; }
int pp_color(const Coords& c, const Layout& l) { return c.dp * l.tp + c.tp; }
int dp_color(const Coords& c, const Layout& l) { return c.pp * l.tp + c.tp; }

int embed_color(const Coords& c, const Layout& l, bool tied) {
  if (!tied || l.pp == 1) return -1;
  if (c.pp != 0 && c.pp != l.pp - 1) return -1;
  return c.dp * l.tp + c.tp;
}

LayerRange stage_layers(int layers, int pp, int stage) {
  const int base = layers / pp, extra = layers % pp;
  LayerRange r;
  r.lo = stage * base + (stage < extra ? stage : extra);
  r.hi = r.lo + base + (stage < extra ? 1 : 0);
  return r;
}

int padded_vocab(int vocab, int tp) {
  const int q = 8 * tp;
  return (vocab + q - 1) / q * q;
}

std::string check_layout(const ModelConfig& m, const Layout& l, int world_size, int micro_batch,
                         int grad_accum) {
  std::ostringstream e;
  if (l.dp < 1 || l.pp < 1 || l.tp < 1) {
    e << "--dp, --pp and --tp must be at least 1 (got " << l.dp << "x" << l.pp << "x" << l.tp << ")";
  } else if (l.world() != world_size) {
    e << "dp x pp x tp = " << l.dp << " x " << l.pp << " x " << l.tp << " = " << l.world()
      << " but the job has " << world_size << " rank(s)";
  } else if (m.layers < 1 || m.d_model < 1 || m.heads < 1 || m.seq < 1 || m.vocab < 2) {
    e << "layers, d-model, heads and seq must be positive and the vocabulary at least 2";
  } else if (m.d_model % m.heads != 0) {
    e << "d-model " << m.d_model << " is not divisible by heads " << m.heads;
  } else if (m.heads % l.tp != 0) {
    e << "heads " << m.heads << " is not divisible by tp " << l.tp
      << " (each tensor-parallel rank owns whole heads)";
  } else if (l.pp > m.layers) {
    e << "pp " << l.pp << " asks for more pipeline stages than the " << m.layers << " layer(s)";
  } else if (micro_batch < 1 || grad_accum < 1) {
    e << "--micro-batch and --grad-accum must be at least 1";
  }
  return e.str();
}

}  // namespace meshtrain
