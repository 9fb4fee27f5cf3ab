"""libte.torch.LayerNormLinear and LayerNormMLP: custom ops libte::layernorm_linear_fwd/_bwd and
libte::layernorm_mlp_fwd/_bwd over te_layernorm_{linear,mlp}_residuals_size /
forward_compute_into / backward_from. Their residual block is never empty (the norm's statistics
at least), and the backward always gets the forward's inputs again (saved by autograd)."""

from typing import List, Optional, Tuple

import torch

from .. import _constants as C
from .._lowlevel import ll
from .._module import norm_code
from ..errors import InvalidArgument
from ..layernorm_linear import LayerNormLinear as _CLayerNormLinear
from ..layernorm_mlp import _ACTIVATIONS, LayerNormMLP as _CLayerNormMLP
from . import _runtime as rt
from ._base import KIND_LAYERNORM_LINEAR, KIND_LAYERNORM_MLP, TEModule, default_init
from .linear import _released

Tensor = torch.Tensor
_U8 = torch.uint8


def _descs(tensors, code):
    return [rt.desc(t, code) if t is not None else None for t in tensors]


def _shape_descs(tensors, code, device):
    return [rt.shape_desc(t.shape, code, device) if t is not None else None for t in tensors]


def _check_params(m, x, params):
    m._check_input(x, m._features_in, m._dtype)
    for p in params:
        if p is not None and p.dtype != x.dtype:
            raise InvalidArgument("libte.torch.%s: the parameters must have the input's dtype %s"
                                  % (m._NAME, x.dtype))


def _grads(specs, like):
    """specs: (shape, needed) -> new tensors (empty ones where not needed)."""
    return [torch.empty(shape, dtype=like.dtype, device=like.device) if need
            else torch.empty(0, dtype=like.dtype, device=like.device) for shape, need in specs]


def _fake_grads(specs, like):
    return [like.new_empty(shape) if need else like.new_empty((0,)) for shape, need in specs]


def _forward(m, x, params, mode, weight_unchanged, fns):
    size_fn, into_fn = fns
    _check_params(m, x, params)
    cw, h = m._native(x)
    rt.sync_scopes(cw, mode)
    cw.follow_stream(x.device)
    code = rt.DTYPES[x.dtype]
    d = _descs((x,) + tuple(params), code)
    n = size_fn(cw.h, h, *d)
    res = torch.empty(n, dtype=_U8, device=x.device)
    y = torch.empty(x.shape[:-1] + (m._features_out,), dtype=x.dtype, device=x.device)
    into_fn(cw.h, h, *d, weight_unchanged, rt.desc(y, code), res.data_ptr(), n)
    return y, res


def _forward_fake(m, x, params, mode, size_fn):
    _check_params(m, x, params)
    cw, h = m._native(x)
    rt.sync_scopes(cw, mode)
    n = size_fn(cw.h, h, *_shape_descs((x,) + tuple(params), rt.DTYPES[x.dtype], x.device))
    return x.new_empty(x.shape[:-1] + (m._features_out,)), x.new_empty((n,), dtype=_U8)


def _backward(m, dy, res, inputs, specs, once, from_fn):
    cw, h = m._layer_for_backward()
    cw.follow_stream(dy.device)
    code = rt.DTYPES[dy.dtype]
    grads = _grads(specs, dy)
    n = res.numel()
    try:
        from_fn(cw.h, h, *_descs(inputs, code), res.data_ptr(), n, rt.desc(dy, code),
                *(rt.desc(g, code) if need else None for g, (_, need) in zip(grads, specs)),
                once)
    except InvalidArgument as e:
        raise _released(e) from e
    return grads


def _flags(need):
    return [bool(need & (1 << i)) for i in range(8)]


# ---- LayerNormLinear ---------------------------------------------------------------------------

def _lnl_specs(m, dy, need):
    f = _flags(need)
    return (((*dy.shape[:-1], m.in_features), f[0]), ((m.in_features,), f[1]),
            ((m.in_features,), f[2]), ((m.out_features, m.in_features), f[3]),
            ((m.out_features,), f[4]))


