// Entry points of the reduction kernels: argument screening, one table lookup
// per call, and the choice of implementation made once per process.
#define MESHCCL_KERNEL_NS portable
#include "kernels/reduce.h"

#include <atomic>
#include <cstring>

#include "kernels/convert.h"
#include "kernels/table.h"

namespace meshccl::kernels {

namespace {

const KernelTable* table_by_name(const char* name) {
  if (std::strcmp(name, "portable") == 0) return &portable_table();
#if MESHCCL_KERNELS_X86
  if (std::strcmp(name, "avx2") == 0) return &avx2_table();
  if (std::strcmp(name, "avx512") == 0) return &avx512_table();
#endif
  return nullptr;
}

const KernelTable* best_table() {
#if MESHCCL_KERNELS_X86
  if (isa_supported("avx512")) return &avx512_table();
  if (isa_supported("avx2")) return &avx2_table();
#endif
  return &portable_table();
}

std::atomic<const KernelTable*> g_table{nullptr};

const KernelTable& table() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) [[unlikely]] {
    const KernelTable* fresh = best_table();
    // A racing first call, or select_isa(), may have set it already; keep theirs.
    if (g_table.compare_exchange_strong(t, fresh, std::memory_order_acq_rel)) t = fresh;
  }
  return *t;
}

bool valid(ncclDataType_t dt, ReduceOp op) {
  return static_cast<unsigned>(dt) < kNumTypes && static_cast<unsigned>(op) < kNumOps;
}

}  // namespace

bool isa_supported(const char* name) {
  if (name == nullptr) return false;
  if (std::strcmp(name, "portable") == 0) return true;
#if MESHCCL_KERNELS_X86
  // The first call may come from another library's static constructor,
  // before libgcc has filled in its CPU model.
  __builtin_cpu_init();
  if (std::strcmp(name, "avx2") == 0) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }
  if (std::strcmp(name, "avx512") == 0) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c");
  }
#endif
  return false;
}

#if MESHCCL_KERNELS_X86
bool avx512_fp8_extras_supported() {
  __builtin_cpu_init();
  return isa_supported("avx512") && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("avx512vbmi2");
}
#endif

bool select_isa(const char* name) {
  if (name == nullptr) return false;
  if (std::strcmp(name, "auto") == 0) {
    g_table.store(best_table(), std::memory_order_release);
    return true;
  }
  const KernelTable* t = table_by_name(name);
  if (t == nullptr || !isa_supported(name)) return false;
  g_table.store(t, std::memory_order_release);
  return true;
}

const char* isa_name() { return table().name; }

// The runtime validates datatypes and ops before it gets here; an invalid one
// (or a missing buffer) is ignored rather than allowed to crash a progress thread.
void reduce2(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  if (count == 0 || !valid(dt, op) || dst == nullptr || a == nullptr || b == nullptr) return;
  table().reduce2[dt][static_cast<int>(op)](dst, a, b, count);
}

void reduce_n(ncclDataType_t dt, ReduceOp op, void* dst, const void* const* srcs, int nsrc, size_t count) {
  if (count == 0 || !valid(dt, op) || dst == nullptr || srcs == nullptr || nsrc < 1) return;
  for (int k = 0; k < nsrc; ++k) {
    if (srcs[k] == nullptr) return;
  }
  table().reduce_n[dt][static_cast<int>(op)](dst, srcs, nsrc, count);
}

void divide(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor) {
  if (count == 0 || !valid(dt, ReduceOp::Sum) || dst == nullptr || src == nullptr) return;
  table().divide[dt](dst, src, count, divisor);
}

void scale(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar) {
  if (count == 0 || !valid(dt, ReduceOp::Sum) || dst == nullptr || src == nullptr || scalar == nullptr) return;
  table().scale[dt](dst, src, count, scalar);
}

float half_to_float(uint16_t h) { return portable::h2f(h); }
uint16_t float_to_half(float f) { return portable::f2h(f); }
float bf16_to_float(uint16_t b) { return portable::b2f(b); }
uint16_t float_to_bf16(float f) { return portable::f2b(f); }
float e4m3_to_float(uint8_t v) { return portable::e4m3_2f(v); }
uint8_t float_to_e4m3(float f) { return portable::f2e4m3(f); }
float e5m2_to_float(uint8_t v) { return portable::e5m2_2f(v); }
uint8_t float_to_e5m2(float f) { return portable::f2e5m2(f); }

}  // namespace meshccl::kernels
