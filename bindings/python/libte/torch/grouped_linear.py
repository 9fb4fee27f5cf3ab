"""libte.torch.GroupedLinear (TE's te.pytorch.GroupedLinear): num_gemms linear experts over
consecutive groups of m_splits tokens; custom ops libte::grouped_linear_fwd/_bwd over
te_grouped_linear_residuals_size / forward_compute_into / backward_from."""

from typing import List, Optional, Tuple

import torch

from .. import _constants as C
from .._lowlevel import ll
from ..errors import InvalidArgument
from ..grouped_linear import GroupedLinear as _CGroupedLinear
from . import _runtime as rt
from ._base import KIND_GROUPED_LINEAR, TEModule, default_init
from .linear import _released

Tensor = torch.Tensor
_U8 = torch.uint8


def _check(m, x, m_splits, weights, biases):
    m._check_input(x, m.in_features, m.weight0.dtype)
    if len(m_splits) != m.num_gemms:
        raise InvalidArgument("libte.torch.GroupedLinear: argument 'm_splits': expected %d "
                              "counts, got %d" % (m.num_gemms, len(m_splits)))
    for p in list(weights) + list(biases):
        if p.dtype != x.dtype:
            raise InvalidArgument("libte.torch.GroupedLinear: the parameters must have the "
                                  "input's dtype %s" % x.dtype)


@torch.library.custom_op("libte::grouped_linear_fwd", mutates_args=())
def grouped_linear_fwd(x: Tensor, m_splits: List[int], weights: List[Tensor],
                       biases: List[Tensor], layer: int, mode: int, weight_unchanged: bool,
                       retain: bool) -> Tuple[Tensor, Tensor]:
    """y [tokens, out] = each group of m_splits[i] rows of x times weights[i]^T (+ biases[i]);
    biases: [] for a layer without."""
    m = rt.module_of(layer)
    _check(m, x, m_splits, weights, biases)
    cw, h = m._native(x)
    rt.sync_scopes(cw, mode)
    cw.follow_stream(x.device)
    code = rt.DTYPES[x.dtype]
    xd = rt.desc(x, code)
    wd = [rt.desc(w, code) for w in weights]
    bd = [rt.desc(b, code) for b in biases] if biases else None
    n = ll.grouped_linear_residuals_size(cw.h, h, xd, m_splits, wd, bd)
    res = torch.empty(n, dtype=_U8, device=x.device)
    y = torch.empty(x.shape[:-1] + (m.out_features,), dtype=x.dtype, device=x.device)
    ll.grouped_linear_forward_compute_into(cw.h, h, xd, m_splits, wd, bd, weight_unchanged,
                                           rt.desc(y, code), res.data_ptr() if n else 0, n)
    return y, res


@grouped_linear_fwd.register_fake
def _fwd_fake(x, m_splits, weights, biases, layer, mode, weight_unchanged, retain):
    m = rt.module_of(layer)
    _check(m, x, m_splits, weights, biases)
    cw, h = m._native(x)
    rt.sync_scopes(cw, mode)
    code, dev = rt.DTYPES[x.dtype], x.device
    n = ll.grouped_linear_residuals_size(
        cw.h, h, rt.shape_desc(x.shape, code, dev), [int(s) for s in m_splits],
        [rt.shape_desc(w.shape, code, dev) for w in weights],
        [rt.shape_desc(b.shape, code, dev) for b in biases] if biases else None)
    return x.new_empty(x.shape[:-1] + (m.out_features,)), x.new_empty((n,), dtype=_U8)


def _grad_shapes(m, dy, need_dx, need_dw, need_db):
    dx = (*dy.shape[:-1], m.in_features) if need_dx else (0,)
    dws = [(m.out_features, m.in_features)] * m.num_gemms if need_dw else []
    dbs = [(m.out_features,)] * m.num_gemms if need_db else []
    return dx, dws, dbs


@torch.library.custom_op("libte::grouped_linear_bwd", mutates_args=())
def grouped_linear_bwd(dy: Tensor, residuals: Tensor, x: Optional[Tensor], m_splits: List[int],
                       weights: List[Tensor], biases: List[Tensor], layer: int, need_dx: bool, need_dw: bool,
                       need_db: bool, once: bool) -> Tuple[Tensor, List[Tensor], List[Tensor]]:
    """(dx or empty, [dW_i] or [], [db_i] or []). x and weights: given after a high-precision
    forward only (else None and []); biases then too, when the layer has them."""
    m = rt.module_of(layer)
    cw, h = m._layer_for_backward()
    cw.follow_stream(dy.device)
    code, dev, dt = rt.DTYPES[dy.dtype], dy.device, dy.dtype
    sx, sws, sbs = _grad_shapes(m, dy, need_dx, need_dw, need_db)
    dx = torch.empty(sx, dtype=dt, device=dev)
    dws = [torch.empty(s, dtype=dt, device=dev) for s in sws]
    dbs = [torch.empty(s, dtype=dt, device=dev) for s in sbs]
    n = residuals.numel()
    try:
        ll.grouped_linear_backward_from(
            cw.h, h, rt.desc(x, code) if x is not None else None,
            m_splits if x is not None else None,
            [rt.desc(w, code) for w in weights] if x is not None else None,
            [rt.desc(b, code) for b in biases] if x is not None and biases else None,
            residuals.data_ptr() if n else 0, n, rt.desc(dy, code),
            rt.desc(dx, code) if need_dx else None,
            [rt.desc(t, code) for t in dws] if need_dw else None,
            [rt.desc(t, code) for t in dbs] if need_db else None, once)
    except InvalidArgument as e:
        if n:
            raise _released(e) from e
        raise
    return dx, dws, dbs


