#include "data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace perf {

namespace {

const TypeInfo kTypes[] = {
    {ncclInt8, "int8", 1, false, true, 0, 0},        {ncclUint8, "uint8", 1, false, false, 0, 0},
    {ncclInt32, "int32", 4, false, true, 0, 0},      {ncclUint32, "uint32", 4, false, false, 0, 0},
    {ncclInt64, "int64", 8, false, true, 0, 0},      {ncclUint64, "uint64", 8, false, false, 0, 0},
    {ncclFloat16, "half", 2, true, true, 5, 10},     {ncclFloat32, "float", 4, true, true, 8, 23},
    {ncclFloat64, "double", 8, true, true, 11, 52},  {ncclBfloat16, "bfloat16", 2, true, true, 8, 7},
    {ncclFloat8e4m3, "f8e4m3", 1, true, true, 4, 3}, {ncclFloat8e5m2, "f8e5m2", 1, true, true, 5, 2},
};

const char* const kOpNames[] = {"sum", "prod", "max", "min", "avg", "mulsum", "none"};

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t RankKey(uint64_t seed, int rank) {
  return Mix(seed * 0x100000001b3ULL + static_cast<uint64_t>(rank) * 0x2545f4914f6cdd1dULL);
}

// Uniform integer in [lo, hi] (hi - lo < 2^32) from the high bits of h.
inline int64_t Uniform(uint64_t h, int64_t lo, int64_t hi) {
  const uint64_t range = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(((h >> 32) * range) >> 32);
}

inline uint64_t Mask(size_t size) { return size >= 8 ? ~0ULL : (1ULL << (8 * size)) - 1; }

inline int64_t SignExtend(uint64_t bits, size_t size) {
  if (size >= 8) return static_cast<int64_t>(bits);
  const int shift = 64 - 8 * static_cast<int>(size);
  return static_cast<int64_t>(bits << shift) >> shift;
}

inline void Store(void* dst, size_t i, size_t size, uint64_t bits) {
  std::memcpy(static_cast<char*>(dst) + i * size, &bits, size);  // little-endian hosts
}

inline uint64_t Load(const void* src, size_t i, size_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(src) + i * size, size);
  return bits;
}

// Per-measurement constants shared by input generation and expected values.
struct Model {
  const TypeInfo& t;
  Op op;
  int n;
  uint64_t seed;
  int64_t lim;  // floating types: largest integer magnitude the type holds exactly

  Model(const DataSpec& s)
      : t(*s.type),
        op(s.op),
        n(std::max(1, s.nranks)),
        seed(s.seed),
        lim(int64_t{1} << (std::min(s.type->mant_bits, 30) + 1)) {}

  // Value of `rank` at global index idx: the bit pattern for integer types and
  // kNone, an exactly representable integer for floating reductions.
  int64_t FloatValue(uint64_t h, int rank, size_t idx) const {
    switch (op) {
      case Op::kSum: {
        const int64_t b = lim / n;
        return Uniform(h, -b, b);
      }
      case Op::kMulSum: {
        const int64_t b = lim / (2 * n);
        return Uniform(h, -b, b);
      }
      case Op::kProd: {
        const int special = static_cast<int>(idx % n);
        if (rank == special) return Uniform(h, -(lim / 2), lim / 2);
        const int64_t sign = (h & 1) ? 1 : -1;
        return rank == static_cast<int>((idx + 1) % n) ? 2 * sign : sign;
      }
      case Op::kMax:
      case Op::kMin: return Uniform(h, -lim, lim);
      case Op::kAvg: {
        if (rank != static_cast<int>(idx % n) && rank != static_cast<int>((idx + 1) % n)) return 0;
        // One sign for both contributors: with cancellation, the rounding of
        // each scaled input could exceed the result's last place many times.
        return Uniform(h, 0, lim / 2);
      }
      case Op::kNone: break;
    }
    return 0;
  }

  uint64_t IntBits(uint64_t h, int rank, size_t idx) const {
    if (op != Op::kAvg) return h & Mask(t.size);
    if (rank != static_cast<int>(idx % n) && rank != static_cast<int>((idx + 1) % n)) return 0;
    const int w = static_cast<int>(8 * t.size);
    const int64_t b = int64_t{1} << std::min(w - 3, 30);
    return static_cast<uint64_t>(t.is_signed ? Uniform(h, -b, b) : Uniform(h, 0, 2 * b)) & Mask(t.size);
  }

  uint64_t InputBits(uint64_t key, int rank, size_t idx) const {
    const uint64_t h = Mix(key + idx);
    if (op == Op::kNone) return h & Mask(t.size);
    if (!t.is_float) return IntBits(h, rank, idx);
    return EncodeFloat(t, static_cast<double>(FloatValue(h, rank, idx)));
  }
};

