// A deliberately plain reference for the reduction kernels: conversions by
// definition (ldexp of the fields) and by nearest-value search over every
// code, arithmetic one element at a time. Shares no code with the kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/reduce.h"

namespace kref {

using meshccl::ReduceOp;

inline bool is_int(ncclDataType_t dt) { return dt <= ncclUint64; }
inline bool is_signed_int(ncclDataType_t dt) { return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64; }
inline size_t size_of(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

inline float fbits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t ubits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Decoding straight from the format definitions.
inline double decode_narrow(ncclDataType_t dt, uint32_t code) {
  int ebits, mbits, bias;
  bool has_inf;
  switch (dt) {
    case ncclFloat16:
      ebits = 5;
      mbits = 10;
      bias = 15;
      has_inf = true;
      break;
    case ncclBfloat16:
      ebits = 8;
      mbits = 7;
      bias = 127;
      has_inf = true;
      break;
    case ncclFloat8e4m3:
      ebits = 4;
      mbits = 3;
      bias = 7;
      has_inf = false;
      break;
    default:
      ebits = 5;
      mbits = 2;
      bias = 15;
      has_inf = true;
      break;
  }
  const uint32_t sign = code >> (ebits + mbits) & 1;
  const uint32_t e = code >> mbits & ((1u << ebits) - 1);
  const uint32_t m = code & ((1u << mbits) - 1);
  double v;
  const uint32_t emax = (1u << ebits) - 1;
  if (has_inf && e == emax) {
    v = m ? NAN : INFINITY;
  } else if (!has_inf && e == emax && m == (1u << mbits) - 1) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << mbits)), static_cast<int>(e) - bias - mbits);
  }
  return sign ? -v : v;
}

// Nearest representable value, ties to the even code. IEEE types overflow to
// inf past the rounding boundary; fp8 saturates to the largest finite value.
class Encoder {
 public:
  explicit Encoder(ncclDataType_t dt) : dt_(dt) {
    const uint32_t n = dt == ncclFloat16 || dt == ncclBfloat16 ? 0x8000u : 0x80u;
    for (uint32_t c = 0; c < n; ++c) {
      const double v = decode_narrow(dt, c);
      if (std::isfinite(v)) vals_.push_back({v, c});
    }
    sign_bit_ = n;
  }
  uint32_t encode(float f) const {
    if (std::isnan(f)) return nan_code();
    const uint32_t sign = std::signbit(f) ? sign_bit_ : 0;
    const double x = std::fabs(static_cast<double>(f));
    const Entry& top = vals_.back();
    if (x > top.v) {
      if (dt_ == ncclFloat8e4m3 || dt_ == ncclFloat8e5m2) return sign | top.code;
      const double ulp = top.v - vals_[vals_.size() - 2].v;
      return sign | (x >= top.v + ulp / 2 ? inf_code() : top.code);
    }
    size_t lo = 0, hi = vals_.size() - 1;  // vals_[lo].v <= x <= vals_[hi].v
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      (vals_[mid].v <= x ? lo : hi) = mid;
    }
    if (vals_[hi].v == x) return sign | vals_[hi].code;
    const double midpoint = (vals_[lo].v + vals_[hi].v) / 2;
    if (x < midpoint) return sign | vals_[lo].code;
    if (x > midpoint) return sign | vals_[hi].code;
    return sign | ((vals_[lo].code & 1) == 0 ? vals_[lo].code : vals_[hi].code);
  }

 private:
  struct Entry {
    double v;
    uint32_t code;
  };
  uint32_t nan_code() const { return dt_ == ncclFloat16 ? 0x7e00 : dt_ == ncclBfloat16 ? 0x7fc0 : 0x7f; }
  uint32_t inf_code() const { return dt_ == ncclFloat16 ? 0x7c00 : 0x7f80; }
  ncclDataType_t dt_;
  std::vector<Entry> vals_;
  uint32_t sign_bit_ = 0;
};

const Encoder& encoder(ncclDataType_t dt);

inline bool is_nan_code(ncclDataType_t dt, uint64_t bits) {
  switch (dt) {
    case ncclFloat32: return std::isnan(fbits(static_cast<uint32_t>(bits)));
    case ncclFloat64: {
      double d;
      std::memcpy(&d, &bits, 8);
      return std::isnan(d);
    }
    default: return std::isnan(decode_narrow(dt, static_cast<uint32_t>(bits)));
  }
}