@grouped_linear_bwd.register_fake
def _bwd_fake(dy, residuals, x, m_splits, weights, biases, layer, need_dx, need_dw, need_db, once):
    sx, sws, sbs = _grad_shapes(rt.module_of(layer), dy, need_dx, need_dw, need_db)
    return dy.new_empty(sx), [dy.new_empty(s) for s in sws], [dy.new_empty(s) for s in sbs]


def _setup(ctx, inputs, output):
    x, m_splits, weights, biases, layer, mode, weight_unchanged, retain = inputs
    _, res = output
    ctx.mark_non_differentiable(res)
    ctx.layer, ctx.once, ctx.m_splits = layer, not retain, list(m_splits)
    ctx.n_weights, ctx.n_biases, ctx.has_bias = len(weights), len(biases), bool(biases)
    ctx.high_precision = res.numel() == 0
    if ctx.high_precision:
        ctx.save_for_backward(res, x, *weights, *biases)
    else:
        ctx.save_for_backward(res)


def _backward(ctx, dy, _dres):
    saved = ctx.saved_tensors
    res = saved[0]
    if ctx.high_precision:
        nw = ctx.n_weights
        x, weights, biases = saved[1], list(saved[2:2 + nw]), list(saved[2 + nw:])
    else:
        x, weights, biases = None, [], []
    need_dx = ctx.needs_input_grad[0]
    need_dw = any(ctx.needs_input_grad[2]) if isinstance(ctx.needs_input_grad[2], (list, tuple)) \
        else bool(ctx.needs_input_grad[2])
    need_db = ctx.has_bias and (any(ctx.needs_input_grad[3])
                                if isinstance(ctx.needs_input_grad[3], (list, tuple))
                                else bool(ctx.needs_input_grad[3]))
    dx, dws, dbs = grouped_linear_bwd(dy.contiguous(), res, x, ctx.m_splits, weights, biases,
                                      ctx.layer, need_dx, need_dw, need_db, ctx.once)
    # List inputs take lists of the same length back (None where no gradient).
    return (dx if need_dx else None, None,
            list(dws) if need_dw else [None] * ctx.n_weights,
            list(dbs) if need_db else [None] * ctx.n_biases, None, None, None, None)


grouped_linear_fwd.register_autograd(_backward, setup_context=_setup)


class GroupedLinear(TEModule):
    """num_gemms linear experts (TE's te.pytorch.GroupedLinear): parameters weight0..weight{n-1}
    [out_features, in_features] and bias0..bias{n-1} [out_features]; forward(input, m_splits,
    is_first_microbatch=None) runs expert i on the next m_splits[i] rows of input (a list of
    ints summing to the token count; 0 is allowed). FP8 inside libte.torch.autocast."""

    _KIND = KIND_GROUPED_LINEAR
    _NAME = "GroupedLinear"

    def __init__(self, num_gemms, in_features, out_features, bias=True, params_dtype=None,
                 device=None, init_method=None):
        super().__init__()
        for name, v in (("num_gemms", num_gemms), ("in_features", in_features),
                        ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument("libte.torch.GroupedLinear: argument '%s': expected a "
                                      "positive int, got %r" % (name, v))
        if num_gemms > C.GROUPED_LINEAR_MAX_GEMMS:
            raise InvalidArgument("libte.torch.GroupedLinear: argument 'num_gemms': at most %d"
                                  % C.GROUPED_LINEAR_MAX_GEMMS)
        dtype = params_dtype if params_dtype is not None else torch.get_default_dtype()
        if dtype not in rt.DTYPES:
            raise InvalidArgument("libte.torch.GroupedLinear: argument 'params_dtype': expected "
                                  "torch.float32, torch.float16 or torch.bfloat16, got %s"
                                  % dtype)
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias = bool(bias)
        for i in range(num_gemms):
            self.register_parameter("weight%d" % i, torch.nn.Parameter(
                torch.empty(out_features, in_features, dtype=dtype, device=device)))
            if bias:
                self.register_parameter("bias%d" % i, torch.nn.Parameter(
                    torch.empty(out_features, dtype=dtype, device=device)))
        self.init_method = init_method
        self.reset_parameters()

    def _weights(self):
        return [getattr(self, "weight%d" % i) for i in range(self.num_gemms)]

    def _biases(self):
        return [getattr(self, "bias%d" % i) for i in range(self.num_gemms)] if self.use_bias \
            else []

    def reset_parameters(self):
        with torch.no_grad():
            for w in self._weights():
                (self.init_method or default_init)(w)
            for b in self._biases():
                b.zero_()

    def _create(self, ctx, dtype_name):
        return _CGroupedLinear(ctx, self.num_gemms, self.in_features, self.out_features,
                               bias=self.use_bias, dtype=dtype_name)

    def forward(self, input, m_splits, is_first_microbatch=None):
        x = input if input.is_contiguous() else input.contiguous()
        t = rt.TLS
        y, _ = grouped_linear_fwd(x, [int(s) for s in m_splits], self._weights(),
                                  self._biases(), self._te_key, t.mode,
                                  is_first_microbatch is False, t.retain)
        return y

    def extra_repr(self):
        return "num_gemms=%d, in_features=%d, out_features=%d, bias=%s" % (
            self.num_gemms, self.in_features, self.out_features, self.use_bias)