template <class Fn>
void ForEachFloat32(size_t count, void* dst, Fn fn) {
  float* out = static_cast<float*>(dst);
  for (size_t i = 0; i < count; i++) out[i] = fn(i);
}

}  // namespace

const TypeInfo* FindType(const char* name) {
  for (const TypeInfo& t : kTypes)
    if (std::strcmp(t.name, name) == 0) return &t;
  return nullptr;
}

const TypeInfo& TypeOf(ncclDataType_t type) {
  for (const TypeInfo& t : kTypes)
    if (t.type == type) return t;
  return kTypes[7];
}

int NumTypes() { return static_cast<int>(sizeof kTypes / sizeof kTypes[0]); }
const TypeInfo& TypeAt(int i) { return kTypes[i]; }

const char* OpName(Op op) { return kOpNames[static_cast<int>(op)]; }

bool FindOp(const char* name, Op* op) {
  for (int i = 0; i < 6; i++) {
    if (std::strcmp(kOpNames[i], name) == 0) {
      *op = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

ncclRedOp_t NcclOp(Op op) {
  switch (op) {
    case Op::kProd: return ncclProd;
    case Op::kMax: return ncclMax;
    case Op::kMin: return ncclMin;
    case Op::kAvg: return ncclAvg;
    default: return ncclSum;
  }
}

uint64_t EncodeFloat(const TypeInfo& t, double v) {
  if (t.size == 8) {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return b;
  }
  if (t.size == 4 && t.exp_bits == 8) {
    const float f = static_cast<float>(v);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  }
  const int E = t.exp_bits, M = t.mant_bits;
  const bool fn = (E == 4);  // e4m3fn: no infinities, one NaN pattern per sign
  const int bias = (1 << (E - 1)) - 1;
  const uint64_t sign = std::signbit(v) ? 1ULL << (E + M) : 0;
  if (std::isnan(v)) return sign | (fn ? 0x7FULL : ((((1ULL << E) - 1) << M) | (1ULL << (M - 1))));
  const double a = std::fabs(v);
  if (a == 0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);
  int exp = e2 - 1;  // a = 1.f * 2^exp
  uint64_t bits;
  if (exp < 1 - bias) {
    const double m = std::nearbyint(std::ldexp(a, bias - 1 + M));  // subnormal quantum
    bits = static_cast<uint64_t>(m);                               // m == 2^M rolls into the smallest normal
  } else {
    double m = std::nearbyint(std::ldexp(a, M - exp));
    if (m >= std::ldexp(1.0, M + 1)) {
      m /= 2;
      exp++;
    }
    bits = (static_cast<uint64_t>(exp + bias) << M) | (static_cast<uint64_t>(m) - (1ULL << M));
  }
  const uint64_t max_exp_field = (1ULL << E) - 1;
  if (fn) {
    if (bits > ((max_exp_field << M) | ((1ULL << M) - 2))) bits = 0x7F;  // beyond 448: NaN
  } else if ((bits >> M) >= max_exp_field) {
    bits = max_exp_field << M;  // infinity
  }
  return sign | bits;
}

double DecodeFloat(const TypeInfo& t, uint64_t bits) {
  if (t.size == 8) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  if (t.size == 4 && t.exp_bits == 8) {
    const uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  const int E = t.exp_bits, M = t.mant_bits;
  const int bias = (1 << (E - 1)) - 1;
  const bool neg = (bits >> (E + M)) & 1;
  const uint64_t ef = (bits >> M) & ((1ULL << E) - 1);
  const uint64_t mf = bits & ((1ULL << M) - 1);
  double v;
  if (E == 4 && ef == 15 && mf == 7) v = NAN;
  else if (E != 4 && ef == (1ULL << E) - 1) v = mf ? NAN : INFINITY;
  else if (ef == 0) v = std::ldexp(static_cast<double>(mf), 1 - bias - M);
  else v = std::ldexp(static_cast<double>(mf | (1ULL << M)), static_cast<int>(ef) - bias - M);
  return neg ? -v : v;
}

void FillInput(const DataSpec& spec, int rank, size_t offset, size_t count, void* dst) {
  const Model m(spec);
  const uint64_t key = RankKey(spec.seed, rank);
  if (m.t.type == ncclFloat32 && spec.op != Op::kNone) {
    ForEachFloat32(count, dst, [&](size_t i) {
      const size_t idx = offset + i;
      return static_cast<float>(m.FloatValue(Mix(key + idx), rank, idx));
    });
    return;
  }
  for (size_t i = 0; i < count; i++) Store(dst, i, m.t.size, m.InputBits(key, rank, offset + i));
}

void FillReduced(const DataSpec& spec, size_t offset, size_t count, void* dst) {
  const Model m(spec);
  std::vector<uint64_t> keys(m.n);
  for (int r = 0; r < m.n; r++) keys[r] = RankKey(spec.seed, r);
  const TypeInfo& t = m.t;

  if (spec.op == Op::kNone) {  // not a reduction: nothing sensible but rank 0's data
    FillInput(spec, 0, offset, count, dst);
    return;
  }
  if (t.is_float) {
    const double avg_scale = DecodeFloat(t, EncodeFloat(t, 1.0 / m.n));
    auto reduce = [&](size_t idx) -> double {
      if (spec.op == Op::kAvg) {
        const int a = static_cast<int>(idx % m.n), b = static_cast<int>((idx + 1) % m.n);
        double r = m.FloatValue(Mix(keys[a] + idx), a, idx) * avg_scale;
        if (b != a) r += m.FloatValue(Mix(keys[b] + idx), b, idx) * avg_scale;
        return r;
      }
      double acc = m.FloatValue(Mix(keys[0] + idx), 0, idx);
      for (int r = 1; r < m.n; r++) {
        const double v = m.FloatValue(Mix(keys[r] + idx), r, idx);
        switch (spec.op) {
          case Op::kSum: acc += v; break;
          case Op::kMulSum: acc += (r & 1 ? 2 : 1) * v; break;
          case Op::kProd: acc *= v; break;
          case Op::kMax: acc = std::max(acc, v); break;
          case Op::kMin: acc = std::min(acc, v); break;
          default: break;
        }
      }
      return acc;  // rank 0's PreMulSum scalar is 1
    };
    if (t.type == ncclFloat32) {
      ForEachFloat32(count, dst, [&](size_t i) { return static_cast<float>(reduce(offset + i)); });
    } else {
      for (size_t i = 0; i < count; i++) Store(dst, i, t.size, EncodeFloat(t, reduce(offset + i)));
    }
    return;
  }

  const uint64_t mask = Mask(t.size);
  for (size_t i = 0; i < count; i++) {
    const size_t idx = offset + i;
    uint64_t acc = m.IntBits(Mix(keys[0] + idx), 0, idx);
    int64_t sacc = SignExtend(acc, t.size);
    for (int r = 1; r < m.n; r++) {
      const uint64_t v = m.IntBits(Mix(keys[r] + idx), r, idx);
      const int64_t sv = SignExtend(v, t.size);
      switch (spec.op) {
        case Op::kSum: acc += v; break;
        case Op::kMulSum: acc += (r & 1 ? 2 : 1) * v; break;
        case Op::kProd: acc *= v; break;
        case Op::kMax:
          if (t.is_signed ? sv > sacc : (v & mask) > (acc & mask)) {
            acc = v;
            sacc = sv;
          }
          break;
        case Op::kMin:
          if (t.is_signed ? sv < sacc : (v & mask) < (acc & mask)) {
            acc = v;
            sacc = sv;
          }
          break;
        case Op::kAvg:
          sacc += sv;
          acc += v;
          break;  // small values: no wrap
        default: break;
      }
    }
    if (spec.op == Op::kAvg) acc = t.is_signed ? static_cast<uint64_t>(sacc / m.n) : (acc & mask) / m.n;
    Store(dst, i, t.size, acc & mask);
  }
}

int64_t CountWrong(const DataSpec& spec, const void* actual, const void* expected, size_t count) {
  const TypeInfo& t = *spec.type;
  int64_t wrong = 0;
  if (t.is_float && spec.op == Op::kAvg) {
    // Order the bit patterns so that adjacent floats differ by one.
    const int sign_shift = static_cast<int>(8 * t.size) - 1;
    auto ordered = [&](uint64_t b) -> int64_t {
      const int64_t mag = static_cast<int64_t>(b & ((1ULL << sign_shift) - 1));
      return ((b >> sign_shift) & 1) ? -mag : mag;
    };
    for (size_t i = 0; i < count; i++) {
      const int64_t d = ordered(Load(actual, i, t.size)) - ordered(Load(expected, i, t.size));
      if (d > 2 || d < -2) wrong++;
    }
    return wrong;
  }
  if (t.size == 4) {
    const uint32_t* a = static_cast<const uint32_t*>(actual);
    const uint32_t* e = static_cast<const uint32_t*>(expected);
    for (size_t i = 0; i < count; i++) wrong += a[i] != e[i];
    return wrong;
  }
  for (size_t i = 0; i < count; i++) wrong += Load(actual, i, t.size) != Load(expected, i, t.size);
  return wrong;
}

void MulSumScalar(const TypeInfo& t, int rank, void* scalar) {
  const int s = (rank & 1) ? 2 : 1;
  const uint64_t bits = t.is_float ? EncodeFloat(t, s) : static_cast<uint64_t>(s);
  std::memcpy(scalar, &bits, t.size);
}

}  // namespace perf
