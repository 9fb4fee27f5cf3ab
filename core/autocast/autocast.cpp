#include "autocast/autocast.h"

#include <algorithm>
#include <atomic>

#include "base/check.h"

namespace te {

// Pending backward passes beyond this are updated oldest-first, so a program that never runs
// the first module's backward cannot grow them without bound.
constexpr size_t kMaxPendingBackwardPasses = 64;

namespace {
// Tokens are unique in the process, not per context, so a token of one context never closes a
// scope of another: each stack numbers its scopes after a prefix of its own, drawn once.
uint64_t next_token_prefix() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed) << 32;
}

void release_scope(AutocastScope &s) {
  s.recipe->release();
  if (s.group) s.group->release();
  s.recipe = nullptr;
  s.group = nullptr;
}
}  // namespace

Autocast::Autocast(Backend &be, AutocastStats &stats, const AmaxSlots &slots)
    : be_(be), stats_(stats), slots_(slots), token_prefix_(next_token_prefix()) {}

Autocast::~Autocast() {
  while (depth_ > 0) release_scope(stack_[--depth_]);
}

uint64_t Autocast::begin(bool enabled, bool calibrating, const Recipe *recipe, const Group *group) {
  if (depth_ == kAutocastMaxDepth)
    fail(Status::InvalidState, "autocast depth limit reached: %d scopes are open (TE_AUTOCAST_MAX_DEPTH)",
         kAutocastMaxDepth);
  bool recording = enabled || calibrating;
  if (recording && recording_depth_ == 0) {
    pass_ = next_pass_++;
    modules_in_pass_ = 0;
  }
  recipe->retain();
  if (group) group->retain();
  AutocastScope &s = stack_[depth_++];
  // 2^32 scopes per prefix; a stack that opens more takes a new prefix.
  if (static_cast<uint32_t>(++tokens_issued_) == 0) token_prefix_ = next_token_prefix();
  s.token = token_prefix_ | static_cast<uint32_t>(tokens_issued_);
  s.enabled = enabled;
  s.calibrating = calibrating;
  s.recipe = recipe;
  s.group = group;
  if (recording) ++recording_depth_;
  return s.token;
}

void Autocast::end(uint64_t token) {
  if (depth_ == 0) fail(Status::InvalidState, "argument 'token': no autocast scope is open");
  AutocastScope &s = stack_[depth_ - 1];
  if (s.token != token)
    fail(Status::InvalidState, "argument 'token': it does not name the innermost open scope (depth %d); "
         "scopes must end innermost first", depth_);
  bool recording = s.enabled || s.calibrating;
  // Update before popping: if the device fails, the scope stays open and nothing changed.
  if (recording && recording_depth_ == 1) update(forward_);
  if (recording && --recording_depth_ == 0) pass_ = 0;
  release_scope(s);
  --depth_;
  ++stats_.scopes_closed;
}

PassTicket Autocast::enter_module() {
  PassTicket t;
  t.pass = pass_;
  t.first = pass_ != 0 && modules_in_pass_++ == 0;
  return t;
}

void Autocast::register_forward(ScalingState *state) {
  const AutocastScope *s = innermost();
  if (!s || pass_ == 0 || state->registered_pass == pass_) return;
  state->registered_pass = pass_;
  forward_.pass = pass_;
  forward_.add(s->recipe, s->group, state);
}

void Autocast::BucketSet::add(const Recipe *recipe, const Group *group, ScalingState *state) {
  uint64_t gid = group ? group->id() : 0;
  for (size_t i = 0; i < used; ++i) {
    if (buckets[i].recipe_key == recipe->key() && buckets[i].group_id == gid) {
      buckets[i].states.push_back(state);
      return;
    }
  }
  if (used == buckets.size()) buckets.emplace_back();
  Bucket &b = buckets[used++];
  b.recipe_key = recipe->key();
  b.group_id = gid;
  b.recipe = RecipeRef(recipe);
  b.group = GroupRef(group);
  b.states.clear();
  b.states.push_back(state);
}

void Autocast::BucketSet::reserve(int n) {
  if (used == buckets.size()) buckets.emplace_back();  // a spare for a new (recipe, group) pair
  for (size_t i = 0; i <= used; ++i) buckets[i].states.reserve(buckets[i].states.size() + static_cast<size_t>(n));
}

size_t Autocast::BucketSet::states() const {
  size_t total = 0;
  for (size_t i = 0; i < used; ++i) total += buckets[i].states.size();
  return total;
}

