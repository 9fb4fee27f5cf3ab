// cuBLASLt, loaded at run time. libte links only the static CUDA runtime, so that libte.so loads
// on machines without CUDA's shared libraries; the functions it uses are looked up with dlsym and
// typed from <cublasLt.h> itself (decltype), so a signature change is a compile error here, not a
// crash there.
#pragma once

#include "base/dynamic_library.h"
#include <cublasLt.h>

namespace te::cuda {

// One loaded copy of libcublasLt (dlopen is reference counted, so each LtGemm holding its own
// is cheap and keeps the library free of process-global state).
class LtApi {
 public:
  // Throws te::Error(Unsupported) naming the library and dlerror() when it cannot be loaded or
  // lacks a function.
  LtApi();
  LtApi(const LtApi &) = delete;
  LtApi &operator=(const LtApi &) = delete;

  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtGetStatusString) get_status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) matmul_desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) matmul_desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) matrix_layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) matrix_layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) matmul_preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) matmul_preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) matmul_preference_set_attribute = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) matmul_algo_get_heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;

  // Throws te::Error(Cublas) "<call> failed: <cuBLAS's text> (status N)" unless status is
  // success; `call` names the cuBLASLt function.
  void check(cublasStatus_t status, const char *call) const;

 private:
  DynamicLibrary lib_;
};

}  // namespace te::cuda
