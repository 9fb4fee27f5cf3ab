"""Attention: O = softmax(scale * Q K^T + mask) V (TE's DotProductAttention), with te_linear's
module contract: split forward, repeatable backward, residuals in library or caller memory, FP8
scaling states (fp8=True: TE's fp8_dpa) and state bytes. And RoPE (rope_forward/backward).

    attn = libte.Attention(ctx, num_heads=8, head_dim=64, num_kv_heads=2, mask="causal")
    o, bwd = attn.forward(q, k, v)                     # BSHD: q [b, s, 8, 64], k, v [b, s, 2, 64]
    dq, dk, dv = bwd.backward(do)
    o, bwd = attn.forward(q, k, v, cu_q, cu_kv)        # THD: q [t, 8, 64], cu_* int32 [b + 1]

Layouts: BSHD (q [batch, seq_q, heads, head_dim], k and v [batch, seq_kv, kv_heads, head_dim])
without offsets, THD (q [tokens_q, heads, head_dim], k and v [tokens_kv, kv_heads, head_dim])
with int32 cu_seqlens_q / cu_seqlens_kv [batch + 1] (sequence b is rows cu[b]..cu[b+1]) and
max_seqlen_q / max_seqlen_kv (read from host offsets when not given).
"""

import numbers

import numpy as np

from . import _constants as C
from ._arrays import adapt, te_dtype
from ._lowlevel import ll
from ._module import Module, ModuleBackwardContext, ModuleResiduals, gradients_type
from .errors import InvalidArgument
from .linear import ScalingState, _positive
from .tensor import Float8Tensor, as_input, check_context, follow_streams, new_output

__all__ = ["Attention", "AttentionResiduals", "AttentionBackwardContext", "AttentionGradients",
           "rope_forward", "rope_backward"]

AttentionGradients = gradients_type(
    "AttentionGradients", "dq dk dv",
    """Attention's backward results: dq like q, dk and dv like k and v (each GQA group's query
    heads summed); None for each one skipped.""")

_MASKS = {"no_mask": C.ATTN_MASK_NONE, "none": C.ATTN_MASK_NONE,
          "causal": C.ATTN_MASK_CAUSAL, "causal_top_left": C.ATTN_MASK_CAUSAL,
          "causal_bottom_right": C.ATTN_MASK_CAUSAL_BOTTOM_RIGHT,
          "bottom_right": C.ATTN_MASK_CAUSAL_BOTTOM_RIGHT}

_STATES = {"q": C.ATTN_Q, "k": C.ATTN_K, "v": C.ATTN_V, "s": C.ATTN_S, "do": C.ATTN_DO,
           "dp": C.ATTN_DP}


def mask_code(mask):
    """te_attn_mask from 'no_mask' | 'causal' | 'causal_bottom_right' (TE's attn_mask_type
    names; 'none' too) or a code."""
    if isinstance(mask, str):
        code = _MASKS.get(mask.lower())
    elif isinstance(mask, int) and not isinstance(mask, bool) and mask in C.ATTN_MASK_NAMES:
        code = mask
    else:
        code = None
    if code is None:
        raise InvalidArgument("argument 'mask': expected 'no_mask', 'causal' or "
                              "'causal_bottom_right', got %r" % (mask,))
    return code


def _state_code(which):
    if isinstance(which, str):
        code = _STATES.get(which.lower())
    elif isinstance(which, int) and not isinstance(which, bool) and which in C.ATTN_TENSOR_NAMES:
        code = which
    else:
        code = None
    if code is None:
        raise InvalidArgument("argument 'which': expected 'q', 'k', 'v', 's', 'do' or 'dp', "
                              "got %r" % (which,))
    return code


def _max_seqlen(value, a_cu, cu, name):
    """max_seqlen_*: the caller's int, or the longest sequence of host offsets."""
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise InvalidArgument("argument '%s': expected a positive int, got %r"
                                  % (name, value))
        return int(value)
    if a_cu is None:
        return 0
    if not a_cu.is_numpy:
        raise InvalidArgument("argument '%s': required with device offsets (libte does not read "
                              "them back)" % name)
    offsets = np.asarray(cu, np.int64)
    return max(int(np.max(np.diff(offsets))) if offsets.size > 1 else 0, 1)


def _hp(ctx, x, name):
    if isinstance(x, Float8Tensor):
        raise InvalidArgument("argument '%s': expected a float32, float16 or bfloat16 array, "
                              "got a Float8Tensor (attention quantizes itself under fp8=True)"
                              % name)
    return as_input(ctx, x, name)


def _offsets(ctx, cu, name):
    if cu is None:
        return None
    return adapt(cu, name, device=ctx.device, stream=ctx._stream, index=True)