@torch.library.custom_op("libte::layernorm_linear_fwd", mutates_args=())
def layernorm_linear_fwd(x: Tensor, ln_weight: Tensor, ln_bias: Optional[Tensor], weight: Tensor,
                         bias: Optional[Tensor], layer: int, mode: int, weight_unchanged: bool,
                         retain: bool) -> Tuple[Tensor, Tensor]:
    m = rt.module_of(layer)
    return _forward(m, x, (ln_weight, ln_bias, weight, bias), mode, weight_unchanged,
                    (ll.layernorm_linear_residuals_size, ll.layernorm_linear_forward_compute_into))


@layernorm_linear_fwd.register_fake
def _lnl_fwd_fake(x, ln_weight, ln_bias, weight, bias, layer, mode, weight_unchanged, retain):
    return _forward_fake(rt.module_of(layer), x, (ln_weight, ln_bias, weight, bias), mode,
                         ll.layernorm_linear_residuals_size)


@torch.library.custom_op("libte::layernorm_linear_bwd", mutates_args=())
def layernorm_linear_bwd(dy: Tensor, residuals: Tensor, x: Tensor, ln_weight: Tensor,
                         ln_bias: Optional[Tensor], weight: Tensor, bias: Optional[Tensor],
                         layer: int, need: int, once: bool) -> List[Tensor]:
    """[dx, dln_weight, dln_bias, dw, db]; bit i of `need` asks for the i-th (else empty)."""
    m = rt.module_of(layer)
    return _backward(m, dy, residuals, (x, ln_weight, ln_bias, weight, bias),
                     _lnl_specs(m, dy, need), once, ll.layernorm_linear_backward_from)


@layernorm_linear_bwd.register_fake
def _lnl_bwd_fake(dy, residuals, x, ln_weight, ln_bias, weight, bias, layer, need, once):
    return _fake_grads(_lnl_specs(rt.module_of(layer), dy, need), dy)


def _need(ctx, indices):
    need = 0
    for bit, i in enumerate(indices):
        if ctx.needs_input_grad[i]:
            need |= 1 << bit
    return need


def _setup(ctx, inputs, output, n_tensors):
    _, res = output
    ctx.mark_non_differentiable(res)
    ctx.layer = inputs[n_tensors]
    ctx.once = not inputs[n_tensors + 3]
    ctx.save_for_backward(res, *inputs[:n_tensors])


def _lnl_setup(ctx, inputs, output):
    _setup(ctx, inputs, output, 5)


def _lnl_backward(ctx, dy, _dres):
    res, *inputs = ctx.saved_tensors
    need = _need(ctx, range(5))
    grads = layernorm_linear_bwd(dy.contiguous(), res, *inputs, ctx.layer, need, ctx.once)
    return tuple(g if need & (1 << i) else None for i, g in enumerate(grads)) + (None,) * 4


layernorm_linear_fwd.register_autograd(_lnl_backward, setup_context=_lnl_setup)


# ---- LayerNormMLP ------------------------------------------------------------------------------

def _mlp_specs(m, dy, need):
    f = _flags(need)
    hid, rows, ffn = m.hidden_size, m._fc1_rows, m.ffn_hidden_size
    return (((*dy.shape[:-1], hid), f[0]), ((hid,), f[1]), ((hid,), f[2]),
            ((rows, hid), f[3]), ((rows,), f[4]), ((hid, ffn), f[5]), ((hid,), f[6]))


@torch.library.custom_op("libte::layernorm_mlp_fwd", mutates_args=())
def layernorm_mlp_fwd(x: Tensor, ln_weight: Tensor, ln_bias: Optional[Tensor], fc1_weight: Tensor,
                      fc1_bias: Optional[Tensor], fc2_weight: Tensor, fc2_bias: Optional[Tensor],
                      layer: int, mode: int, weight_unchanged: bool,
                      retain: bool) -> Tuple[Tensor, Tensor]:
    m = rt.module_of(layer)
    return _forward(m, x, (ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias), mode,
                    weight_unchanged,
                    (ll.layernorm_mlp_residuals_size, ll.layernorm_mlp_forward_compute_into))


@layernorm_mlp_fwd.register_fake
def _mlp_fwd_fake(x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, layer, mode,
                  weight_unchanged, retain):
    return _forward_fake(rt.module_of(layer), x,
                         (ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias), mode,
                         ll.layernorm_mlp_residuals_size)


