#include "modules/grouped_linear/sequential_scratch.h"

namespace te {

namespace {

int count_of(const ScratchPlan &p, size_t bytes) {
  int c = 0;
  for (int i = 0; i < p.n; ++i) c += p.bytes[i] == bytes;
  return c;
}

// Whether bytes[i] is the first block of its size in p.
bool first_of_size(const ScratchPlan &p, int i) {
  for (int j = 0; j < i; ++j)
    if (p.bytes[j] == p.bytes[i]) return false;
  return true;
}

}  // namespace

void SequentialScratch::add_step(const ScratchPlan &step) {
  int missing = 0;
  for (int i = 0; i < step.n; ++i)
    if (first_of_size(step, i)) {
      const int extra = count_of(step, step.bytes[i]) - count_of(merged_, step.bytes[i]);
      if (extra > 0) missing += extra;
    }
  if (merged_.n + missing > ScratchPlan::kMax) reserve();
  for (int i = 0; i < step.n; ++i)
    if (first_of_size(step, i))
      for (int k = count_of(merged_, step.bytes[i]); k < count_of(step, step.bytes[i]); ++k)
        merged_.add(step.bytes[i]);
}

void SequentialScratch::reserve() {
  if (merged_.n) be_.reserve(merged_);
  merged_.n = 0;
}

}  // namespace te
