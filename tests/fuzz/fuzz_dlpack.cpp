// libFuzzer harness: te_tensor_from_dlpack over fuzzed DLManagedTensor and
// DLManagedTensorVersioned structs (dlpack_spec.h: the DLPack v1.0 structs, declared from the
// specification, and the input's layout). Only <te/te.h> and libte.so.
//
// The struct, its shape and strides arrays and the data are exactly-sized heap blocks, so ASan
// sees any read past them (a shape array read beyond ndim, a versioned read of a plain struct).
// Checks: no crash, no sanitizer report, the producer's deleter is never called; a failure
// leaves *out untouched and names te_tensor_from_dlpack in te_last_error(); a success only for
// what the header (and DLPack) allow: `versioned` 0 or 1 (a boolean), DLPack major version 1,
// not read-only (libte may write to any te_tensor), 1..TE_MAX_DIMS positive dimensions whose
// byte size fits in int64, contiguous strides (size-1 dimensions excepted), a known dtype with
// one lane, a known device, an element-aligned byte_offset that does not wrap the pointer; and
// then *out is that tensor: its dtype, shape, device and data == data + byte_offset. A tensor
// in a real buffer is then read by te_amax or te_dequantize (an int32 one must be refused by
// te_amax).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dlpack_spec.h"
#include "fuzz_common.h"

FUZZ_SANITIZER_DEFAULTS

namespace {

using fuzz::Blob;
using fuzz::DlpackSpec;

te_context *g_ctx = nullptr;
bool g_deleter_called = false;

void deleter_plain(fuzz::DLManagedTensor *) { g_deleter_called = true; }
void deleter_versioned(fuzz::DLManagedTensorVersioned *) { g_deleter_called = true; }

// The te_dtype the header promises for a DLPack dtype, or -1 (must fail).
int expected_dtype(const DlpackSpec &s) {
  if (s.dtype_lanes != 1) return -1;
  if (s.dtype_code == fuzz::kDLFloat && s.dtype_bits == 32) return TE_DTYPE_F32;
  if (s.dtype_code == fuzz::kDLFloat && s.dtype_bits == 16) return TE_DTYPE_F16;
  if (s.dtype_code == fuzz::kDLBfloat && s.dtype_bits == 16) return TE_DTYPE_BF16;
  if (s.dtype_code == fuzz::kDLFloat8_e4m3fn && s.dtype_bits == 8) return TE_DTYPE_E4M3;
  if (s.dtype_code == fuzz::kDLFloat8_e5m2 && s.dtype_bits == 8) return TE_DTYPE_E5M2;
  if (s.dtype_code == fuzz::kDLInt && s.dtype_bits == 32) return TE_DTYPE_I32;
  if ((s.dtype_code == fuzz::kDLUInt || s.dtype_code == fuzz::kDLInt) && s.dtype_bits == 8 &&
      (s.fp8_dtype == TE_DTYPE_E4M3 || s.fp8_dtype == TE_DTYPE_E5M2))
    return s.fp8_dtype;
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  te_context_options o;
  te_context_options_init(&o);
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  if (te_context_create(&g_ctx, &o) != TE_SUCCESS) fuzz::violation("te_context_create failed");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  DlpackSpec s;
  std::memset(&s, 0, sizeof s);
  std::memcpy(&s, data, size < sizeof s ? size : sizeof s);
  const bool shape_null = s.shape_mode % 2 == 1, data_null = s.data_mode % 2 == 1;
  const int strides_mode = s.strides_mode % 3, out_mode = s.out_mode % 3;

  // Shape and strides: exactly ndim entries (clamped to 1..8: a library that reads more before
  // rejecting ndim reads past the array).
  const int count = s.ndim < 1 ? 1 : s.ndim > 8 ? 8 : s.ndim;
  Blob shape_blob(sizeof(int64_t) * static_cast<size_t>(count));
  Blob strides_blob(sizeof(int64_t) * static_cast<size_t>(count));
  int64_t *shape = reinterpret_cast<int64_t *>(shape_blob.data());
  int64_t *strides = reinterpret_cast<int64_t *>(strides_blob.data());
  std::memcpy(shape, s.shape, sizeof(int64_t) * static_cast<size_t>(count));
  if (strides_mode == 1) {
    int64_t st = 1;
    for (int i = count - 1; i >= 0; --i) {
      strides[i] = st;
      st = static_cast<int64_t>(static_cast<uint64_t>(st) * static_cast<uint64_t>(shape[i]));  // wraps: fine
    }
  } else {
    std::memcpy(strides, s.strides, sizeof(int64_t) * static_cast<size_t>(count));
  }

  // What a valid tensor would be.
  const int want_dtype = expected_dtype(s);
  const size_t elem = want_dtype < 0 ? 1 : fuzz::dtype_bytes(want_dtype);
  bool shape_ok = s.ndim >= 1 && s.ndim <= TE_MAX_DIMS && !shape_null;
  __int128 numel = 1;
  for (int i = 0; shape_ok && i < s.ndim; ++i) {
    if (shape[i] < 1) shape_ok = false;
    else numel *= shape[i];
    if (numel * static_cast<__int128>(elem) > INT64_MAX) shape_ok = false;
  }
  bool strides_ok = true;
  if (shape_ok && strides_mode != 0) {
    __int128 st = 1;
    for (int i = s.ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != st) strides_ok = false;
      st *= shape[i];
    }
  }

