// The device reduction kernels (reduce.cu) as one fat binary for sm_80,
// sm_90 and compute_90 PTX, embedded in the library by the build
// (scripts/embed_bin). src/cuda loads it with cuModuleLoadData and finds the
// kernels by their C names: meshccl_reduce2_<dt>_<op>, meshccl_divide_<dt>,
// meshccl_scale_<dt> (datatype and op numbered as in nccl.h and kernels/elements.h).
#pragma once

#include <cstddef>

namespace meshccl::kernels {

const unsigned char* cuda_fatbin();
size_t cuda_fatbin_size();

}  // namespace meshccl::kernels
