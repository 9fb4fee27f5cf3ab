#include "scaling/recipe.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/check.h"

namespace te {

RecipeOptions RecipeOptions::defaults(RecipeKind kind) {
  RecipeOptions o;
  o.kind = kind;
  if (kind == RecipeKind::Block) {
    // TE's Float8BlockScaling: E4M3 throughout and power-of-2 scales by default.
    o.format = Format::E4M3;
    o.power_of_2_scales = true;
  }
  return o;
}

namespace {

// The canonical encoding, packed: every numerics-affecting field in its own bit range, so two
// recipes get equal keys exactly when their options are equal. validate() has bounded each field:
//   bit 63      1, so that no key is 0 ("no recipe")
//   62..61      kind (0..2)               60   format (0..1)
//   59..53      margin (0..127)           52..37  amax_history_len - 1 (0..65535)
//   36          amax_algo                 35   reduce_amax        34   power_of_2_scales
//   33..3       amax_epsilon's bits without the sign (it is >= 0; -0 is folded into +0, which
//               scales identically)
//   2, 1, 0     fprop / dgrad / wgrad split accumulator
// A field appended to te_recipe_options later needs bits of its own: when none are left, this
// becomes an index into a table of encodings.
uint64_t packed_key(const RecipeOptions &o) {
  const float eps = o.amax_epsilon == 0.0f ? 0.0f : o.amax_epsilon;
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  uint64_t k = uint64_t{1} << 63;
  k |= static_cast<uint64_t>(o.kind) << 61;
  k |= static_cast<uint64_t>(o.format) << 60;
  k |= static_cast<uint64_t>(o.margin) << 53;
  k |= static_cast<uint64_t>(o.amax_history_len - 1) << 37;
  k |= static_cast<uint64_t>(o.amax_algo) << 36;
  k |= static_cast<uint64_t>(o.reduce_amax) << 35;
  k |= static_cast<uint64_t>(o.power_of_2_scales) << 34;
  k |= static_cast<uint64_t>(eps_bits & 0x7FFFFFFFu) << 3;
  k |= static_cast<uint64_t>(o.fprop_split_accumulator) << 2;
  k |= static_cast<uint64_t>(o.dgrad_split_accumulator) << 1;
  k |= static_cast<uint64_t>(o.wgrad_split_accumulator);
  return k;
}

const char *kind_name(RecipeKind k) {
  switch (k) {
    case RecipeKind::Delayed: return "delayed_scaling";
    case RecipeKind::Current: return "current_scaling";
    case RecipeKind::Block: return "block_scaling";
  }
  return "?";
}

std::string describe(const RecipeOptions &o) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s(format=%s, margin=%d, amax_history_len=%d, amax_algo=%s, reduce_amax=%d, "
                "power_of_2_scales=%d, amax_epsilon=%.9g, fprop_split_accumulator=%d, "
                "dgrad_split_accumulator=%d, wgrad_split_accumulator=%d)",
                kind_name(o.kind), o.format == Format::Hybrid ? "HYBRID" : "E4M3", o.margin, o.amax_history_len,
                o.amax_algo == AmaxAlgo::Max ? "MAX" : "MOST_RECENT", o.reduce_amax, o.power_of_2_scales,
                (double)(o.amax_epsilon == 0.0f ? 0.0f : o.amax_epsilon), o.fprop_split_accumulator,
                o.dgrad_split_accumulator, o.wgrad_split_accumulator);
  return buf;
}

void validate(const RecipeOptions &o) {
  if (o.margin < 0 || o.margin > 127)
    fail(Status::InvalidArgument, "argument 'opts->margin': expected 0..127, got %d", o.margin);
  if (o.amax_history_len < 1 || o.amax_history_len > 65536)
    fail(Status::InvalidArgument, "argument 'opts->amax_history_len': expected 1..65536, got %d", o.amax_history_len);
  if (!(o.amax_epsilon >= 0.0f) || !std::isfinite(o.amax_epsilon))
    fail(Status::InvalidArgument, "argument 'opts->amax_epsilon': expected a finite value >= 0, got %g",
         (double)o.amax_epsilon);
}

}  // namespace

Recipe::Recipe(const RecipeOptions &opts)
    : Handle(HandleKind::Recipe), opts_(opts), key_(packed_key(opts)), describe_(te::describe(opts)) {}

Recipe *Recipe::create(const RecipeOptions &opts) {
  validate(opts);
  return new Recipe(opts);
}

}  // namespace te