  // The data: a real buffer for small tensors, so that libte can read what it imported.
  const bool real = shape_ok && !data_null && s.byte_offset <= (1u << 16) &&
                    numel * static_cast<__int128>(elem) <= (1 << 16);
  Blob buffer(real ? static_cast<size_t>(s.byte_offset + static_cast<uint64_t>(numel) * elem) : 64);
  for (size_t i = 0; i < buffer.size(); ++i) buffer.data()[i] = static_cast<uint8_t>(i * 37 + 11);
  void *base = data_null ? nullptr : buffer.data();

  fuzz::DLTensor t;
  t.data = base;
  t.device.device_type = s.device_type;
  t.device.device_id = s.device_id;
  t.ndim = s.ndim;
  t.dtype.code = s.dtype_code;
  t.dtype.bits = s.dtype_bits;
  t.dtype.lanes = s.dtype_lanes;
  t.shape = shape_null ? nullptr : shape;
  t.strides = strides_mode == 0 ? nullptr : strides;
  t.byte_offset = s.byte_offset;

  // The managed struct, in a block of exactly its size.
  const bool as_versioned = s.versioned == 1 || (s.versioned != 0 && (s.struct_kind & 1));
  std::unique_ptr<fuzz::DLManagedTensor> plain;
  std::unique_ptr<fuzz::DLManagedTensorVersioned> versioned;
  const void *managed;
  if (as_versioned) {
    versioned.reset(new fuzz::DLManagedTensorVersioned);
    versioned->version.major = s.version_major;
    versioned->version.minor = s.version_minor;
    versioned->manager_ctx = fuzz::sentinel_ptr();
    versioned->deleter = deleter_versioned;
    versioned->flags = s.flags;
    versioned->dl_tensor = t;
    managed = versioned.get();
  } else {
    plain.reset(new fuzz::DLManagedTensor);
    plain->dl_tensor = t;
    plain->manager_ctx = fuzz::sentinel_ptr();
    plain->deleter = deleter_plain;
    managed = plain.get();
  }

  te_tensor out;
  std::memset(&out, 0xA7, sizeof out);
  te_tensor untouched;
  std::memcpy(&untouched, &out, sizeof out);
  te_dtype fp8;
  fuzz::set_enum(fp8, s.fp8_dtype);
  te_tensor *pout = out_mode == 1 ? nullptr : &out;
  const void *pin = out_mode == 2 ? nullptr : managed;
  g_deleter_called = false;
  const te_status st = TE_CALL(te_tensor_from_dlpack, pout, pin, s.versioned, fp8);
  FUZZ_ASSERT(!g_deleter_called, "te_tensor_from_dlpack called the producer's deleter");
  if (st != TE_SUCCESS) {
    FUZZ_ASSERT(std::memcmp(&out, &untouched, sizeof out) == 0, "te_tensor_from_dlpack failed but wrote *out");
    return 0;
  }

