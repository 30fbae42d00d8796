// The avx512 implementation (compiled with avx512 flags; only called after the
// runtime CPU check).
#define MESHCCL_KERNEL_NS avx512
#include "collectives/kernels/typed.h"

namespace meshccl::kernels {

const KernelTable& avx512_table() {
  static const KernelTable table = [] {
    KernelTable t{};
    t.name = "avx512";
    avx512::fill_generic(t);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
