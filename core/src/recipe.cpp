#include "te/core/recipe.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "te/core/check.h"

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

// The canonical encoding: every numerics-affecting field at a fixed offset, floats by their bit
// pattern (with -0 folded into +0, which scales identically).
std::string canonical_encoding(const RecipeOptions &o) {
  int32_t fields[11];
  float eps = o.amax_epsilon == 0.0f ? 0.0f : o.amax_epsilon;
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  fields[0] = static_cast<int32_t>(o.kind);
  fields[1] = static_cast<int32_t>(o.format);
  fields[2] = o.margin;
  fields[3] = o.amax_history_len;
  fields[4] = static_cast<int32_t>(o.amax_algo);
  fields[5] = o.reduce_amax;
  fields[6] = o.power_of_2_scales;
  fields[7] = static_cast<int32_t>(eps_bits);
  fields[8] = o.fprop_split_accumulator;
  fields[9] = o.dgrad_split_accumulator;
  fields[10] = o.wgrad_split_accumulator;
  return std::string(reinterpret_cast<const char *>(fields), sizeof fields);
}

// The one process-wide structure in libte: an append-only table mapping canonical encodings to
// keys. It holds no training state; it only makes keys collision-free. Touched at recipe
// creation only, never on the hot path.
uint64_t intern(const std::string &encoding) {
  static std::mutex mu;
  static std::unordered_map<std::string, uint64_t> table;
  std::lock_guard<std::mutex> lock(mu);
  auto it = table.find(encoding);
  if (it != table.end()) return it->second;
  uint64_t key = table.size() + 1;  // never 0: 0 means "no recipe"
  table.emplace(encoding, key);
  return key;
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
    : Handle(HandleKind::Recipe), opts_(opts), key_(intern(canonical_encoding(opts))), describe_(te::describe(opts)) {}

Recipe *Recipe::create(const RecipeOptions &opts) {
  validate(opts);
  return new Recipe(opts);
}

void Recipe::release() const {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace te
