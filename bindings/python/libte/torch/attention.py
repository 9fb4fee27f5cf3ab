"""libte.torch.DotProductAttention and apply_rotary_pos_emb: custom ops libte::attention_fwd /
libte::attention_bwd over te_attention_residuals_size / forward_compute_into / backward_from
(the residual block - the LSE, and under FP8 the E4M3 Q, K, V - is a torch uint8 tensor that
autograd saves), and libte::rope_fwd / libte::rope_bwd over te_rope_forward / te_rope_backward.
All four have fake impls, so torch.compile(fullgraph=True) traces them with no graph break."""

from typing import Optional, Tuple

import torch

from .. import _constants as C
from .._lowlevel import ll
from ..attention import Attention as _CAttention, mask_code
from ..errors import InvalidArgument, InvalidState
from . import _runtime as rt
from ._base import KIND_ATTENTION, TEModule


def _released(e):
    return InvalidState(
        "libte.torch: backward through a graph whose attention residuals an earlier backward "
        "released (for loss.backward(retain_graph=True) run the forward inside "
        "libte.torch.retain_residuals()); library: %s" % e)

Tensor = torch.Tensor
_U8 = torch.uint8
_I32 = C.DTYPE_I32

_FORMATS = ("bshd", "sbhd", "thd")


def _offsets_desc(t, device):
    return rt.desc(t, _I32) if t is not None else None


_FAKE_OFFSETS = {}  # (batch, tokens, max_seqlen) -> host int32 offsets, kept alive


def _offsets_shape(t, tokens, max_seqlen, device):
    """The offsets for te_attention_residuals_size in a fake impl (no data there): on a CPU
    context the library reads and validates them even for a size query, and the size does not
    depend on their values, so valid stand-ins of the same shape do: sequence i holds
    min(max_seqlen, what is left) tokens."""
    if t is None:
        return None
    import numpy as np
    batch = int(t.shape[0]) - 1
    key = (batch, int(tokens), int(max_seqlen))
    a = _FAKE_OFFSETS.get(key)
    if a is None:
        if len(_FAKE_OFFSETS) > 256:
            _FAKE_OFFSETS.clear()
        a = _FAKE_OFFSETS[key] = np.minimum(np.arange(batch + 1, dtype=np.int64) * max(
            key[2], 1), key[1]).astype(np.int32)
    dt, di = rt.device_key(device)
    return (a.ctypes.data, _I32, (batch + 1,), dt, di, 0, C.SCALING_PER_TENSOR)


def _layer(layer, q, k, v, cu_q, cu_kv):
    m = rt.module_of(layer)
    m._check_qkv(q, k, v, cu_q, cu_kv)
    return m


# ---- attention -----------------------------------------------------------------------------------

@torch.library.custom_op("libte::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                  cu_seqlens_kv: Optional[Tensor], max_seqlen_q: int, max_seqlen_kv: int,
                  layer: int, mode: int, retain: bool) -> Tuple[Tensor, Tensor]:
    """o = softmax(scale q k^T + mask) v under the autocast mode `mode`; returns (o [like q],
    residual bytes)."""
    m = _layer(layer, q, k, v, cu_seqlens_q, cu_seqlens_kv)
    cw, h = m._native(q)
    rt.sync_scopes(cw, mode)
    cw.follow_stream(q.device)
    code = rt.DTYPES[q.dtype]
    d = (rt.desc(q, code), rt.desc(k, code), rt.desc(v, code),
         _offsets_desc(cu_seqlens_q, q.device), _offsets_desc(cu_seqlens_kv, q.device),
         max_seqlen_q, max_seqlen_kv)
    n = ll.attention_residuals_size(cw.h, h, *d)
    res = torch.empty(n, dtype=_U8, device=q.device)
    o = torch.empty_like(q)
    ll.attention_forward_compute_into(cw.h, h, *d, rt.desc(o, code), res.data_ptr() if n else 0,
                                      n)
    return o, res


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, layer,
                        mode, retain):
    m = _layer(layer, q, k, v, cu_seqlens_q, cu_seqlens_kv)
    cw, h = m._native(q)
    rt.sync_scopes(cw, mode)
    code = rt.DTYPES[q.dtype]
    dev = q.device
    n = ll.attention_residuals_size(
        cw.h, h, rt.shape_desc(q.shape, code, dev), rt.shape_desc(k.shape, code, dev),
        rt.shape_desc(v.shape, code, dev),
        _offsets_shape(cu_seqlens_q, q.shape[0], max_seqlen_q, dev),
        _offsets_shape(cu_seqlens_kv, k.shape[0], max_seqlen_kv, dev), max_seqlen_q,
        max_seqlen_kv)
    return q.new_empty(q.shape), q.new_empty((n,), dtype=_U8)


