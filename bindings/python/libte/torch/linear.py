"""libte.torch.Linear and its ops: libte::linear_fwd / libte::linear_bwd, custom ops with fake
impls and autograd, over te_linear_residuals_size / forward_compute_into / backward_from."""

from typing import Optional, Tuple

import torch

from .._lowlevel import ll
from ..errors import InvalidArgument, InvalidState
from ..linear import Linear as _CLinear
from . import _runtime as rt
from ._base import KIND_LINEAR, TEModule, default_init

Tensor = torch.Tensor
_U8 = torch.uint8


def _layer(layer, x, weight, bias):
    m = rt.module_of(layer)
    m._check_input(x, m.in_features, m.weight.dtype)
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise InvalidArgument("libte.torch.Linear: weight and bias must have the input's dtype "
                              "%s" % x.dtype)
    return m


def _released(e):
    return InvalidState(
        "libte.torch: backward through a graph whose FP8 residuals an earlier backward released "
        "(for loss.backward(retain_graph=True) run the forward inside "
        "libte.torch.retain_residuals()); library: %s" % e)


@torch.library.custom_op("libte::linear_fwd", mutates_args=())
def linear_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor], layer: int, mode: int,
               weight_unchanged: bool, retain: bool) -> Tuple[Tensor, Tensor]:
    """y = x W^T + b under the autocast mode `mode`; returns (y, residual bytes)."""
    m = _layer(layer, x, weight, bias)
    cw, h = m._native(x)
    rt.sync_scopes(cw, mode)
    cw.follow_stream(x.device)
    code = rt.DTYPES[x.dtype]
    xd, wd = rt.desc(x, code), rt.desc(weight, code)
    bd = rt.desc(bias, code) if bias is not None else None
    n = ll.linear_residuals_size(cw.h, h, xd, wd, bd)
    res = torch.empty(n, dtype=_U8, device=x.device)
    y = torch.empty(x.shape[:-1] + (m.out_features,), dtype=x.dtype, device=x.device)
    ll.linear_forward_compute_into(cw.h, h, xd, wd, bd, weight_unchanged, rt.desc(y, code),
                                   res.data_ptr() if n else 0, n)
    return y, res


@linear_fwd.register_fake
def _linear_fwd_fake(x, weight, bias, layer, mode, weight_unchanged, retain):
    m = _layer(layer, x, weight, bias)
    cw, h = m._native(x)
    rt.sync_scopes(cw, mode)
    code = rt.DTYPES[x.dtype]
    n = ll.linear_residuals_size(
        cw.h, h, rt.shape_desc(x.shape, code, x.device),
        rt.shape_desc(weight.shape, code, x.device),
        rt.shape_desc(bias.shape, code, x.device) if bias is not None else None)
    return (x.new_empty(x.shape[:-1] + (m.out_features,)), x.new_empty((n,), dtype=_U8))


