// cuDNN's fused flash attention through the backend API (see cudnn_sdpa.h). The operation graphs
// are the ones cuDNN's runtime-fusion flash engines recognise: Q K^T (matmul) -> * scale
// (pointwise, scalar by value) -> [padding mask: gen_index + cmp_lt against per-sequence lengths
// + logical_and + binary_select] -> [causal mask: gen_index row/col, row (+ s_kv - s_q for the
// bottom-right diagonal) >= col, binary_select -inf] -> softmax with statistics (reduction max,
// sub, exp, reduction add, log, add = LSE; div) -> P V (matmul); and the backward graph built the
// same way (D = rowsum(dO * O) into a workspace tensor, P from the saved LSE, dV = P^T dO,
// dS = P (dP - D) scale, dK = dS^T Q, dQ = dS K through an fp32 accumulator in the workspace).
// Variable lengths (THD) use ragged offsets on Q/K/V/O/dQ/dK/dV/LSE plus the padding mask, and
// the GEMMs' M/N/K overrides, with lengths and offsets made from cu_seqlens by a small kernel.
#include "backends/cuda/cudnn_sdpa.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_api.h"
#include "backends/cuda/cudnn_sdpa_kernels.h"
#include "base/check.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace te::cuda {
namespace {

using Dims = std::array<int64_t, 4>;
using Bd = cudnnBackendDescriptor_t;

bool debug_enabled() {
  static const bool on = [] {
    const char *e = std::getenv("TE_CUDNN_SDPA_DEBUG");
    return e && e[0] && e[0] != '0';
  }();
  return on;
}

// Read when a backend first loads cuDNN (not at every call: getenv scans the environment).
bool fp8_opt_in() {
  const char *e = std::getenv("TE_CUDNN_SDPA_FP8");
  return e && e[0] == '1';
}

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

bool to_cudnn(DType t, cudnnDataType_t *out) {
  switch (t) {
    case DType::F16: *out = CUDNN_DATA_HALF; return true;
    case DType::BF16: *out = CUDNN_DATA_BFLOAT16; return true;
    default: return false;
  }
}

// Tensor unique ids (virtual tensors get ids from kFirstVirtual on).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kSeqQ, kSeqKv, kOffQ, kOffKv, kOffStats, kSqConst, kSkvConst,
  kDO, kDQ, kDK, kDV, kOne, kSoftSum, kDQAcc,
  kDescaleQ, kDescaleK, kDescaleV, kSScale, kSScaleInv, kAmaxS, kAmaxO,  // FP8 forward
  kNumUids, kFirstVirtual = 1000
};

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc(const CudnnApi &api, cudnnBackendDescriptorType_t type) : api_(&api) {
    api.check(api.create_descriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() {
    if (d_) api_->destroy_descriptor(d_);
  }
  Desc(const Desc &) = delete;
  Desc &operator=(const Desc &) = delete;
  Bd get() const { return d_; }
  void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    cudnnStatus_t s = api_->set_attribute(d_, a, t, n, v);
    if (s != CUDNN_STATUS_SUCCESS) {
      char what[96];
      std::snprintf(what, sizeof(what), "cudnnBackendSetAttribute(attribute %d)", static_cast<int>(a));
      api_->check(s, what);
    }
  }
  void finalize(const char *what) { api_->check(api_->finalize(d_), what); }

 private:
  const CudnnApi *api_;
  Bd d_ = nullptr;
};

struct Tn {
  Bd d = nullptr;
  Dims dim{}, stride{};
};

// A built and finalized execution plan with everything it refers to.
struct Plan {
  bool ok = false;
  std::string why;
  std::vector<std::unique_ptr<Desc>> keep;
  Bd plan = nullptr;
  int64_t cudnn_ws = 0;
  std::vector<int64_t> uids;  // the non-virtual tensors, in the variant pack
  bool padding = false, varlen = false;
  // Values passed by value (pointed to from the variant pack).
  float scale = 1.0f, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
  int32_t sq_const = 0, skv_const = 0;
};

class GraphBuilder {
 public:
  GraphBuilder(const CudnnApi &api, cudnnHandle_t handle, Plan *plan) : api_(api), handle_(handle), plan_(plan) {}

  Desc &make(cudnnBackendDescriptorType_t t) {
    plan_->keep.push_back(std::make_unique<Desc>(api_, t));
    return *plan_->keep.back();
  }

