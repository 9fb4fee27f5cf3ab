// te_rope_forward / te_rope_backward: argument checks, then one backend call.
#include "modules/attention/attention.h"
#include "modules/common/validate.h"

namespace te {

void rope_run(Context &ctx, const RopeCall &c) {
  const Device &dev = ctx.device();
  const TensorView &x = c.x;
  if (!is_high_precision(x.dtype))
    fail(Status::InvalidArgument, "argument '%s': expected F32, F16 or BF16, got %s", c.x_name, dtype_name(x.dtype));
  check_tensor(x, c.x_name, x.dtype, dev);
  check_tensor(c.y, c.y_name, x.dtype, dev);
  const bool thd = c.cu_seqlens.data != nullptr;
  const int nd = thd ? 3 : 4;
  if (x.ndim != nd)
    fail(Status::InvalidArgument, "argument '%s': expected %d dimensions (%s), got %d", c.x_name, nd,
         thd ? "[tokens, heads, head_dim] with cu_seqlens" : "[batch, seq, heads, head_dim] without cu_seqlens", x.ndim);
  bool same = c.y.ndim == x.ndim;
  for (int i = 0; same && i < x.ndim; ++i) same = c.y.shape[i] == x.shape[i];
  if (!same) fail(Status::InvalidArgument, "argument '%s': expected the shape of '%s'", c.y_name, c.x_name);
  RopeArgs a;
  a.x = x;
  a.y = c.y;
  a.head_dim = x.shape[nd - 1];
  a.heads = x.shape[nd - 2];
  a.tokens = x.rows() / a.heads;
  a.rot_dim = c.rot_dim ? c.rot_dim : a.head_dim;
  if (a.rot_dim < 2 || a.rot_dim % 2 || a.rot_dim > a.head_dim)
    fail(Status::InvalidArgument, "argument 'opts->rot_dim': expected an even value in 2..head_dim=%lld (0: head_dim), got %lld",
         (long long)a.head_dim, (long long)c.rot_dim);
  a.interleaved = c.interleaved;
  a.inverse = c.inverse;
  check_tensor(c.freqs, "freqs", DType::F32, dev);
  if (c.freqs.ndim != 2 || c.freqs.shape[1] != a.rot_dim / 2)
    fail(Status::InvalidArgument, "argument 'freqs': expected [positions, rot_dim / 2 = %lld], got %d dims, last %lld",
         (long long)(a.rot_dim / 2), c.freqs.ndim, (long long)c.freqs.cols());
  a.freqs = c.freqs;
  const int64_t positions = c.freqs.shape[0];
  if (!thd) {
    a.seq_len = x.shape[1];
    if (a.seq_len > positions)
      fail(Status::InvalidArgument, "argument 'freqs': %lld positions, fewer than the sequence length %lld",
           (long long)positions, (long long)a.seq_len);
  } else {
    const TensorView &cu = c.cu_seqlens;
    check_tensor(cu, "cu_seqlens", DType::I32, dev);
    if (cu.ndim != 1 || cu.shape[0] < 2)
      fail(Status::InvalidArgument, "argument 'cu_seqlens': expected 1 dimension [batch + 1] with batch >= 1, got %d dims",
           cu.ndim);
    a.batch = cu.shape[0] - 1;
    a.cu_seqlens = static_cast<const int32_t *>(cu.data);
    if (dev.type == DeviceType::CPU) {
      const int32_t *o = a.cu_seqlens;
      if (o[0] != 0) fail(Status::InvalidArgument, "argument 'cu_seqlens': expected offsets starting at 0, got %d", o[0]);
      for (int64_t b = 0; b < a.batch; ++b) {
        if (o[b + 1] < o[b])
          fail(Status::InvalidArgument, "argument 'cu_seqlens': offsets must not decrease, got [%lld] = %d > [%lld] = %d",
               (long long)b, o[b], (long long)(b + 1), o[b + 1]);
        if (o[b + 1] - o[b] > positions)
          fail(Status::InvalidArgument, "argument 'freqs': %lld positions, fewer than sequence %lld's length %d",
               (long long)positions, (long long)b, o[b + 1] - o[b]);
      }
      if (o[a.batch] != a.tokens)
        fail(Status::InvalidArgument, "argument 'cu_seqlens': the last offset must be the token count %lld, got %d",
             (long long)a.tokens, o[a.batch]);
    }
  }
  ctx.backend().rope(a);
}

}  // namespace te
