// NCCL process groups: a te::Communicator over an ncclComm_t, built by the factories below.
// This header is free of CUDA and NCCL types, so that the C shims (compiled without CUDA's
// include path) can call it; in builds without the CUDA backend or without <nccl.h> every
// factory throws te::Error(Unsupported).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dist/group.h"

namespace te::dist {

constexpr size_t kNcclIdBytes = 128;  // sizeof(ncclUniqueId) == sizeof(te_nccl_id)

// Whether this build has NCCL process groups (libnccl is still loaded only on first use).
bool nccl_compiled();

// Writes a new ncclUniqueId (kNcclIdBytes bytes) to `id`. Throws Unsupported when NCCL is
// absent, Nccl when NCCL fails.
void nccl_get_unique_id(void *id);

// A group over a communicator the caller owns and keeps alive (an ncclComm_t): rank and size
// come from NCCL. The group never destroys it.
std::unique_ptr<Group> nccl_group_borrow(void *comm);

// Joins `nranks` ranks into a new communicator on the calling thread's current CUDA device
// (collective: every rank calls it, as ncclCommInitRank). The communicator is non-blocking:
// when the ranks have not all joined within timeout_ms (0: no limit) it is aborted and this
// throws te::Error(Nccl). The group owns the communicator: destroying the group finalizes and
// destroys it (aborts it when NCCL reported an error or finalizing takes over 30 s).
std::unique_ptr<Group> nccl_group_init(int rank, int nranks, const void *id, int64_t timeout_ms);

}  // namespace te::dist
