#include "cuda/lt_api.h"

#include <dlfcn.h>

#include <string>

#include "te/core/check.h"

namespace te::cuda {

namespace {

// The major version libte is built against first, then whatever the loader finds.
constexpr const char *kLibNames[] = {"libcublasLt.so.13", "libcublasLt.so"};

template <class Fn>
void bind(void *lib, const char *name, Fn *out) {
  dlerror();
  void *sym = dlsym(lib, name);
  if (!sym) {
    const char *err = dlerror();
    fail(Status::Unsupported, "cuBLASLt: symbol %s not found in the loaded libcublasLt (%s)", name,
         err ? err : "no error text");
  }
  *out = reinterpret_cast<Fn>(sym);
}

}  // namespace

LtApi::LtApi() {
  std::string errors;
  for (const char *name : kLibNames) {
    lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib_) break;
    const char *err = dlerror();
    errors += errors.empty() ? "" : "; ";
    errors += err ? err : name;
  }
  if (!lib_)
    fail(Status::Unsupported, "cuBLASLt could not be loaded (FP8 and matrix GEMMs need it): %s", errors.c_str());
  try {
    bind(lib_, "cublasLtCreate", &create);
    bind(lib_, "cublasLtDestroy", &destroy);
    bind(lib_, "cublasLtGetVersion", &get_version);
    bind(lib_, "cublasLtGetStatusString", &get_status_string);
    bind(lib_, "cublasLtMatmulDescCreate", &matmul_desc_create);
    bind(lib_, "cublasLtMatmulDescDestroy", &matmul_desc_destroy);
    bind(lib_, "cublasLtMatmulDescSetAttribute", &matmul_desc_set_attribute);
    bind(lib_, "cublasLtMatrixLayoutCreate", &matrix_layout_create);
    bind(lib_, "cublasLtMatrixLayoutDestroy", &matrix_layout_destroy);
    bind(lib_, "cublasLtMatmulPreferenceCreate", &matmul_preference_create);
    bind(lib_, "cublasLtMatmulPreferenceDestroy", &matmul_preference_destroy);
    bind(lib_, "cublasLtMatmulPreferenceSetAttribute", &matmul_preference_set_attribute);
    bind(lib_, "cublasLtMatmulAlgoGetHeuristic", &matmul_algo_get_heuristic);
    bind(lib_, "cublasLtMatmul", &matmul);
  } catch (...) {
    dlclose(lib_);
    lib_ = nullptr;
    throw;
  }
}

LtApi::~LtApi() {
  if (lib_) dlclose(lib_);
}

void LtApi::check(cublasStatus_t status, const char *call) const {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const char *text = get_status_string ? get_status_string(status) : nullptr;
  fail(Status::Cublas, "%s failed: %s (status %d)", call, text ? text : "unknown cuBLAS status", static_cast<int>(status));
}

}  // namespace te::cuda
