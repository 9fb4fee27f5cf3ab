// The header as gen_sweep.py parsed it: the types of the tables in the generated sweep_api.cpp.
// Kinds are decided by type alone (see gen_sweep.py: param_kind, field_kind).
#pragma once

#include <te/te.h>

#include <cstddef>
#include <cstring>

namespace sweep {

template <class T>
struct Span {
  const T *data;
  size_t size;
  const T *begin() const { return data; }
  const T *end() const { return data + size; }
};

enum class ReturnKind { Status, Void, Value };

enum class ParamKind {
  Handle,     // te_X * / const te_X *, te_X an opaque typedef
  OutHandle,  // te_X **
  Tensor,     // te_tensor * / const te_tensor *
  Options,    // pointer to a struct beginning with size_t struct_size
  Struct,     // pointer to another struct of the header (te_device, te_nccl_id)
  Pointer,    // any other pointer
  Enum,
  Int,        // int, int32_t
  UInt,
  Int64,
  UInt64,     // uint64_t and typedefs of it (te_autocast_token)
  Size,       // size_t
  Float,
};

enum class FieldKind {
  Handle, Tensor, TensorValue, Pointer, Array, Enum, Int, UInt, Int64, UInt64, Size, Float,
};

struct EnumValue {
  const char *name;
  long long value;
};
struct EnumInfo {
  const char *name;
  const EnumValue *values;
  size_t count;
};

// A struct field, nested structs flattened ("device.type").
struct FieldInfo {
  const char *path;
  const char *type;
  size_t offset, size;
  FieldKind kind;
  const char *base;        // the type without const and stars
  bool const_target;       // pointer to const
  size_t pointee_size;     // sizeof the pointee for typed pointers, 0 otherwise
};
struct StructInfo {
  const char *name;
  size_t size;
  bool has_struct_size;
  const FieldInfo *fields;
  size_t nfields;
};

struct ParamInfo {
  const char *name;
  const char *type;
  size_t offset, size;     // in the function's sweep::args struct
  ParamKind kind;
  const char *base;
  bool const_target;
  size_t pointee_size;
  int struct_index;        // into header_structs() for Tensor/Options/Struct, else -1
};

struct CallResult {
  te_status status = TE_SUCCESS;
  long long value = 0;
  const void *pointer = nullptr;
  const char *text = nullptr;
  bool has_value = false, has_pointer = false, has_text = false;
  bool not_exported = false;  // libte.so has no such symbol: nothing was called
};

struct FunctionInfo {
  const char *name;
  const char *return_type;
  ReturnKind ret;
  size_t args_size;
  const ParamInfo *params;
  size_t nparams;
  CallResult (*invoke)(const void *args);
};

// An enum argument as the bits the caller stored (any int), converted without an enum load.
template <class E>
E enum_arg(const E *p) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  int v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<E>(v);
}

// Generated (sweep_api.cpp).
// The symbol libte.so exports under `name` (looked up in the loaded library), or NULL.
const void *exported_symbol(const char *name);
Span<FunctionInfo> header_functions();
Span<StructInfo> header_structs();
Span<EnumInfo> header_enums();
Span<const char *const> header_handle_types();

}  // namespace sweep
