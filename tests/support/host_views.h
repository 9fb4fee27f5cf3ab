// Views of host float vectors on the CPU device, for tests that drive modules at the core level.
#pragma once

#include <cstdint>
#include <vector>

#include "base/types.h"

namespace te::test_support {

inline TensorView host_vec(std::vector<float> &v) {
  TensorView t = make_view(v.data(), DType::F32, Device{}, 1, static_cast<int64_t>(v.size()));
  t.ndim = 1;
  t.shape[0] = static_cast<int64_t>(v.size());
  return t;
}

inline TensorView host_mat(std::vector<float> &v, int64_t rows, int64_t cols) {
  return make_view(v.data(), DType::F32, Device{}, rows, cols);
}

}  // namespace te::test_support
