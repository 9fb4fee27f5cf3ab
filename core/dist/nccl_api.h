// NCCL, loaded at run time. libte never links libnccl: like cuBLASLt (cuda/lt_api.h) the few
// functions it uses are looked up with dlsym and typed from <nccl.h> itself (decltype), so a
// signature change is a compile error here, not a crash there, and libte.so loads on machines
// without NCCL (where NCCL groups answer Unsupported).
//
// Only builds with the CUDA backend and NCCL's header have it: TE_NCCL_ENABLED says which.
#pragma once

#if TE_HAVE_CUDA_BACKEND && defined(__has_include)
#if __has_include(<nccl.h>)
#define TE_NCCL_ENABLED 1
#endif
#endif
#ifndef TE_NCCL_ENABLED
#define TE_NCCL_ENABLED 0
#endif

#if TE_NCCL_ENABLED
#include "base/dynamic_library.h"
#include <nccl.h>

namespace te::dist {

class NcclApi {
 public:
  // Throws te::Error(Unsupported) naming the library and dlerror() when it cannot be loaded or
  // lacks a function.
  NcclApi();
  NcclApi(const NcclApi &) = delete;
  NcclApi &operator=(const NcclApi &) = delete;

  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclCommCuDevice) comm_cu_device = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;  // optional (NCCL >= 2.13): may be null

  // Throws te::Error(Nccl) "<call> failed: <NCCL's text> (<last error>) (ncclResult N)" unless
  // result is ncclSuccess; `call` names the NCCL function, `comm` (may be null) gives NCCL's
  // last-error detail.
  void check(ncclResult_t result, const char *call, ncclComm_t comm = nullptr) const;

 private:
  DynamicLibrary lib_;
};

// The process's one loaded copy (loaded on first use; a failed load is retried next time).
const NcclApi &nccl_api();

}  // namespace te::dist
#endif  // TE_NCCL_ENABLED