inline bool is_zero_code(ncclDataType_t dt, uint64_t bits) {
  switch (dt) {
    case ncclFloat32: return (bits & 0x7fffffffu) == 0;
    case ncclFloat64: return (bits & 0x7fffffffffffffffull) == 0;
    default: return decode_narrow(dt, static_cast<uint32_t>(bits)) == 0.0;
  }
}

// Element i of a buffer as raw bits.
inline uint64_t get(ncclDataType_t dt, const void* p, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + i * size_of(dt), size_of(dt));
  return v;
}
inline void put(ncclDataType_t dt, void* p, size_t i, uint64_t v) {
  std::memcpy(static_cast<unsigned char*>(p) + i * size_of(dt), &v, size_of(dt));
}

inline uint64_t mask(ncclDataType_t dt) {
  const size_t b = size_of(dt) * 8;
  return b == 64 ? ~0ull : (1ull << b) - 1;
}
inline int64_t sext(ncclDataType_t dt, uint64_t v) {
  const unsigned b = static_cast<unsigned>(size_of(dt) * 8);
  if (b == 64) return static_cast<int64_t>(v);
  const uint64_t sign = 1ull << (b - 1);
  return static_cast<int64_t>((v ^ sign) - sign);
}

// Combine for integers on raw bits.
inline uint64_t int_op(ncclDataType_t dt, ReduceOp op, uint64_t a, uint64_t b) {
  switch (op) {
    case ReduceOp::Sum: return (a + b) & mask(dt);
    case ReduceOp::Prod: return (a * b) & mask(dt);
    case ReduceOp::Max:
      if (is_signed_int(dt)) return sext(dt, a) >= sext(dt, b) ? a : b;
      return a >= b ? a : b;
    default:
      if (is_signed_int(dt)) return sext(dt, a) <= sext(dt, b) ? a : b;
      return a <= b ? a : b;
  }
}

template <class F>
inline F float_op(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::Sum: return a + b;
    case ReduceOp::Prod: return a * b;
    // fmax/fmin, except that a signalling NaN counts as missing data like a
    // quiet one (IEEE 754-2019 maximumNumber; glibc's fmax returns NaN).
    case ReduceOp::Max: return std::isnan(a) ? b : std::isnan(b) ? a : std::fmax(a, b);
    default: return std::isnan(a) ? b : std::isnan(b) ? a : std::fmin(a, b);
  }
}

// Reduction of one element position over n operands given as raw bits,
// accumulating in the compute type (float for the narrow types) and rounding once.
inline uint64_t reduce_elem(ncclDataType_t dt, ReduceOp op, const uint64_t* v, int n) {
  if (is_int(dt)) {
    uint64_t acc = v[0];
    for (int k = 1; k < n; ++k) acc = int_op(dt, op, acc, v[k]);
    return acc;
  }
  if (dt == ncclFloat64) {
    double acc, x;
    std::memcpy(&acc, &v[0], 8);
    for (int k = 1; k < n; ++k) {
      std::memcpy(&x, &v[k], 8);
      acc = float_op(op, acc, x);
    }
    uint64_t r;
    std::memcpy(&r, &acc, 8);
    return r;
  }
  auto widen = [&](uint64_t bits) {
    return dt == ncclFloat32 ? fbits(static_cast<uint32_t>(bits))
                             : static_cast<float>(decode_narrow(dt, static_cast<uint32_t>(bits)));
  };
  float acc = widen(v[0]);
  for (int k = 1; k < n; ++k) acc = float_op(op, acc, widen(v[k]));
  if (dt == ncclFloat32) return ubits(acc);
  return encoder(dt).encode(acc);
}

// Whether a kernel result matches the reference: bit-equal, both NaN, or
// both zero for max/min (fmax may return either zero of +0/-0).
inline bool same(ncclDataType_t dt, ReduceOp op, uint64_t want, uint64_t got) {
  if (want == got) return true;
  if (is_int(dt)) return false;
  if (is_nan_code(dt, want) && is_nan_code(dt, got)) return true;
  return (op == ReduceOp::Max || op == ReduceOp::Min) && is_zero_code(dt, want) && is_zero_code(dt, got);
}

}  // namespace kref
