// te_adamw_step: every entry of the parameter list validated (and every owner handle resolved)
// before anything runs, then the core (training/adamw.cpp).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

#include "capi_common.h"
#include "modules/common/validate.h"
#include "modules/layernorm_linear/layernorm_linear.h"
#include "modules/layernorm_mlp/layernorm_mlp.h"
#include "training/adamw.h"

using namespace te;
using namespace te::capi;

namespace {

// Far beyond any model's parameter count, small enough that the host-side list stays cheap.
constexpr size_t kMaxParams = size_t(1) << 20;

void check_float_dtype(const TensorView &t, const ArgName &name, const Device &dev) {
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    fail(Status::InvalidArgument, "argument '%s': expected F32, F16 or BF16, got %s",
         name.c_str(), dtype_name(t.dtype));
  check_device(t, name, dev);
}

void check_numel(const TensorView &t, const ArgName &name, int64_t numel) {
  if (t.numel() != numel)
    fail(Status::InvalidArgument, "argument '%s': expected %lld elements (those of the param), got %lld", name.c_str(),
         (long long)numel, (long long)t.numel());
}

// The memory of one tensor of the list, for the overlap check.
struct Span {
  uintptr_t begin, end;
  size_t index;
  const char *field;
  bool written;
};

// Nothing the step writes may overlap anything else it reads or writes (a gradient read by two
// params is fine). Sorted sweep: each span against the farthest-reaching earlier one (of all,
// and of the written ones).
void check_no_overlap(std::vector<Span> &spans) {
  std::sort(spans.begin(), spans.end(), [](const Span &a, const Span &b) { return a.begin < b.begin; });
  const Span *far_any = nullptr, *far_written = nullptr;
  for (const Span &s : spans) {
    const Span *hit = nullptr;
    if (s.written && far_any && far_any->end > s.begin) hit = far_any;
    else if (far_written && far_written->end > s.begin) hit = far_written;
    if (hit) {
      const bool opts_s = s.field[0] == '*', opts_h = hit->field[0] == '*';
      char a[64], b[64];
      if (opts_s) std::snprintf(a, sizeof a, "opts->grad_norm");
      else std::snprintf(a, sizeof a, "params[%zu].%s", s.index, s.field);
      if (opts_h) std::snprintf(b, sizeof b, "opts->grad_norm");
      else std::snprintf(b, sizeof b, "params[%zu].%s", hit->index, hit->field);
      fail(Status::InvalidArgument,
           "argument '%s': its memory overlaps that of '%s' (each tensor the step writes must be given once and "
           "overlap nothing else)", a, b);
    }
    if (!far_any || s.end > far_any->end) far_any = &s;
    if (s.written && (!far_written || s.end > far_written->end)) far_written = &s;
  }
}

// The projection state a param's owner names, after checking its kind, handle, context and
// weight shape.
ProjectionState *resolve_owner(Context &ctx, const te_adamw_param &p, size_t i, const TensorView &param,
                               std::vector<const void *> &seen) {
  const int kind = enum_int(p.owner_kind);
  if (kind < TE_MODULE_NONE || kind > TE_MODULE_LAYERNORM_MLP)
    fail(Status::InvalidArgument, "argument '%s': expected a te_module_kind value, got %d",
         ArgName::field_of("params", i, "owner_kind").c_str(), kind);
  if (kind == TE_MODULE_NONE) {
    if (p.owner)
      fail(Status::InvalidArgument, "argument '%s': expected NULL with owner_kind TE_MODULE_NONE, got a pointer",
           ArgName::field_of("params", i, "owner").c_str());
    return nullptr;
  }
  if (!p.owner) return nullptr;  // te.h: "the module handle of owner_kind, or NULL"
  const ArgName owner_name = ArgName::field_of("params", i, "owner");
  ProjectionState *st = nullptr;
  Context *owner_ctx = nullptr;
  int64_t rows = 0, cols = 0;
  int gemm = 0;
  switch (kind) {
    case TE_MODULE_LINEAR: {
      auto &core = *from_handle<Linear>(p.owner, HandleKind::Linear, owner_name)->core();
      st = &core.proj;
      owner_ctx = &core.ctx;
      rows = core.opts.out_features;
      cols = core.opts.in_features;
      break;
    }
    case TE_MODULE_LAYERNORM_LINEAR: {
      auto &core = *from_handle<LayerNormLinear>(p.owner, HandleKind::LayerNormLinear, owner_name)->core();
      st = &core.proj;
      owner_ctx = &core.ctx;
      rows = core.opts.out_features;
      cols = core.opts.in_features;
      break;
    }
    case TE_MODULE_LAYERNORM_MLP: {
      auto &core = *from_handle<LayerNormMlp>(p.owner, HandleKind::LayerNormMlp, owner_name)->core();
      gemm = p.owner_gemm;
      if (gemm != TE_MLP_FC1 && gemm != TE_MLP_FC2)
        fail(Status::InvalidArgument, "argument '%s': expected TE_MLP_FC1 or TE_MLP_FC2, got %d",
             ArgName::field_of("params", i, "owner_gemm").c_str(), gemm);
      st = gemm == TE_MLP_FC1 ? &core.fc1 : &core.fc2;
      owner_ctx = &core.ctx;
      rows = gemm == TE_MLP_FC1 ? core.opts.fc1_out() : core.opts.hidden;
      cols = gemm == TE_MLP_FC1 ? core.opts.hidden : core.opts.ffn;
      break;
    }
  }
  if (owner_ctx != &ctx)
    fail(Status::InvalidArgument, "argument '%s': the module belongs to another context than 'ctx'",
         owner_name.c_str());
  if (param.ndim != 2 || param.shape[0] != rows || param.shape[1] != cols)
    fail(Status::InvalidArgument,
         "argument '%s': the owner's weight is [%lld, %lld], expected the param to have that shape, got %d dims "
         "[%lld, ...]", ArgName::field_of("params", i, "param").c_str(), (long long)rows, (long long)cols, param.ndim,
         (long long)param.shape[0]);
  if (std::find(seen.begin(), seen.end(), static_cast<const void *>(st)) != seen.end())
    fail(Status::InvalidArgument, "argument '%s': this module weight is already the owner of an earlier param",
         owner_name.c_str());
  seen.push_back(st);
  return st;
}

void check_adamw_options(const te_adamw_options *o) {
  capi::check_options(o, "opts");
  if (!(o->lr >= 0.0f) || !std::isfinite(o->lr))
    fail(Status::InvalidArgument, "argument 'opts->lr': expected a finite value >= 0, got %g", (double)o->lr);
  if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f))
    fail(Status::InvalidArgument, "argument 'opts->beta1': expected a value in [0, 1), got %g", (double)o->beta1);
  if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f))
    fail(Status::InvalidArgument, "argument 'opts->beta2': expected a value in [0, 1), got %g", (double)o->beta2);
  if (!(o->eps > 0.0f) || !std::isfinite(o->eps))
    fail(Status::InvalidArgument, "argument 'opts->eps': expected a finite value > 0, got %g", (double)o->eps);
  if (!(o->weight_decay >= 0.0f) || !std::isfinite(o->weight_decay))
    fail(Status::InvalidArgument, "argument 'opts->weight_decay': expected a finite value >= 0, got %g",
         (double)o->weight_decay);
  if (o->step < 1)
    fail(Status::InvalidArgument, "argument 'opts->step': expected >= 1 (the 1-based update number), got %lld",
         (long long)o->step);
  if (!(o->max_grad_norm >= 0.0f) || !std::isfinite(o->max_grad_norm))
    fail(Status::InvalidArgument, "argument 'opts->max_grad_norm': expected a finite value >= 0 (0: no clipping), got %g",
         (double)o->max_grad_norm);
}

}  // namespace

