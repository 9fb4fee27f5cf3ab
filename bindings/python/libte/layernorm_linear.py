"""LayerNormLinear: y = norm(x) W^T + b (TE's LayerNormLinear, e.g. a QKV projection), with
te_linear's split forward and repeatable backward.

    m = libte.LayerNormLinear(ctx, 64, 192)                  # LayerNorm, bias, float32
    with libte.autocast(ctx, recipe=recipe):
        y, bwd = m.forward(x, gamma, beta, w, b)              # FP8 inside the scope
    dx, dgamma, dbeta, dw, db = bwd.backward(dy)
"""

from . import _constants as C
from ._arrays import te_dtype
from ._lowlevel import ll
from ._module import (Module, ModuleBackwardContext, ModuleResiduals, gradients_type,
                      norm_code, real)
from .linear import _positive
from .tensor import as_input, check_context, follow_streams

__all__ = ["LayerNormLinear", "LayerNormLinearResiduals", "LayerNormLinearBackwardContext",
           "LayerNormLinearGradients"]

LayerNormLinearGradients = gradients_type(
    "LayerNormLinearGradients", "dx dln_weight dln_bias dw db",
    """LayerNormLinear's backward results: dx [..., in] (through the norm), dln_weight and
    dln_bias [in] (gamma's and beta's; dln_bias None for RMSNorm), dw [out, in], db [out] (None
    without bias); None for each one skipped.""")


class LayerNormLinearResiduals(ModuleResiduals):
    """What LayerNormLinear's backward needs (host copies through the properties):
    ln_out_t (FP8: norm(x)^T [in, tokens] as a Float8Tensor; else norm(x) [tokens, in]),
    weight_t (FP8: W^T [in, out]; else W), mu (LayerNorm) and rsigma, float32 [tokens]."""

    ln_out_t = property(lambda self: self._tensor("ln_out_t"))
    weight_t = property(lambda self: self._tensor("weight_t"))
    mu = property(lambda self: self._tensor("mu"))
    rsigma = property(lambda self: self._tensor("rsigma"))


class LayerNormLinearBackwardContext(ModuleBackwardContext):
    """A LayerNormLinear forward's saved context (residuals as LayerNormLinearResiduals'
    properties, when it came from forward_save)."""

    ln_out_t = property(lambda self: self._tensor("ln_out_t"))
    weight_t = property(lambda self: self._tensor("weight_t"))
    mu = property(lambda self: self._tensor("mu"))
    rsigma = property(lambda self: self._tensor("rsigma"))

    def backward(self, dy, *, dx=None, dln_weight=None, dln_bias=None, dw=None, db=None,
                 once=False):
        """From dy [..., out]: dx [..., in] through the norm, dln_weight (dgamma), dln_bias
        (dbeta, LayerNorm), dw = dy^T norm(x), db = sum of dy over tokens. Each: None for a new
        array, False to skip it, or an array to write into; with fuse_wgrad_accumulation dw
        must be your float32 main_grad, which dW is added into. once=True frees the residuals
        on return (later calls raise InvalidState). Returns LayerNormLinearGradients."""
        m = self._module
        hidden = (m.in_features,)
        (h_ctx, h), a_dy, outs = self._gradients(dy, (
            ("dx", dx, (None, m.in_features), m._dtype, True, False),
            ("dln_weight", dln_weight, hidden, m._dtype, True, False),
            ("dln_bias", dln_bias, hidden, m._dtype, m._norm == C.NORM_LAYERNORM, False),
            ("dw", dw, (m.out_features, m.in_features),
             C.DTYPE_F32 if m.fuse_wgrad_accumulation else m._dtype, True,
             m.fuse_wgrad_accumulation),
            ("db", db, (m.out_features,), m._dtype, m.bias, False)))
        follow_streams(m._ctx, a_dy, *(a for _, a in outs))
        ll.layernorm_linear_backward(h_ctx, h, a_dy.desc,
                                     *(a.desc if a is not None else None for _, a in outs),
                                     once)
        if once:
            self._consumed = True
        return LayerNormLinearGradients(*(arr for arr, _ in outs))


