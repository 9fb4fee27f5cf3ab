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
  // The last pass's deferred update goes first: this pass's casts read and write those states.
  if (recording && recording_depth_ == 0) settle();
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
  // Update (or defer) before popping: if the device fails, the scope stays open and nothing
  // changed.
  if (recording && recording_depth_ == 1) {
    if (can_defer(forward_)) {
      if (deferred_.pass) update(deferred_);  // not reached: the pass's begin settled
      std::swap(forward_, deferred_);        // forward_ takes the cleared set: no allocation
    } else {
      update(forward_);
    }
  }
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
  // Room for the deferred forward set too, so that both take one launch.
  items_.reserve(set.states() + deferred_.states() + static_cast<size_t>(n));
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

bool Autocast::reduces(const Bucket &b) {
  return b.group && b.group->needs_reduction() && b.recipe->options().reduce_amax;
}

bool Autocast::can_defer(const BucketSet &set) const {
  if (set.used == 0) return false;
  // An all-reduce is a collective: every rank must run it at the same point of its program, so
  // it is not moved to whichever later call happens to settle.
  for (size_t i = 0; i < set.used; ++i)
    if (reduces(set.buckets[i])) return false;
  return !be_.stream_capturing();
}

// A bucket whose amaxes are all-reduced first has a launch of its own: when its slots are not one
// range, its update reads the reduced amaxes from the gathered buffer.
void Autocast::update_reduced_bucket(Bucket &b) {
  items_.clear();
  for (ScalingState *st : b.states) items_.push_back(st->update_item());
  int n = static_cast<int>(items_.size());
  if (n == 0) return;
  const float *reduced = nullptr;
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
  be_.scale_update(items_.data(), n, reduced);
  ++stats_.update_launches;
  ++stats_.bucket_updates;
  stats_.states_updated += static_cast<uint64_t>(n);
}

void Autocast::update(BucketSet &set, BucketSet *also) {
  BucketSet *sets[2] = {&set, also};
  for (BucketSet *s : sets)
    for (size_t i = 0; s && i < s->used; ++i)
      if (reduces(s->buckets[i])) update_reduced_bucket(s->buckets[i]);
  // Every other bucket of both sets in one launch. items_ was reserved for each set's states
  // (and a backward set's room counts the deferred set's): a merge that would not fit launches
  // what it has first rather than allocate here.
  items_.clear();
  uint64_t buckets = 0;
  auto launch = [&] {
    if (items_.empty()) return;
    be_.scale_update(items_.data(), static_cast<int>(items_.size()), nullptr);
    ++stats_.update_launches;
    stats_.bucket_updates += buckets;
    stats_.states_updated += static_cast<uint64_t>(items_.size());
    items_.clear();
    buckets = 0;
  };
  for (BucketSet *s : sets) {
    for (size_t i = 0; s && i < s->used; ++i) {
      const Bucket &b = s->buckets[i];
      if (reduces(b) || b.states.empty()) continue;
      if (items_.size() + b.states.size() > items_.capacity()) launch();
      for (ScalingState *st : b.states) items_.push_back(st->update_item());
      ++buckets;
    }
  }
  launch();
  set.clear();
  if (also) also->clear();
}

void Autocast::settle_check() const {
  if (deferred_.pass && be_.stream_capturing())
    fail(Status::InvalidState, "the scale update of an autocast pass that ended outside stream capture is still "
         "pending, and a capture would repeat it at every replay; run that pass's backward or call "
         "te_autocast_flush_backward (or te_context_synchronize) before the capture begins");
}

void Autocast::settle() {
  if (!deferred_.pass) return;
  settle_check();
  update(deferred_);
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

Autocast::BucketSet *Autocast::deferred_if_eager() {
  return deferred_.pass && !be_.stream_capturing() ? &deferred_ : nullptr;
}

Autocast::BucketSet *Autocast::pending_backward_set(uint64_t pass) {
  if (pass == 0) return nullptr;
  for (BucketSet &set : backward_)
    if (set.pass == pass) return &set;
  return nullptr;
}

void Autocast::finish_backward_pass(uint64_t pass, bool carried) {
  BucketSet *set = pending_backward_set(pass);
  if (!set) return;
  if (!carried) {
    // Under capture a deferred forward update stays pending (the capture must not repeat it);
    // the next settle outside capture enqueues it.
    update(*set, deferred_if_eager());
    return;
  }
  // The norm backward enqueued what carry_backward_update put in items_: count it as update()
  // would have counted its one launch, and clear the sets it covered.
  BucketSet *sets[2] = {set, carried_also_};
  for (BucketSet *s : sets)
    for (size_t i = 0; s && i < s->used; ++i)
      if (!s->buckets[i].states.empty()) ++stats_.bucket_updates;
  ++stats_.update_launches;
  ++stats_.updates_carried;
  stats_.states_updated += static_cast<uint64_t>(items_.size());
  set->clear();
  if (carried_also_) carried_also_->clear();
  carried_also_ = nullptr;
}

bool Autocast::carry_backward_update(uint64_t pass, NormBackwardArgs *nb) {
  BucketSet *set = pending_backward_set(pass);
  if (!set) return false;  // finishing the pass enqueues nothing (a deferred set stays deferred)
  BucketSet *also = deferred_if_eager();
  BucketSet *sets[2] = {set, also};
  size_t n = 0;
  for (BucketSet *s : sets)
    for (size_t i = 0; s && i < s->used; ++i) {
      if (reduces(s->buckets[i])) return false;  // its own launch, after the all-reduce
      n += s->buckets[i].states.size();
    }
  if (n == 0 || n > static_cast<size_t>(kCarriedUpdateItems)) return false;
  items_.clear();  // reserve_backward made room for both sets
  for (BucketSet *s : sets)
    for (size_t i = 0; s && i < s->used; ++i)
      for (ScalingState *st : s->buckets[i].states) items_.push_back(st->update_item());
  nb->then_update = items_.data();
  nb->then_update_count = static_cast<int>(n);
  carried_also_ = also;
  return true;
}

void Autocast::flush_backward() {
  settle_check();
  // Oldest pass first, so scales evolve in the order the passes ran.
  for (;;) {
    BucketSet *oldest = nullptr;
    for (BucketSet &set : backward_)
      if (set.pass && (!oldest || set.pass < oldest->pass)) oldest = &set;
    if (!oldest) break;
    update(*oldest, deferred_if_eager());
  }
  settle();
}

void Autocast::forget(const ScalingState *state) {
  auto drop = [state](BucketSet &set) {
    for (size_t i = 0; i < set.used; ++i) {
      auto &v = set.buckets[i].states;
      v.erase(std::remove(v.begin(), v.end(), state), v.end());
    }
  };
  drop(forward_);
  drop(deferred_);
  for (BucketSet &set : backward_) drop(set);
}

}  // namespace te
