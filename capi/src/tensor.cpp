// te_tensor <-> core views, and DLPack import.
#include <cstdint>
#include <cstring>

#include "capi_common.h"

namespace te::capi {

TensorView to_shape_view(const te_tensor *t, const ArgName &name) {
  check_not_null(t, name);
  const int dtype = enum_int(t->dtype);
  if (!known_dtype(dtype))
    fail(Status::InvalidArgument, "argument '%s->dtype': expected a te_dtype value, got %d", name.c_str(), dtype);
  check_shape(t->shape, t->ndim, name);
  TensorView v;
  v.data = t->data;
  v.dtype = static_cast<DType>(dtype);
  v.ndim = t->ndim;
  for (int i = 0; i < t->ndim; ++i) v.shape[i] = t->shape[i];
  v.device = to_device(t->device, "device", &name);
  return v;
}

TensorView to_view(const te_tensor *t, const ArgName &name) {
  check_not_null(t, name);
  if (!t->data)
    fail(Status::InvalidArgument, "argument '%s->data': expected a non-NULL pointer, got NULL", name.c_str());
  TensorView v = to_shape_view(t, name);
  const int scaling = enum_int(t->scaling);
  if (is_fp8(v.dtype)) {
    if (!t->scale_inv)
      fail(Status::InvalidArgument, "argument '%s->scale_inv': an FP8 tensor needs a scale_inv pointer, got NULL",
           name.c_str());
    if (scaling < TE_SCALING_PER_TENSOR || scaling > TE_SCALING_BLOCK_128X128)
      fail(Status::InvalidArgument, "argument '%s->scaling': expected a te_scaling_mode value, got %d",
           name.c_str(), scaling);
    v.scale_inv = t->scale_inv;
    v.scaling = static_cast<ScalingMode>(scaling);
  }
  return v;
}

TensorView to_optional_view(const te_tensor *t, const ArgName &name) { return t ? to_view(t, name) : TensorView(); }

}  // namespace te::capi

using namespace te;
using namespace te::capi;

namespace {

// DLPack's ABI (dlpack.h v0.8 / v1.x), declared here so that libte needs no DLPack header.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
};
struct DLManagedTensor { DLTensor dl_tensor; void *manager_ctx; void (*deleter)(DLManagedTensor *); };
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(DLManagedTensorVersioned *);
  uint64_t flags;
  DLTensor dl_tensor;
};
enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
constexpr uint32_t kDLPackMajor = 1;        // DLManagedTensorVersioned's layout is that of 1.x
constexpr uint64_t kDLFlagReadOnly = 1;     // DLPACK_FLAG_BITMASK_READ_ONLY
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 };

te_dtype dl_dtype(const DLDataType &t, int fp8_dtype) {
  if (t.lanes != 1) fail(Status::InvalidArgument, "argument 'dl_managed_tensor': expected 1 lane, got %u", t.lanes);
  if (t.code == kDLFloat && t.bits == 32) return TE_DTYPE_F32;
  if (t.code == kDLFloat && t.bits == 16) return TE_DTYPE_F16;
  if (t.code == kDLBfloat && t.bits == 16) return TE_DTYPE_BF16;
  if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return TE_DTYPE_E4M3;
  if (t.code == kDLFloat8_e5m2 && t.bits == 8) return TE_DTYPE_E5M2;
  if (t.code == kDLInt && t.bits == 32) return TE_DTYPE_I32;
  if ((t.code == kDLUInt || t.code == kDLInt) && t.bits == 8) {
    if (fp8_dtype != TE_DTYPE_E4M3 && fp8_dtype != TE_DTYPE_E5M2)
      fail(Status::InvalidArgument, "argument 'fp8_dtype': 8-bit integer data is read as FP8, so expected "
           "TE_DTYPE_E4M3 or TE_DTYPE_E5M2, got %d", fp8_dtype);
    return static_cast<te_dtype>(fp8_dtype);
  }
  fail(Status::InvalidArgument, "argument 'dl_managed_tensor': unsupported DLPack dtype (code %u, %u bits)", t.code, t.bits);
}

}  // namespace

