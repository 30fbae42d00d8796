// The portable implementation: the generic loops of typed.h compiled for the
// baseline ISA of the build, vectorised as far as the compiler manages.
#define MESHCCL_KERNEL_NS portable
#include "kernels/typed.h"

namespace meshccl::kernels {

const KernelTable& portable_table() {
  static const KernelTable table = [] {
    KernelTable t{};
    t.name = "portable";
    portable::fill_generic(t);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
