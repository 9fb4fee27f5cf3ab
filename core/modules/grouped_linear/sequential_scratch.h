// Reserving the scratch of steps that run one after another, each giving back what it took before
// the next starts (a grouped layer's experts): the backend's cache must then hold, at once, the
// most blocks of each size that any one step takes, not the sum over steps, and a layer of 1024
// experts must not need 1024 plans' worth of blocks in one ScratchPlan (which holds kMax).
#pragma once

#include "backends/backend.h"

namespace te {

class SequentialScratch {
 public:
  explicit SequentialScratch(Backend &be) : be_(be) {}
  // Adds one step's plan: blocks of a size already merged are shared (the merged count of a
  // size is the most any step takes), new ones appended. When the merge would outgrow a
  // ScratchPlan, what was merged so far is reserved first and a new merge begins: the cache
  // keeps what a reserve put in it until a planned call takes it, so reserving in rounds gives
  // the same guarantee. May throw OutOfMemory (nothing changed).
  void add_step(const ScratchPlan &step);
  // Reserves what is left; afterwards every planned step runs without allocating.
  void reserve();

 private:
  Backend &be_;
  ScratchPlan merged_;
};

}  // namespace te
