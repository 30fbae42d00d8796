// Microbenchmarks of the reduction kernels. bytes_per_second counts the bytes
// of one operand (count x element size), the same as for the memcpy baseline
// of that size, so the two columns compare directly: memcpy reads and writes
// each byte once, reduce2 reads two and writes one, reduce_n reads n.
// reduce2 Sum runs for every datatype, Prod/Max/Min for the floating-point
// ones; reduce_n runs Sum and Max with 2, 4 and 8 inputs for float and the
// narrow types.
//
//   bench_kernels [--isa=portable|avx2|avx512|all] [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/op.h"
#include "kernels/reduce.h"
#include "kernels/table.h"

namespace mk = meshccl::kernels;

namespace {

constexpr ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
constexpr ncclDataType_t kNarrowTypes[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclFloat8e4m3, ncclFloat8e5m2};
constexpr size_t kBytes[] = {64u << 10, 1u << 20, 64u << 20};
constexpr meshccl::ReduceOp kOps[] = {meshccl::ReduceOp::Sum, meshccl::ReduceOp::Prod, meshccl::ReduceOp::Max,
                                      meshccl::ReduceOp::Min};
const char* const kOpNames[] = {"sum", "prod", "max", "min"};

bool is_float(ncclDataType_t dt) { return dt >= ncclFloat16; }

// Page-aligned buffers, like ncclMemAlloc gives, so that results do not
// depend on where malloc happened to place them relative to each other.
struct FreeDeleter {
  void operator()(unsigned char* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char[], FreeDeleter>;

Buffer alloc_buffer(size_t bytes) {
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (p == nullptr) std::abort();
  std::memset(p, 0, bytes);
  return Buffer(p);
}

// Buffers of small, finite values so no path takes a NaN or inf shortcut.
Buffer make_buffer(ncclDataType_t dt, size_t bytes, int seed) {
  Buffer b = alloc_buffer(bytes);
  const size_t n = bytes / meshccl::dtype_size(dt);
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>((i * 7 + static_cast<size_t>(seed)) % 13) * 0.25f - 1.5f;
    unsigned char* p = b.get() + i * meshccl::dtype_size(dt);
    switch (dt) {
      case ncclFloat16: {
        uint16_t h = mk::float_to_half(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case ncclBfloat16: {
        uint16_t h = mk::float_to_bf16(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case ncclFloat8e4m3: *p = mk::float_to_e4m3(v); break;
      case ncclFloat8e5m2: *p = mk::float_to_e5m2(v); break;
      case ncclFloat32: std::memcpy(p, &v, 4); break;
      case ncclFloat64: {
        double d = v;
        std::memcpy(p, &d, 8);
        break;
      }
      default: {
        int64_t x = static_cast<int64_t>(i % 251) - 100;
        std::memcpy(p, &x, meshccl::dtype_size(dt));
      }
    }
  }
  return b;
}

void bench_memcpy(benchmark::State& state, size_t bytes) {
  Buffer a = alloc_buffer(bytes), d = alloc_buffer(bytes);
  for (auto _ : state) {
    std::memcpy(d.get(), a.get(), bytes);
    benchmark::DoNotOptimize(d.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void bench_reduce2(benchmark::State& state, std::string isa, meshccl::ReduceOp op, ncclDataType_t dt, size_t bytes) {
  if (!mk::select_isa(isa.c_str())) {
    state.SkipWithError("ISA not supported");
    return;
  }
  auto a = make_buffer(dt, bytes, 1), b = make_buffer(dt, bytes, 2);
  Buffer d = alloc_buffer(bytes);
  const size_t count = bytes / meshccl::dtype_size(dt);
  for (auto _ : state) {
    mk::reduce2(dt, op, d.get(), a.get(), b.get(), count);
    benchmark::DoNotOptimize(d.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void bench_reduce_n(benchmark::State& state, std::string isa, meshccl::ReduceOp op, ncclDataType_t dt, size_t bytes,
                    int n) {
  if (!mk::select_isa(isa.c_str())) {
    state.SkipWithError("ISA not supported");
    return;
  }
  std::vector<Buffer> bufs;
  std::vector<const void*> srcs;
  for (int k = 0; k < n; ++k) bufs.push_back(make_buffer(dt, bytes, k));
  for (auto& b : bufs) srcs.push_back(b.get());
  Buffer d = alloc_buffer(bytes);
  const size_t count = bytes / meshccl::dtype_size(dt);
  for (auto _ : state) {
    mk::reduce_n(dt, op, d.get(), srcs.data(), n, count);
    benchmark::DoNotOptimize(d.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

std::string size_name(size_t bytes) {
  return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> isas;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--isa=", 0) == 0) {
      const std::string v = arg.substr(6);
      if (v == "all") {
        isas = {"portable", "avx2", "avx512"};
      } else {
        isas.push_back(v);
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (isas.empty()) isas.push_back(mk::isa_name());  // the one this CPU would use
  for (size_t bytes : kBytes) {
    benchmark::RegisterBenchmark(("memcpy/" + size_name(bytes)).c_str(), bench_memcpy, bytes);
  }
  for (const std::string& isa : isas) {
    if (!mk::isa_supported(isa.c_str())) continue;
    for (meshccl::ReduceOp op : kOps) {
      const std::string opname = kOpNames[static_cast<int>(op)];
      for (size_t bytes : kBytes) {
        for (ncclDataType_t dt : kTypes) {
          if (op != meshccl::ReduceOp::Sum && !is_float(dt)) continue;
          benchmark::RegisterBenchmark(
              ("reduce2_" + opname + "/" + isa + "/" + meshccl::dtype_name(dt) + "/" + size_name(bytes)).c_str(),
              bench_reduce2, isa, op, dt, bytes);
        }
      }
    }
    for (meshccl::ReduceOp op : {meshccl::ReduceOp::Sum, meshccl::ReduceOp::Max}) {
      const std::string opname = kOpNames[static_cast<int>(op)];
      for (ncclDataType_t dt : kNarrowTypes) {
        for (int n : {2, 4, 8}) {
          for (size_t bytes : {size_t{1} << 20, size_t{64} << 20}) {
            benchmark::RegisterBenchmark(("reduce_n_" + opname + "/" + isa + "/" + meshccl::dtype_name(dt) + "/n" +
                                          std::to_string(n) + "/" + size_name(bytes))
                                             .c_str(),
                                         bench_reduce_n, isa, op, dt, bytes, n);
          }
        }
      }
    }
  }
  int rargc = static_cast<int>(rest.size());
  benchmark::Initialize(&rargc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
