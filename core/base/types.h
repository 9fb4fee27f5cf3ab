// Core value types: dtypes, devices, tensor views and the error type the core throws.
// The core never includes the public C header; capi/src translates (values are equal by design
// and checked by static_asserts there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace te {

enum class Status : int {
  Success = 0,
  InvalidArgument = 1,
  InvalidState = 2,
  Unsupported = 3,
  OutOfMemory = 4,
  Cuda = 5,
  Cublas = 6,
  Nccl = 7,
  Internal = 8,
};

// Everything the core reports goes through this one exception; the C shims catch it, prefix the
// public function's name and store the message as the thread's last error.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string &message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3, E5M2 = 4, I32 = 5 };
enum class DeviceType : int { CPU = 0, CUDA = 1 };
enum class ScalingMode : int { PerTensor = 0, Block1x128 = 1, Block128x128 = 2 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device &o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device &o) const { return !(*this == o); }
};

constexpr int kMaxDims = 8;

// The largest element count a tensor may have: 2^60, so that its size in bytes (at most 4 per
// element, and 8 for fp64 scratch) fits int64_t and size_t and no size computation downstream of
// a validated shape can overflow.
constexpr int64_t kMaxElements = int64_t{1} << 60;

// The element count of a shape of `ndim` positive dimensions, or -1 when a dimension is < 1 or
// the product exceeds kMaxElements. Never overflows.
int64_t shape_numel(const int64_t *shape, int ndim);

inline bool is_fp8(DType t) { return t == DType::E4M3 || t == DType::E5M2; }
inline bool is_high_precision(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
size_t dtype_size(DType t);
const char *dtype_name(DType t);
const char *device_name(DeviceType t);

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
inline float fp8_max(DType t) { return t == DType::E4M3 ? kE4M3Max : kE5M2Max; }
// The smallest scale any scale formula produces. An FP8 GEMM multiplies its two operands'
// scale_inv, and two scale_inv of at most 2^63 multiply to at most 2^126: finite, so a GEMM of
// all-zero codes gives 0, not 0 * inf = NaN. Only amaxes above fp8_max * 2^63 (about 4e21 for
// E4M3), or huge margins, reach it: their values then saturate, as diverged tensors should.
constexpr float kMinScale = 0x1p-63f;

// A non-owning view of a row-major contiguous tensor. Fixed-size shape: building one never
// allocates.
struct TensorView {
  void *data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  Device device;
  float *scale_inv = nullptr;  // FP8 only
  ScalingMode scaling = ScalingMode::PerTensor;

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  // Seen as a matrix [rows, cols]: all leading dims folded into rows.
  int64_t cols() const { return ndim == 0 ? 1 : shape[ndim - 1]; }
  int64_t rows() const { return ndim == 0 ? 1 : numel() / (cols() == 0 ? 1 : cols()); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

TensorView make_view(void *data, DType dtype, Device device, int64_t rows, int64_t cols);

// Number of scale_inv floats an FP8 [rows, cols] tensor needs under `mode`.
int64_t scale_inv_count(ScalingMode mode, int64_t rows, int64_t cols);

}  // namespace te
