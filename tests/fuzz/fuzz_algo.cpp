// libFuzzer: MESHCCL_ALGO is bytes from the environment. The first byte picks
// the collective, the rest is the setting's value; parsing must end with a
// list of known names or a clear error, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algo_rule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshccl;
  static const std::vector<AlgoName> table = {
      {"ring", OpKind::AllReduce},
      {"tree", OpKind::AllReduce},
      {"halving_doubling", OpKind::AllReduce},
      {"recursive_doubling", OpKind::AllReduce},
      {"ring", OpKind::AllGather},
      {"ring", OpKind::ReduceScatter},
      {"chain", OpKind::Broadcast},
      {"tree", OpKind::Broadcast},
      {"chain", OpKind::Reduce},
      {"tree", OpKind::Reduce},
      {"pairwise", OpKind::AlltoAll},
      {"direct", OpKind::Gather},
      {"direct", OpKind::Scatter},
      {"direct_shm", OpKind::AllReduce},
      {"direct_shm", OpKind::Broadcast},
  };
  if (size < 1) return 0;
  const OpKind kind = static_cast<OpKind>(data[0] % (static_cast<int>(OpKind::Recv) + 1));
  const std::string spec(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string> names;
  bool exclude = false;
  Status s = parse_algo_rule(spec, kind, table, &names, &exclude);
  if (!s.ok()) return 0;
  for (const std::string& n : names) {
    bool known = false;
    for (const AlgoName& a : table) known |= n == a.name;
    if (!known) __builtin_trap();  // a name that passed must be one of the table's
  }
  return 0;
}
