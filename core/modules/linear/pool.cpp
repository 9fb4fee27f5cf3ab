#include "modules/linear/linear.h"

namespace te {

LinearObjectPool &linear_pool(Context &ctx) { return module_pools<LinearObjectPool>(ctx, ModuleSlot::Linear); }

void SavedRecycler::operator()(LinearSaved *s) const { s->pool->release(s); }

void LinearSaved::clear() {
  layer.reset();
  recipe.reset();
  group.reset();
  ticket = PassTicket();
  proj.clear();
}

SavedPtr LinearObjectPool::acquire_saved(Context &ctx) {
  LinearSaved *s = saved_.acquire(ctx);
  s->pool = this;
  return SavedPtr(s);
}

}  // namespace te
