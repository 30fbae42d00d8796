/* Built against meshccl's own nccl.h (without CUDA headers), so its layout
 * can be compared with NVIDIA's in abi_check.c. */
#include "nccl.h"

#include "abi_layout.h"

void abi_layout_ours(struct abi_layout* out) { ABI_FILL_LAYOUT(out); }
