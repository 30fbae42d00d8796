// libFuzzer: ncclUniqueId bytes handed to ncclCommInitRank (id_decode), and
// the id-file text of meshcclCommInitFromEnv.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/id_text.h"
#include "bootstrap/unique_id.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshccl;
  ncclUniqueId id{};
  std::memcpy(id.internal, data, size < sizeof id.internal ? size : sizeof id.internal);
  IdContents c{};
  SockAddr root;
  if (id_decode(id, &c, &root).ok()) {
    std::string s = root.str();  // what init logs and connects to
    (void)s;
  }
  unsigned long gen = 0;
  ncclUniqueId parsed{};
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (parse_id_text(text, &gen, &parsed)) {
    // What parses must print back to the same id.
    unsigned long gen2 = 0;
    ncclUniqueId again{};
    if (!parse_id_text(id_text(gen, parsed), &gen2, &again) || gen2 != gen ||
        std::memcmp(&again, &parsed, sizeof parsed) != 0)
      __builtin_trap();
  }
  return 0;
}