@torch.library.custom_op("libte::attention_bwd", mutates_args=())
def attention_bwd(d_o: Tensor, residuals: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor,
                  cu_seqlens_q: Optional[Tensor], cu_seqlens_kv: Optional[Tensor],
                  max_seqlen_q: int, max_seqlen_kv: int, layer: int, need_dq: bool,
                  need_dk: bool, need_dv: bool, once: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of attention_fwd; an output not needed is an empty tensor."""
    m = rt.module_of(layer)
    cw, h = m._layer_for_backward()
    cw.follow_stream(d_o.device)
    code = rt.DTYPES[d_o.dtype]
    dev, dt = d_o.device, d_o.dtype
    grads = [torch.empty(t.shape, dtype=dt, device=dev) if need
             else torch.empty(0, dtype=dt, device=dev)
             for t, need in ((q, need_dq), (k, need_dk), (v, need_dv))]
    n = residuals.numel()
    try:
        ll.attention_backward_from(
            cw.h, h, rt.desc(q, code), rt.desc(k, code), rt.desc(v, code),
            _offsets_desc(cu_seqlens_q, dev), _offsets_desc(cu_seqlens_kv, dev), max_seqlen_q,
            max_seqlen_kv, rt.desc(o, code), residuals.data_ptr() if n else 0, n,
            rt.desc(d_o, code),
            *(rt.desc(g, code) if need else None
              for g, need in zip(grads, (need_dq, need_dk, need_dv))), once)
    except InvalidArgument as e:
        if "record" in str(e):
            raise _released(e) from e
        raise
    return grads[0], grads[1], grads[2]


@attention_bwd.register_fake
def _attention_bwd_fake(d_o, residuals, q, k, v, o, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                        max_seqlen_kv, layer, need_dq, need_dk, need_dv, once):
    return tuple(d_o.new_empty(t.shape) if need else d_o.new_empty((0,))
                 for t, need in ((q, need_dq), (k, need_dk), (v, need_dv)))


def _attention_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_kv, max_q, max_kv, layer, mode, retain = inputs
    o, res = output
    ctx.mark_non_differentiable(res)
    ctx.layer = layer
    ctx.once = not retain
    ctx.max_seqlens = (max_q, max_kv)
    ctx.has_cu = (cu_q is not None, cu_kv is not None)
    saved = [res, q, k, v, o]
    saved += [t for t in (cu_q, cu_kv) if t is not None]
    ctx.save_for_backward(*saved)


def _attention_backward(ctx, d_o, _dres):
    saved = list(ctx.saved_tensors)
    res, q, k, v, o = saved[:5]
    rest = saved[5:]
    cu_q = rest.pop(0) if ctx.has_cu[0] else None
    cu_kv = rest.pop(0) if ctx.has_cu[1] else None
    need_dq, need_dk, need_dv = ctx.needs_input_grad[:3]
    dq, dk, dv = attention_bwd(d_o.contiguous(), res, q, k, v, o, cu_q, cu_kv,
                               ctx.max_seqlens[0], ctx.max_seqlens[1], ctx.layer, need_dq,
                               need_dk, need_dv, ctx.once)
    return (dq if need_dq else None, dk if need_dk else None, dv if need_dv else None,
            None, None, None, None, None, None, None)


attention_fwd.register_autograd(_attention_backward, setup_context=_attention_setup_context)


def _max_seqlen(value, cu, name):
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument("libte.torch.DotProductAttention: argument '%s': expected a "
                                  "positive int, got %r" % (name, value))
        return value
    # Reads the offsets back (a device synchronisation, and a graph break under torch.compile):
    # pass max_seqlen_q / max_seqlen_kv to avoid it, as with TE.
    return max(int((cu[1:] - cu[:-1]).max().item()), 1) if cu.numel() > 1 else 1


class DotProductAttention(TEModule):
    """Scaled dot-product attention (TE's transformer_engine.pytorch.DotProductAttention):
    softmax(softmax_scale q k^T + mask) v for every query head, with GQA/MQA.

    num_attention_heads   query heads
    kv_channels           head_dim (a multiple of 8, at most 256)
    num_gqa_groups        key/value heads (default num_attention_heads)
    attention_dropout     must be 0.0 (libte has no dropout)
    qkv_format            'sbhd' (TE's default: [s, b, h, d], transposed to and from bshd by
                          copies), 'bshd' ([b, s, h, d], zero copy) or 'thd' ([tokens, h, d]
                          with int32 cu_seqlens_q / cu_seqlens_kv [batch + 1])
    attn_mask_type        'causal' (TE's default; top-left), 'no_mask' or
                          'causal_bottom_right'
    softmax_scale         default 1 / sqrt(kv_channels)
    fp8_dpa               FP8 attention inside libte.torch.autocast (delayed or current scaling):
                          TE's recipe.fp8_dpa=True, here a module option; O and the gradients
                          stay in the input dtype (TE's fp8_mha=False)

    forward(query_layer, key_layer, value_layer, ...) returns the output with the heads
    flattened, as TE: [b, s, h*d] (bshd), [s, b, h*d] (sbhd), [tokens, h*d] (thd). The dtype
    follows the inputs (float32, float16 or bfloat16). The FP8 scaling states are in the
    module's state_dict (extra state), as for the other libte.torch modules.
    """

    _KIND = KIND_ATTENTION
    _NAME = "DotProductAttention"

    def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None,
                 attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal",
                 softmax_scale=None, fp8_dpa=False, layer_number=None, attention_type="self"):
        super().__init__()
        for name, val in (("num_attention_heads", num_attention_heads),
                          ("kv_channels", kv_channels)) + (
                              (("num_gqa_groups", num_gqa_groups),)
                              if num_gqa_groups is not None else ()):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise InvalidArgument("libte.torch.DotProductAttention: argument '%s': expected "
                                      "a positive int, got %r" % (name, val))
        if attention_dropout:
            raise InvalidArgument("libte.torch.DotProductAttention: attention_dropout is not "
                                  "supported (libte's attention has no dropout): pass 0.0")
        if qkv_format not in _FORMATS:
            raise InvalidArgument("libte.torch.DotProductAttention: argument 'qkv_format': "
                                  "expected 'sbhd', 'bshd' or 'thd', got %r" % (qkv_format,))
        self.num_attention_heads = num_attention_heads
        self.kv_channels = kv_channels
        self.num_gqa_groups = num_gqa_groups if num_gqa_groups is not None \
            else num_attention_heads
        self.qkv_format = qkv_format
        self._mask = mask_code(attn_mask_type)
        self.attn_mask_type = C.ATTN_MASK_NAMES[self._mask]
        self.softmax_scale = softmax_scale
        self.fp8_dpa = bool(fp8_dpa)
        self.layer_number = layer_number
        self.attention_type = attention_type

    def _create(self, ctx, dtype_name):
        return _CAttention(ctx, self.num_attention_heads, self.kv_channels,
                           num_kv_heads=self.num_gqa_groups, softmax_scale=self.softmax_scale,
                           mask=self._mask, dtype=dtype_name, fp8=self.fp8_dpa)

    def _check_qkv(self, q, k, v, cu_q, cu_kv):
        name = "libte.torch.DotProductAttention"
        if q.dtype not in rt.DTYPES:
            raise InvalidArgument("%s: argument 'query_layer': expected dtype float32, float16 "
                                  "or bfloat16, got %s" % (name, q.dtype))
        for arg, t in (("key_layer", k), ("value_layer", v)):
            if t.dtype != q.dtype:
                raise InvalidArgument("%s: argument '%s': expected the query's dtype %s, got %s"
                                      % (name, arg, q.dtype, t.dtype))
            if t.device != q.device:
                raise InvalidArgument("%s: argument '%s': expected the query's device %s, got %s"
                                      % (name, arg, q.device, t.device))
        rank = 3 if cu_q is not None else 4
        for arg, t, heads in (("query_layer", q, self.num_attention_heads),
                              ("key_layer", k, self.num_gqa_groups),
                              ("value_layer", v, self.num_gqa_groups)):
            if t.dim() != rank or t.shape[-2] != heads or t.shape[-1] != self.kv_channels:
                raise InvalidArgument(
                    "%s: argument '%s': expected shape %s, got %s"
                    % (name, arg, ("[tokens, %d, %d]" if rank == 3 else "[b, s, %d, %d]")
                       % (heads, self.kv_channels), list(t.shape)))
        for arg, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_kv", cu_kv)):
            if t is not None and (t.dtype != torch.int32 or t.dim() != 1
                                  or t.device != q.device):
                raise InvalidArgument("%s: argument '%s': expected an int32 [batch + 1] tensor "
                                      "on %s, got %s %s on %s"
                                      % (name, arg, q.device, t.dtype, list(t.shape), t.device))

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
                cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                attn_mask_type=None):
        name = "libte.torch.DotProductAttention"
        if attention_mask is not None:
            raise InvalidArgument("%s: attention_mask tensors are not supported (use "
                                  "attn_mask_type, or thd with cu_seqlens for padding)" % name)
        if attn_mask_type is not None and mask_code(attn_mask_type) != self._mask:
            raise InvalidArgument("%s: attn_mask_type %r differs from the module's %r (the mask "
                                  "is a layer option here)" % (name, attn_mask_type,
                                                               self.attn_mask_type))
        fmt = self.qkv_format if qkv_format is None else qkv_format
        if fmt not in _FORMATS:
            raise InvalidArgument("%s: argument 'qkv_format': expected 'sbhd', 'bshd' or 'thd', "
                                  "got %r" % (name, fmt))
        q, k, v = query_layer, key_layer, value_layer
        if fmt == "thd":
            if cu_seqlens_q is None:
                raise InvalidArgument("%s: qkv_format 'thd' needs cu_seqlens_q (and "
                                      "cu_seqlens_kv)" % name)
            if cu_seqlens_kv is None:
                cu_seqlens_kv = cu_seqlens_q
            if cu_seqlens_q.dtype != torch.int32:
                cu_seqlens_q = cu_seqlens_q.to(torch.int32)
            if cu_seqlens_kv.dtype != torch.int32:
                cu_seqlens_kv = cu_seqlens_kv.to(torch.int32)
            cu_seqlens_q = cu_seqlens_q.contiguous()
            cu_seqlens_kv = cu_seqlens_kv.contiguous()
            # A bound on every length: TE callers often pass a configured maximum above the
            # packed batch's token count, which libte refuses; the token count bounds them too.
            max_q = min(_max_seqlen(max_seqlen_q, cu_seqlens_q, "max_seqlen_q"), q.shape[0])
            max_kv = min(_max_seqlen(max_seqlen_kv, cu_seqlens_kv, "max_seqlen_kv"), k.shape[0])
        else:
            if cu_seqlens_q is not None or cu_seqlens_kv is not None:
                raise InvalidArgument("%s: cu_seqlens_q / cu_seqlens_kv need qkv_format 'thd'"
                                      % name)
            cu_seqlens_q = cu_seqlens_kv = None
            max_q = max_kv = 0
            if fmt == "sbhd":
                q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q = q if q.is_contiguous() else q.contiguous()
        k = k if k.is_contiguous() else k.contiguous()
        v = v if v.is_contiguous() else v.contiguous()
        t = rt.TLS
        o, _ = attention_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_q, max_kv, self._te_key,
                             t.mode, t.retain)
        if fmt == "sbhd":
            o = o.transpose(0, 1)
        return o.reshape(o.shape[:-2] + (o.shape[-2] * o.shape[-1],))

    def extra_repr(self):
        return ("num_attention_heads=%d, kv_channels=%d, num_gqa_groups=%d, qkv_format=%s, "
                "attn_mask_type=%s, fp8_dpa=%s" % (
                    self.num_attention_heads, self.kv_channels, self.num_gqa_groups,
                    self.qkv_format, self.attn_mask_type, self.fp8_dpa))


# ---- RoPE --------------------------------------------------------------------------------------

def _rope_call(x, freqs, cu_seqlens, rot_dim, interleaved, backward):
    cw = rt.context_for(x.device)
    cw.follow_stream(x.device)
    code = rt.DTYPES.get(x.dtype)
    if code is None:
        raise InvalidArgument("libte.torch.apply_rotary_pos_emb: argument 't': expected dtype "
                              "float32, float16 or bfloat16, got %s" % x.dtype)
    y = torch.empty_like(x)
    f = ll.rope_backward if backward else ll.rope_forward
    f(cw.h, rot_dim, interleaved, rt.desc(x, code), rt.desc(freqs, C.DTYPE_F32),
      _offsets_desc(cu_seqlens, x.device), rt.desc(y, code))
    return y


@torch.library.custom_op("libte::rope_fwd", mutates_args=())
def rope_fwd(t: Tensor, freqs: Tensor, cu_seqlens: Optional[Tensor], rot_dim: int,
             interleaved: bool) -> Tensor:
    """te_rope_forward: t [b, s, h, d] (or [tokens, h, d] with cu_seqlens) rotated by freqs
    (float32 [positions, rot_dim / 2])."""
    return _rope_call(t, freqs, cu_seqlens, rot_dim, interleaved, False)


@rope_fwd.register_fake
def _rope_fwd_fake(t, freqs, cu_seqlens, rot_dim, interleaved):
    return t.new_empty(t.shape)


@torch.library.custom_op("libte::rope_bwd", mutates_args=())
def rope_bwd(dy: Tensor, freqs: Tensor, cu_seqlens: Optional[Tensor], rot_dim: int,
             interleaved: bool) -> Tensor:
    """te_rope_backward: the inverse rotation of dy."""
    return _rope_call(dy, freqs, cu_seqlens, rot_dim, interleaved, True)


@rope_bwd.register_fake
def _rope_bwd_fake(dy, freqs, cu_seqlens, rot_dim, interleaved):
    return dy.new_empty(dy.shape)


def _rope_setup_context(ctx, inputs, output):
    t, freqs, cu_seqlens, rot_dim, interleaved = inputs
    ctx.rot_dim = rot_dim
    ctx.interleaved = interleaved
    ctx.has_cu = cu_seqlens is not None
    ctx.save_for_backward(freqs, *((cu_seqlens,) if cu_seqlens is not None else ()))


def _rope_backward(ctx, dy):
    saved = ctx.saved_tensors
    freqs = saved[0]
    cu = saved[1] if ctx.has_cu else None
    dx = rope_bwd(dy.contiguous(), freqs, cu, ctx.rot_dim, ctx.interleaved)
    return dx, None, None, None, None


rope_fwd.register_autograd(_rope_backward, setup_context=_rope_setup_context)


class RotaryPositionEmbedding(torch.nn.Module):
    """TE's RotaryPositionEmbedding: forward(max_seq_len, offset=0) -> freqs [s, 1, 1, dim']
    (float32, each angle twice: TE's layout), for apply_rotary_pos_emb. dim' = dim *
    rotary_percent; angles (offset + p) / seq_len_interpolation_factor * base^(-2k/dim')."""

    def __init__(self, dim, rotary_percent=1.0, seq_len_interpolation_factor=None,
                 pretrained_max_position_embeddings=None, rotary_base=10000.0,
                 interleaved=False):
        super().__init__()
        dim = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.interleaved = interleaved
        inv = 1.0 / rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings

    def forward(self, max_seq_len, offset=0):
        seq = torch.arange(max_seq_len, device=self.inv_freq.device,
                           dtype=self.inv_freq.dtype) + offset
        if self.pretrained_max_position_embeddings is not None and \
                self.seq_len_interpolation_factor is not None:
            if max_seq_len > self.pretrained_max_position_embeddings * \
                    self.seq_len_interpolation_factor:
                seq = seq * (self.pretrained_max_position_embeddings / max_seq_len)
            else:
                seq = seq / self.seq_len_interpolation_factor
        elif self.seq_len_interpolation_factor is not None:
            seq = seq / self.seq_len_interpolation_factor
        f = torch.outer(seq, self.inv_freq)
        if self.interleaved:
            emb = torch.stack((f, f), -1).reshape(f.shape[0], -1)
        else:
            emb = torch.cat((f, f), -1)
        return emb.reshape(emb.shape[0], 1, 1, emb.shape[1])


def _libte_freqs(freqs, interleaved):
    """freqs as libte wants them: float32 [positions, rot_dim / 2], each angle once. TE's form
    [positions, 1, 1, rot_dim] (RotaryPositionEmbedding's output: the angles twice, as
    cat(f, f), or each twice in a row, f0 f0 f1 f1 ..., when interleaved) is converted; a 2-D
    tensor is taken as libte's form already. Returns (freqs, rot_dim)."""
    if freqs.dim() == 4:
        if freqs.shape[1] != 1 or freqs.shape[2] != 1 or freqs.shape[3] % 2:
            raise InvalidArgument("libte.torch.apply_rotary_pos_emb: argument 'freqs': expected "
                                  "TE's [s, 1, 1, rot_dim] (rot_dim even) or libte's "
                                  "[s, rot_dim / 2], got %s" % list(freqs.shape))
        rot_dim = freqs.shape[3]
        f = freqs[:, 0, 0, :]
        f = f[:, 0::2] if interleaved else f[:, :rot_dim // 2]
    elif freqs.dim() == 2:
        rot_dim = 2 * freqs.shape[1]
        f = freqs
    else:
        raise InvalidArgument("libte.torch.apply_rotary_pos_emb: argument 'freqs': expected "
                              "TE's [s, 1, 1, rot_dim] or libte's [s, rot_dim / 2], got %s"
                              % list(freqs.shape))
    if f.dtype != torch.float32:
        f = f.float()
    return f.contiguous(), rot_dim


def apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", interleaved=False, fused=True,
                         cu_seqlens=None, cp_size=1, cp_rank=0):
    """TE's apply_rotary_pos_emb: rotates the first rot_dim features of every head of t by the
    angles of each token's position (in its sequence for 'thd'). t: [s, b, h, d] ('sbhd', TE's
    default; copied to bshd and back), [b, s, h, d] ('bshd') or [tokens, h, d] ('thd', with
    int32 cu_seqlens [batch + 1]). freqs: TE's [s, 1, 1, rot_dim] (as RotaryPositionEmbedding
    returns it) or libte's float32 [s, rot_dim / 2]; rot_dim <= d, the other features pass
    through. interleaved: GPT-J pairs (2k, 2k+1) instead of GPT-NeoX's (k, k + rot_dim/2).
    `fused` is accepted for TE's signature (libte's rope is always fused); context parallelism
    (cp_size > 1) is not supported. Differentiable in t (not in freqs)."""
    name = "libte.torch.apply_rotary_pos_emb"
    if cp_size != 1:
        raise InvalidArgument("%s: context parallelism (cp_size %r) is not supported"
                              % (name, cp_size))
    if tensor_format not in _FORMATS:
        raise InvalidArgument("%s: argument 'tensor_format': expected 'sbhd', 'bshd' or 'thd', "
                              "got %r" % (name, tensor_format))
    if (tensor_format == "thd") != (cu_seqlens is not None):
        raise InvalidArgument("%s: cu_seqlens goes with tensor_format 'thd' (and only with it)"
                              % name)
    f, rot_dim = _libte_freqs(freqs, interleaved)
    if f.device != t.device:
        f = f.to(t.device)
    x = t.transpose(0, 1) if tensor_format == "sbhd" else t
    x = x if x.is_contiguous() else x.contiguous()
    cu = None
    if cu_seqlens is not None:
        cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
        cu = cu.contiguous()
    y = rope_fwd(x, f, cu, rot_dim, bool(interleaved))
    return y.transpose(0, 1) if tensor_format == "sbhd" else y
