#include "backends/cuda/cuda_backend.h"

#include <cstdint>
#include <cstdio>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/lt_gemm.h"
#include "base/check.h"

namespace te {
namespace cuda {

void fail_cuda(const char *call, cudaError_t err) {
  Status status = err == cudaErrorMemoryAllocation ? Status::OutOfMemory : Status::Cuda;
  fail(status, "%s failed: %s (%s)", call, cudaGetErrorString(err), cudaGetErrorName(err));
}

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommendation for Hopper

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    fail(Status::Unsupported, "argument 'device': no usable CUDA device (driver missing or no GPU)");
  if (device < 0 || device >= count)
    fail(Status::InvalidArgument, "argument 'device': CUDA device %d requested, %d present", device, count);
  DeviceGuard guard(device_);
  cudaDeviceProp prop;
  TE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  if (prop.major * 10 + prop.minor < 89)
    fail(Status::Unsupported, "argument 'device': FP8 needs compute capability 8.9 or newer, %s is %d.%d", prop.name,
         prop.major, prop.minor);
  // Keep freed blocks in the pool instead of returning them to the driver at each sync.
  cudaMemPool_t pool;
  TE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
  uint64_t threshold = UINT64_MAX;
  TE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  TE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  try {
    TE_CUDA_CHECK(cudaMalloc(&amax_partials_, sizeof(uint32_t) * kMaxCastItems * kAmaxPartialBlocks));
    gemm_ = std::make_unique<LtGemm>(device_);
  } catch (...) {
    cudaFree(amax_partials_);
    cudaFree(workspace_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  DeviceGuard::forget();
  cudaStreamSynchronize(stream_);
  // Everything has run: the cached blocks go back synchronously (the stream may be gone next).
  cache_.drain([](void *p) { cudaFree(p); });
  for (const HeldBlock &b : freed_during_capture_) cudaFree(b.ptr);
  gemm_.reset();
  cudaFree(amax_partials_);
  cudaFree(workspace_);
}

bool CudaBackend::capturing() const {
  // Asked once per C API call: a capture cannot begin or end while libte runs (base/api_call.h).
  const uint64_t call = api_call_epoch();
  if (call != 0 && capture_known_.call == call && capture_known_.stream == stream_) return capture_known_.capturing;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  bool capturing = true;
  if (cudaStreamIsCapturing(stream_, &status) != cudaSuccess) {
    // The legacy stream cannot be asked while another stream captures in global mode: treat it as
    // capturing (no cache), and take the query's error back so that it reaches nobody else.
    cudaGetLastError();
  } else {
    capturing = status != cudaStreamCaptureStatusNone;
  }
  capture_known_ = CaptureKnown{call, stream_, capturing};
  return capturing;
}

void CudaBackend::drain_cache() {
  if (cache_.cached_bytes() == 0) return;
  DeviceGuard g(device_);
  // Back to the pool on the stream the blocks were freed on: ordered after that stream's work.
  const cudaStream_t s = cache_stream_;
  bool waited = false;
  cache_.drain([&](void *p) {
    if (cudaFreeAsync(p, s) == cudaSuccess) return;
    // The stream is gone (destroyed since its blocks were cached): wait for all work, then free.
    cudaGetLastError();
    if (!waited) cudaDeviceSynchronize(), waited = true;
    cudaFree(p);
  });
}

void CudaBackend::follow_stream_in_cache() {
  if (cache_stream_ == stream_) return;
  // Freeing a block, on any stream, while this thread captures invalidates the capture (torch's
  // torch.cuda.graph switches libte to its capture stream mid-step): blocks cached from another
  // stream wait, unused (capture bypasses the cache), for a call on a stream that is not capturing.
  if (cache_.cached_bytes() != 0) {
    if (capturing()) return;
    drain_cache();
  }
  cache_stream_ = stream_;
}

void CudaBackend::set_stream(void *stream) {
  stream_ = static_cast<cudaStream_t>(stream);
  follow_stream_in_cache();
}

void CudaBackend::synchronize() {
  DeviceGuard g(device_);
  TE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::release_freed_during_capture() {
  std::vector<HeldBlock> held;
  held.swap(freed_during_capture_);
  for (const HeldBlock &b : held) free(b.ptr, b.bytes);
}

void *CudaBackend::alloc(size_t bytes) {
  const bool capture = capturing();
  if (!capture) {
    if (!freed_during_capture_.empty()) release_freed_during_capture();
    follow_stream_in_cache();
    if (void *p = cache_.take(bytes)) return p;
  }
  DeviceGuard g(device_);
  const size_t size = BlockCache::size_class(bytes);
  void *p = nullptr;
  cudaError_t err = cudaMallocAsync(&p, size, stream_);
  if (err == cudaErrorMemoryAllocation && !capture && cache_.cached_bytes() != 0) {
    // Blocks cached in other size classes may make room: give them back and try once more.
    cudaGetLastError();
    drain_cache();
    err = cudaMallocAsync(&p, size, stream_);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail_cuda("cudaMallocAsync", err);
  }
  if (capture) captured_.insert(p);
  return p;
}

void CudaBackend::free(void *ptr, size_t bytes) {
  if (!ptr) return;
  const bool from_capture = !captured_.empty() && captured_.erase(ptr) != 0;
  // A block of a captured graph goes back to the driver (during the capture its free becomes a
  // node of the graph, stream-ordered there too). An eager block freed during a capture waits.
  if (!from_capture) {
    if (capturing()) {
      try {
        freed_during_capture_.push_back(HeldBlock{ptr, bytes});
      } catch (...) {
        // No host memory to remember it: the block is lost to the pool, never freed into the capture.
      }
      return;
    }
    if (!freed_during_capture_.empty()) release_freed_during_capture();
    follow_stream_in_cache();
    if (cache_.put(ptr, bytes)) return;
  }
  DeviceGuard g(device_);
  // Stream-ordered: the block is reused only by work enqueued after this point.
  cudaFreeAsync(ptr, stream_);
}

void CudaBackend::copy(void *dst, const void *src, size_t bytes) {
  DeviceGuard g(device_);
  TE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_to_host(void *dst, const void *src, size_t bytes) {
  DeviceGuard g(device_);
  TE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  TE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_from_host(void *dst, const void *src, size_t bytes) {
  DeviceGuard g(device_);
  TE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  // The host buffer may be gone when the call returns: wait (used off the hot path only).
  TE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fill_floats(float *dst, float value, size_t count) {
  DeviceGuard g(device_);
  cuda::fill_floats(dst, value, count, stream_);
}

void CudaBackend::zero_many(const ByteRange *ranges, int n) {
  DeviceGuard g(device_);
  cuda::zero_many(ranges, n, stream_);
}

void CudaBackend::copy_row_segments(void *dst, const void *src, size_t row_bytes, const RowSegment *segs, int n) {
  DeviceGuard g(device_);
  cuda::copy_row_segments(dst, src, row_bytes, segs, n, stream_);
}

void CudaBackend::amax(const TensorView &x, float *out, bool accumulate) {
  DeviceGuard g(device_);
  cuda::amax(*this, x, out, accumulate, stream_);
}

void CudaBackend::scale_from_amax(const float *amax, float *scale, float *scale_inv, float fp8_max,
                                  bool power_of_2, float epsilon) {
  DeviceGuard g(device_);
  cuda::scale_from_amax(amax, scale, scale_inv, fp8_max, power_of_2, epsilon, stream_);
}

void CudaBackend::cast_transpose(const TensorView &x, const float *scale, float *amax_accum, TensorView *out,
                                 TensorView *out_t) {
  DeviceGuard g(device_);
  cuda::cast_transpose(*this, x, scale, amax_accum, out, out_t, stream_);
}

void CudaBackend::block_quantize(const TensorView &x, ScalingMode mode, bool power_of_2, float epsilon,
                                 TensorView *out, TensorView *out_t) {
  DeviceGuard g(device_);
  cuda::block_quantize(*this, x, mode, power_of_2, epsilon, out, out_t, stream_);
}

void CudaBackend::dequantize(const TensorView &x, const TensorView &out) {
  DeviceGuard g(device_);
  cuda::dequantize(x, out, stream_);
}

void CudaBackend::gemm(const GemmArgs &args) {
  DeviceGuard g(device_);
  gemm_->run(*this, args, workspace_, workspace_bytes_, stream_);
}

void CudaBackend::gemm_many(const GemmArgs *args, int n) {
  DeviceGuard g(device_);
  gemm_->run_many(*this, args, n, workspace_, workspace_bytes_, stream_);
}

void CudaBackend::activation_forward(Activation act, const TensorView &x, const TensorView &y) {
  DeviceGuard g(device_);
  cuda::activation_forward(act, x, y, stream_);
}

void CudaBackend::activation_backward(Activation act, const TensorView &x, const TensorView &dy,
                                      const TensorView &dx) {
  DeviceGuard g(device_);
  cuda::activation_backward(act, x, dy, dx, stream_);
}

void CudaBackend::bias_grad(const TensorView &dy, const TensorView &db) {
  DeviceGuard g(device_);
  cuda::bias_grad(*this, dy, db, stream_);
}

void CudaBackend::bias_grad_many(const TensorView *dys, const TensorView *dbs, int n) {
  DeviceGuard g(device_);
  cuda::bias_grad_many(*this, dys, dbs, n, stream_);
}

void CudaBackend::norm_forward(const NormForwardArgs &args) {
  DeviceGuard g(device_);
  cuda::norm_forward(args, stream_);
}

void CudaBackend::norm_backward(const NormBackwardArgs &args) {
  DeviceGuard g(device_);
  cuda::norm_backward(*this, args, stream_);
}

void CudaBackend::plan_norm_backward(const NormBackwardArgs &args, ScratchPlan *plan) const {
  const size_t bytes = cuda::norm_backward_scratch_bytes(args);
  if (bytes) plan->add(bytes);
}

void CudaBackend::gather_amax(const ScaleUpdateItem *items, int n, float *packed) {
  DeviceGuard g(device_);
  cuda::gather_amax(items, n, packed, stream_);
}

void CudaBackend::scale_update(const ScaleUpdateItem *items, int n, const float *reduced_amax) {
  DeviceGuard g(device_);
  cuda::scale_update(items, n, reduced_amax, stream_);
}

}  // namespace cuda

bool cuda_backend_available() {
  // Without a driver (CPU machines, CI) this fails quietly: the CPU is then the default.
  int count = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
    return false;
  return major * 10 + minor >= 89;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_unique<cuda::CudaBackend>(device_index);
}

}  // namespace te
