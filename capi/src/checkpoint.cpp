// te_checkpoint_*: named tensors and byte strings, saved to and loaded from one versioned,
// checksummed file (core/checkpoint: the record set, format.h's byte layout, file.h's atomic
// write). Every function validates everything before it changes anything.
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "capi_common.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/file.h"
#include "checkpoint/format.h"

using namespace te;
using namespace te::capi;

namespace {

Checkpoint *to_checkpoint(const te_checkpoint *h, const char *name = "ck") {
  return from_handle<Checkpoint>(h, HandleKind::Checkpoint, name);
}

const char *kind_name(RecordKind k) { return k == RecordKind::Tensor ? "tensor" : "byte"; }

// The record `name`, which must exist and be of `kind`.
const CheckpointRecord &record_of(const Checkpoint &ck, const char *name, RecordKind kind) {
  check_record_name(name, "name");
  const CheckpointRecord *r = ck.find(name);
  if (!r) fail(Status::InvalidArgument, "argument 'name': the checkpoint has no record '%s'", name);
  if (r->kind != kind)
    fail(Status::InvalidArgument, "argument 'name': record '%s' is a %s record, not a %s record", name,
         kind_name(r->kind), kind_name(kind));
  return *r;
}

std::string shape_text(const int64_t *shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The caller's buffer for a serialised checkpoint.
class SpanSink : public ByteSink {
 public:
  explicit SpanSink(uint8_t *p) : p_(p) {}
  void write(const void *data, size_t size) override {
    if (size) std::memcpy(p_, data, size);
    p_ += size;
  }

 private:
  uint8_t *p_;
};

// NULL with capacity 0 asks for the size; otherwise buf must hold `need` bytes. *size is set
// either way (so that a too-small buffer still learns the size), buf is not touched on failure.
// Returns whether to write.
bool check_output_buffer(const void *buf, size_t capacity, size_t need, size_t *size) {
  if (!buf && capacity != 0)
    fail(Status::InvalidArgument, "argument 'buf': NULL with capacity %zu (pass capacity 0 to ask for the size)", capacity);
  *size = need;
  if (!buf) return false;
  if (capacity < need)
    fail(Status::InvalidArgument, "argument 'capacity': %zu bytes are needed, got %zu (*size holds the size)", need, capacity);
  return true;
}

}  // namespace

extern "C" {

TE_API te_status te_checkpoint_create(te_checkpoint **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    *out = (new Checkpoint())->as_public<te_checkpoint>();
  });
}

TE_API void te_checkpoint_destroy(te_checkpoint *ck) { delete live_or_null<Checkpoint>(ck, HandleKind::Checkpoint); }

TE_API te_status te_checkpoint_put_tensor(te_checkpoint *ck, te_context *ctx, const char *name, const te_tensor *t) {
  return guarded(__func__, [&] {
    Checkpoint *c = to_checkpoint(ck);
    Context *context = to_context(ctx);
    check_record_name(name, "name");
    const TensorView v = to_view(t, "t");
    if (!storable_dtype(v.dtype))
      fail(Status::InvalidArgument, "argument 't': an FP8 tensor (%s) cannot be checkpointed: store its high-precision "
           "source (the module's state keeps the scales)", dtype_name(v.dtype));
    check_device(v, "t", context->device());
    CheckpointRecord r;
    r.name = name;
    r.kind = RecordKind::Tensor;
    r.dtype = v.dtype;
    r.ndim = v.ndim;
    for (int i = 0; i < v.ndim; ++i) r.shape[i] = v.shape[i];
    r.payload.resize(v.bytes());
    context->backend().copy_to_host(r.payload.data(), v.data, r.payload.size());  // synchronises
    c->put(std::move(r));  // only now: a failed copy leaves an older record of this name in place
  });
}

TE_API te_status te_checkpoint_put_bytes(te_checkpoint *ck, const char *name, const void *data, size_t size) {
  return guarded(__func__, [&] {
    Checkpoint *c = to_checkpoint(ck);
    check_record_name(name, "name");
    if (!data && size != 0) fail(Status::InvalidArgument, "argument 'data': NULL with size %zu", size);
    // No real buffer comes near this (the vector would throw length_error, an internal error).
    if (size > (SIZE_MAX >> 2))
      fail(Status::InvalidArgument, "argument 'size': expected at most %zu bytes, got %zu", SIZE_MAX >> 2, size);
    CheckpointRecord r;
    r.name = name;
    r.kind = RecordKind::Bytes;
    const auto *p = static_cast<const uint8_t *>(data);
    if (size) r.payload.assign(p, p + size);
    c->put(std::move(r));
  });
}