@torch.library.custom_op("libte::layernorm_mlp_bwd", mutates_args=())
def layernorm_mlp_bwd(dy: Tensor, residuals: Tensor, x: Tensor, ln_weight: Tensor,
                      ln_bias: Optional[Tensor], fc1_weight: Tensor, fc1_bias: Optional[Tensor],
                      fc2_weight: Tensor, fc2_bias: Optional[Tensor], layer: int, need: int,
                      once: bool) -> List[Tensor]:
    """[dx, dln_weight, dln_bias, dfc1_weight, dfc1_bias, dfc2_weight, dfc2_bias]."""
    m = rt.module_of(layer)
    return _backward(m, dy, residuals,
                     (x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias),
                     _mlp_specs(m, dy, need), once, ll.layernorm_mlp_backward_from)


@layernorm_mlp_bwd.register_fake
def _mlp_bwd_fake(dy, residuals, x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight,
                  fc2_bias, layer, need, once):
    return _fake_grads(_mlp_specs(rt.module_of(layer), dy, need), dy)


def _mlp_setup(ctx, inputs, output):
    _setup(ctx, inputs, output, 7)


def _mlp_backward(ctx, dy, _dres):
    res, *inputs = ctx.saved_tensors
    need = _need(ctx, range(7))
    grads = layernorm_mlp_bwd(dy.contiguous(), res, *inputs, ctx.layer, need, ctx.once)
    return tuple(g if need & (1 << i) else None for i, g in enumerate(grads)) + (None,) * 4


layernorm_mlp_fwd.register_autograd(_mlp_backward, setup_context=_mlp_setup)


# ---- modules -----------------------------------------------------------------------------------

def _dtype_of(params_dtype, name):
    dtype = params_dtype if params_dtype is not None else torch.get_default_dtype()
    if dtype not in rt.DTYPES:
        raise InvalidArgument("libte.torch.%s: argument 'params_dtype': expected torch.float32, "
                              "torch.float16 or torch.bfloat16, got %s" % (name, dtype))
    return dtype


def _positive(name, module, **values):
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgument("libte.torch.%s: argument '%s': expected a positive int, got %r"
                                  % (module, k, v))


class _NormModule(TEModule):
    def _norm_params(self, features, normalization, eps, zero_centered_gamma, dtype, device):
        self._norm = norm_code(normalization)
        self.normalization = "LayerNorm" if self._norm == C.NORM_LAYERNORM else "RMSNorm"
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.layer_norm_weight = torch.nn.Parameter(torch.empty(features, dtype=dtype,
                                                                device=device))
        if self._norm == C.NORM_LAYERNORM:
            self.layer_norm_bias = torch.nn.Parameter(torch.empty(features, dtype=dtype,
                                                                  device=device))
        else:
            self.register_parameter("layer_norm_bias", None)

    def _reset_norm(self):
        if self.zero_centered_gamma:
            self.layer_norm_weight.zero_()
        else:
            self.layer_norm_weight.fill_(1.0)
        if self.layer_norm_bias is not None:
            self.layer_norm_bias.zero_()

    @property
    def _dtype(self):
        return self.layer_norm_weight.dtype


class LayerNormLinear(_NormModule):
    """y = norm(x) W^T + b (TE's te.pytorch.LayerNormLinear): a LayerNorm ('LayerNorm') or
    RMSNorm ('RMSNorm') over in_features, then a linear layer, in FP8 inside autocast (the norm
    writes the GEMM's FP8 input). Parameters: layer_norm_weight (gamma; ones, or zeros with
    zero_centered_gamma), layer_norm_bias (beta, LayerNorm only; zeros), weight (init_method,
    default normal std 0.023), bias (zeros)."""

    _KIND = KIND_LAYERNORM_LINEAR
    _NAME = "LayerNormLinear"

    def __init__(self, in_features, out_features, eps=1e-5, bias=True,
                 normalization="LayerNorm", zero_centered_gamma=False, params_dtype=None,
                 device=None, init_method=None):
        super().__init__()
        _positive(self._NAME, self._NAME, in_features=in_features, out_features=out_features)
        dtype = _dtype_of(params_dtype, self._NAME)
        self.in_features, self.out_features = in_features, out_features
        self._features_in, self._features_out = in_features, out_features
        self.use_bias = bool(bias)
        self._norm_params(in_features, normalization, eps, zero_centered_gamma, dtype, device)
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
            self._reset_norm()
            (self.init_method or default_init)(self.weight)
            if self.bias is not None:
                self.bias.zero_()

    def _create(self, ctx, dtype_name):
        return _CLayerNormLinear(ctx, self.in_features, self.out_features, bias=self.use_bias,
                                 dtype=dtype_name, normalization=self.normalization.lower(),
                                 eps=self.eps, zero_centered_gamma=self.zero_centered_gamma)

    def forward(self, input, is_first_microbatch=None):
        x = input if input.is_contiguous() else input.contiguous()
        t = rt.TLS
        y, _ = layernorm_linear_fwd(x, self.layer_norm_weight, self.layer_norm_bias, self.weight,
                                    self.bias, self._te_key, t.mode,
                                    is_first_microbatch is False, t.retain)
        return y

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s, normalization=%s" % (
            self.in_features, self.out_features, self.use_bias, self.normalization)