def _buffer(buf, name, writable):
    """(address, bytes) of a caller's residual block: a C-contiguous NumPy array, an object with
    __cuda_array_interface__ (a CUDA buffer), or None / an empty array (0, 0)."""
    if buf is None:
        return 0, 0
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise InvalidArgument("argument '%s': expected a C-contiguous array" % name)
        if writable and not buf.flags.writeable:
            raise InvalidArgument("argument '%s': expected a writable array" % name)
        return (buf.ctypes.data if buf.nbytes else 0), int(buf.nbytes)
    cai = getattr(buf, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        n = int(np.prod(cai["shape"])) * int(cai["typestr"][2:])
        return (cai["data"][0] if n else 0), n
    if hasattr(buf, "data_ptr") and hasattr(buf, "numel"):  # a torch tensor
        n = buf.numel() * buf.element_size()
        return (buf.data_ptr() if n else 0), n
    raise InvalidArgument("argument '%s': expected a NumPy array, a CUDA array or None, got %s"
                          % (name, type(buf).__name__))


class AttentionResiduals(ModuleResiduals):
    """What Attention's backward needs (host copies through the properties): q, k, v (FP8: the
    E4M3 copies as Float8Tensors; else the caller's), o (the forward's output) and lse (float32
    [tokens_q, heads], the rows' log-sum-exp)."""

    q = property(lambda self: self._tensor("q"))
    k = property(lambda self: self._tensor("k"))
    v = property(lambda self: self._tensor("v"))
    o = property(lambda self: self._tensor("o"))
    lse = property(lambda self: self._tensor("lse"))


class AttentionBackwardContext(ModuleBackwardContext):
    """An Attention forward's saved context (residuals as AttentionResiduals' properties, when
    it came from forward_save). The caller's q, k, v, offsets and o stay referenced by it."""

    q = property(lambda self: self._tensor("q"))
    k = property(lambda self: self._tensor("k"))
    v = property(lambda self: self._tensor("v"))
    o = property(lambda self: self._tensor("o"))
    lse = property(lambda self: self._tensor("lse"))

    def backward(self, d_o, *, dq=None, dk=None, dv=None, once=False):
        """From d_o (like o): dq like q, dk and dv like k and v. Each: None for a new array,
        False to skip it, or an array to write into (written, not accumulated). once=True frees
        the residuals on return (later calls raise InvalidState). Returns AttentionGradients."""
        m = self._module
        q_shape, k_shape, v_shape = self._shapes
        (h_ctx, h), a_do, outs = self._gradients(d_o, (
            ("dq", dq, q_shape, m._dtype, True, False),
            ("dk", dk, k_shape, m._dtype, True, False),
            ("dv", dv, v_shape, m._dtype, True, False)))
        follow_streams(m._ctx, a_do, *(a for _, a in outs))
        ll.attention_backward(h_ctx, h, a_do.desc,
                              *(a.desc if a is not None else None for _, a in outs), once)
        if once:
            self._consumed = True
        return AttentionGradients(*(arr for arr, _ in outs))


class Attention(Module):
    """The state of one scaled dot-product attention layer (TE's DotProductAttention): its
    options and, with fp8=True, the FP8 scaling states of Q, K, V, S (softmax output), dO and
    dS. It has no parameters: q, k and v are passed to every forward.

    num_heads, head_dim   query heads; head_dim a multiple of 8 in 8..256
    num_kv_heads          key/value heads (GQA/MQA; default num_heads), dividing num_heads
    softmax_scale         default 1 / sqrt(head_dim)
    mask                  'no_mask' | 'causal' (top-left) | 'causal_bottom_right'
    dtype                 activation dtype of q, k, v, o and the gradients
    fp8                   TE's fp8_dpa: FP8 GEMMs inside an FP8 autocast (delayed or current
                          scaling); o and the gradients stay in `dtype`
    """

    _LL = "attention"
    _Residuals = AttentionResiduals
    _Backward = AttentionBackwardContext

    def __init__(self, ctx, num_heads, head_dim, num_kv_heads=None, softmax_scale=None,
                 mask="no_mask", dtype="float32", fp8=False):
        h_ctx = check_context(ctx)
        self.num_heads = _positive(num_heads, "num_heads")
        self.head_dim = _positive(head_dim, "head_dim")
        self.num_kv_heads = (self.num_heads if num_kv_heads is None
                             else _positive(num_kv_heads, "num_kv_heads"))
        if softmax_scale is not None and (not isinstance(softmax_scale, numbers.Real)
                                          or isinstance(softmax_scale, bool)):
            raise InvalidArgument("argument 'softmax_scale': expected a number or None, got %r"
                                  % (softmax_scale,))
        self._scale_arg = None if softmax_scale is None else float(softmax_scale)
        self._mask = mask_code(mask)
        self._dtype = te_dtype(dtype)
        self.fp8 = bool(fp8)
        self._own(ctx, ll.attention_create(
            h_ctx, self.num_heads, self.num_kv_heads, self.head_dim,
            0.0 if self._scale_arg is None else self._scale_arg, self._mask, self._dtype,
            self.fp8))

    @property
    def softmax_scale(self):
        """The scale of Q K^T (1 / sqrt(head_dim) unless given)."""
        return self._scale_arg if self._scale_arg is not None else 1.0 / self.head_dim ** 0.5

    @property
    def mask(self):
        """'no_mask' | 'causal' | 'causal_bottom_right' (TE's attn_mask_type)."""
        return C.ATTN_MASK_NAMES[self._mask]

    attn_mask_type = mask

    # -- operands ------------------------------------------------------------------------------

    def _inputs(self, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
        ctx = self._ctx
        a_q = _hp(ctx, q, "q")
        a_k = _hp(ctx, k, "k")
        a_v = _hp(ctx, v, "v")
        a_cq = _offsets(ctx, cu_seqlens_q, "cu_seqlens_q")
        a_ck = _offsets(ctx, cu_seqlens_kv, "cu_seqlens_kv")
        mq = _max_seqlen(max_seqlen_q, a_cq, cu_seqlens_q, "max_seqlen_q")
        mk = _max_seqlen(max_seqlen_kv, a_ck, cu_seqlens_kv, "max_seqlen_kv")
        adapted = (a_q, a_k, a_v, a_cq, a_ck)
        descs = tuple(a.desc if a is not None else None for a in adapted) + (mq, mk)
        keep = tuple(a.keep for a in adapted if a is not None)
        return adapted, descs, keep

    def _operands(self, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out):
        adapted, descs, keep = self._inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                            max_seqlen_kv)
        a_q = adapted[0]
        out, a_o = self._output(out, adapted[:3], tuple(a_q.desc[2]), "out")
        follow_streams(self._ctx, *adapted, a_o)
        shapes = tuple(tuple(a.desc[2]) for a in adapted[:3])
        return descs, (out, a_o), keep + (out,), shapes

    def forward_compute(self, q, k, v, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                        max_seqlen_kv=None, *, out=None):
        """Pure compute: o = softmax(scale q k^T + mask) v (in FP8 inside an enabled autocast
        scope when the layer has fp8=True). Returns (o, AttentionResiduals); q, k, v, the
        offsets and o stay referenced until the backward context is closed."""
        h_ctx, h = self._handles()
        descs, (out, a_o), keep, shapes = self._operands(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out)
        res = ll.attention_forward_compute(h_ctx, h, *descs, a_o.desc)
        rq, rk, rv, ro, lse, fp8 = ll.attention_residuals_tensors(res)
        residuals = self._residuals(res, {"q": rq, "k": rk, "v": rv, "o": ro, "lse": lse}, fp8,
                                    keep)
        residuals._shapes = shapes
        return out, residuals

    def forward_save(self, residuals):
        bwd = super().forward_save(residuals)
        bwd._shapes = residuals._shapes
        return bwd

    def forward(self, q, k, v, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                max_seqlen_kv=None, *, out=None):
        """forward_compute + forward_save: (o, AttentionBackwardContext)."""
        h_ctx, h = self._handles()
        descs, (out, a_o), keep, shapes = self._operands(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out)
        ptr = ll.attention_forward(h_ctx, h, *descs, a_o.desc)
        bwd = self._backward_context(ptr, keep)
        bwd._shapes = shapes
        return out, bwd

    # -- residuals in the caller's memory --------------------------------------------------------

    def residuals_size(self, q, k, v, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                       max_seqlen_kv=None):
        """te_attention_residuals_size: bytes of the caller's residual block for these inputs
        (the LSE, and under FP8 the E4M3 q, k, v with their scale_inv; never 0)."""
        h_ctx, h = self._handles()
        _, descs, _ = self._inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                   max_seqlen_kv)
        return ll.attention_residuals_size(h_ctx, h, *descs)

    def forward_compute_into(self, q, k, v, residuals, cu_seqlens_q=None, cu_seqlens_kv=None,
                             max_seqlen_q=None, max_seqlen_kv=None, *, out=None):
        """The forward with its residuals written into `residuals` (a uint8 array of at least
        residuals_size() bytes, 16-byte aligned: NumPy's allocations are). Returns o. Keep the
        inputs, o and the block for backward_from."""
        h_ctx, h = self._handles()
        descs, (out, a_o), keep, _ = self._operands(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out)
        ptr, n = _buffer(residuals, "residuals", True)
        ll.attention_forward_compute_into(h_ctx, h, *descs, a_o.desc, ptr, n)
        del keep
        return out

    def backward_from(self, q, k, v, o, residuals, d_o, cu_seqlens_q=None, cu_seqlens_kv=None,
                      max_seqlen_q=None, max_seqlen_kv=None, *, dq=None, dk=None, dv=None,
                      once=False):
        """The backward of a forward_compute_into: the same inputs (they may have moved), its
        output o, its residual block and d_o -> AttentionGradients (None: a new array, False:
        skipped, or an array to write into). Callable again until once=True."""
        h_ctx, h = self._handles()
        ctx = self._ctx
        adapted, descs, _ = self._inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                         max_seqlen_kv)
        a_o = _hp(ctx, o, "o")
        a_do = _hp(ctx, d_o, "d_o")
        outs = []
        for name, given, a_like in (("dq", dq, adapted[0]), ("dk", dk, adapted[1]),
                                    ("dv", dv, adapted[2])):
            if given is False:
                outs.append((None, None))
                continue
            if given is None:
                given = new_output((a_like, a_do), tuple(a_like.desc[2]), self._dtype, name)
            outs.append((given, as_input(ctx, given, name, writable=True)))
        ptr, n = _buffer(residuals, "residuals", False)
        follow_streams(ctx, *adapted, a_o, a_do, *(a for _, a in outs))
        ll.attention_backward_from(h_ctx, h, *descs, a_o.desc, ptr, n, a_do.desc,
                                   *(a.desc if a is not None else None for _, a in outs), once)
        return AttentionGradients(*(arr for arr, _ in outs))

    # -- FP8 state --------------------------------------------------------------------------------

    def scaling_state(self, which, history=True):
        """The FP8 scaling state of 'q', 'k', 'v', 's' (the softmax output P), 'do' or 'dp'
        (dS = P (dP - D))."""
        code = _state_code(which)
        h_ctx, h = self._handles()
        cap = ll.attention_get_scaling_state(h_ctx, h, code, 0)[2] if history else 0
        scale, scale_inv, hist_len, dtype, hist = ll.attention_get_scaling_state(h_ctx, h, code,
                                                                                 cap)
        return ScalingState((scale, scale_inv, hist_len, C.DTYPE_NAMES.get(dtype, str(dtype)),
                             np.asarray(hist, np.float32)))

    get_scaling_state = scaling_state

    def __repr__(self):
        return "<libte.Attention heads=%d kv_heads=%d head_dim=%d mask=%s dtype=%s fp8=%s%s>" % (
            self.num_heads, self.num_kv_heads, self.head_dim, self.mask, self.dtype, self.fp8,
            " closed" if self.closed else "")


