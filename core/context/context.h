// One execution context: one device and its backend (stream, BLAS handle, memory cache), one
// autocast stack, the default recipe. Not thread-safe: one per thread.
#pragma once

#include <memory>
#include <unordered_map>

#include "scaling/amax_slots.h"
#include "autocast/autocast.h"
#include "backends/backend.h"
#include "base/handle.h"
#include "scaling/recipe.h"
#include "base/ref.h"

namespace te {

// What a module keeps per context (its pools of residuals and backward contexts): made by the
// module on first use, destroyed with the context, which knows it only by its slot. So the
// context depends on no module.
struct ModuleState {
  virtual ~ModuleState() = default;
};
enum class ModuleSlot : int { Linear = 0, LayerNormLinear, LayerNormMlp, GroupedLinear, Attention, Count };

// Reference counted: te_context_destroy kills the handle and drops the caller's reference; each
// layer, residuals block and backward context made with the context holds one, so the context
// (its backend, memory and pools) lives until the last of them is destroyed.
class Context : public Handle, public RefCounted<Context> {
 public:
  // Throws Unsupported when the device's backend is not available.
  explicit Context(const Device &device);
  ~Context();

  Backend &backend() { return *backend_; }
  const Device &device() const { return device_; }
  Autocast &autocast() { return autocast_; }
  const Autocast &autocast() const { return autocast_; }
  const Recipe &default_recipe() const { return *default_recipe_.get(); }
  const AutocastStats &stats() const { return stats_; }
  AmaxSlots &amax_slots() { return amax_slots_; }

  // CUDA 0 when this build has the CUDA backend and a usable GPU, else the CPU.
  static Device default_device();

  // te_context_malloc's blocks: their sizes, which the backend's free wants back.
  void *user_alloc(size_t bytes);
  void user_free(void *ptr);

  ModuleState *module_state(ModuleSlot s) const { return module_states_[static_cast<int>(s)].get(); }
  void set_module_state(ModuleSlot s, std::unique_ptr<ModuleState> state) {
    module_states_[static_cast<int>(s)] = std::move(state);
  }

 private:
  Device device_;
  std::unique_ptr<Backend> backend_;
  RecipeRef default_recipe_;
  AutocastStats stats_;
  AmaxSlots amax_slots_;  // before autocast_ and every scaling state, after backend_
  Autocast autocast_;
  std::unique_ptr<ModuleState> module_states_[static_cast<int>(ModuleSlot::Count)];  // last: first to go
  std::unordered_map<void *, size_t> user_blocks_;
};

using ContextRef = Ref<Context>;

}  // namespace te
