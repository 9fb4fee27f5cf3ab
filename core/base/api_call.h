// The C API call running on this thread, as a number: caches of facts that cannot change while
// one call runs (the current CUDA device, whether the context's stream is being captured) are
// keyed on it, so that a training step asks the driver once per call instead of once per
// allocation or kernel. Outside any call (core code driven directly, tests) the number is 0 and
// nothing may be cached.
#pragma once

#include <cstdint>

namespace te {

// Nonzero and unique (across threads) for the C API call in progress on this thread; 0 outside.
uint64_t api_call_epoch();

// Marks one C API call (capi's `guarded`); restores the enclosing call's number on exit.
class ApiCallScope {
 public:
  ApiCallScope() noexcept;
  ~ApiCallScope();
  ApiCallScope(const ApiCallScope &) = delete;
  ApiCallScope &operator=(const ApiCallScope &) = delete;

 private:
  uint64_t enclosing_;
};

}  // namespace te
