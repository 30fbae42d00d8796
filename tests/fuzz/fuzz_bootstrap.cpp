// libFuzzer: what strangers can send the bootstrap: a connection's greeting,
// and the rank table a (possibly forged) root returns.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshccl;
  static const uint8_t secret[kSecretBytes] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  if (size < 1) return 0;
  const int nranks = 1 + data[0] % 8;
  const int me = (data[0] >> 3) % nranks;
  const int from = greeting_sender(data + 1, size - 1, secret, nranks, me);
  if (from >= nranks) __builtin_trap();
  std::vector<PeerInfo> table(nranks);
  std::memset(table.data(), 0, sizeof(PeerInfo) * nranks);
  std::memcpy(table.data(), data + 1, std::min(size - 1, sizeof(PeerInfo) * nranks));
  if (check_peer_table(&table, nranks).ok()) {
    for (int r = 0; r < nranks; ++r)
      if (table[r].rank != r || std::strlen(table[r].host_id) >= sizeof(table[r].host_id)) __builtin_trap();
  }
  return 0;
}
