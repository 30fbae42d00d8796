// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the bootstrap's
// challenge-response: ranks prove they hold a communicator's secret without
// sending it. Self-contained; checked against the FIPS 180-4 and RFC 4231
// test vectors in tests/util/util_test.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace meshccl {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  Digest finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// HMAC-SHA256 over the concatenation of `parts` (pointer, size pairs).
struct Bytes {
  const void* data;
  size_t size;
};
Digest hmac_sha256(const void* key, size_t key_size, std::initializer_list<Bytes> parts);

// Equal without an early exit, so timing does not tell how much matched.
bool equal_in_constant_time(const void* a, const void* b, size_t size);

}  // namespace meshccl
