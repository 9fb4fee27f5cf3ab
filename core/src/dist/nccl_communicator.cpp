#include "te/core/nccl_group.h"

#include "dist/nccl_api.h"
#include "te/core/backend.h"
#include "te/core/check.h"

#if TE_NCCL_ENABLED
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/cuda_check.h"
#endif

namespace te::dist {

#if TE_NCCL_ENABLED

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "te_nccl_id must hold an ncclUniqueId");

namespace {

// Amax reduction over an NCCL communicator: one ncclAllReduce(MAX) of the packed fp32 amaxes,
// enqueued on the context's stream. No host synchronisation, so a step stays capturable in a
// CUDA graph.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi &api, ncclComm_t comm, bool owned) : api_(api), comm_(comm), owned_(owned) {
    api_.check(api_.comm_cu_device(comm_, &device_), "ncclCommCuDevice", comm_);
  }

  ~NcclCommunicator() override {
    if (!owned_ || !comm_) return;
    ncclResult_t async = ncclSuccess;
    // A communicator that errored (a peer died, a network failure) cannot be destroyed
    // collectively: abort it, which never waits for the other ranks.
    if (api_.comm_get_async_error(comm_, &async) != ncclSuccess || async != ncclSuccess)
      api_.comm_abort(comm_);
    else
      api_.comm_destroy(comm_);
  }

  void allreduce_max(float *buf, size_t count, Backend &backend) override {
    Device dev = backend.device();
    if (dev.type != DeviceType::CUDA)
      fail(Status::InvalidArgument,
           "an NCCL group reduces device memory: the context must be on a CUDA device, not the CPU");
    if (dev.index != device_)
      fail(Status::InvalidArgument, "the NCCL group's communicator is on CUDA device %d, the context on device %d",
           device_, dev.index);
    // A communicator already in error fails here, with NCCL's message, rather than hanging.
    ncclResult_t async = ncclSuccess;
    api_.check(api_.comm_get_async_error(comm_, &async), "ncclCommGetAsyncError", comm_);
    api_.check(async, "NCCL communicator (asynchronous error)", comm_);
    int previous = 0;
    TE_CUDA_CHECK(cudaGetDevice(&previous));
    if (previous != device_) TE_CUDA_CHECK(cudaSetDevice(device_));
    ncclResult_t r = api_.all_reduce(buf, buf, count, ncclFloat32, ncclMax, comm_,
                                     static_cast<cudaStream_t>(backend.stream()));
    if (previous != device_) cudaSetDevice(previous);
    api_.check(r, "ncclAllReduce", comm_);
  }

 private:
  const NcclApi &api_;
  ncclComm_t comm_;
  bool owned_;
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

std::unique_ptr<Group> nccl_group_init(int rank, int nranks, const void *id) {
  const NcclApi &api = require_gpu_and_nccl();
  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof uid);
  ncclComm_t comm = nullptr;
  api.check(api.comm_init_rank(&comm, nranks, uid, rank), "ncclCommInitRank");
  std::unique_ptr<Communicator> c;
  try {
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
std::unique_ptr<Group> nccl_group_init(int, int, const void *) { no_nccl(); }

#endif  // TE_NCCL_ENABLED

}  // namespace te::dist
