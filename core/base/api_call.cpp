#include "base/api_call.h"

#include <atomic>

namespace te {

namespace {

std::atomic<uint64_t> g_next_epoch{1};
thread_local uint64_t t_epoch = 0;

}  // namespace

uint64_t api_call_epoch() { return t_epoch; }

ApiCallScope::ApiCallScope() noexcept : enclosing_(t_epoch) {
  t_epoch = g_next_epoch.fetch_add(1, std::memory_order_relaxed);
}

ApiCallScope::~ApiCallScope() { t_epoch = enclosing_; }

}  // namespace te
