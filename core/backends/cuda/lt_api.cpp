#include "backends/cuda/lt_api.h"

#include "base/check.h"

namespace te::cuda {

// The major version libte is built against first, then whatever the loader finds.
LtApi::LtApi() : lib_({"libcublasLt.so.13", "libcublasLt.so"}, "cuBLASLt", "FP8 and matrix GEMMs need it") {
  lib_.bind("cublasLtCreate", &create);
  lib_.bind("cublasLtDestroy", &destroy);
  lib_.bind("cublasLtGetVersion", &get_version);
  lib_.bind("cublasLtGetStatusString", &get_status_string);
  lib_.bind("cublasLtMatmulDescCreate", &matmul_desc_create);
  lib_.bind("cublasLtMatmulDescDestroy", &matmul_desc_destroy);
  lib_.bind("cublasLtMatmulDescSetAttribute", &matmul_desc_set_attribute);
  lib_.bind("cublasLtMatrixLayoutCreate", &matrix_layout_create);
  lib_.bind("cublasLtMatrixLayoutDestroy", &matrix_layout_destroy);
  lib_.bind("cublasLtMatmulPreferenceCreate", &matmul_preference_create);
  lib_.bind("cublasLtMatmulPreferenceDestroy", &matmul_preference_destroy);
  lib_.bind("cublasLtMatmulPreferenceSetAttribute", &matmul_preference_set_attribute);
  lib_.bind("cublasLtMatmulAlgoGetHeuristic", &matmul_algo_get_heuristic);
  lib_.bind("cublasLtMatmul", &matmul);
}

void LtApi::check(cublasStatus_t status, const char *call) const {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const char *text = get_status_string ? get_status_string(status) : nullptr;
  fail(Status::Cublas, "%s failed: %s (status %d)", call, text ? text : "unknown cuBLAS status", static_cast<int>(status));
}

}  // namespace te::cuda