extern "C" {

TE_API int64_t te_tensor_numel(const te_tensor *t) {
  if (!t || t->ndim < 1 || t->ndim > TE_MAX_DIMS) return 0;
  const int64_t n = shape_numel(t->shape, t->ndim);
  return n < 0 ? 0 : n;
}

TE_API te_status te_tensor_scale_inv_count(int64_t *count, const te_tensor *t) {
  return guarded(__func__, [&] {
    check_not_null(count, "count");
    check_not_null(t, "t");
    const int dtype = enum_int(t->dtype), scaling = enum_int(t->scaling);
    if (dtype != TE_DTYPE_E4M3 && dtype != TE_DTYPE_E5M2)
      fail(Status::InvalidArgument, "argument 't->dtype': expected E4M3 or E5M2, got %s",
           known_dtype(dtype) ? dtype_name(static_cast<DType>(dtype)) : "an unknown value");
    check_shape(t->shape, t->ndim, "t");
    if (scaling < TE_SCALING_PER_TENSOR || scaling > TE_SCALING_BLOCK_128X128)
      fail(Status::InvalidArgument, "argument 't->scaling': expected a te_scaling_mode value, got %d", scaling);
    TensorView v;
    v.ndim = t->ndim;
    for (int i = 0; i < t->ndim; ++i) v.shape[i] = t->shape[i];
    *count = scale_inv_count(static_cast<ScalingMode>(scaling), v.rows(), v.cols());
  });
}

TE_API te_status te_tensor_from_dlpack(te_tensor *out, const void *dl_managed_tensor, int versioned, te_dtype fp8_dtype) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    check_not_null(dl_managed_tensor, "dl_managed_tensor");
    if (versioned != 0 && versioned != 1)
      fail(Status::InvalidArgument, "argument 'versioned': expected 0 (DLManagedTensor) or 1 "
           "(DLManagedTensorVersioned), got %d", versioned);
    if (versioned) {
      const auto *v = static_cast<const DLManagedTensorVersioned *>(dl_managed_tensor);
      // A new major version may change the struct's layout: nothing past `version` can be read.
      if (v->version.major != kDLPackMajor)
        fail(Status::Unsupported, "argument 'dl_managed_tensor': expected DLPack major version %u, got %u.%u",
             kDLPackMajor, v->version.major, v->version.minor);
      if (v->flags & kDLFlagReadOnly)
        fail(Status::InvalidArgument, "argument 'dl_managed_tensor': the tensor is read-only "
             "(DLPACK_FLAG_BITMASK_READ_ONLY), and libte may write to any te_tensor");
    }
    const DLTensor &t = versioned ? static_cast<const DLManagedTensorVersioned *>(dl_managed_tensor)->dl_tensor
                                  : static_cast<const DLManagedTensor *>(dl_managed_tensor)->dl_tensor;
    if (t.ndim < 1 || t.ndim > TE_MAX_DIMS)
      fail(Status::InvalidArgument, "argument 'dl_managed_tensor': expected 1..%d dimensions, got %d", TE_MAX_DIMS, t.ndim);
    if (!t.shape) fail(Status::InvalidArgument, "argument 'dl_managed_tensor': shape is NULL");
    check_shape(t.shape, t.ndim, "dl_managed_tensor");
    if (!t.data) fail(Status::InvalidArgument, "argument 'dl_managed_tensor': data is NULL");
    te_tensor r;
    std::memset(&r, 0, sizeof r);
    r.dtype = dl_dtype(t.dtype, enum_int(fp8_dtype));
    r.ndim = t.ndim;
    int64_t expected_stride = 1;  // bounded by the element count check above
    for (int i = t.ndim - 1; i >= 0; --i) {
      // Strides of size-1 dimensions carry no meaning, as in PyTorch's contiguity rule.
      if (t.strides && t.shape[i] != 1 && t.strides[i] != expected_stride)
        fail(Status::InvalidArgument, "argument 'dl_managed_tensor': expected a row-major contiguous tensor, "
             "got stride %lld for dimension %d (expected %lld)", (long long)t.strides[i], i, (long long)expected_stride);
      expected_stride *= t.shape[i];
      r.shape[i] = t.shape[i];
    }
    switch (t.device.device_type) {
      case kDLCPU: case kDLCUDAHost: r.device.type = TE_DEVICE_CPU; r.device.index = 0; break;
      case kDLCUDA:
        if (t.device.device_id < 0)
          fail(Status::InvalidArgument, "argument 'dl_managed_tensor': expected a CUDA device_id >= 0, got %d",
               t.device.device_id);
        r.device.type = TE_DEVICE_CUDA;
        r.device.index = t.device.device_id;
        break;
      default:
        fail(Status::InvalidArgument, "argument 'dl_managed_tensor': unsupported DLPack device type %d",
             t.device.device_type);
    }
    const size_t elem = dtype_size(static_cast<DType>(r.dtype));
    if (t.byte_offset % elem)
      fail(Status::InvalidArgument, "argument 'dl_managed_tensor': byte_offset %llu is not a multiple of the element size %zu",
           (unsigned long long)t.byte_offset, elem);
    const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
    if (t.byte_offset > UINTPTR_MAX - base)
      fail(Status::InvalidArgument, "argument 'dl_managed_tensor': byte_offset %llu wraps the data pointer %p",
           (unsigned long long)t.byte_offset, t.data);
    r.data = reinterpret_cast<void *>(base + t.byte_offset);
    *out = r;
  });
}

}  // extern "C"