extern "C" {

TE_API te_status te_adamw_param_init(te_adamw_param *param) {
  return guarded(__func__, [&] {
    check_not_null(param, "param");
    *param = te_adamw_param{};
    param->struct_size = sizeof *param;
    param->weight_decay = 1;
    param->owner_kind = TE_MODULE_NONE;
  });
}

TE_API te_status te_adamw_options_init(te_adamw_options *opts) {
  return guarded(__func__, [&] {
    check_not_null(opts, "opts");
    *opts = te_adamw_options{};
    opts->struct_size = sizeof *opts;
    opts->lr = 1e-3f;
    opts->beta1 = 0.9f;
    opts->beta2 = 0.999f;
    opts->eps = 1e-8f;
    opts->weight_decay = 0.01f;
    opts->step = 1;
    opts->max_grad_norm = 0.0f;
    opts->grad_norm = nullptr;
  });
}

TE_API te_status te_adamw_step(te_context *ctx, const te_adamw_options *opts, const te_adamw_param *params,
                               size_t count) {
  return guarded(__func__, [&] {
    Context *c = to_context(ctx);
    check_adamw_options(opts);
    if (count == 0) return;
    if (count > kMaxParams)
      fail(Status::InvalidArgument, "argument 'count': expected at most %zu parameters, got %zu", kMaxParams, count);
    check_not_null(params, "params");
    // Entries are laid out with the stride of params[0].struct_size, which every entry repeats.
    const size_t stride = params[0].struct_size;
    check_struct(params, stride, sizeof(te_adamw_param), "params[0].struct_size");
    if (stride % alignof(te_adamw_param) != 0)
      fail(Status::InvalidArgument, "argument 'params[0].struct_size': expected a multiple of %zu (the entries' stride), got %zu",
           alignof(te_adamw_param), stride);
    const Device &dev = c->device();
    std::vector<AdamwParam> list(count);
    std::vector<Span> spans;
    spans.reserve(count * 5 + 1);
    std::vector<const void *> owners;
    for (size_t i = 0; i < count; ++i) {
      const auto &p = *reinterpret_cast<const te_adamw_param *>(reinterpret_cast<const char *>(params) + i * stride);
      if (p.struct_size != stride)
        fail(Status::InvalidArgument, "argument '%s': expected %zu (params[0].struct_size: every entry the same), got %zu",
             ArgName::field_of("params", i, "struct_size").c_str(), stride, p.struct_size);
      AdamwParam &a = list[i];
      a.param = to_view(p.param, ArgName::field_of("params", i, "param"));
      check_tensor(a.param, ArgName::field_of("params", i, "param"), DType::F32, dev);
      const int64_t n = a.param.numel();
      a.grad = to_view(p.grad, ArgName::field_of("params", i, "grad"));
      check_float_dtype(a.grad, ArgName::field_of("params", i, "grad"), dev);
      check_numel(a.grad, ArgName::field_of("params", i, "grad"), n);
      a.exp_avg = to_view(p.exp_avg, ArgName::field_of("params", i, "exp_avg"));
      check_tensor(a.exp_avg, ArgName::field_of("params", i, "exp_avg"), DType::F32, dev);
      check_numel(a.exp_avg, ArgName::field_of("params", i, "exp_avg"), n);
      a.exp_avg_sq = to_view(p.exp_avg_sq, ArgName::field_of("params", i, "exp_avg_sq"));
      check_tensor(a.exp_avg_sq, ArgName::field_of("params", i, "exp_avg_sq"), DType::F32, dev);
      check_numel(a.exp_avg_sq, ArgName::field_of("params", i, "exp_avg_sq"), n);
      a.model_weight = to_optional_view(p.model_weight, ArgName::field_of("params", i, "model_weight"));
      if (a.model_weight.data) {
        check_float_dtype(a.model_weight, ArgName::field_of("params", i, "model_weight"), dev);
        check_numel(a.model_weight, ArgName::field_of("params", i, "model_weight"), n);
      }
      check_bool(p.weight_decay, ArgName::field_of("params", i, "weight_decay"));
      a.decay = p.weight_decay != 0;
      a.owner = resolve_owner(*c, p, i, a.param, owners);
      if (a.owner) {
        a.rows = a.param.shape[0];
        a.cols = a.param.shape[1];
      }
      auto span = [&](const TensorView &t, const char *field, bool written) {
        const auto b = reinterpret_cast<uintptr_t>(t.data);
        spans.push_back(Span{b, b + static_cast<uintptr_t>(t.numel()) * dtype_size(t.dtype), i, field, written});
      };
      span(a.param, "param", true);
      span(a.grad, "grad", false);
      span(a.exp_avg, "exp_avg", true);
      span(a.exp_avg_sq, "exp_avg_sq", true);
      if (a.model_weight.data) span(a.model_weight, "model_weight", true);
    }
    if (opts->grad_norm) {
      const auto b = reinterpret_cast<uintptr_t>(opts->grad_norm);
      spans.push_back(Span{b, b + sizeof(float), 0, "*grad_norm", true});
    }
    check_no_overlap(spans);
    AdamwHyper h;
    h.lr = opts->lr;
    h.beta1 = opts->beta1;
    h.beta2 = opts->beta2;
    h.eps = opts->eps;
    h.weight_decay = opts->weight_decay;
    h.step = opts->step;
    h.max_grad_norm = opts->max_grad_norm;
    h.grad_norm = opts->grad_norm;
    adamw_step(*c, h, list.data(), count);
  });
}

}  // extern "C"