@torch.library.custom_op("libte::linear_bwd", mutates_args=())
def linear_bwd(dy: Tensor, residuals: Tensor, x: Optional[Tensor], weight: Optional[Tensor],
               layer: int, need_dx: bool, need_dw: bool, need_db: bool,
               once: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dw, db) of linear_fwd; an output not needed is an empty tensor."""
    m = rt.module_of(layer)
    cw, h = m._layer_for_backward()
    cw.follow_stream(dy.device)
    code = rt.DTYPES[dy.dtype]
    dev, dt = dy.device, dy.dtype
    dx = torch.empty(dy.shape[:-1] + (m.in_features,), dtype=dt, device=dev) if need_dx \
        else torch.empty(0, dtype=dt, device=dev)
    dw = torch.empty((m.out_features, m.in_features), dtype=dt, device=dev) if need_dw \
        else torch.empty(0, dtype=dt, device=dev)
    db = torch.empty((m.out_features,), dtype=dt, device=dev) if need_db \
        else torch.empty(0, dtype=dt, device=dev)
    n = residuals.numel()
    try:
        ll.linear_backward_from(
            cw.h, h, rt.desc(x, code) if x is not None else None,
            rt.desc(weight, code) if weight is not None else None, None,
            residuals.data_ptr() if n else 0, n, rt.desc(dy, code),
            rt.desc(dx, code) if need_dx else None, rt.desc(dw, code) if need_dw else None,
            rt.desc(db, code) if need_db else None, once)
    except InvalidArgument as e:
        if n:
            raise _released(e) from e
        raise
    return dx, dw, db


@linear_bwd.register_fake
def _linear_bwd_fake(dy, residuals, x, weight, layer, need_dx, need_dw, need_db, once):
    m = rt.module_of(layer)
    e = dy.new_empty((0,))
    return (dy.new_empty(dy.shape[:-1] + (m.in_features,)) if need_dx else e,
            dy.new_empty((m.out_features, m.in_features)) if need_dw else dy.new_empty((0,)),
            dy.new_empty((m.out_features,)) if need_db else dy.new_empty((0,)))


def _setup_context(ctx, inputs, output):
    x, weight, bias, layer, mode, weight_unchanged, retain = inputs
    _, res = output
    ctx.mark_non_differentiable(res)
    ctx.layer = layer
    ctx.once = not retain
    ctx.high_precision = res.numel() == 0
    if ctx.high_precision:  # the backward reads x and W themselves
        ctx.save_for_backward(res, x, weight)
    else:  # FP8: x^T lives in res; W^T is the library's FP8 weight
        ctx.save_for_backward(res)


def _backward(ctx, dy, _dres):
    if ctx.high_precision:
        res, x, weight = ctx.saved_tensors
    else:
        (res,) = ctx.saved_tensors
        x = weight = None
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx, dw, db = linear_bwd(dy.contiguous(), res, x, weight, ctx.layer, need_dx, need_dw,
                            need_db, ctx.once)
    return (dx if need_dx else None, dw if need_dw else None, db if need_db else None,
            None, None, None, None)


linear_fwd.register_autograd(_backward, setup_context=_setup_context)


class Linear(TEModule):
    """y = x W^T + b, in FP8 inside libte.torch.autocast (TE's te.pytorch.Linear).

    weight [out_features, in_features], bias [out_features]: nn.Parameters in params_dtype
    (default torch.get_default_dtype()) on `device` (default torch's default device).
    init_method(weight) initialises the weight (default: normal, std 0.023, as TE); the bias
    starts at zero. forward(input, is_first_microbatch=None): is_first_microbatch=False reuses
    the FP8 weight cast of the previous forward (weights unchanged between microbatches).
    """

    _KIND = KIND_LINEAR
    _NAME = "Linear"

    def __init__(self, in_features, out_features, bias=True, params_dtype=None, device=None,
                 init_method=None, fuse_wgrad_accumulation=False):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument("libte.torch.Linear: argument '%s': expected a positive "
                                      "int, got %r" % (name, v))
        if fuse_wgrad_accumulation:
            raise InvalidArgument("libte.torch.Linear: fuse_wgrad_accumulation is not supported "
                                  "yet")
        dtype = params_dtype if params_dtype is not None else torch.get_default_dtype()
        if dtype not in rt.DTYPES:
            raise InvalidArgument("libte.torch.Linear: argument 'params_dtype': expected "
                                  "torch.float32, torch.float16 or torch.bfloat16, got %s" % dtype)
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bool(bias)
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype,
                                                     device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.init_method = init_method
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            (self.init_method or default_init)(self.weight)
            if self.bias is not None:
                self.bias.zero_()

    def _create(self, ctx, dtype_name):
        return _CLinear(ctx, self.in_features, self.out_features, bias=self.use_bias,
                        dtype=dtype_name)

    def forward(self, input, is_first_microbatch=None):
        x = input if input.is_contiguous() else input.contiguous()
        t = rt.TLS
        y, _ = linear_fwd(x, self.weight, self.bias, self._te_key, t.mode,
                          is_first_microbatch is False, t.retain)
        return y

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s" % (
            self.in_features, self.out_features, self.use_bias)
