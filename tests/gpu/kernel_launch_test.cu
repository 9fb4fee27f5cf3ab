// launch_kernel (backends/cuda/kernel_launch.cuh): libte's kernels launched through the driver.
// Arguments reach the kernel converted to its parameter types, as with <<<>>>, from any thread;
// a bad configuration is a te::Error naming cuLaunchKernel, not an abort or a sticky error.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"  // TE_HAVE_CUDA_BACKEND

#if TE_HAVE_CUDA_BACKEND
#include <cuda_runtime.h>

#include "backends/cuda/kernel_launch.cuh"
#include "base/types.h"

namespace {

struct Block {
  int32_t word[256];  // a 1 KiB parameter, passed by value like libte's launch batches
};

__global__ void fill_kernel(int64_t *out, int64_t n, double scale, const __grid_constant__ Block b) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<int64_t>(scale * static_cast<double>(i)) + b.word[i % 256];
}

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Runs fill_kernel through launch_kernel (ints and a float where the kernel takes int64_t and
// double) and checks every element.
void check_fill(cudaStream_t stream) {
  constexpr int64_t kN = 3000;
  int64_t *out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kN * sizeof(int64_t)), cudaSuccess);
  Block b;
  for (int i = 0; i < 256; ++i) b.word[i] = 7 * i - 300;
  te::cuda::launch_kernel<fill_kernel>(dim3(12), dim3(256), 0, stream, out, static_cast<int>(kN), 3.0f, b);
  std::vector<int64_t> host(kN);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), out, kN * sizeof(int64_t), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(host[i], 3 * i + b.word[i % 256]) << "element " << i;
  cudaFree(out);
}

TEST(CudaKernelLaunch, ArgumentsArriveConvertedToTheKernelsTypes) {
  if (!have_gpu()) GTEST_SKIP() << "no usable CUDA GPU";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  check_fill(s);
  check_fill(s);  // the cached function
  check_fill(nullptr);  // the legacy stream
  cudaStreamDestroy(s);
}

TEST(CudaKernelLaunch, WorksFromAThreadThatHasNoContextYet) {
  // The function cache is per context, the context current per thread: a thread that never
  // set a device launches too.
  if (!have_gpu()) GTEST_SKIP() << "no usable CUDA GPU";
  std::thread t([] {
    check_fill(nullptr);
    check_fill(nullptr);
  });
  t.join();
}

TEST(CudaKernelLaunch, ABadConfigurationIsAnErrorThatNamesTheLaunch) {
  if (!have_gpu()) GTEST_SKIP() << "no usable CUDA GPU";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  check_fill(nullptr);  // a current context: the driver's path
  int64_t *out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64), cudaSuccess);
  Block b{};
  te::Status status = te::Status::Success;
  std::string message;
  try {
    te::cuda::launch_kernel<fill_kernel>(dim3(1), dim3(4096), 0, nullptr, out, 8, 1.0, b);  // > 1024 threads
  } catch (const te::Error &e) {
    status = e.status();
    message = e.what();
  }
  EXPECT_EQ(status, te::Status::Cuda);
  EXPECT_NE(message.find("cuLaunchKernel failed"), std::string::npos) << message;
  EXPECT_NE(message.find("block (4096, 1, 1)"), std::string::npos) << message;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "nothing left for the next runtime call to report";
  check_fill(nullptr);  // and the next launch works
  cudaFree(out);
}

}  // namespace
#endif  // TE_HAVE_CUDA_BACKEND
