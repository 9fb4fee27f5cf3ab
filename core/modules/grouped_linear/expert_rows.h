// Where each expert's tokens are in a grouped layer's x, y, dy and dx, and the zero-padded copies
// that FP8 needs for experts whose token count is not a multiple of 16.
#pragma once

#include <cstdint>

#include "backends/backend.h"

namespace te {

// Expert i's rows are [row0, row0 + tokens) of x, y, dy and dx. Under FP8 an expert whose tokens
// are not a multiple of 16 (cuBLASLt's rule for every GEMM dimension) computes on `padded` rows
// instead: its rows copied to row pad_row0 of the call's padding scratch, zeros after them.
struct ExpertRows {
  int64_t row0 = 0, tokens = 0, padded = 0;
  int64_t pad_row0 = -1;  // -1: computes on the caller's rows
  bool is_padded() const { return pad_row0 >= 0; }
};

// Lays out n experts from their counts (validated: >= 0). Returns the rows of padding scratch
// they need in all (0 unless fp8).
int64_t layout_expert_rows(const int64_t *splits, int n, bool fp8, ExpertRows *rows);

// Rows [row0, row0 + rows) of the row-major matrix m; an absent m (data == nullptr) stays absent.
TensorView row_block(const TensorView &m, int64_t row0, int64_t rows);

// The matrix an expert computes on: its block of `pad` when padded, else its rows of `m`.
TensorView expert_matrix(const ExpertRows &e, const TensorView &m, const TensorView &pad);

// Copies every padded expert's rows of m into its block of pad and zeroes the padding rows after
// them, all in one backend call (Backend::copy_row_segments). pad's columns are a multiple of 16
// (FP8 features), so every row starts 4-byte aligned.
void pad_experts(Backend &be, const ExpertRows *rows, int n, const TensorView &m, const TensorView &pad);
// Copies every padded expert's real rows from its block of pad back into m (one backend call).
void unpad_experts(Backend &be, const ExpertRows *rows, int n, const TensorView &pad, const TensorView &m);

}  // namespace te
