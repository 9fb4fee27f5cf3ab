"""LayerNormMLP: y = fc2(act(fc1(norm(x)))) (TE's LayerNormMLP, the feed-forward block), with
te_linear's split forward and repeatable backward.

    m = libte.LayerNormMLP(ctx, 64, 256, activation="swiglu")   # fc1 weight [2 * 256, 64]
    with libte.autocast(ctx, recipe=recipe):
        y, bwd = m.forward(x, gamma, beta, w1, b1, w2, b2)
    g = bwd.backward(dy)             # g.dx, g.dln_weight, ..., g.dfc2_bias
"""

from . import _constants as C
from ._arrays import te_dtype
from ._lowlevel import ll
from ._module import (Module, ModuleBackwardContext, ModuleResiduals, gradients_type,
                      norm_code, real)
from .errors import InvalidArgument
from .linear import _positive
from .tensor import as_input, check_context, follow_streams

__all__ = ["LayerNormMLP", "LayerNormMLPResiduals", "LayerNormMLPBackwardContext",
           "LayerNormMLPGradients"]

_ACTIVATIONS = {"relu": C.ACTIVATION_RELU, "gelu": C.ACTIVATION_GELU,
                "swiglu": C.ACTIVATION_SWIGLU, "geglu": C.ACTIVATION_GEGLU,
                "srelu": C.ACTIVATION_SRELU}
_ACTIVATION_NAMES = {code: name for name, code in _ACTIVATIONS.items()}
_GEMMS = {"fc1": C.MLP_FC1, "fc2": C.MLP_FC2}

LayerNormMLPGradients = gradients_type(
    "LayerNormMLPGradients", "dx dln_weight dln_bias dfc1_weight dfc1_bias dfc2_weight dfc2_bias",
    """LayerNormMLP's backward results: dx [..., hidden], dln_weight and dln_bias [hidden]
    (dln_bias None for RMSNorm), dfc1_weight / dfc1_bias and dfc2_weight / dfc2_bias shaped as
    the parameters (biases None without bias); None for each one skipped.""")

_TENSORS = ("ln_out_t", "fc1_weight_t", "fc1_out", "act_out_t", "fc2_weight_t", "mu", "rsigma")


class LayerNormMLPResiduals(ModuleResiduals):
    """What LayerNormMLP's backward needs (host copies through the properties): ln_out_t
    (FP8: norm(x)^T; else norm(x)), fc1_weight_t, fc1_out (fc1's output, the activation's input,
    in the activation dtype), act_out_t (FP8: act(fc1_out)^T [ffn, tokens]; else act(fc1_out)),
    fc2_weight_t, mu (LayerNorm) and rsigma."""


class LayerNormMLPBackwardContext(ModuleBackwardContext):
    """A LayerNormMLP forward's saved context."""

    def backward(self, dy, *, dx=None, dln_weight=None, dln_bias=None, dfc1_weight=None,
                 dfc1_bias=None, dfc2_weight=None, dfc2_bias=None, once=False):
        """From dy [..., hidden], every gradient of the block. Each: None for a new array,
        False to skip it, or an array to write into; with fuse_wgrad_accumulation dfc1_weight
        and dfc2_weight must be your float32 main_grads, which the wgrads are added into.
        once=True frees the residuals on return. Returns LayerNormMLPGradients."""
        m = self._module
        wdtype = C.DTYPE_F32 if m.fuse_wgrad_accumulation else m._dtype
        hidden = (m.hidden_size,)
        (h_ctx, h), a_dy, outs = self._gradients(dy, (
            ("dx", dx, (None, m.hidden_size), m._dtype, True, False),
            ("dln_weight", dln_weight, hidden, m._dtype, True, False),
            ("dln_bias", dln_bias, hidden, m._dtype, m._norm == C.NORM_LAYERNORM, False),
            ("dfc1_weight", dfc1_weight, (m.fc1_rows, m.hidden_size), wdtype, True,
             m.fuse_wgrad_accumulation),
            ("dfc1_bias", dfc1_bias, (m.fc1_rows,), m._dtype, m.bias, False),
            ("dfc2_weight", dfc2_weight, (m.hidden_size, m.ffn_hidden_size), wdtype, True,
             m.fuse_wgrad_accumulation),
            ("dfc2_bias", dfc2_bias, hidden, m._dtype, m.bias, False)))
        follow_streams(m._ctx, a_dy, *(a for _, a in outs))
        ll.layernorm_mlp_backward(h_ctx, h, a_dy.desc,
                                  *(a.desc if a is not None else None for _, a in outs), once)
        if once:
            self._consumed = True
        return LayerNormMLPGradients(*(arr for arr, _ in outs))


for _name in _TENSORS:
    for _cls in (LayerNormMLPResiduals, LayerNormMLPBackwardContext):
        setattr(_cls, _name, property(lambda self, n=_name: self._tensor(n)))
del _name, _cls


