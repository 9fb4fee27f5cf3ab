#include "te/core/context.h"

#include "te/core/check.h"
#include "te/core/linear.h"

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
      autocast_(*backend_, stats_),
      linear_pool_(std::make_unique<LinearObjectPool>()) {}

Context::~Context() = default;

Device Context::default_device() {
  Device d;
  if (cuda_backend_available()) d.type = DeviceType::CUDA;
  return d;
}

}  // namespace te
