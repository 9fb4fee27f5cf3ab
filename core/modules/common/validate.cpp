#include "modules/common/validate.h"

#include <cstdio>

namespace te {

void check_tensor(const TensorView &t, const ArgName &name, DType dtype, const Device &device) {
  check_dtype(t, name, dtype);
  check_device(t, name, device);
}

void check_weight(const TensorView &t, const ArgName &name, int64_t rows, int64_t cols, DType dtype,
                  const Device &device) {
  check_tensor(t, name, dtype, device);
  if (t.ndim != 2) fail(Status::InvalidArgument, "argument '%s': expected 2 dimensions, got %d", name.c_str(), t.ndim);
  check_matrix(t, name, rows, cols);
}

void check_vector(const TensorView &t, const ArgName &name, int64_t n, DType dtype, const Device &device) {
  check_tensor(t, name, dtype, device);
  if (t.ndim != 1 || t.shape[0] != n)
    fail(Status::InvalidArgument, "argument '%s': expected shape [%lld], got %d dims, %lld elements", name.c_str(),
         (long long)n, t.ndim, (long long)t.numel());
}

void check_presence(const TensorView &t, const ArgName &name, bool expected, const char *why) {
  if (expected && !t.data) fail(Status::InvalidArgument, "argument '%s': %s, got NULL", name.c_str(), why);
  if (!expected && t.data) fail(Status::InvalidArgument, "argument '%s': %s, expected NULL", name.c_str(), why);
}

void check_output_like(const TensorView &t, const ArgName &name, const TensorView &input, int64_t cols,
                       const char *cols_name, DType dtype, const Device &device) {
  check_tensor(t, name, dtype, device);
  bool same_lead = t.ndim == input.ndim;
  for (int i = 0; same_lead && i + 1 < t.ndim; ++i) same_lead = t.shape[i] == input.shape[i];
  if (!same_lead || t.cols() != cols)
    fail(Status::InvalidArgument, "argument '%s': expected the input's leading dimensions and last dimension "
         "%s=%lld, got %d dims with last dimension %lld", name.c_str(), cols_name, (long long)cols, t.ndim,
         (long long)t.cols());
}

void check_module_fp8_dims(const ArgName &input_name, const ArgName &module_name, int64_t tokens, int64_t n,
                           int64_t k) {
  if (tokens % 16 == 0 && n % 16 == 0 && k % 16 == 0) return;  // the name is formatted only for the message
  char culprit[96];
  std::snprintf(culprit, sizeof culprit, "argument '%s'", (tokens % 16 ? input_name : module_name).c_str());
  check_fp8_dims(culprit, tokens, n, k);
}

}  // namespace te
