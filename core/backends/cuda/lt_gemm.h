// FP8 and high-precision GEMMs through cuBLASLt, loaded at run time (lt_api.h) so that libte.so
// has no link-time dependency on CUDA's shared libraries.
//
// Row-major D[m, n] = op(A) op(B) is column-major D^T = op(B)^T op(A)^T, so cuBLASLt's A is our
// B and its B is our A, with transa_lt = transb and transb_lt = transa; libte's FP8 rule
// (transa = 0, transb = 1) is cuBLASLt's TN. Matmul descriptors, layouts and the heuristic's
// algorithm are cached per (shape, dtypes, transposes, epilogue, flags); pointers (scales, bias,
// aux) are set on the cached descriptor at each call.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "backends/backend.h"

namespace te::cuda {

struct SmallGemmArgs;  // lt_gemm_kernels.h

class LtGemm {
 public:
  // Throws Unsupported when cuBLASLt cannot be loaded, Cublas when it fails to initialise.
  explicit LtGemm(int device);
  ~LtGemm();
  LtGemm(const LtGemm &) = delete;
  LtGemm &operator=(const LtGemm &) = delete;

  // workspace: workspace_bytes of device memory owned by the backend.
  void run(Backend &be, const GemmArgs &args, void *workspace, size_t workspace_bytes, cudaStream_t stream);
  // Independent GEMMs (no output read by another): every one is checked first, then the small
  // ones run in one launch.
  void run_many(Backend &be, const GemmArgs *args, int n, void *workspace, size_t workspace_bytes,
                cudaStream_t stream);

 private:
  void run_checked(Backend &be, const GemmArgs &args, void *workspace, size_t workspace_bytes, cudaStream_t stream);
  bool small(const GemmArgs &g, SmallGemmArgs *s) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace te::cuda