class LayerNormMLP(_NormModule):
    """y = fc2(act(fc1(norm(x)))) (TE's te.pytorch.LayerNormMLP). activation: 'gelu' (tanh
    approximation, TE's default), 'relu', 'srelu', 'swiglu', 'geglu' (gated: fc1 has 2 *
    ffn_hidden_size rows, gate rows first). Parameters: layer_norm_weight, layer_norm_bias
    (LayerNorm), fc1_weight, fc1_bias, fc2_weight, fc2_bias; init_method initialises fc1,
    output_layer_init_method fc2 (default normal std 0.023), biases zero."""

    _KIND = KIND_LAYERNORM_MLP
    _NAME = "LayerNormMLP"

    def __init__(self, hidden_size, ffn_hidden_size, eps=1e-5, bias=True,
                 normalization="LayerNorm", activation="gelu", init_method=None,
                 output_layer_init_method=None, zero_centered_gamma=False, params_dtype=None,
                 device=None):
        super().__init__()
        _positive(self._NAME, self._NAME, hidden_size=hidden_size,
                  ffn_hidden_size=ffn_hidden_size)
        code = _ACTIVATIONS.get(activation.lower()) if isinstance(activation, str) else None
        if code is None:
            raise InvalidArgument("libte.torch.LayerNormMLP: argument 'activation': expected "
                                  "'gelu', 'relu', 'srelu', 'swiglu' or 'geglu', got %r"
                                  % (activation,))
        dtype = _dtype_of(params_dtype, self._NAME)
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self._features_in = self._features_out = hidden_size
        self.activation = activation.lower()
        self._fc1_rows = ffn_hidden_size * (2 if code in C.GATED_ACTIVATIONS else 1)
        self.use_bias = bool(bias)
        self._norm_params(hidden_size, normalization, eps, zero_centered_gamma, dtype, device)
        kw = dict(dtype=dtype, device=device)
        self.fc1_weight = torch.nn.Parameter(torch.empty(self._fc1_rows, hidden_size, **kw))
        self.fc2_weight = torch.nn.Parameter(torch.empty(hidden_size, ffn_hidden_size, **kw))
        if bias:
            self.fc1_bias = torch.nn.Parameter(torch.empty(self._fc1_rows, **kw))
            self.fc2_bias = torch.nn.Parameter(torch.empty(hidden_size, **kw))
        else:
            self.register_parameter("fc1_bias", None)
            self.register_parameter("fc2_bias", None)
        self.init_method = init_method
        self.output_layer_init_method = output_layer_init_method
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self._reset_norm()
            (self.init_method or default_init)(self.fc1_weight)
            (self.output_layer_init_method or default_init)(self.fc2_weight)
            if self.fc1_bias is not None:
                self.fc1_bias.zero_()
                self.fc2_bias.zero_()

    def _create(self, ctx, dtype_name):
        return _CLayerNormMLP(ctx, self.hidden_size, self.ffn_hidden_size, bias=self.use_bias,
                              activation=self.activation, dtype=dtype_name,
                              normalization=self.normalization.lower(), eps=self.eps,
                              zero_centered_gamma=self.zero_centered_gamma)

    def forward(self, input, is_first_microbatch=None):
        x = input if input.is_contiguous() else input.contiguous()
        t = rt.TLS
        y, _ = layernorm_mlp_fwd(x, self.layer_norm_weight, self.layer_norm_bias,
                                 self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias,
                                 self._te_key, t.mode, is_first_microbatch is False, t.retain)
        return y

    def extra_repr(self):
        return "hidden_size=%d, ffn_hidden_size=%d, activation=%s, normalization=%s" % (
            self.hidden_size, self.ffn_hidden_size, self.activation, self.normalization)
