// What the te_*_caller_residuals tests share: caller-owned residual memory and backward args.
#pragma once

#include <cstdlib>
#include <memory>

#include "api_test_util.h"

namespace te_test {

// Caller-owned residual memory, 256-byte aligned; its bytes start as a sentinel.
struct Block {
  void *p = nullptr;
  size_t bytes = 0;
  explicit Block(size_t n) : bytes(n) {
    if (n) {
      p = std::aligned_alloc(256, (n + 255) / 256 * 256);
      std::memset(p, 0xC3, n);
    }
  }
  ~Block() { std::free(p); }
  Block(const Block &) = delete;
  Block &operator=(const Block &) = delete;
};

inline te_linear_backward_args backward_flags(uint32_t flags) {
  te_linear_backward_args ba;
  te_linear_backward_args_init(&ba);
  ba.flags = flags;
  return ba;
}

inline bool error_names(const char *what) { return std::string(te_last_error()).find(what) != std::string::npos; }

}  // namespace te_test
