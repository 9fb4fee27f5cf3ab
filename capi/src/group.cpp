#include <cstring>

#include "capi_common.h"
// CUDA- and NCCL-free declarations of the NCCL group factories (core/src/dist): they throw
// Unsupported in builds without the CUDA backend or <nccl.h>, or where libnccl.so.2 is absent.
#include "dist/nccl_group.h"

using namespace te;
using namespace te::capi;

static_assert(sizeof(te_nccl_id) == te::dist::kNcclIdBytes, "te_nccl_id must hold an ncclUniqueId");

namespace {

constexpr int32_t kDefaultNcclTimeoutMs = 600000;  // as PyTorch's NCCL process groups: 10 minutes

// te_group_init_nccl(_with_options); opts null: the defaults.
void init_nccl(te_group **out, int32_t rank, int32_t nranks, const te_nccl_id *id, const te_group_nccl_options *opts) {
  check_not_null(out, "out");
  check_not_null(id, "id");
  if (nranks < 1) fail(Status::InvalidArgument, "argument 'nranks': expected >= 1, got %d", nranks);
  if (rank < 0 || rank >= nranks)
    fail(Status::InvalidArgument, "argument 'rank': expected 0..%d, got %d", nranks - 1, rank);
  int64_t timeout_ms = kDefaultNcclTimeoutMs;
  if (opts) {
    check_options(opts, "opts");
    if (opts->timeout_ms < 0)
      fail(Status::InvalidArgument, "argument 'opts->timeout_ms': expected >= 0 (0: no limit), got %d", opts->timeout_ms);
    timeout_ms = opts->timeout_ms;
  }
  *out = te::dist::nccl_group_init(rank, nranks, id->internal, timeout_ms).release()->as_public<te_group>();
}

}  // namespace

extern "C" {

TE_API te_status te_group_create_single(te_group **out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    *out = (new Group(0, 1, nullptr))->as_public<te_group>();
  });
}

TE_API te_status te_group_create_nccl(te_group **out, void *nccl_comm) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    check_not_null(nccl_comm, "nccl_comm");
    *out = te::dist::nccl_group_borrow(nccl_comm).release()->as_public<te_group>();
  });
}

TE_API te_status te_nccl_get_unique_id(te_nccl_id *out) {
  return guarded(__func__, [&] {
    check_not_null(out, "out");
    te_nccl_id id;
    te::dist::nccl_get_unique_id(id.internal);
    *out = id;
  });
}

TE_API te_status te_group_nccl_options_init(te_group_nccl_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_group_nccl_options{};
    opts->struct_size = sizeof *opts;
    opts->timeout_ms = kDefaultNcclTimeoutMs;
  });
}

TE_API te_status te_group_init_nccl_with_options(te_group **out, int32_t rank, int32_t nranks, const te_nccl_id *id,
                                                 const te_group_nccl_options *opts) {
  return guarded(__func__, [&] { init_nccl(out, rank, nranks, id, opts); });
}

TE_API te_status te_group_init_nccl(te_group **out, int32_t rank, int32_t nranks, const te_nccl_id *id) {
  return guarded(__func__, [&] { init_nccl(out, rank, nranks, id, nullptr); });
}

TE_API te_status te_group_abort(te_group *g) {
  return guarded(__func__, [&] { to_group(g, "g")->abort(); });
}

TE_API void te_group_destroy(te_group *g) {
  // The handle dies now; the group itself lives on while a scope, bucket or saved forward uses it.
  if (Group *grp = live_or_null<Group>(g, HandleKind::Group)) {
    grp->retire();
    grp->release();
  }
}

TE_API uint64_t te_group_id(const te_group *g) {
  const Group *grp = live_or_null<Group>(g, HandleKind::Group);
  return grp ? grp->id() : 0;
}

TE_API int32_t te_group_rank(const te_group *g) {
  const Group *grp = live_or_null<Group>(g, HandleKind::Group);
  return grp ? grp->rank() : 0;
}

TE_API int32_t te_group_size(const te_group *g) {
  const Group *grp = live_or_null<Group>(g, HandleKind::Group);
  return grp ? grp->size() : 1;
}

}  // extern "C"
