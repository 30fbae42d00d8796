// The avx2 implementation (compiled with avx2 flags; only called after the
// runtime CPU check).
#define MESHCCL_KERNEL_NS avx2
#include "collectives/kernels/typed.h"

namespace meshccl::kernels {

const KernelTable& avx2_table() {
  static const KernelTable table = [] {
    KernelTable t{};
    t.name = "avx2";
    avx2::fill_generic(t);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
