// Golden values for the scale formulas: current/block scaling (compute_scale_from_amax) and
// the delayed-scaling update with its history roll. Expected values are worked out by hand in
// the comments; float literals like 149.3333333f are the correctly rounded quotients.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "numerics/numerics.h"

namespace {

using te::AmaxAlgo;
using te::compute_scale_from_amax;
using te::delayed_scale_update;

constexpr float kE4 = 448.0f, kE5 = 57344.0f;

TEST(NumericsComputeScale, PlainQuotients) {
  EXPECT_EQ(compute_scale_from_amax(448.0f, kE4, false, 0.0f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(1.0f, kE4, false, 0.0f), 448.0f);
  EXPECT_EQ(compute_scale_from_amax(2.0f, kE4, false, 0.0f), 224.0f);
  EXPECT_EQ(compute_scale_from_amax(3.0f, kE4, false, 0.0f), 149.3333333333f);
  EXPECT_EQ(compute_scale_from_amax(7.0f, kE5, false, 0.0f), 8192.0f);
  EXPECT_EQ(compute_scale_from_amax(1000.0f, kE4, false, 0.0f), 0.448f);
}

TEST(NumericsComputeScale, DegenerateAmaxGivesOne) {
  EXPECT_EQ(compute_scale_from_amax(0.0f, kE4, false, 0.0f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(INFINITY, kE4, false, 0.0f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(NAN, kE4, false, 0.0f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(NAN, kE5, true, 1e-3f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(INFINITY, kE4, false, 1e-3f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(0.0f, kE4, true, 0.0f), 1.0f);
}

TEST(NumericsComputeScale, TinyAmaxGivesFltMax) {
  // 448 / 1e-40 = 4.48e42 overflows float.
  EXPECT_EQ(compute_scale_from_amax(1e-40f, kE4, false, 0.0f), FLT_MAX);
  EXPECT_EQ(compute_scale_from_amax(FLT_TRUE_MIN, kE5, false, 0.0f), FLT_MAX);
  // Power of 2 keeps FLT_MAX's exponent: 2^127.
  EXPECT_EQ(compute_scale_from_amax(1e-40f, kE4, true, 0.0f), 0x1p127f);
  // Not quite overflowing: 448 / 2^-120 = 1.75 * 2^128 -> inf -> FLT_MAX; / 2^-118 is finite.
  EXPECT_EQ(compute_scale_from_amax(0x1p-120f, kE4, false, 0.0f), FLT_MAX);
  EXPECT_EQ(compute_scale_from_amax(0x1p-118f, kE4, false, 0.0f), 0x1.cp126f);
}

TEST(NumericsComputeScale, EpsilonClampsAmaxUp) {
  EXPECT_EQ(compute_scale_from_amax(0.0f, kE4, false, 0.5f), 896.0f);
  EXPECT_EQ(compute_scale_from_amax(0.25f, kE4, false, 0.5f), 896.0f);
  EXPECT_EQ(compute_scale_from_amax(1.0f, kE4, false, 0.5f), 448.0f);  // above epsilon: unchanged
  EXPECT_EQ(compute_scale_from_amax(1e-40f, kE4, false, 1e-3f), 448.0f / 1e-3f);
}

TEST(NumericsComputeScale, PowerOfTwoKeepsSignAndExponent) {
  EXPECT_EQ(compute_scale_from_amax(1.0f, kE4, true, 0.0f), 256.0f);   // 448 = 1.75 * 2^8
  EXPECT_EQ(compute_scale_from_amax(3.0f, kE4, true, 0.0f), 128.0f);   // 149.33 -> 2^7
  EXPECT_EQ(compute_scale_from_amax(448.0f, kE4, true, 0.0f), 1.0f);
  EXPECT_EQ(compute_scale_from_amax(500.0f, kE4, true, 0.0f), 0.5f);   // 0.896 -> 2^-1
  EXPECT_EQ(compute_scale_from_amax(7.0f, kE5, true, 0.0f), 8192.0f);  // already a power of 2
  EXPECT_EQ(compute_scale_from_amax(0.25f, kE5, true, 0.5f), 65536.0f);  // 57344/0.5 = 1.75*2^16
}

// ---- delayed scaling --------------------------------------------------------------------

struct State {
  std::vector<float> history;
  float scale = 1.0f, scale_inv = 1.0f;
  void update(float fp8_max, int margin, AmaxAlgo algo, const float *reduced = nullptr) {
    delayed_scale_update(history.data(), static_cast<int>(history.size()), &scale, &scale_inv,
                         fp8_max, margin, algo, reduced);
  }
};

TEST(NumericsDelayedScale, LengthOneMarginZero) {
  State s{{2.0f}};
  s.update(kE4, 0, AmaxAlgo::Max);
  EXPECT_EQ(s.scale, 224.0f);
  EXPECT_EQ(s.scale_inv, 1.0f / 224.0f);
  EXPECT_EQ(s.history[0], 0.0f);  // the roll of a one-slot window clears it
}

TEST(NumericsDelayedScale, MarginTwoDividesByFour) {
  State s{{2.0f}};
  s.update(kE4, 2, AmaxAlgo::MostRecent);
  EXPECT_EQ(s.scale, 56.0f);  // (448 / 2) / 4
  EXPECT_EQ(s.scale_inv, 1.0f / 56.0f);
  State t{{3.0f}};
  t.update(kE5, 2, AmaxAlgo::Max);
  EXPECT_EQ(t.scale, 19114.6666667f / 4.0f);  // (57344 / 3) / 4, division by 4 exact
  EXPECT_EQ(t.scale, 4778.6666667f);
}

TEST(NumericsDelayedScale, LengthThirtyOneBothAlgorithmsAndTheRoll) {
  std::vector<float> h(31);
  for (int i = 0; i < 31; ++i) h[i] = 0.5f * static_cast<float>(i + 1);  // 0.5, 1.0, ..., 15.5
  h[0] = 7.0f;                                                           // current amax
  State max_state{h}, recent_state{h};
  max_state.update(kE4, 0, AmaxAlgo::Max);
  recent_state.update(kE4, 0, AmaxAlgo::MostRecent);
  EXPECT_EQ(max_state.scale, 448.0f / 15.5f);  // max over the window is h[30] = 15.5
  EXPECT_EQ(max_state.scale, 28.9032258f);
  EXPECT_EQ(recent_state.scale, 64.0f);        // 448 / 7
  EXPECT_EQ(recent_state.scale_inv, 0.015625f);
  // Roll: new[i] = old[i+1] for i < 30, new[30] = old[0], then new[0] = 0.
  std::vector<float> want(31);
  for (int i = 0; i < 30; ++i) want[i] = h[i + 1];
  want[30] = 7.0f;
  want[0] = 0.0f;
  EXPECT_EQ(max_state.history, want);
  EXPECT_EQ(recent_state.history, want);
}

TEST(NumericsDelayedScale, LengthOneThousandTwentyFourE5M2) {
  std::vector<float> h(1024, 1.0f);
  h[700] = 7.0f;
  h[0] = 2.0f;
  State max_state{h}, recent_state{h};
  max_state.update(kE5, 0, AmaxAlgo::Max);
  recent_state.update(kE5, 2, AmaxAlgo::MostRecent);
  EXPECT_EQ(max_state.scale, 8192.0f);          // 57344 / 7
  EXPECT_EQ(max_state.scale_inv, 0x1p-13f);
  EXPECT_EQ(recent_state.scale, 7168.0f);       // (57344 / 2) / 4
  EXPECT_EQ(max_state.history[0], 0.0f);
  EXPECT_EQ(max_state.history[699], 7.0f);      // slid down one slot
  EXPECT_EQ(max_state.history[1023], 2.0f);     // old current amax at the end
  EXPECT_EQ(max_state.history[1022], 1.0f);
  // A second update sees the rolled window: max is still 7 (now at 699).
  max_state.update(kE5, 0, AmaxAlgo::Max);
  EXPECT_EQ(max_state.scale, 8192.0f);
  EXPECT_EQ(max_state.history[698], 7.0f);
  EXPECT_EQ(max_state.history[1023], 0.0f);     // the cleared slot 0 went to the end
}

TEST(NumericsDelayedScale, ZeroAmaxKeepsThePreviousScale) {
  State s{std::vector<float>(16, 0.0f), 3.5f, 0.0f};
  s.update(kE4, 0, AmaxAlgo::Max);
  EXPECT_EQ(s.scale, 3.5f);
  EXPECT_EQ(s.scale_inv, 1.0f / 3.5f);  // recomputed from the kept scale
}

TEST(NumericsDelayedScale, TinyAmaxGivesFltMax) {
  for (AmaxAlgo algo : {AmaxAlgo::Max, AmaxAlgo::MostRecent}) {
    State s{{1e-40f, 0.0f, 0.0f}};
    s.update(kE4, 0, algo);
    EXPECT_EQ(s.scale, FLT_MAX);
    EXPECT_EQ(s.scale_inv, 0x1p-128f);  // 1 / FLT_MAX rounds to the subnormal 2^-128
  }
  State m{{1e-40f}};
  m.update(kE5, 3, AmaxAlgo::Max);  // (57344 / 1e-40) is inf already; / 8 stays inf
  EXPECT_EQ(m.scale, FLT_MAX);
}

TEST(NumericsDelayedScale, InfAmaxKeepsThePreviousScale) {
  State s{{INFINITY, 1.0f}, 5.0f, 0.2f};
  s.update(kE4, 0, AmaxAlgo::Max);  // inf wins the max: not finite -> keep
  EXPECT_EQ(s.scale, 5.0f);
  EXPECT_EQ(s.scale_inv, 0.2f);
  State r{{INFINITY, 1.0f}, 5.0f, 0.2f};
  r.update(kE4, 0, AmaxAlgo::MostRecent);
  EXPECT_EQ(r.scale, 5.0f);
  EXPECT_EQ(r.history, (std::vector<float>{0.0f, INFINITY}));
}

TEST(NumericsDelayedScale, NaNAmax) {
  // Most recent NaN, or a window holding only NaN: keep the previous scale.
  State a{{NAN}, 5.0f, 0.2f};
  a.update(kE4, 0, AmaxAlgo::Max);
  EXPECT_EQ(a.scale, 5.0f);
  State b{{NAN, 2.0f}, 5.0f, 0.2f};
  b.update(kE4, 0, AmaxAlgo::MostRecent);
  EXPECT_EQ(b.scale, 5.0f);
  EXPECT_EQ(b.history[0], 0.0f);
  EXPECT_TRUE(std::isnan(b.history[1]));  // the roll carries the NaN along
  // TE's MAX reduces with fmaxf, which skips NaN: the finite entries decide.
  State c{{NAN, 2.0f}, 5.0f, 0.2f};
  c.update(kE4, 0, AmaxAlgo::Max);
  EXPECT_EQ(c.scale, 224.0f);
}

TEST(NumericsDelayedScale, ReducedAmaxReplacesSlotZero) {
  State s{{1.0f, 0.5f}};
  const float reduced = 4.0f;
  s.update(kE4, 0, AmaxAlgo::MostRecent, &reduced);
  EXPECT_EQ(s.scale, 112.0f);
  // [4, 0.5] rolled: slot 0 gets 0.5 and is cleared, the reduced amax goes to the end.
  EXPECT_EQ(s.history, (std::vector<float>{0.0f, 4.0f}));
}

}  // namespace