void Autocast::reserve_forward(int n) {
  forward_.reserve(n);
  items_.reserve(forward_.states() + static_cast<size_t>(n));
}

void Autocast::reserve_backward(uint64_t pass, int n) {
  if (pass == 0) return;
  // Making the pass pending may update the oldest pending pass (kMaxPendingBackwardPasses):
  // what a successful call would do at this point too.
  BucketSet &set = backward_set(pass);
  set.reserve(n);
  items_.reserve(set.states() + static_cast<size_t>(n));
}

void Autocast::BucketSet::clear() {
  for (size_t i = 0; i < used; ++i) {
    for (ScalingState *st : buckets[i].states) st->registered_pass = 0;
    buckets[i].states.clear();  // keeps capacity: the next pass does not allocate
    buckets[i].recipe = RecipeRef();
    buckets[i].group = GroupRef();
  }
  used = 0;
  pass = 0;
}

void Autocast::update_bucket(Bucket &b) {
  items_.clear();
  for (ScalingState *st : b.states) items_.push_back(st->update_item());
  int n = static_cast<int>(items_.size());
  if (n == 0) return;
  const float *reduced = nullptr;
  if (b.group && b.group->needs_reduction() && b.recipe->options().reduce_amax) {
    // The usual case: the bucket's amax slots are one range, reduced in place. Otherwise (states
    // first used in an order that interleaves buckets) they are gathered into one buffer first.
    if (float *range = slots_.contiguous_range(items_.data(), n)) {
      b.group->allreduce_max(range, items_.size(), be_);
    } else {
      size_t bytes = sizeof(float) * items_.size();
      if (packed_amax_.bytes() < bytes) packed_amax_ = Buffer(&be_, bytes);
      be_.gather_amax(items_.data(), n, packed_amax_.floats());
      b.group->allreduce_max(packed_amax_.floats(), items_.size(), be_);
      reduced = packed_amax_.floats();
    }
    ++stats_.amax_reductions;
  }
  be_.scale_update(items_.data(), n, reduced);
  ++stats_.bucket_updates;
  stats_.states_updated += static_cast<uint64_t>(n);
}

void Autocast::update(BucketSet &set) {
  for (size_t i = 0; i < set.used; ++i) update_bucket(set.buckets[i]);
  set.clear();
}

Autocast::BucketSet &Autocast::backward_set(uint64_t pass) {
  BucketSet *free_slot = nullptr;
  size_t pending = 0;
  for (BucketSet &set : backward_) {
    if (set.pass == pass) return set;
    if (set.pass == 0) { if (!free_slot) free_slot = &set; }
    else ++pending;
  }
  if (pending >= kMaxPendingBackwardPasses) {
    auto oldest = std::min_element(backward_.begin(), backward_.end(), [](const BucketSet &a, const BucketSet &b) {
      return (a.pass ? a.pass : UINT64_MAX) < (b.pass ? b.pass : UINT64_MAX);
    });
    update(*oldest);
    free_slot = &*oldest;
  }
  if (!free_slot) {
    backward_.emplace_back();
    free_slot = &backward_.back();
  }
  free_slot->pass = pass;
  return *free_slot;
}

void Autocast::register_backward(uint64_t pass, const Recipe *recipe, const Group *group, ScalingState *state) {
  if (pass == 0 || state->registered_pass == pass) return;
  BucketSet &set = backward_set(pass);
  state->registered_pass = pass;
  set.add(recipe, group, state);
}

void Autocast::finish_backward_pass(uint64_t pass) {
  for (BucketSet &set : backward_)
    if (set.pass == pass && pass != 0) update(set);
}

void Autocast::flush_backward() {
  // Oldest pass first, so scales evolve in the order the passes ran.
  for (;;) {
    BucketSet *oldest = nullptr;
    for (BucketSet &set : backward_)
      if (set.pass && (!oldest || set.pass < oldest->pass)) oldest = &set;
    if (!oldest) return;
    update(*oldest);
  }
}

void Autocast::forget(const ScalingState *state) {
  auto drop = [state](BucketSet &set) {
    for (size_t i = 0; i < set.used; ++i) {
      auto &v = set.buckets[i].states;
      v.erase(std::remove(v.begin(), v.end(), state), v.end());
    }
  };
  drop(forward_);
  for (BucketSet &set : backward_) drop(set);
}

}  // namespace te
