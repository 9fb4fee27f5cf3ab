#include "dist/nccl_group.h"

#include "dist/nccl_api.h"
#include "backends/backend.h"
#include "base/check.h"

#if TE_NCCL_ENABLED
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "backends/cuda/cuda_check.h"
#endif

namespace te::dist {

#if TE_NCCL_ENABLED

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "te_nccl_id must hold an ncclUniqueId");

namespace {

// Polls the communicator until no operation of it is pending (ncclInProgress, which only
// non-blocking communicators report, has ended). Throws te::Error(Nccl) with NCCL's message,
// naming `call`, when the communicator is in error; returns false when timeout_ms (0: no limit)
// passes first, leaving the communicator to the caller.
bool wait_ready(const NcclApi &api, ncclComm_t comm, const char *call, int64_t timeout_ms) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    api.check(api.comm_get_async_error(comm, &state), "ncclCommGetAsyncError", comm);
    if (state != ncclInProgress) {
      api.check(state, call, comm);
      return true;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (timeout_ms > 0 && waited.count() >= timeout_ms) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Amax reduction over an NCCL communicator: one ncclAllReduce(MAX) of the packed fp32 amaxes,
// enqueued on the context's stream. No host synchronisation, so a step stays capturable in a
// CUDA graph.
class NcclCommunicator final : public Communicator {
 public:
  static constexpr int64_t kFinalizeTimeoutMs = 30000;

  NcclCommunicator(const NcclApi &api, ncclComm_t comm, bool owned) : api_(api), comm_(comm), owned_(owned) {
    api_.check(api_.comm_cu_device(comm_, &device_), "ncclCommCuDevice", comm_);
  }

  ~NcclCommunicator() override {
    if (!owned_ || !comm_ || aborted_.load()) return;
    // Owned communicators are non-blocking: finalize (flushing its work) and wait for it, then
    // destroy. One that errored (a peer died, a network failure), or does not finalize within
    // kFinalizeTimeoutMs, is aborted instead, which never waits for the other ranks.
    bool finalized = false;
    try {
      if (wait_ready(api_, comm_, "NCCL communicator", kFinalizeTimeoutMs)) {
        ncclResult_t r = api_.comm_finalize(comm_);
        if (r != ncclInProgress) api_.check(r, "ncclCommFinalize", comm_);
        finalized = wait_ready(api_, comm_, "ncclCommFinalize", kFinalizeTimeoutMs);
      }
    } catch (const Error &) {  // in error: aborted below
    }
    if (finalized) api_.comm_destroy(comm_);
    else api_.comm_abort(comm_);
  }

  void allreduce_max(float *buf, size_t count, Backend &backend) override {
    if (aborted_.load())
      fail(Status::Nccl, "the group's NCCL communicator was aborted (te_group_abort): destroy the group and make a new one");
    Device dev = backend.device();
    if (dev.type != DeviceType::CUDA)
      fail(Status::InvalidArgument,
           "an NCCL group reduces device memory: the context must be on a CUDA device, not the CPU");
    if (dev.index != device_)
      fail(Status::InvalidArgument, "the NCCL group's communicator is on CUDA device %d, the context on device %d",
           device_, dev.index);
    // A communicator already in error fails here, with NCCL's message, rather than hanging.
    wait_ready(api_, comm_, "NCCL communicator (asynchronous error)", 0);
    int previous = 0;
    TE_CUDA_CHECK(cudaGetDevice(&previous));
    if (previous != device_) TE_CUDA_CHECK(cudaSetDevice(device_));
    ncclResult_t r = api_.all_reduce(buf, buf, count, ncclFloat32, ncclMax, comm_,
                                     static_cast<cudaStream_t>(backend.stream()));
    if (previous != device_) cudaSetDevice(previous);
    // A non-blocking communicator may still be enqueueing: it is done within microseconds, and
    // NCCL wants it finished before the next call on the communicator.
    if (r == ncclInProgress) wait_ready(api_, comm_, "ncclAllReduce", 0);
    else api_.check(r, "ncclAllReduce", comm_);
  }

  void abort() override {
    if (!owned_)
      fail(Status::InvalidState, "argument 'g': the group borrows its communicator (te_group_create_nccl): "
           "its owner aborts it with ncclCommAbort");
    if (aborted_.exchange(true)) return;
    api_.comm_abort(comm_);
  }

 private:
  const NcclApi &api_;
  ncclComm_t comm_;
  bool owned_;
  std::atomic<bool> aborted_{false};
  int device_ = 0;
};

// NCCL groups reduce device memory: without a usable GPU (CPU machines, CI) they are
// Unsupported, before NCCL is even loaded.
const NcclApi &require_gpu_and_nccl() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    fail(Status::Unsupported, "NCCL process groups need a CUDA device, and none is usable here (%s); "
         "use te_group_create_single or a NULL group", err != cudaSuccess ? cudaGetErrorString(err) : "no GPU");
  return nccl_api();
}

}  // namespace