class LayerNormLinear(Module):
    """The FP8 state of a LayerNorm (or RMSNorm) followed by a linear layer. Parameters stay
    yours: ln_weight (gamma) and ln_bias (beta, LayerNorm only) [in_features], weight
    [out_features, in_features] and bias [out_features], passed to every forward.

    dtype                 activation dtype of x, the parameters, y and the gradients
    normalization         'layernorm' | 'rmsnorm'; eps; zero_centered_gamma (scale by 1 + gamma)
    fuse_wgrad_accumulation   backward adds dW into your float32 main_grad
    """

    _LL = "layernorm_linear"
    _Residuals = LayerNormLinearResiduals
    _Backward = LayerNormLinearBackwardContext

    def __init__(self, ctx, in_features, out_features, bias=True, dtype="float32",
                 fuse_wgrad_accumulation=False, normalization="layernorm", eps=1e-5,
                 zero_centered_gamma=False):
        h_ctx = check_context(ctx)
        self.in_features = _positive(in_features, "in_features")
        self.out_features = _positive(out_features, "out_features")
        self.bias = bool(bias)
        self._dtype = te_dtype(dtype)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self._norm = norm_code(normalization)
        self.eps = real(eps, "eps")
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self._own(ctx, ll.layernorm_linear_create(
            h_ctx, self.in_features, self.out_features, self.bias, self._dtype,
            self.fuse_wgrad_accumulation, self._norm, self.eps, self.zero_centered_gamma))

    @property
    def normalization(self):
        return "layernorm" if self._norm == C.NORM_LAYERNORM else "rmsnorm"

    def _operands(self, x, ln_weight, ln_bias, weight, bias, out, ln_out):
        ctx = self._ctx
        a_x = as_input(ctx, x, "x")
        a_g = as_input(ctx, ln_weight, "ln_weight")
        a_beta = as_input(ctx, ln_bias, "ln_bias") if ln_bias is not None else None
        a_w = as_input(ctx, weight, "weight")
        a_b = as_input(ctx, bias, "bias") if bias is not None else None
        inputs = (a_x, a_g, a_beta, a_w, a_b)
        lead = tuple(a_x.desc[2][:-1])
        out, a_y = self._output(out, inputs, lead + (self.out_features,), "out")
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

    def forward_compute(self, x, ln_weight, ln_bias, weight, bias=None, *,
                        weight_unchanged=False, out=None, ln_out=None):
        """Pure compute: y = norm(x) W^T (+ b), in FP8 inside an enabled autocast scope (the
        norm then writes the GEMM's FP8 input). ln_bias is None for RMSNorm. Returns
        (y, LayerNormLinearResiduals), or (y, ln_out, residuals) when ln_out is asked for
        (True for a new array, or an array [..., in] to write norm(x) into: TE's
        return_layernorm_output). weight_unchanged=True reuses the cached FP8 weight."""
        h_ctx, h = self._handles()
        descs, (out, a_y), (ln_out, a_ln), keep = self._operands(x, ln_weight, ln_bias, weight,
                                                                 bias, out, ln_out)
        res = ll.layernorm_linear_forward_compute(h_ctx, h, *descs, weight_unchanged,
                                                  a_ln.desc if a_ln else None, a_y.desc)
        ln_t, w_t, mu, rsigma, fp8 = ll.layernorm_linear_residuals_tensors(res)
        residuals = self._residuals(res, {"ln_out_t": ln_t, "weight_t": w_t, "mu": mu,
                                          "rsigma": rsigma}, fp8, keep)
        return (out, residuals) if a_ln is None else (out, ln_out, residuals)

    def forward(self, x, ln_weight, ln_bias, weight, bias=None, *, weight_unchanged=False,
                out=None, ln_out=None):
        """forward_compute + forward_save: (y, LayerNormLinearBackwardContext), or
        (y, ln_out, backward context) when ln_out is asked for."""
        h_ctx, h = self._handles()
        descs, (out, a_y), (ln_out, a_ln), keep = self._operands(x, ln_weight, ln_bias, weight,
                                                                 bias, out, ln_out)
        ptr = ll.layernorm_linear_forward(h_ctx, h, *descs, weight_unchanged,
                                          a_ln.desc if a_ln else None, a_y.desc)
        bwd = self._backward_context(ptr, keep)
        return (out, bwd) if a_ln is None else (out, ln_out, bwd)

    def scaling_state(self, role, history=True):
        """The GEMM's scaling state for role 'input' (the norm's FP8 output), 'weight' or
        'grad_output'."""
        return self._scaling_state((), role, history)

    def __repr__(self):
        return "<libte.LayerNormLinear in=%d out=%d bias=%s %s dtype=%s%s>" % (
            self.in_features, self.out_features, self.bias, self.normalization, self.dtype,
            " closed" if self.closed else "")
