// Names and sizes of the core value types, and the scale_inv layout rule every FP8 tensor obeys.
#include "base/types.h"

namespace te {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::E4M3:
    case DType::E5M2: return 1;
  }
  return 0;
}

const char *dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::E4M3: return "E4M3";
    case DType::E5M2: return "E5M2";
    case DType::I32: return "I32";
  }
  return "UNKNOWN";
}

const char *device_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU: return "CPU";
    case DeviceType::CUDA: return "CUDA";
  }
  return "UNKNOWN";
}

int64_t shape_numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 1 || shape[i] > kMaxElements / n) return -1;
    n *= shape[i];
  }
  return n;
}

TensorView make_view(void *data, DType dtype, Device device, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = 2;
  v.shape[0] = rows;
  v.shape[1] = cols;
  return v;
}

namespace {
constexpr int64_t kBlock = 128;
int64_t blocks_of(int64_t n) { return (n + kBlock - 1) / kBlock; }
}  // namespace

int64_t scale_inv_count(ScalingMode mode, int64_t rows, int64_t cols) {
  switch (mode) {
    case ScalingMode::PerTensor: return 1;
    case ScalingMode::Block1x128: return rows * blocks_of(cols);
    case ScalingMode::Block128x128: return blocks_of(rows) * blocks_of(cols);
  }
  return 0;
}

}  // namespace te
