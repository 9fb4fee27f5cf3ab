#include "context/context.h"

#include "base/check.h"

namespace te {

namespace {
std::unique_ptr<Backend> make_backend(const Device &d) {
  if (d.type == DeviceType::CPU) {
    if (d.index != 0) fail(Status::InvalidArgument, "argument 'opts->device.index': expected 0 for the CPU, got %d", d.index);
    return make_cpu_backend();
  }
  return make_cuda_backend(d.index);
}
}  // namespace

Context::Context(const Device &device)
    : Handle(HandleKind::Context),
      device_(device),
      backend_(make_backend(device)),
      default_recipe_(RecipeRef::adopt(Recipe::create(RecipeOptions::defaults(RecipeKind::Delayed)))),
      amax_slots_(*backend_),
      autocast_(*backend_, stats_, amax_slots_) {}

Context::~Context() {
  // Blocks the caller forgot to free go back with the context rather than leak.
  for (auto &block : user_blocks_) backend_->free(block.first, block.second);
}

void *Context::user_alloc(size_t bytes) {
  if (bytes == 0) fail(Status::InvalidArgument, "argument 'bytes': expected > 0, got 0");
  // No object may be larger than PTRDIFF_MAX (C's rule); the allocators round sizes up, which
  // must not wrap.
  if (bytes > static_cast<size_t>(PTRDIFF_MAX))
    fail(Status::InvalidArgument, "argument 'bytes': expected at most PTRDIFF_MAX (%td), got %zu", PTRDIFF_MAX, bytes);
  user_blocks_.reserve(user_blocks_.size() + 1);  // the insert below cannot fail after alloc
  void *p = backend_->alloc(bytes);
  user_blocks_.emplace(p, bytes);
  return p;
}

void Context::user_free(void *ptr) {
  auto it = user_blocks_.find(ptr);
  if (it == user_blocks_.end())
    fail(Status::InvalidArgument, "argument 'ptr': %p was not allocated by te_context_malloc on this context", ptr);
  backend_->free(it->first, it->second);
  user_blocks_.erase(it);
}

Device Context::default_device() {
  Device d;
  if (cuda_backend_available()) d.type = DeviceType::CUDA;
  return d;
}

}  // namespace te