  Tn tensor(int64_t uid, cudnnDataType_t dt, Dims dim, Dims stride, bool is_virtual = false, bool by_value = false,
            Bd ragged = nullptr) {
    Desc &d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data());
    d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride.data());
    d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (is_virtual) {
      bool v = true;
      d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    }
    if (by_value) {
      bool v = true;
      d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &v);
    }
    if (ragged) d.set(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged);
    d.finalize("cudnnBackendFinalize(tensor)");
    if (!is_virtual) plan_->uids.push_back(uid);
    return Tn{d.get(), dim, stride};
  }
  Tn virt(cudnnDataType_t dt, Dims dim, Dims stride, Bd ragged = nullptr) {
    return tensor(next_virtual_++, dt, dim, stride, true, false, ragged);
  }
  Tn scalar(int64_t uid, cudnnDataType_t dt) { return tensor(uid, dt, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  void pointwise(cudnnPointwiseMode_t mode, const Tn &x, const Tn *b, const Tn *t, const Tn &y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc &pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize("cudnnBackendFinalize(pointwise)");
    Desc &op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    Bd pwd = pw.get();
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d);
    if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d);
    if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->d);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d);
    op.finalize("cudnnBackendFinalize(pointwise operation)");
    ops_.push_back(op.get());
  }
  // A pointwise operation into a new virtual tensor shaped like x.
  Tn pw(cudnnPointwiseMode_t mode, const Tn &x, const Tn *b = nullptr, cudnnDataType_t out = CUDNN_DATA_FLOAT,
        cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1, const Tn *t = nullptr) {
    Tn y = virt(out, x.dim, x.stride);
    pointwise(mode, x, b, t, y, prec, axis);
    return y;
  }

  void matmul(const Tn &a, const Tn &b, const Tn &c, const Tn *m, const Tn *n, const Tn *k) {
    Desc &mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    mm.finalize("cudnnBackendFinalize(matmul)");
    Desc &op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    Bd mmd = mm.get();
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.d);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.d);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.d);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mmd);
    if (m) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m->d);
    if (n) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n->d);
    if (k) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k->d);
    op.finalize("cudnnBackendFinalize(matmul operation)");
    ops_.push_back(op.get());
  }

  void reduction(cudnnReduceTensorOp_t mode, const Tn &x, const Tn &y) {
    Desc &r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    r.finalize("cudnnBackendFinalize(reduction)");
    Desc &op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    Bd rd = r.get();
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    op.finalize("cudnnBackendFinalize(reduction operation)");
    ops_.push_back(op.get());
  }

  void reshape(const Tn &x, const Tn &y) {
    Desc &op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d);
    op.finalize("cudnnBackendFinalize(reshape operation)");
    ops_.push_back(op.get());
  }

  // The operation graph, the heuristics' engine configurations and the first of them that
  // finalizes into an execution plan.
  void finish() {
    Desc &g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()), ops_.data());
    g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    g.finalize("cudnnBackendFinalize(operation graph)");
    Bd gd = g.get();
    std::string errors;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc &h = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      h.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd);
      h.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      try {
        h.finalize("cudnnBackendFinalize(engine heuristics)");
      } catch (const std::exception &e) {
        errors += e.what();
        errors += "; ";
        continue;
      }
      int64_t count = 0;
      api_.check(api_.get_attribute(h.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                    nullptr),
                 "cudnnBackendGetAttribute(engine heuristics results count)");
      if (count <= 0) continue;
      if (count > 16) count = 16;
      std::vector<Bd> cfgs;
      for (int64_t i = 0; i < count; ++i) cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
      int64_t got = 0;
      api_.check(api_.get_attribute(h.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                    cfgs.data()),
                 "cudnnBackendGetAttribute(engine heuristics results)");
      for (int64_t i = 0; i < got; ++i) {
        try {
          Desc &p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
          p.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
          p.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
          p.finalize("cudnnBackendFinalize(execution plan)");
          int64_t ws = 0, n = 0;
          api_.check(api_.get_attribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
                     "cudnnBackendGetAttribute(workspace size)");
          plan_->plan = p.get();
          plan_->cudnn_ws = ws;
          plan_->ok = true;
          return;
        } catch (const std::exception &e) {
          errors += e.what();
          errors += "; ";
        }
      }
    }
    fail(Status::Unsupported, "no cuDNN engine runs this attention graph: %s",
         errors.empty() ? "the heuristics found none" : errors.c_str());
  }

 private:
  const CudnnApi &api_;
  cudnnHandle_t handle_;
  Plan *plan_;
  std::vector<Bd> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// The shape of one call as the plan sees it.
struct Shape {
  bool backward = false;
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16;  // q, k, v (E4M3 for FP8)
  cudnnDataType_t out = CUDNN_DATA_BFLOAT16;  // o (and the gradients)
  bool fp8 = false;
  int64_t b = 0, h = 0, hk = 0, d = 0, sq = 0, skv = 0;
  bool varlen = false;
  int mask = 0;
  float scale = 1.0f;
  // The plan cache's key: every field above as plain data, so that a call's lookup neither
  // formats nor allocates.
  using Key = std::array<int64_t, 13>;
  Key key() const {
    uint32_t sbits;
    std::memcpy(&sbits, &scale, 4);
    return {backward ? 1 : 0, static_cast<int64_t>(io), static_cast<int64_t>(out), fp8 ? 1 : 0, b, h, hk, d, sq,
            skv, varlen ? 1 : 0, mask, static_cast<int64_t>(sbits)};
  }
  // The key as text, for TE_CUDNN_SDPA_DEBUG's lines (printed when a plan is built).
  void describe(char *buf, size_t size) const {
    const Key k = key();
    std::snprintf(buf, size, "%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%lld/%08llx", (long long)k[0],
                  (long long)k[1], (long long)k[2], (long long)k[3], (long long)k[4], (long long)k[5], (long long)k[6],
                  (long long)k[7], (long long)k[8], (long long)k[9], (long long)k[10], (long long)k[11],
                  (long long)k[12]);
  }
};

