// base/check.h's ArgName: every form of an argument's name as messages print it, made only when
// asked for (the checks that pass format nothing), and the checks' messages naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "base/check.h"

namespace te {
namespace {

TEST(ArgName, EachFormAsMessagesPrintIt) {
  EXPECT_STREQ(ArgName("x").c_str(), "x");
  EXPECT_STREQ(ArgName("args", "ln_weight").c_str(), "args->ln_weight");
  EXPECT_STREQ(ArgName::element("args", "weights", 3).c_str(), "args->weights[3]");
  EXPECT_STREQ(ArgName::element(nullptr, "dw", 1023).c_str(), "dw[1023]");
  EXPECT_STREQ(ArgName::field_of("params", 17, "exp_avg_sq").c_str(), "params[17].exp_avg_sq");
}

TEST(ArgName, LongNamesAreCutNotOverrun) {
  const std::string longer(200, 'a');
  const ArgName n("inputs", longer.c_str());
  const std::string got = n.c_str();
  EXPECT_LT(got.size(), 100u);
  EXPECT_EQ(got.rfind("inputs->aaaa", 0), 0u);
}

TEST(ArgName, ChecksNameTheArgumentOnlyWhenTheyFail) {
  TensorView t;
  t.dtype = DType::BF16;
  t.ndim = 2;
  t.shape[0] = 4, t.shape[1] = 8;
  check_dtype(t, ArgName("args", "input"), DType::BF16);  // passes: nothing to name
  try {
    check_dtype(t, ArgName::element("args", "weights", 5), DType::F32);
    FAIL() << "check_dtype accepted a BF16 tensor as F32";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("argument 'args->weights[5]'"), std::string::npos) << e.what();
  }
  try {
    check_same_shape(t, ArgName("inputs", "v"), TensorView(), ArgName("inputs", "k"));
    FAIL() << "check_same_shape accepted different shapes";
  } catch (const Error &e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'inputs->v'"), std::string::npos) << m;
    EXPECT_NE(m.find("'inputs->k'"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace te
