// Encoding test values (small integers, exact in every datatype) into NCCL
// datatypes, and the reference reduction semantics (integers wrap).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/reduce.h"
#include "nccl.h"

namespace meshccl_test {

inline size_t esize(ncclDataType_t dt) { return meshccl::dtype_size(dt); }
inline bool is_float(ncclDataType_t dt) { return dt >= ncclFloat16; }

inline void encode(ncclDataType_t dt, double v, void* out) {
  using namespace meshccl::kernels;
  int64_t iv = static_cast<int64_t>(v);
  switch (dt) {
    case ncclInt8: {
      int8_t x = static_cast<int8_t>(iv);
      std::memcpy(out, &x, 1);
      break;
    }
    case ncclUint8: {
      uint8_t x = static_cast<uint8_t>(iv);
      std::memcpy(out, &x, 1);
      break;
    }
    case ncclInt32: {
      int32_t x = static_cast<int32_t>(iv);
      std::memcpy(out, &x, 4);
      break;
    }
    case ncclUint32: {
      uint32_t x = static_cast<uint32_t>(iv);
      std::memcpy(out, &x, 4);
      break;
    }
    case ncclInt64: {
      int64_t x = iv;
      std::memcpy(out, &x, 8);
      break;
    }
    case ncclUint64: {
      uint64_t x = static_cast<uint64_t>(iv);
      std::memcpy(out, &x, 8);
      break;
    }
    case ncclFloat16: {
      uint16_t x = float_to_half(static_cast<float>(v));
      std::memcpy(out, &x, 2);
      break;
    }
    case ncclFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(out, &x, 4);
      break;
    }
    case ncclFloat64: {
      std::memcpy(out, &v, 8);
      break;
    }
    case ncclBfloat16: {
      uint16_t x = float_to_bf16(static_cast<float>(v));
      std::memcpy(out, &x, 2);
      break;
    }
    case ncclFloat8e4m3: {
      uint8_t x = float_to_e4m3(static_cast<float>(v));
      std::memcpy(out, &x, 1);
      break;
    }
    case ncclFloat8e5m2: {
      uint8_t x = float_to_e5m2(static_cast<float>(v));
      std::memcpy(out, &x, 1);
      break;
    }
    default: break;
  }
}

inline double decode(ncclDataType_t dt, const void* in) {
  using namespace meshccl::kernels;
  switch (dt) {
    case ncclInt8: {
      int8_t x;
      std::memcpy(&x, in, 1);
      return x;
    }
    case ncclUint8: {
      uint8_t x;
      std::memcpy(&x, in, 1);
      return x;
    }
    case ncclInt32: {
      int32_t x;
      std::memcpy(&x, in, 4);
      return x;
    }
    case ncclUint32: {
      uint32_t x;
      std::memcpy(&x, in, 4);
      return x;
    }
    case ncclInt64: {
      int64_t x;
      std::memcpy(&x, in, 8);
      return static_cast<double>(x);
    }
    case ncclUint64: {
      uint64_t x;
      std::memcpy(&x, in, 8);
      return static_cast<double>(x);
    }
    case ncclFloat16: {
      uint16_t x;
      std::memcpy(&x, in, 2);
      return half_to_float(x);
    }
    case ncclFloat32: {
      float x;
      std::memcpy(&x, in, 4);
      return x;
    }
    case ncclFloat64: {
      double x;
      std::memcpy(&x, in, 8);
      return x;
    }
    case ncclBfloat16: {
      uint16_t x;
      std::memcpy(&x, in, 2);
      return bf16_to_float(x);
    }
    case ncclFloat8e4m3: {
      uint8_t x;
      std::memcpy(&x, in, 1);
      return e4m3_to_float(x);
    }
    case ncclFloat8e5m2: {
      uint8_t x;
      std::memcpy(&x, in, 1);
      return e5m2_to_float(x);
    }
    default: return 0;
  }
}

// The value a datatype holds after storing v (integer wrap, float rounding).
inline double stored(ncclDataType_t dt, double v) {
  unsigned char buf[8];
  encode(dt, v, buf);
  return decode(dt, buf);
}

// Relative tolerance for floating results that involve one rounding.
inline double tolerance(ncclDataType_t dt) {
  switch (dt) {
    case ncclFloat16: return 2e-3;
    case ncclBfloat16: return 1.6e-2;
    case ncclFloat8e4m3: return 0.13;
    case ncclFloat8e5m2: return 0.26;
    case ncclFloat32: return 1e-6;
    case ncclFloat64: return 1e-12;
    default: return 0;
  }
}

// For a value reduced over nranks: every partial sum an algorithm keeps is
// rounded in the datatype, and algorithms add in different orders, so the
// error bound grows with the number of additions.
inline bool close(ncclDataType_t dt, double got, double want, int nranks = 2) {
  if (!is_float(dt)) return got == want;
  const double tol = tolerance(dt) * std::fmax(1.0, (nranks - 1) / 2.0);
  return std::fabs(got - want) <= tol * std::fmax(1.0, std::fabs(want));
}

}  // namespace meshccl_test