// Workspace pieces after cuDNN's own (each 256-byte aligned).
struct Layout {
  size_t seq_q = 0, seq_kv = 0, off_q = 0, off_kv = 0, off_stats = 0, stats = 0, soft_sum = 0, dq_acc = 0, amax = 0,
         total = 0;
};

Layout layout_for(const Plan &p, const Shape &s, int64_t tokens_q, bool need_stats_scratch) {
  Layout l;
  size_t at = align_up(static_cast<size_t>(p.cudnn_ws));
  auto take = [&](size_t bytes) {
    size_t here = at;
    at += align_up(bytes);
    return here;
  };
  if (p.padding) {
    l.seq_q = take(sizeof(int32_t) * s.b);
    l.seq_kv = take(sizeof(int32_t) * s.b);
  }
  if (s.varlen) {
    l.off_q = take(sizeof(int64_t) * (s.b + 1));
    l.off_kv = take(sizeof(int64_t) * (s.b + 1));
    l.off_stats = take(sizeof(int64_t) * (s.b + 1));
  }
  if (need_stats_scratch) {
    const int64_t n = s.varlen ? tokens_q * s.h : s.b * s.h * s.sq;
    l.stats = take(sizeof(float) * static_cast<size_t>(n));
  }
  if (s.fp8) l.amax = take(2 * sizeof(float));
  if (s.backward) {
    l.soft_sum = take(sizeof(float) * static_cast<size_t>(s.b * s.h * s.sq));
    l.dq_acc = take(sizeof(float) * static_cast<size_t>(s.b * s.h * s.sq * s.d));
  }
  l.total = at;
  return l;
}

class CudnnSdpaImpl final : public CudnnSdpa {
 public:
  CudnnSdpaImpl(std::unique_ptr<CudnnApi> api, cudnnHandle_t handle, int device, int sm_major)
      : api_(std::move(api)), handle_(handle), device_(device), sm_major_(sm_major), version_(api_->get_version()),
        fp8_opt_in_(fp8_opt_in()) {}
  ~CudnnSdpaImpl() override {
    plans_.clear();
    if (handle_) api_->destroy(handle_);
  }

  bool supports_forward(const AttentionForwardArgs &a, size_t *ws) override {
    Shape s;
    if (!shape_of(a.dims, a.q, a.k, a.v, a.o, false, &s)) return false;
    if (s.fp8 && (!a.s_scale || !a.s_scale_inv)) return false;
    if (!s.fp8 && (a.s_scale || a.s_scale_inv || a.s_amax)) return false;
    Plan *p = plan_for(s);
    if (!p) return false;
    const bool stats_scratch = !s.varlen || a.lse == nullptr;
    if (ws) *ws = layout_for(*p, s, a.dims.tokens_q, stats_scratch).total;
    return true;
  }

  bool supports_backward(const AttentionBackwardArgs &a, size_t *ws) override {
    if (a.dp_amax_only || a.d_o8.data || a.s_scale || a.dp_scale || a.dp_amax) return false;
    if (!a.lse) return false;
    Shape s;
    if (!shape_of(a.dims, a.q, a.k, a.v, a.o, true, &s) || s.fp8) return false;
    for (const TensorView *t : {&a.d_o, &a.dq, &a.dk, &a.dv})
      if (t->dtype != a.o.dtype || !aligned(t->data)) return false;
    Plan *p = plan_for(s);
    if (!p) return false;
    if (ws) *ws = layout_for(*p, s, a.dims.tokens_q, true).total;
    return true;
  }