class LayerNormMLP(Module):
    """The FP8 state of a norm, fc1, an activation and fc2. Parameters stay yours: ln_weight
    (gamma) and ln_bias (beta, LayerNorm only) [hidden_size], fc1_weight [ffn_hidden_size,
    hidden_size] ([2 * ffn_hidden_size, hidden_size] for the gated 'swiglu' and 'geglu', gate
    rows first) and fc1_bias, fc2_weight [hidden_size, ffn_hidden_size] and fc2_bias.

    activation  'gelu' (default, tanh approximation) | 'relu' | 'srelu' | 'swiglu' | 'geglu'
    """

    _LL = "layernorm_mlp"
    _Residuals = LayerNormMLPResiduals
    _Backward = LayerNormMLPBackwardContext

    def __init__(self, ctx, hidden_size, ffn_hidden_size, bias=True, activation="gelu",
                 dtype="float32", fuse_wgrad_accumulation=False, normalization="layernorm",
                 eps=1e-5, zero_centered_gamma=False):
        h_ctx = check_context(ctx)
        self.hidden_size = _positive(hidden_size, "hidden_size")
        self.ffn_hidden_size = _positive(ffn_hidden_size, "ffn_hidden_size")
        self.bias = bool(bias)
        code = _ACTIVATIONS.get(activation.lower()) if isinstance(activation, str) else None
        if code is None:
            raise InvalidArgument("argument 'activation': expected 'gelu', 'relu', 'srelu', "
                                  "'swiglu' or 'geglu', got %r" % (activation,))
        self._activation = code
        self._dtype = te_dtype(dtype)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self._norm = norm_code(normalization)
        self.eps = real(eps, "eps")
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self._own(ctx, ll.layernorm_mlp_create(
            h_ctx, self.hidden_size, self.ffn_hidden_size, self.bias, self._activation,
            self._dtype, self.fuse_wgrad_accumulation, self._norm, self.eps,
            self.zero_centered_gamma))

    @property
    def activation(self):
        return _ACTIVATION_NAMES[self._activation]

    @property
    def normalization(self):
        return "layernorm" if self._norm == C.NORM_LAYERNORM else "rmsnorm"

    @property
    def fc1_rows(self):
        """fc1's output features: ffn_hidden_size, twice that for a gated activation."""
        gated = self._activation in C.GATED_ACTIVATIONS
        return self.ffn_hidden_size * (2 if gated else 1)

    def _operands(self, x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, out,
                  ln_out):
        ctx = self._ctx
        named = (("x", x), ("ln_weight", ln_weight), ("ln_bias", ln_bias),
                 ("fc1_weight", fc1_weight), ("fc1_bias", fc1_bias),
                 ("fc2_weight", fc2_weight), ("fc2_bias", fc2_bias))
        inputs = tuple(as_input(ctx, v, n) if v is not None else None for n, v in named)
        a_x = inputs[0]
        lead = tuple(a_x.desc[2][:-1])
        out, a_y = self._output(out, inputs, lead + (self.hidden_size,), "out")
        a_ln = None
        if ln_out is True:
            ln_out = None
        elif ln_out is None or ln_out is False:
            ln_out = False
        if ln_out is not False:
            ln_out, a_ln = self._output(ln_out, inputs, tuple(a_x.desc[2]), "ln_out")
        follow_streams(ctx, *inputs, a_y, a_ln)
        descs = tuple(a.desc if a is not None else None for a in inputs)
        keep = tuple(a.keep for a in inputs if a is not None)
        return descs, (out, a_y), (ln_out, a_ln), keep

    def forward_compute(self, x, ln_weight, ln_bias, fc1_weight, fc1_bias=None, fc2_weight=None,
                        fc2_bias=None, *, weight_unchanged=False, out=None, ln_out=None):
        """Pure compute: y = fc2(act(fc1(norm(x)))), in FP8 inside an enabled autocast scope.
        ln_bias is None for RMSNorm, the biases None without bias. Returns
        (y, LayerNormMLPResiduals), or (y, ln_out, residuals) when ln_out is asked for (True
        or an array [..., hidden]). weight_unchanged=True reuses both cached FP8 weights."""
        h_ctx, h = self._handles()
        descs, (out, a_y), (ln_out, a_ln), keep = self._operands(
            x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, out, ln_out)
        res = ll.layernorm_mlp_forward_compute(h_ctx, h, *descs, weight_unchanged,
                                               a_ln.desc if a_ln else None, a_y.desc)
        got = ll.layernorm_mlp_residuals_tensors(res)
        residuals = self._residuals(res, dict(zip(_TENSORS, got[:-1])), got[-1], keep)
        return (out, residuals) if a_ln is None else (out, ln_out, residuals)

    def forward(self, x, ln_weight, ln_bias, fc1_weight, fc1_bias=None, fc2_weight=None,
                fc2_bias=None, *, weight_unchanged=False, out=None, ln_out=None):
        """forward_compute + forward_save: (y, LayerNormMLPBackwardContext), or
        (y, ln_out, backward context) when ln_out is asked for."""
        h_ctx, h = self._handles()
        descs, (out, a_y), (ln_out, a_ln), keep = self._operands(
            x, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, out, ln_out)
        ptr = ll.layernorm_mlp_forward(h_ctx, h, *descs, weight_unchanged,
                                       a_ln.desc if a_ln else None, a_y.desc)
        bwd = self._backward_context(ptr, keep)
        return (out, bwd) if a_ln is None else (out, ln_out, bwd)

    def scaling_state(self, role, gemm="fc1", history=True):
        """The scaling state of GEMM 'fc1' or 'fc2' for role 'input', 'weight' or
        'grad_output'."""
        code = _GEMMS.get(gemm) if isinstance(gemm, str) else None
        if code is None:
            raise InvalidArgument("argument 'gemm': expected 'fc1' or 'fc2', got %r" % (gemm,))
        return self._scaling_state((code,), role, history)

    def __repr__(self):
        return "<libte.LayerNormMLP hidden=%d ffn=%d %s bias=%s %s dtype=%s%s>" % (
            self.hidden_size, self.ffn_hidden_size, self.activation, self.bias,
            self.normalization, self.dtype, " closed" if self.closed else "")
