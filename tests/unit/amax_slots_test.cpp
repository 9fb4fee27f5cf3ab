// AmaxSlots: where states accumulate their current amax. Slots are zeroed when handed out, keep
// their address, come in creation order (so a bucket's slots make one range, reduced in place),
// and the lowest free one is reused first. contiguous_range recognises exactly one range.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "scaling/amax_slots.h"
#include "backends/backend.h"

namespace {

using te::AmaxSlots;
using te::ScaleUpdateItem;

std::vector<ScaleUpdateItem> items_for(const std::vector<float *> &slots) {
  std::vector<ScaleUpdateItem> items(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) items[i].amax = slots[i];
  return items;
}

float *range_of(const AmaxSlots &a, const std::vector<float *> &slots) {
  auto items = items_for(slots);
  return a.contiguous_range(items.data(), static_cast<int>(items.size()));
}

TEST(AmaxSlots, HandsOutZeroedSlotsInCreationOrder) {
  auto be = te::make_cpu_backend();
  AmaxSlots a(*be);
  std::vector<float *> s;
  for (int i = 0; i < 10; ++i) s.push_back(a.acquire());
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(*s[i], 0.0f);
    if (i) EXPECT_EQ(s[i], s[i - 1] + 1);
  }
  EXPECT_EQ(range_of(a, s), s[0]);
  // Any order of the same slots is the same range.
  std::vector<float *> shuffled = {s[3], s[0], s[9], s[1], s[2], s[8], s[4], s[7], s[5], s[6]};
  EXPECT_EQ(range_of(a, shuffled), s[0]);
  EXPECT_EQ(range_of(a, {s[4], s[5]}), s[4]);
  EXPECT_EQ(range_of(a, {s[7]}), s[7]);
  // Holes and strangers are not a range.
  EXPECT_EQ(range_of(a, {s[0], s[2]}), nullptr);
  EXPECT_EQ(range_of(a, {s[0], s[1], s[3]}), nullptr);
  float outside[2] = {0, 0};
  EXPECT_EQ(range_of(a, {&outside[0], &outside[1]}), nullptr);
  EXPECT_EQ(a.contiguous_range(nullptr, 0), nullptr);
  for (float *p : s) a.release(p);
}

TEST(AmaxSlots, ReusesTheLowestFreeSlotZeroed) {
  auto be = te::make_cpu_backend();
  AmaxSlots a(*be);
  std::vector<float *> s;
  for (int i = 0; i < 6; ++i) s.push_back(a.acquire());
  for (float *p : s) *p = 7.0f;  // amaxes recorded by states that then go away
  // Released in an order unlike creation (as a model's layers destroy their states).
  for (int i : {1, 5, 0, 3, 2, 4}) a.release(s[i]);
  std::vector<float *> again;
  for (int i = 0; i < 6; ++i) again.push_back(a.acquire());
  EXPECT_EQ(again, s) << "a model made after another was destroyed gets its slots in creation order";
  for (float *p : again) EXPECT_EQ(*p, 0.0f);
  EXPECT_EQ(range_of(a, again), s[0]);
  for (float *p : again) a.release(p);
}

TEST(AmaxSlots, ARangeNeverSpansTwoChunks) {
  auto be = te::make_cpu_backend();
  AmaxSlots a(*be);
  std::vector<float *> s;
  const size_t n = AmaxSlots::kSlotsPerChunk + 4;
  for (size_t i = 0; i < n; ++i) s.push_back(a.acquire());
  const size_t k = AmaxSlots::kSlotsPerChunk;
  EXPECT_EQ(range_of(a, {s[k - 2], s[k - 1]}), s[k - 2]);
  EXPECT_EQ(range_of(a, {s[k], s[k + 1], s[k + 2]}), s[k]);
  // The last slot of chunk 1 and the first of chunk 2 are a range only if the chunks happen to
  // be adjacent in memory, and even then they are separate allocations: never one range.
  EXPECT_EQ(range_of(a, {s[k - 1], s[k]}), nullptr);
  // Addresses stay put when chunks are added.
  EXPECT_EQ(s[1], s[0] + 1);
  for (float *p : s) a.release(p);
}

}  // namespace