  void forward(const AttentionForwardArgs &a, void *workspace, cudaStream_t stream) override {
    Shape s;
    if (!shape_of(a.dims, a.q, a.k, a.v, a.o, false, &s)) fail(Status::Internal, "cuDNN attention: unsupported call");
    Plan *p = plan_for(s);
    if (!p) fail(Status::Internal, "cuDNN attention: no plan for this call");
    const bool stats_scratch = !s.varlen || a.lse == nullptr;
    const Layout l = layout_for(*p, s, a.dims.tokens_q, stats_scratch);
    char *w = static_cast<char *>(workspace);
    const SdpaSeqInfo info = seq_info(a.dims);
    std::lock_guard<std::mutex> lock(mu_);
    api_->check(api_->set_stream(handle_, stream), "cudnnSetStream", Status::Cuda);
    prepare(*p, s, info, w, l, stream);
    void *ptrs[kNumUids] = {};
    ptrs[kQ] = a.q.data;
    ptrs[kK] = a.k.data;
    ptrs[kV] = a.v.data;
    ptrs[kO] = a.o.data;
    float *stats = stats_scratch ? reinterpret_cast<float *>(w + l.stats) : a.lse;
    ptrs[kStats] = stats;
    if (s.fp8) {
      ptrs[kDescaleQ] = a.q.scale_inv;
      ptrs[kDescaleK] = a.k.scale_inv;
      ptrs[kDescaleV] = a.v.scale_inv;
      ptrs[kSScale] = const_cast<float *>(a.s_scale);
      ptrs[kSScaleInv] = const_cast<float *>(a.s_scale_inv);
      ptrs[kAmaxS] = w + l.amax;
      ptrs[kAmaxO] = w + l.amax + sizeof(float);
    }
    fill_common(*p, w, l, ptrs);
    execute(*p, ptrs, workspace);
    if (s.fp8 && a.s_amax) sdpa_max_merge(reinterpret_cast<const float *>(w + l.amax), a.s_amax, stream);
    const bool finish = s.varlen || a.lse || (s.mask == 2 && s.sq > s.skv);
    if (finish)
      sdpa_finish_forward(info, s.varlen ? nullptr : stats, a.lse, a.o.data, static_cast<int>(dtype_size(a.o.dtype)),
                          stream);
  }

  void backward(const AttentionBackwardArgs &a, void *workspace, cudaStream_t stream) override {
    Shape s;
    if (!shape_of(a.dims, a.q, a.k, a.v, a.o, true, &s)) fail(Status::Internal, "cuDNN attention: unsupported call");
    Plan *p = plan_for(s);
    if (!p) fail(Status::Internal, "cuDNN attention: no plan for this call");
    const Layout l = layout_for(*p, s, a.dims.tokens_q, true);
    char *w = static_cast<char *>(workspace);
    const SdpaSeqInfo info = seq_info(a.dims);
    std::lock_guard<std::mutex> lock(mu_);
    api_->check(api_->set_stream(handle_, stream), "cudnnSetStream", Status::Cuda);
    prepare(*p, s, info, w, l, stream);
    float *stats = reinterpret_cast<float *>(w + l.stats);
    sdpa_prepare_backward_stats(info, a.lse, stats, stream);
    if (version_ < 90600)
      TE_CUDA_CHECK(cudaMemsetAsync(w + l.dq_acc, 0, sizeof(float) * s.b * s.h * s.sq * s.d, stream));
    void *ptrs[kNumUids] = {};
    ptrs[kQ] = a.q.data;
    ptrs[kK] = a.k.data;
    ptrs[kV] = a.v.data;
    ptrs[kO] = a.o.data;
    ptrs[kDO] = a.d_o.data;
    ptrs[kStats] = stats;
    ptrs[kDQ] = a.dq.data;
    ptrs[kDK] = a.dk.data;
    ptrs[kDV] = a.dv.data;
    ptrs[kSoftSum] = w + l.soft_sum;
    ptrs[kDQAcc] = w + l.dq_acc;
    fill_common(*p, w, l, ptrs);
    execute(*p, ptrs, workspace);
  }

  size_t version() const { return version_; }