TE_API te_status te_checkpoint_get_tensor(const te_checkpoint *ck, te_context *ctx, const char *name, te_tensor *t) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    Context *context = to_context(ctx);
    const TensorView v = to_view(t, "t");
    check_device(v, "t", context->device());
    const CheckpointRecord &r = record_of(*c, name, RecordKind::Tensor);
    if (v.dtype != r.dtype)
      fail(Status::InvalidArgument, "argument 't': record '%s' holds a %s tensor, t is %s", name, dtype_name(r.dtype),
           dtype_name(v.dtype));
    bool same = v.ndim == r.ndim;
    for (int i = 0; same && i < v.ndim; ++i) same = v.shape[i] == r.shape[i];
    if (!same)
      fail(Status::InvalidArgument, "argument 't': record '%s' has shape %s, t has shape %s", name,
           shape_text(r.shape, r.ndim).c_str(), shape_text(v.shape, v.ndim).c_str());
    context->backend().copy_from_host(v.data, r.payload.data(), r.payload.size());
  });
}

TE_API te_status te_checkpoint_get_bytes(const te_checkpoint *ck, const char *name, void *buf, size_t capacity,
                                         size_t *size) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    check_not_null(size, "size");
    const CheckpointRecord &r = record_of(*c, name, RecordKind::Bytes);
    if (check_output_buffer(buf, capacity, r.payload.size(), size) && !r.payload.empty())
      std::memcpy(buf, r.payload.data(), r.payload.size());
  });
}

TE_API te_status te_checkpoint_record_info(const te_checkpoint *ck, const char *name, int32_t *is_tensor,
                                           te_tensor *shape, size_t *size) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    check_not_null(is_tensor, "is_tensor");
    check_not_null(size, "size");
    check_record_name(name, "name");
    const CheckpointRecord *r = c->find(name);
    if (!r) fail(Status::InvalidArgument, "argument 'name': the checkpoint has no record '%s'", name);
    const bool tensor = r->kind == RecordKind::Tensor;
    if (tensor && shape) {
      te_tensor t;
      std::memset(&t, 0, sizeof t);
      t.dtype = static_cast<te_dtype>(r->dtype);
      t.ndim = r->ndim;
      for (int i = 0; i < r->ndim; ++i) t.shape[i] = r->shape[i];
      t.device.type = TE_DEVICE_CPU;
      *shape = t;
    }
    *is_tensor = tensor ? 1 : 0;
    *size = r->payload.size();
  });
}

TE_API te_status te_checkpoint_count(const te_checkpoint *ck, size_t *count) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    check_not_null(count, "count");
    *count = c->count();
  });
}

TE_API te_status te_checkpoint_name(const te_checkpoint *ck, size_t index, const char **name) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    check_not_null(name, "name");
    if (index >= c->count())
      fail(Status::InvalidArgument, "argument 'index': expected 0..count-1 (count %zu), got %zu", c->count(), index);
    *name = c->at(index).name.c_str();
  });
}

TE_API te_status te_checkpoint_write(const te_checkpoint *ck, const char *path) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    check_not_null(path, "path");
    if (!*path) fail(Status::InvalidArgument, "argument 'path': expected a file path, got an empty string");
    write_checkpoint_file(*c, path);
  });
}

TE_API te_status te_checkpoint_read(te_checkpoint **out, const char *path) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    check_not_null(path, "path");
    if (!*path) fail(Status::InvalidArgument, "argument 'path': expected a file path, got an empty string");
    std::unique_ptr<Checkpoint> c = read_checkpoint_file(path);
    *out = c.release()->as_public<te_checkpoint>();
  });
}

TE_API te_status te_checkpoint_serialize(const te_checkpoint *ck, void *buf, size_t capacity, size_t *size) {
  return guarded(__func__, [&] {
    const Checkpoint *c = to_checkpoint(ck);
    check_not_null(size, "size");
    const uint64_t need = serialized_size(*c);
    if (need > SIZE_MAX) fail(Status::Unsupported, "the serialised checkpoint (%llu bytes) exceeds SIZE_MAX",
                              static_cast<unsigned long long>(need));
    if (!check_output_buffer(buf, capacity, static_cast<size_t>(need), size)) return;
    SpanSink sink(static_cast<uint8_t *>(buf));
    serialize_checkpoint(*c, sink);
  });
}

TE_API te_status te_checkpoint_deserialize(te_checkpoint **out, const void *buf, size_t size) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    check_not_null(buf, "buf");
    std::unique_ptr<Checkpoint> c = parse_checkpoint(static_cast<const uint8_t *>(buf), size, "argument 'buf'", "buffer");
    *out = c.release()->as_public<te_checkpoint>();
  });
}

}  // extern "C"
