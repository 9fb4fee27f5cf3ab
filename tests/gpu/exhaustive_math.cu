// Kernels of exhaustive_math.h: each thread takes units of 16 consecutive float bit patterns,
// so the 2^32 inputs cover every value and every unit-level branch (a unit of mixed NaN and
// finite inputs, of inputs on both sides of map_sigmoid's range test).
#include <cuda_runtime.h>

#include "backends/cuda/activation_math.cuh"
#include "backends/cuda/activation_tile.cuh"
#include "gpu/exhaustive_math.h"

namespace te::gpu_test {
namespace {

using cuda::kUnit;

constexpr uint64_t kUnits = (1ull << 32) / kUnit;

__device__ void record(ExhaustiveResult *out, uint32_t bits) {
  atomicAdd(&out->mismatches, 1ull);
  atomicMin(&out->first_bits, bits);
}

// The definition before map_sigmoid: every element through the correctly rounded division.
__device__ float sigmoid_by_division(float x) {
  return __fdiv_rn(1.0f, cuda::act_math::add(1.0f, expf(-x)));
}

__global__ void sigmoid_kernel(ExhaustiveResult *out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t u = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < kUnits; u += stride) {
    const uint32_t base = static_cast<uint32_t>(u * kUnit);
    float x[kUnit], s[kUnit];
#pragma unroll
    for (int k = 0; k < kUnit; ++k) x[k] = __uint_as_float(base + k);
    cuda::act_math::map_sigmoid(x, s, [](int, float v) { return v; });
#pragma unroll
    for (int k = 0; k < kUnit; ++k)
      if (__float_as_uint(s[k]) != __float_as_uint(sigmoid_by_division(x[k]))) record(out, base + k);
  }
}

template <DType T>
__global__ void round_unit_kernel(ExhaustiveResult *out) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t u = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < kUnits; u += stride) {
    const uint32_t base = static_cast<uint32_t>(u * kUnit);
    float f[kUnit];
#pragma unroll
    for (int k = 0; k < kUnit; ++k) f[k] = __uint_as_float(base + k);
    cuda::round_unit<T>(f);
#pragma unroll
    for (int k = 0; k < kUnit; ++k)
      if (__float_as_uint(f[k]) != __float_as_uint(cuda::round_to<T>(__uint_as_float(base + k)))) record(out, base + k);
  }
}

bool cuda_ok(cudaError_t e, const char *what, std::string *error) {
  if (e == cudaSuccess) return true;
  *error = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

template <class Launch>
bool run(Launch launch, ExhaustiveResult *r, std::string *error) {
  ExhaustiveResult *d = nullptr;
  ExhaustiveResult init;
  init.first_bits = 0xFFFFFFFFu;
  if (!cuda_ok(cudaMalloc(&d, sizeof *d), "cudaMalloc", error)) return false;
  bool ok = cuda_ok(cudaMemcpy(d, &init, sizeof init, cudaMemcpyHostToDevice), "cudaMemcpy", error);
  if (ok) {
    launch(d);
    ok = cuda_ok(cudaGetLastError(), "launch", error) && cuda_ok(cudaDeviceSynchronize(), "kernel", error) &&
         cuda_ok(cudaMemcpy(r, d, sizeof *r, cudaMemcpyDeviceToHost), "cudaMemcpy", error);
  }
  cudaFree(d);
  return ok;
}

constexpr int kBlocks = 4096, kThreads = 256;

}  // namespace

bool exhaustive_sigmoid(ExhaustiveResult *r, std::string *error) {
  return run([](ExhaustiveResult *d) { sigmoid_kernel<<<kBlocks, kThreads>>>(d); }, r, error);
}

bool exhaustive_round_unit(DType t, ExhaustiveResult *r, std::string *error) {
  if (t == DType::BF16)
    return run([](ExhaustiveResult *d) { round_unit_kernel<DType::BF16><<<kBlocks, kThreads>>>(d); }, r, error);
  return run([](ExhaustiveResult *d) { round_unit_kernel<DType::F16><<<kBlocks, kThreads>>>(d); }, r, error);
}

}  // namespace te::gpu_test