bool nccl_compiled() { return true; }

void nccl_get_unique_id(void *id) {
  const NcclApi &api = require_gpu_and_nccl();
  ncclUniqueId uid;
  api.check(api.get_unique_id(&uid), "ncclGetUniqueId");
  std::memcpy(id, &uid, sizeof uid);
}

std::unique_ptr<Group> nccl_group_borrow(void *comm_ptr) {
  const NcclApi &api = require_gpu_and_nccl();
  ncclComm_t comm = static_cast<ncclComm_t>(comm_ptr);
  int rank = 0, size = 0;
  api.check(api.comm_user_rank(comm, &rank), "ncclCommUserRank", comm);
  api.check(api.comm_count(comm, &size), "ncclCommCount", comm);
  return std::make_unique<Group>(rank, size, std::make_unique<NcclCommunicator>(api, comm, /*owned=*/false));
}

std::unique_ptr<Group> nccl_group_init(int rank, int nranks, const void *id, int64_t timeout_ms) {
  const NcclApi &api = require_gpu_and_nccl();
  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof uid);
  // Non-blocking, so that a rank that never joins ends in a timeout here, not a hang in NCCL.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = api.comm_init_rank_config(&comm, nranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) api.comm_abort(comm);
    api.check(r, "ncclCommInitRankConfig");
  }
  std::unique_ptr<Communicator> c;
  try {
    if (!wait_ready(api, comm, "ncclCommInitRankConfig", timeout_ms))
      fail(Status::Nccl, "ncclCommInitRankConfig did not complete within %lld ms (rank %d of %d): did every rank "
           "call te_group_init_nccl with the same id and nranks?", static_cast<long long>(timeout_ms), rank, nranks);
    c = std::make_unique<NcclCommunicator>(api, comm, /*owned=*/true);
  } catch (...) {
    api.comm_abort(comm);
    throw;
  }
  return std::make_unique<Group>(rank, nranks, std::move(c));
}

#else  // !TE_NCCL_ENABLED

namespace {
[[noreturn]] void no_nccl() {
#if TE_HAVE_CUDA_BACKEND
  fail(Status::Unsupported, "this libte was built without NCCL process groups (<nccl.h> was not found at build "
       "time); use te_group_create_single or a NULL group");
#else
  fail(Status::Unsupported, "this libte was built without NCCL process groups (they need the CUDA backend); "
       "use te_group_create_single or a NULL group");
#endif
}
}  // namespace

bool nccl_compiled() { return false; }
void nccl_get_unique_id(void *) { no_nccl(); }
std::unique_ptr<Group> nccl_group_borrow(void *) { no_nccl(); }
std::unique_ptr<Group> nccl_group_init(int, int, const void *, int64_t) { no_nccl(); }

#endif  // TE_NCCL_ENABLED

}  // namespace te::dist