 private:
  static bool aligned(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

  bool shape_of(const AttentionDims &d, const TensorView &q, const TensorView &k, const TensorView &v,
                const TensorView &o, bool backward, Shape *s) const {
    cudnnDataType_t io, out;
    bool fp8 = false;
    if (q.dtype == DType::E4M3 && k.dtype == DType::E4M3 && v.dtype == DType::E4M3 && to_cudnn(o.dtype, &out)) {
      // FP8 forward (per-tensor scales): E4M3 q/k/v, high-precision o. cuDNN runs FP8 attention
      // with an F16/BF16 O (and F16/BF16 gradients) only on Blackwell (sm_100+, cuDNN 9.13+); on
      // Hopper its FP8 engines write O and dQ/dK/dV in FP8, which is not libte's contract, so
      // FP8 stays with libte's kernels there. The FP8 backward also wants O in FP8 (D from it):
      // always libte's kernels.
      // Not yet validated on a Blackwell GPU: opt in with TE_CUDNN_SDPA_FP8=1 until the FP8
      // test (CudnnFp8Forward) has run there.
      if (backward || sm_major_ < 10 || version_ < 91300 || !fp8_opt_in_) return false;
      for (const TensorView *t : {&q, &k, &v})
        if (!t->scale_inv || t->scaling != ScalingMode::PerTensor) return false;
      io = CUDNN_DATA_FP8_E4M3;
      fp8 = true;
    } else {
      if (!to_cudnn(q.dtype, &io) || k.dtype != q.dtype || v.dtype != q.dtype || o.dtype != q.dtype) return false;
      out = io;
    }
    for (const TensorView *t : {&q, &k, &v, &o}) {
      if (t->device.type != DeviceType::CUDA || !aligned(t->data)) return false;
    }
    if (d.batch <= 0 || d.heads <= 0 || d.kv_heads <= 0 || d.head_dim <= 0 || d.heads % d.kv_heads != 0) return false;
    if (d.tokens_q <= 0 || d.tokens_kv <= 0 || d.max_seq_q <= 0 || d.max_seq_kv <= 0) return false;
    if (d.head_dim % 8 != 0) return false;
    if ((d.cu_seqlens_q == nullptr) != (d.cu_seqlens_kv == nullptr)) return false;
    if (d.max_seq_q > INT32_MAX || d.max_seq_kv > INT32_MAX) return false;
    if (!std::isfinite(d.softmax_scale)) return false;
    s->backward = backward;
    s->io = io;
    s->out = out;
    s->fp8 = fp8;
    s->b = d.batch;
    s->h = d.heads;
    s->hk = d.kv_heads;
    s->d = d.head_dim;
    s->sq = d.max_seq_q;
    s->skv = d.max_seq_kv;
    s->varlen = d.varlen();
    s->mask = static_cast<int>(d.mask);
    s->scale = d.softmax_scale;
    return true;
  }

  SdpaSeqInfo seq_info(const AttentionDims &d) const {
    SdpaSeqInfo i;
    i.cu_q = d.cu_seqlens_q;
    i.cu_kv = d.cu_seqlens_kv;
    i.batch = d.batch;
    i.heads = d.heads;
    i.kv_heads = d.kv_heads;
    i.head_dim = d.head_dim;
    i.tokens_q = d.tokens_q;
    i.tokens_kv = d.tokens_kv;
    i.max_q = d.max_seq_q;
    i.max_kv = d.max_seq_kv;
    i.mask = static_cast<int>(d.mask);
    return i;
  }

  // The cached plan for s (built on first sight), or nullptr when cuDNN cannot run it. A call
  // looks its shape up three times (plan, support, run): the last key of each direction is
  // remembered, so a steady training loop compares 13 integers and finds its plan.
  Plan *plan_for(const Shape &s) {
    std::lock_guard<std::mutex> lock(mu_);
    const Shape::Key key = s.key();
    LastPlan &last = last_[s.backward ? 1 : 0];
    if (!last.plan || last.key != key) {
      auto it = plans_.find(key);
      if (it == plans_.end()) it = plans_.emplace(key, build_or_explain(s)).first;
      last.key = key;
      last.plan = it->second.get();
    }
    return last.plan->ok ? last.plan : nullptr;
  }

  // A plan for s; one that cuDNN refuses is kept too (ok false, with its reason), so that a shape
  // is asked of cuDNN once.
  std::unique_ptr<Plan> build_or_explain(const Shape &s) {
    auto p = std::make_unique<Plan>();
    char what[256] = "";
    if (debug_enabled()) s.describe(what, sizeof what);
    try {
      build(s, p.get());
    } catch (const std::exception &e) {
      p->ok = false;
      p->why = e.what();
      p->keep.clear();
      if (debug_enabled())
        std::fprintf(stderr, "[te cudnn sdpa] %s %s: not supported: %s\n", s.backward ? "bwd" : "fwd", what, e.what());
    }
    if (p->ok && debug_enabled())
      std::fprintf(stderr, "[te cudnn sdpa] %s %s: plan built (cuDNN %zu, workspace %lld, padding %d)\n",
                   s.backward ? "bwd" : "fwd", what, version_, (long long)p->cudnn_ws, p->padding ? 1 : 0);
    return p;
  }

  void build(const Shape &s, Plan *p) {
    DeviceGuard g(device_);
    p->varlen = s.varlen;
    // Per-sequence lengths (padding mask + GEMM overrides): variable lengths; a bottom-right
    // mask with more queries than keys (cuDNN takes that only with lengths); the backward with
    // s_kv not a multiple of 128 on cuDNN <= 9.15 (what cuDNN's frontend does there).
    p->padding = s.varlen || (s.mask == 2 && s.sq > s.skv) || (s.backward && s.skv % 128 != 0 && version_ <= 91500);
    p->scale = s.scale;
    p->sq_const = static_cast<int32_t>(s.sq);
    p->skv_const = static_cast<int32_t>(s.skv);
    GraphBuilder gb(*api_, handle_, p);
    const int64_t B = s.b, H = s.h, Hk = s.hk, D = s.d, Sq = s.sq, Skv = s.skv;
    const cudnnDataType_t io = s.io, F = CUDNN_DATA_FLOAT, I32 = CUDNN_DATA_INT32, BOOL = CUDNN_DATA_BOOLEAN;

    Tn off_q, off_kv, off_st, seq_q, seq_kv;
    if (s.varlen) {
      off_q = gb.tensor(kOffQ, CUDNN_DATA_INT64, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
      off_kv = gb.tensor(kOffKv, CUDNN_DATA_INT64, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
      off_st = gb.tensor(kOffStats, CUDNN_DATA_INT64, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
    }
    if (p->padding) {
      seq_q = gb.tensor(kSeqQ, I32, {B, 1, 1, 1}, {1, 1, 1, 1});
      seq_kv = gb.tensor(kSeqKv, I32, {B, 1, 1, 1}, {1, 1, 1, 1});
    }
    const Tn *mq = p->padding ? &seq_q : nullptr, *mkv = p->padding ? &seq_kv : nullptr;
    const Dims qdim{B, H, Sq, D}, qstr{Sq * H * D, D, H * D, 1};
    const Dims ktdim{B, Hk, D, Skv}, ktstr{Skv * Hk * D, D, 1, Hk * D};
    const Dims vdim{B, Hk, Skv, D}, vstr{Skv * Hk * D, D, Hk * D, 1};
    const Dims sdim{B, H, Sq, Skv}, sstr{H * Sq * Skv, Sq * Skv, Skv, 1};
    const Dims rdim{B, H, Sq, 1}, rstr{H * Sq, Sq, 1, 1};
    const Dims st_str = s.varlen ? Dims{H * Sq, 1, H, 1} : rstr;
    Bd rq = s.varlen ? off_q.d : nullptr, rkv = s.varlen ? off_kv.d : nullptr, rst = s.varlen ? off_st.d : nullptr;

    Tn q = gb.tensor(kQ, io, qdim, qstr, false, false, rq);
    Tn kt = gb.tensor(kK, io, ktdim, ktstr, false, false, rkv);
    Tn scale = gb.scalar(kScale, F);
    // Only tensors that an operation uses may be in the variant pack.
    Tn neg_inf;
    if (p->padding || s.mask != 0) neg_inf = gb.scalar(kNegInf, F);
    Tn sq_c, skv_c;
    if (s.mask == 2 && !p->padding) {
      sq_c = gb.scalar(kSqConst, I32);
      skv_c = gb.scalar(kSkvConst, I32);
    }

    auto padding_mask = [&](Tn x) {
      Tn row = gb.pw(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, I32, I32, 2);
      Tn col = gb.pw(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, I32, I32, 3);
      Tn rm = gb.pw(CUDNN_POINTWISE_CMP_LT, row, &seq_q, BOOL, BOOL);
      Tn cm = gb.pw(CUDNN_POINTWISE_CMP_LT, col, &seq_kv, BOOL, BOOL);
      Tn m = gb.pw(CUDNN_POINTWISE_LOGICAL_AND, rm, &cm, BOOL, BOOL);
      return gb.pw(CUDNN_POINTWISE_BINARY_SELECT, x, &neg_inf, F, F, -1, &m);
    };
    auto causal_mask = [&](Tn x) {
      Tn row = gb.pw(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, I32, F, 2);
      Tn col = gb.pw(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, I32, F, 3);
      if (s.mask == 2) {
        const Tn &kv_len = p->padding ? seq_kv : skv_c;
        const Tn &q_len = p->padding ? seq_q : sq_c;
        row = gb.pw(CUDNN_POINTWISE_ADD, row, &kv_len, I32, I32, 3);
        row = gb.pw(CUDNN_POINTWISE_SUB, row, &q_len, I32, I32, 3);
      }
      Tn keep = gb.pw(CUDNN_POINTWISE_CMP_GE, row, &col, BOOL, BOOL);
      return gb.pw(CUDNN_POINTWISE_BINARY_SELECT, x, &neg_inf, F, F, -1, &keep);
    };

    if (!s.backward) {
      Tn v = gb.tensor(kV, io, vdim, vstr, false, false, rkv);
      Tn o = gb.tensor(kO, s.out, qdim, qstr, false, false, rq);
      Tn stats = gb.tensor(kStats, F, rdim, st_str, false, false, rst);
      Tn sc = gb.virt(F, sdim, sstr);
      gb.matmul(q, kt, sc, mq, mkv, nullptr);
      Tn x = gb.pw(CUDNN_POINTWISE_MUL, sc, &scale);
      const Dims one4{1, 1, 1, 1};
      Tn descale_v, s_scale, s_scale_inv, amax_s, amax_o, scale_o;
      if (s.fp8) {
        Tn descale_q = gb.tensor(kDescaleQ, F, one4, one4);
        Tn descale_k = gb.tensor(kDescaleK, F, one4, one4);
        descale_v = gb.tensor(kDescaleV, F, one4, one4);
        s_scale = gb.tensor(kSScale, F, one4, one4);
        s_scale_inv = gb.tensor(kSScaleInv, F, one4, one4);
        amax_s = gb.tensor(kAmaxS, F, one4, one4);
        amax_o = gb.tensor(kAmaxO, F, one4, one4);
        scale_o = gb.scalar(kOne, F);
        x = gb.pw(CUDNN_POINTWISE_MUL, x, &descale_q);
        x = gb.pw(CUDNN_POINTWISE_MUL, x, &descale_k);
      }
      if (p->padding) x = padding_mask(x);
      if (s.mask != 0) x = causal_mask(x);
      Tn mx = gb.virt(F, rdim, rstr);
      gb.reduction(CUDNN_REDUCE_TENSOR_MAX, x, mx);
      Tn sub = gb.pw(CUDNN_POINTWISE_SUB, x, &mx);
      Tn e = gb.pw(CUDNN_POINTWISE_EXP, sub);
      Tn sum = gb.virt(F, rdim, rstr);
      gb.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
      Tn lg = gb.pw(CUDNN_POINTWISE_LOG, sum);
      gb.pointwise(CUDNN_POINTWISE_ADD, mx, &lg, nullptr, stats);
      if (!s.fp8) {
        Tn pm = gb.virt(io, sdim, sstr);
        gb.pointwise(CUDNN_POINTWISE_DIV, e, &sum, nullptr, pm);
        gb.matmul(pm, v, o, mq, nullptr, mkv);
      } else {
        // P (fp32) -> max P -> P * s_scale as E4M3 -> P8 V8 -> * s_scale_inv * v.scale_inv -> O.
        Tn pf = gb.pw(CUDNN_POINTWISE_DIV, e, &sum);
        gb.reduction(CUDNN_REDUCE_TENSOR_AMAX, pf, amax_s);
        Tn p8 = gb.virt(io, sdim, sstr);
        gb.pointwise(CUDNN_POINTWISE_MUL, pf, &s_scale, nullptr, p8);
        Tn pv = gb.virt(F, qdim, {H * Sq * D, Sq * D, D, 1});
        gb.matmul(p8, v, pv, mq, nullptr, mkv);
        Tn o1 = gb.pw(CUDNN_POINTWISE_MUL, pv, &s_scale_inv);
        Tn o2 = gb.pw(CUDNN_POINTWISE_MUL, o1, &descale_v);
        gb.pointwise(CUDNN_POINTWISE_MUL, o2, &scale_o, nullptr, o);
        gb.reduction(CUDNN_REDUCE_TENSOR_AMAX, o2, amax_o);
      }
    } else {
      Tn vt = gb.tensor(kV, io, ktdim, ktstr, false, false, rkv);
      Tn o = gb.tensor(kO, io, qdim, qstr, false, false, rq);
      Tn d_o = gb.tensor(kDO, io, qdim, qstr, false, false, rq);
      Tn stats = gb.tensor(kStats, F, rdim, st_str, false, false, rst);
      Tn dq = gb.tensor(kDQ, io, qdim, qstr, false, false, rq);
      Tn dk = gb.tensor(kDK, io, vdim, vstr, false, false, rkv);
      Tn dv = gb.tensor(kDV, io, vdim, vstr, false, false, rkv);
      Tn one = gb.scalar(kOne, F);
      // D = rowsum(dO * O), kept in the workspace.
      Tn prod = gb.virt(F, qdim, {H * Sq * D, Sq * D, H * D, 1});
      gb.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, nullptr, prod);
      Tn dsum = gb.virt(F, rdim, rstr);
      gb.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, dsum);
      Tn soft_sum = gb.tensor(kSoftSum, F, rdim, rstr);
      gb.pointwise(CUDNN_POINTWISE_MUL, dsum, &one, nullptr, soft_sum);
      // P = exp(S * scale - LSE), masked.
      Tn sc = gb.virt(F, sdim, sstr);
      gb.matmul(q, kt, sc, mq, mkv, nullptr);
      Tn x = gb.pw(CUDNN_POINTWISE_MUL, sc, &scale);
      if (p->padding) x = padding_mask(x);
      x = gb.pw(CUDNN_POINTWISE_SUB, x, &stats);
      if (s.mask != 0) x = causal_mask(x);
      Tn e = gb.pw(CUDNN_POINTWISE_EXP, x);
      const Dims tdim{B, H, Skv, Sq}, tstr{H * Sq * Skv, Sq * Skv, 1, Skv};
      // dV = P^T dO (summed over the GQA group).
      Tn pt = gb.virt(io, tdim, tstr);
      gb.reshape(e, pt);
      const Dims fdim{B, H, Skv, D}, fstr{H * Skv * D, Skv * D, D, 1};
      if (H == Hk) {
        gb.matmul(pt, d_o, dv, mkv, nullptr, mq);
      } else {
        Tn dvf = gb.virt(io, fdim, fstr);
        gb.matmul(pt, d_o, dvf, mkv, nullptr, mq);
        gb.reduction(CUDNN_REDUCE_TENSOR_ADD, dvf, dv);
      }
      // dS = P (dP - D) scale.
      Tn dp = gb.virt(F, sdim, sstr);
      gb.matmul(d_o, vt, dp, mq, mkv, nullptr);
      Tn t1 = gb.pw(CUDNN_POINTWISE_SUB, dp, &soft_sum);
      Tn t2 = gb.pw(CUDNN_POINTWISE_MUL, t1, &e);
      Tn ds = gb.pw(CUDNN_POINTWISE_MUL, t2, &scale);
      // dK = dS^T Q (summed over the GQA group).
      Tn dst = gb.virt(io, tdim, tstr);
      gb.reshape(ds, dst);
      if (H == Hk) {
        gb.matmul(dst, q, dk, mkv, nullptr, mq);
      } else {
        Tn dkf = gb.virt(io, fdim, fstr);
        gb.matmul(dst, q, dkf, mkv, nullptr, mq);
        gb.reduction(CUDNN_REDUCE_TENSOR_ADD, dkf, dk);
      }
      // dQ = dS K through an fp32 accumulator.
      Tn kr = gb.virt(io, vdim, vstr, rkv);
      gb.reshape(kt, kr);
      Tn acc = gb.tensor(kDQAcc, F, qdim, {H * Sq * D, Sq * D, D, 1});
      gb.matmul(ds, kr, acc, mq, nullptr, mkv);
      gb.pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
    }
    gb.finish();
  }

  void prepare(const Plan &p, const Shape &s, const SdpaSeqInfo &info, char *w, const Layout &l, cudaStream_t stream) {
    if (!p.padding && !s.varlen) return;
    sdpa_prepare_lengths(info, p.padding ? reinterpret_cast<int32_t *>(w + l.seq_q) : nullptr,
                         p.padding ? reinterpret_cast<int32_t *>(w + l.seq_kv) : nullptr,
                         s.varlen ? reinterpret_cast<int64_t *>(w + l.off_q) : nullptr,
                         s.varlen ? reinterpret_cast<int64_t *>(w + l.off_kv) : nullptr,
                         s.varlen ? reinterpret_cast<int64_t *>(w + l.off_stats) : nullptr, stream);
  }

  static void fill_common(Plan &p, char *w, const Layout &l, void **ptrs) {
    ptrs[kScale] = &p.scale;
    ptrs[kNegInf] = &p.neg_inf;
    ptrs[kOne] = &p.one;
    ptrs[kSqConst] = &p.sq_const;
    ptrs[kSkvConst] = &p.skv_const;
    ptrs[kSeqQ] = w + l.seq_q;
    ptrs[kSeqKv] = w + l.seq_kv;
    ptrs[kOffQ] = w + l.off_q;
    ptrs[kOffKv] = w + l.off_kv;
    ptrs[kOffStats] = w + l.off_stats;
  }

  void execute(const Plan &p, void **ptrs, void *workspace) {
    void *data[kNumUids];
    const int64_t n = static_cast<int64_t>(p.uids.size());
    for (int64_t i = 0; i < n; ++i) data[i] = ptrs[p.uids[i]];
    Desc vp(*api_, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, p.uids.data());
    vp.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data);
    vp.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    vp.finalize("cudnnBackendFinalize(variant pack)");
    api_->check(api_->execute(handle_, p.plan, vp.get()), "cudnnBackendExecute", Status::Cuda);
  }

  std::unique_ptr<CudnnApi> api_;
  cudnnHandle_t handle_ = nullptr;
  int device_ = 0;
  int sm_major_ = 0;
  size_t version_ = 0;
  bool fp8_opt_in_ = false;  // TE_CUDNN_SDPA_FP8=1
  std::mutex mu_;
  std::map<Shape::Key, std::unique_ptr<Plan>> plans_;  // never erased: plans stay where they are
  struct LastPlan {
    Shape::Key key{};
    Plan *plan = nullptr;
  };
  LastPlan last_[2];  // forward, backward
};

}  // namespace

std::unique_ptr<CudnnSdpa> CudnnSdpa::create(int device, std::string *why) {
  auto say = [&](const std::string &r) {
    if (why) *why = r;
    if (debug_enabled()) std::fprintf(stderr, "[te cudnn sdpa] unavailable: %s\n", r.c_str());
    return nullptr;
  };
  std::unique_ptr<CudnnApi> api;
  try {
    api = std::make_unique<CudnnApi>();
  } catch (const std::exception &e) {
    return say(e.what());
  }
  const size_t version = api->get_version();
  if (version < 90000) return say("cuDNN " + std::to_string(version) + " is older than 9.0");
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return say("cudaGetDeviceProperties failed");
  if (prop.major < 8) return say("cuDNN's fused attention needs sm_80 or newer");
  cudnnHandle_t handle = nullptr;
  try {
    DeviceGuard g(device);
    api->check(api->create(&handle), "cudnnCreate");
  } catch (const std::exception &e) {
    return say(e.what());
  }
  if (debug_enabled()) std::fprintf(stderr, "[te cudnn sdpa] cuDNN %zu loaded, device %d\n", version, device);
  return std::make_unique<CudnnSdpaImpl>(std::move(api), handle, device, prop.major);
}

}  // namespace te::cuda