  // A success: only for what is allowed...
  FUZZ_ASSERT(pout && pin, "te_tensor_from_dlpack accepted a NULL argument");
  FUZZ_ASSERT(s.versioned == 0 || s.versioned == 1, "te_tensor_from_dlpack accepted versioned = %d (a boolean)", s.versioned);
  if (s.versioned == 1) {
    FUZZ_ASSERT(s.version_major == fuzz::DLPACK_MAJOR_VERSION, "te_tensor_from_dlpack accepted DLPack major version %u",
                s.version_major);
    FUZZ_ASSERT(!(s.flags & fuzz::DLPACK_FLAG_BITMASK_READ_ONLY), "te_tensor_from_dlpack accepted a read-only tensor");
  }
  FUZZ_ASSERT(!shape_null, "te_tensor_from_dlpack accepted shape == NULL");
  FUZZ_ASSERT(base != nullptr, "te_tensor_from_dlpack accepted data == NULL");
  FUZZ_ASSERT(s.ndim >= 1 && s.ndim <= TE_MAX_DIMS, "te_tensor_from_dlpack accepted ndim %d", s.ndim);
  FUZZ_ASSERT(shape_ok, "te_tensor_from_dlpack accepted a bad shape (a dimension < 1, or more than INT64_MAX bytes)");
  FUZZ_ASSERT(strides_ok, "te_tensor_from_dlpack accepted non-contiguous strides");
  FUZZ_ASSERT(want_dtype >= 0, "te_tensor_from_dlpack accepted DLPack dtype code %u bits %u lanes %u (fp8_dtype %d)",
              s.dtype_code, s.dtype_bits, s.dtype_lanes, s.fp8_dtype);
  const bool cpu = s.device_type == fuzz::kDLCPU || s.device_type == fuzz::kDLCUDAHost;
  FUZZ_ASSERT(cpu || (s.device_type == fuzz::kDLCUDA && s.device_id >= 0),
              "te_tensor_from_dlpack accepted device type %d id %d", s.device_type, s.device_id);
  FUZZ_ASSERT(s.byte_offset % elem == 0, "te_tensor_from_dlpack accepted byte_offset %llu for %zu-byte elements",
              static_cast<unsigned long long>(s.byte_offset), elem);
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  FUZZ_ASSERT(s.byte_offset <= UINTPTR_MAX - b, "te_tensor_from_dlpack accepted a byte_offset that wraps the pointer");
  // ...and *out is that tensor.
  FUZZ_ASSERT(fuzz::get_enum(out.dtype) == want_dtype, "out.dtype %d, expected %d", fuzz::get_enum(out.dtype), want_dtype);
  FUZZ_ASSERT(out.ndim == s.ndim, "out.ndim %d, expected %d", out.ndim, s.ndim);
  for (int i = 0; i < s.ndim; ++i)
    FUZZ_ASSERT(out.shape[i] == shape[i], "out.shape[%d] %lld, expected %lld", i, static_cast<long long>(out.shape[i]),
                static_cast<long long>(shape[i]));
  FUZZ_ASSERT(reinterpret_cast<uintptr_t>(out.data) == b + s.byte_offset, "out.data is not data + byte_offset");
  FUZZ_ASSERT(reinterpret_cast<uintptr_t>(out.data) % elem == 0, "out.data %p is not aligned to its %zu-byte elements",
              out.data, elem);
  if (cpu)
    FUZZ_ASSERT(fuzz::get_enum(out.device.type) == TE_DEVICE_CPU && out.device.index == 0, "out.device is not the CPU");
  else
    FUZZ_ASSERT(fuzz::get_enum(out.device.type) == TE_DEVICE_CUDA && out.device.index == s.device_id,
                "out.device is not CUDA %d", s.device_id);

  // Reading it: the imported view stays inside the producer's buffer.
  if (real && cpu) {
    if (fuzz::is_fp8(want_dtype)) {
      float scale_inv = 0.5f;
      out.scale_inv = &scale_inv;
      out.scaling = TE_SCALING_PER_TENSOR;
      te_tensor f = out;
      Blob fbuf(static_cast<size_t>(numel) * sizeof(float));
      f.data = fbuf.data();
      f.dtype = TE_DTYPE_F32;
      f.scale_inv = nullptr;
      FUZZ_ASSERT(TE_CALL(te_dequantize, g_ctx, &out, &f) == TE_SUCCESS, "te_dequantize of an imported FP8 tensor failed");
    } else if (want_dtype == TE_DTYPE_I32) {
      // Offsets are not floats: te_amax refuses them without reading (nothing in the API reads
      // an int32 tensor on its own; attention reads offsets with their q/k/v).
      float amax = -1.0f;
      FUZZ_ASSERT(TE_CALL(te_amax, g_ctx, &out, &amax) == TE_ERROR_INVALID_ARGUMENT && amax == -1.0f,
                  "te_amax accepted an int32 tensor");
    } else {
      float amax = -1.0f;
      FUZZ_ASSERT(TE_CALL(te_amax, g_ctx, &out, &amax) == TE_SUCCESS, "te_amax of an imported tensor failed");
    }
  }
  return 0;
}