# ---- RoPE ------------------------------------------------------------------------------------------

def _rope(ctx, x, freqs, cu_seqlens, rot_dim, interleaved, out, backward):
    h = check_context(ctx)
    xname = "dy" if backward else "x"
    a_x = _hp(ctx, x, xname)
    a_f = as_input(ctx, freqs, "freqs")
    a_cu = _offsets(ctx, cu_seqlens, "cu_seqlens")
    if rot_dim is None:
        fshape = tuple(a_f.desc[2])
        rot_dim = 2 * fshape[-1] if len(fshape) == 2 else 0
    elif isinstance(rot_dim, bool) or not isinstance(rot_dim, numbers.Integral):
        raise InvalidArgument("argument 'rot_dim': expected an int or None, got %r" % (rot_dim,))
    if out is None:
        out = new_output((a_x, a_f, a_cu), tuple(a_x.desc[2]), a_x.desc[1], "out")
    a_y = as_input(ctx, out, "out", writable=True)
    follow_streams(ctx, a_x, a_f, a_cu, a_y)
    f = ll.rope_backward if backward else ll.rope_forward
    f(h, int(rot_dim), bool(interleaved), a_x.desc, a_f.desc,
      a_cu.desc if a_cu is not None else None, a_y.desc)
    return out


def rope_forward(ctx, x, freqs, cu_seqlens=None, *, rot_dim=None, interleaved=False, out=None):
    """Rotary position embedding (TE's fused RoPE): the first rot_dim features of every head of
    x (BSHD [batch, seq, heads, head_dim], or THD [tokens, heads, head_dim] with int32
    cu_seqlens [batch + 1]) rotate by the angles freqs[p, k] (float32 [positions, rot_dim / 2],
    each angle once: TE's freqs hold it twice) of the token's position p in its sequence; pairs
    (k, k + rot_dim/2), or (2k, 2k+1) with interleaved=True. rot_dim defaults to
    2 * freqs.shape[1]. out may be x (in place). Returns y."""
    return _rope(ctx, x, freqs, cu_seqlens, rot_dim, interleaved, out, False)


def rope_backward(ctx, dy, freqs, cu_seqlens=None, *, rot_dim=None, interleaved=False, out=None):
    """RoPE's backward, the inverse rotation: dx from dy (arguments as rope_forward)."""
    return _rope(ctx, dy, freqs, cu_seqlens, rot_dim, interleaved, out, True)
