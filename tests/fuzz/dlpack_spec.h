// DLPack's ABI (DLPack v1.0, dlpack.h), declared here from the specification so that the harness
// needs no DLPack header and does not share the library's own declarations; and the fixed layout
// of a fuzz_dlpack input (also written by make_corpus.cpp).
#pragma once

#include <cstdint>

namespace fuzz {

// ---- DLPack v1.0 -----------------------------------------------------------------------------
struct DLDevice {
  int32_t device_type;  // DLDeviceType: kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, ...
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // DLDataTypeCode: kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, ...
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;    // ndim entries (NULL is malformed)
  int64_t *strides;  // ndim entries, in elements; NULL: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(DLManagedTensor *self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
constexpr uint64_t DLPACK_FLAG_BITMASK_READ_ONLY = 1ull << 0;
constexpr uint64_t DLPACK_FLAG_BITMASK_IS_COPIED = 1ull << 1;
constexpr uint32_t DLPACK_MAJOR_VERSION = 1;
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
};
enum : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLOpenCL = 4, kDLVulkan = 7, kDLMetal = 8, kDLROCM = 10 };
enum : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLOpaqueHandle = 3, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6,
                 kDLFloat8_e3m4 = 7, kDLFloat8_e4m3 = 8, kDLFloat8_e4m3b11fnuz = 9, kDLFloat8_e4m3fn = 10,
                 kDLFloat8_e4m3fnuz = 11, kDLFloat8_e5m2 = 12, kDLFloat8_e5m2fnuz = 13 };

// ---- a fuzz_dlpack input: these bytes, little-endian, zero-filled when the input is shorter ----
struct DlpackSpec {
  int32_t versioned;       // passed to te_tensor_from_dlpack as is
  uint32_t struct_kind;    // bit 0: for `versioned` outside {0, 1}, build a versioned struct (else not)
  uint32_t version_major;  // DLManagedTensorVersioned::version
  uint32_t version_minor;
  uint64_t flags;          // DLManagedTensorVersioned::flags
  int32_t ndim;
  uint8_t dtype_code, dtype_bits;
  uint16_t dtype_lanes;
  int32_t device_type, device_id;
  uint64_t byte_offset;
  int32_t fp8_dtype;       // te_tensor_from_dlpack's fp8_dtype
  uint8_t shape_mode;      // even: an array of the entries below; odd: NULL
  uint8_t strides_mode;    // % 3 == 0: NULL; 1: the compact strides; 2: the entries below
  uint8_t data_mode;       // even: a real buffer when small enough; odd: NULL
  uint8_t out_mode;        // % 3 == 0: a te_tensor; 1: out == NULL; 2: dl_managed_tensor == NULL
  int64_t shape[8];
  int64_t strides[8];
};

}  // namespace fuzz
