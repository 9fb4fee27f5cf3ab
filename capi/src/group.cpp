#include <cstring>

#include "capi_common.h"

using namespace te;
using namespace te::capi;

namespace {
[[noreturn]] void no_nccl() {
  fail(Status::Unsupported, "this libte was built without NCCL process groups (they arrive with the NCCL backend); "
       "use te_group_create_single or a NULL group");
}
}  // namespace

extern "C" {

TE_API te_status te_group_create_single(te_group **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    *out = reinterpret_cast<te_group *>(new Group(0, 1, nullptr));
  });
}

TE_API te_status te_group_create_nccl(te_group **out, void *nccl_comm) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    check_not_null(nccl_comm, "nccl_comm");
    no_nccl();
  });
}

TE_API te_status te_nccl_get_unique_id(te_nccl_id *out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    no_nccl();
  });
}

TE_API te_status te_group_init_nccl(te_group **out, int32_t rank, int32_t nranks, const te_nccl_id *id) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    check_not_null(id, "id");
    if (nranks < 1) fail(Status::InvalidArgument, "argument 'nranks': expected >= 1, got %d", nranks);
    if (rank < 0 || rank >= nranks)
      fail(Status::InvalidArgument, "argument 'rank': expected 0..%d, got %d", nranks - 1, rank);
    no_nccl();
  });
}

TE_API void te_group_destroy(te_group *g) {
  if (g && reinterpret_cast<Handle *>(g)->handle_kind == HandleKind::Group) delete reinterpret_cast<Group *>(g);
}

TE_API uint64_t te_group_id(const te_group *g) {
  if (!g || reinterpret_cast<const Handle *>(g)->handle_kind != HandleKind::Group) return 0;
  return reinterpret_cast<const Group *>(g)->id();
}

TE_API int32_t te_group_rank(const te_group *g) {
  if (!g || reinterpret_cast<const Handle *>(g)->handle_kind != HandleKind::Group) return 0;
  return reinterpret_cast<const Group *>(g)->rank();
}

TE_API int32_t te_group_size(const te_group *g) {
  if (!g || reinterpret_cast<const Handle *>(g)->handle_kind != HandleKind::Group) return 1;
  return reinterpret_cast<const Group *>(g)->size();
}

}  // extern "C"
