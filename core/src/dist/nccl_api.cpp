#include "dist/nccl_api.h"

#if TE_NCCL_ENABLED

#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <string>

#include "te/core/check.h"

namespace te::dist {

namespace {

constexpr const char *kLibNames[] = {"libnccl.so.2", "libnccl.so"};

template <class Fn>
void bind(void *lib, const char *name, Fn *out, bool required = true) {
  dlerror();
  void *sym = dlsym(lib, name);
  if (!sym) {
    const char *err = dlerror();
    if (!required) return;
    fail(Status::Unsupported, "NCCL: symbol %s not found in the loaded libnccl (%s)", name, err ? err : "no error text");
  }
  *out = reinterpret_cast<Fn>(sym);
}

}  // namespace

NcclApi::NcclApi() {
  std::string errors;
  for (const char *name : kLibNames) {
    lib_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib_) break;
    const char *err = dlerror();
    errors += errors.empty() ? "" : "; ";
    errors += err ? err : name;
  }
  if (!lib_)
    fail(Status::Unsupported, "NCCL could not be loaded (NCCL process groups need libnccl.so.2): %s", errors.c_str());
  try {
    bind(lib_, "ncclGetVersion", &get_version);
    bind(lib_, "ncclGetUniqueId", &get_unique_id);
    bind(lib_, "ncclCommInitRank", &comm_init_rank);
    bind(lib_, "ncclCommDestroy", &comm_destroy);
    bind(lib_, "ncclCommAbort", &comm_abort);
    bind(lib_, "ncclCommGetAsyncError", &comm_get_async_error);
    bind(lib_, "ncclCommCount", &comm_count);
    bind(lib_, "ncclCommUserRank", &comm_user_rank);
    bind(lib_, "ncclCommCuDevice", &comm_cu_device);
    bind(lib_, "ncclAllReduce", &all_reduce);
    bind(lib_, "ncclGetErrorString", &get_error_string);
    bind(lib_, "ncclGetLastError", &get_last_error, /*required=*/false);
  } catch (...) {
    dlclose(lib_);
    lib_ = nullptr;
    throw;
  }
}

NcclApi::~NcclApi() {
  if (lib_) dlclose(lib_);
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
