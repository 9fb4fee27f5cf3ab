#include "dist/nccl_api.h"

#if TE_NCCL_ENABLED

#include <memory>
#include <mutex>

#include "base/check.h"

namespace te::dist {

NcclApi::NcclApi() : lib_({"libnccl.so.2", "libnccl.so"}, "NCCL", "NCCL process groups need libnccl.so.2") {
  lib_.bind("ncclGetVersion", &get_version);
  lib_.bind("ncclGetUniqueId", &get_unique_id);
  lib_.bind("ncclCommInitRankConfig", &comm_init_rank_config);
  lib_.bind("ncclCommFinalize", &comm_finalize);
  lib_.bind("ncclCommDestroy", &comm_destroy);
  lib_.bind("ncclCommAbort", &comm_abort);
  lib_.bind("ncclCommGetAsyncError", &comm_get_async_error);
  lib_.bind("ncclCommCount", &comm_count);
  lib_.bind("ncclCommUserRank", &comm_user_rank);
  lib_.bind("ncclCommCuDevice", &comm_cu_device);
  lib_.bind("ncclAllReduce", &all_reduce);
  lib_.bind("ncclGetErrorString", &get_error_string);
  lib_.bind("ncclGetLastError", &get_last_error, /*required=*/false);
}

void NcclApi::check(ncclResult_t result, const char *call, ncclComm_t comm) const {
  if (result == ncclSuccess) return;
  const char *text = get_error_string ? get_error_string(result) : nullptr;
  const char *last = get_last_error ? get_last_error(comm) : nullptr;
  if (last && *last)
    fail(Status::Nccl, "%s failed: %s: %s (ncclResult %d)", call, text ? text : "unknown NCCL error", last,
         static_cast<int>(result));
  fail(Status::Nccl, "%s failed: %s (ncclResult %d)", call, text ? text : "unknown NCCL error",
       static_cast<int>(result));
}

const NcclApi &nccl_api() {
  // Loaded once and kept for the process: communicators may outlive any one group's owner, and
  // unloading NCCL while its proxy threads run is not safe.
  static std::mutex mu;
  static NcclApi *api = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!api) api = new NcclApi();  // throws on failure, leaving api null for a later retry
  return *api;
}

}  // namespace te::dist

#endif  // TE_NCCL_ENABLED
