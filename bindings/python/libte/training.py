"""Training-step ops over libte's C API: the token embedding, a fused softmax cross-entropy, and
a fused multi-tensor AdamW that also refreshes the modules' FP8 weight caches."""

import collections
import numbers

import numpy as np

from . import _constants as C
from ._arrays import adapt
from ._lowlevel import ll
from .errors import InvalidArgument
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .tensor import Float8Tensor, as_input, check_context, follow_streams, new_output, one_float

__all__ = ["embedding_forward", "embedding_backward", "cross_entropy", "AdamW", "AdamWParam"]


def _hp(ctx, x, name, writable=False):
    if isinstance(x, Float8Tensor):
        raise InvalidArgument("argument '%s': expected a float32, float16 or bfloat16 array, "
                              "got a Float8Tensor" % name)
    return as_input(ctx, x, name, writable)


def _ids(ctx, ids, name, what):
    return adapt(ids, name, device=ctx.device, stream=ctx._stream, index=what)


def embedding_forward(ctx, table, ids, out=None):
    """y[t, :] = table[ids[t], :]: table float32/float16/bfloat16 [vocab, dim], ids int32 of
    any shape; out (table's dtype) defaults to a new NumPy array of ids.shape + (dim,). An id
    outside [0, vocab) is refused on the CPU (InvalidArgument naming the position); CUDA writes
    that row as zeros. Returns out."""
    h = check_context(ctx)
    a_t = _hp(ctx, table, "table")
    a_ids = _ids(ctx, ids, "ids", "token ids")
    if out is None:
        out = new_output((a_t, a_ids), tuple(a_ids.desc[2]) + (a_t.desc[2][-1],), a_t.desc[1],
                         "out")
    a_y = _hp(ctx, out, "out", writable=True)
    follow_streams(ctx, a_t, a_ids, a_y)
    ll.embedding_forward(h, a_t.desc, a_ids.desc, a_y.desc)
    return out


def embedding_backward(ctx, ids, dy, dtable, accumulate=False):
    """The embedding's gradient, a scatter-add dtable[ids[t], :] += dy[t, :]: dtable float32
    [vocab, dim] is zeroed first unless accumulate=True (a tied LM head's dW already in it);
    dy float32/float16/bfloat16 with last dimension dim. Deterministic (each row sums its
    tokens in increasing t, in fp32). Returns dtable."""
    h = check_context(ctx)
    a_ids = _ids(ctx, ids, "ids", "token ids")
    a_dy = _hp(ctx, dy, "dy")
    a_dt = _hp(ctx, dtable, "dtable", writable=True)
    follow_streams(ctx, a_ids, a_dy, a_dt)
    ll.embedding_backward(h, a_ids.desc, a_dy.desc, a_dt.desc, bool(accumulate))
    return dtable


def cross_entropy(ctx, logits, targets, loss_out=None, dlogits=None, ignore_index=-100,
                  grad_scale=1.0):
    """Softmax cross-entropy over the last dimension, the mean over the tokens whose target is
    not ignore_index, and in the same pass its gradient
    dlogits = grad_scale * (softmax(logits) - onehot(target)) / count (zero rows for ignored
    tokens). logits float32/float16/bfloat16 [..., vocab]; targets int32, one per row;
    loss_out a float32 one-element array on the context's device (a new NumPy one when None);
    dlogits None (loss only), an array of logits' dtype and shape (may be logits itself: in
    place), or True (a new NumPy array). Returns (loss_out, dlogits)."""
    h = check_context(ctx)
    a_l = _hp(ctx, logits, "logits")
    a_t = _ids(ctx, targets, "targets", "target ids")
    if loss_out is None:
        loss_out = new_output((a_l, a_t), (1,), C.DTYPE_F32, "loss_out")
    a_loss = one_float(ctx, loss_out, "loss_out", True)
    if dlogits is True:
        dlogits = new_output((a_l,), tuple(a_l.desc[2]), a_l.desc[1], "dlogits")
    elif dlogits is False:
        dlogits = None
    a_d = _hp(ctx, dlogits, "dlogits", writable=True) if dlogits is not None else None
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise InvalidArgument("argument 'ignore_index': expected an int, got %r"
                              % (ignore_index,))
    if not isinstance(grad_scale, numbers.Real) or isinstance(grad_scale, bool):
        raise InvalidArgument("argument 'grad_scale': expected a number, got %r" % (grad_scale,))
    follow_streams(ctx, a_l, a_t, a_loss, a_d)
    ll.cross_entropy(h, int(ignore_index), float(grad_scale), a_l.desc, a_t.desc, a_loss.desc,
                     a_d.desc if a_d is not None else None)
    return loss_out, dlogits


# ---- AdamW -------------------------------------------------------------------------------------

AdamWParam = collections.namedtuple(
    "AdamWParam", "param grad exp_avg exp_avg_sq model_weight weight_decay owner owner_gemm")
AdamWParam.__doc__ = """One parameter of an AdamW step (see AdamW.add_param)."""

_GEMMS = {"fc1": C.MLP_FC1, "fc2": C.MLP_FC2}


def _owner(owner, owner_gemm, index):
    """(owner_kind, handle, owner_gemm) for te_adamw_param, from a libte module object."""
    name = "params[%d].owner" % index
    if owner is None:
        if owner_gemm is not None:
            raise InvalidArgument("argument 'params[%d].owner_gemm': only a LayerNormMLP owner "
                                  "has GEMMs, got no owner" % index)
        return C.MODULE_NONE, None, 0
    if isinstance(owner, LayerNormMLP):
        gemm = _GEMMS.get(owner_gemm.lower()) if isinstance(owner_gemm, str) else (
            owner_gemm if owner_gemm in (C.MLP_FC1, C.MLP_FC2) and
            not isinstance(owner_gemm, bool) else None)
        if gemm is None:
            raise InvalidArgument("argument 'params[%d].owner_gemm': a LayerNormMLP owner needs "
                                  "'fc1' or 'fc2', got %r" % (index, owner_gemm))
        return C.MODULE_LAYERNORM_MLP, owner._handles()[1], gemm
    if owner_gemm is not None:
        raise InvalidArgument("argument 'params[%d].owner_gemm': only a LayerNormMLP owner has "
                              "GEMMs, got %s" % (index, type(owner).__name__))
    if isinstance(owner, Linear):
        return C.MODULE_LINEAR, owner._handles()[1], 0
    if isinstance(owner, LayerNormLinear):
        return C.MODULE_LAYERNORM_LINEAR, owner._handles()[1], 0
    raise InvalidArgument("argument '%s': expected a libte.Linear, LayerNormLinear or "
                          "LayerNormMLP, got %s" % (name, type(owner).__name__))


class AdamW:
    """Fused multi-tensor AdamW (torch.optim.AdamW's formulas, fp32), one te_adamw_step per
    step() for the whole list:

        g = grad * clip;  p -= lr * weight_decay * p  (params with weight_decay=True)
        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
        p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)

    then model_weight (when given) = p rounded to its dtype. clip is
    min(1, max_grad_norm / (norm + 1e-6)) with the global L2 norm of all the gradients when
    max_grad_norm > 0 (a non-finite norm skips the whole update). A param whose owner is a
    libte.Linear / LayerNormLinear / LayerNormMLP (+ owner_gemm 'fc1' or 'fc2') has that
    module's FP8 weight cache re-quantized from the new weight, so that its next forward with
    weight_unchanged=True casts nothing.

    Options left None take the library's defaults (te_adamw_options_init: lr 1e-3, betas
    (0.9, 0.999), eps 1e-8, weight_decay 0.01, max_grad_norm 0: off).
    """

    def __init__(self, params=(), *, lr=None, betas=None, eps=None, weight_decay=None,
                 max_grad_norm=None):
        self.lr = lr
        self.betas = tuple(betas) if betas is not None else None
        self.eps = eps
        self.weight_decay = weight_decay
        self.max_grad_norm = max_grad_norm
        self.params = []
        for p in params:
            if isinstance(p, dict):
                self.add_param(**p)
            else:
                self.add_param(*p)

    def add_param(self, param, grad, exp_avg=None, exp_avg_sq=None, model_weight=None,
                  weight_decay=True, owner=None, owner_gemm=None):
        """Adds one parameter: param float32 master weights (updated in place), grad float32/
        float16/bfloat16, exp_avg and exp_avg_sq float32 moments (new zeroed NumPy arrays for
        a NumPy param when None), model_weight an optional float32/float16/bfloat16 copy of
        the new param written in the same pass, weight_decay False for norms and biases, owner
        the module whose weight this is (a LayerNormMLP needs owner_gemm 'fc1' or 'fc2'; a
        (module, gemm) tuple also works). Returns the AdamWParam."""
        if isinstance(owner, tuple) and len(owner) == 2 and owner_gemm is None:
            owner, owner_gemm = owner
        for name, moment in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
            if moment is None and not isinstance(param, np.ndarray):
                raise InvalidArgument("argument '%s': pass it for a device param: libte "
                                      "allocates moments only for NumPy params" % name)
        if exp_avg is None:
            exp_avg = np.zeros(param.shape, np.float32)
        if exp_avg_sq is None:
            exp_avg_sq = np.zeros(param.shape, np.float32)
        _owner(owner, owner_gemm, len(self.params))  # refuse a bad owner now, not at step()
        entry = AdamWParam(param, grad, exp_avg, exp_avg_sq, model_weight, bool(weight_decay),
                           owner, owner_gemm)
        self.params.append(entry)
        return entry

    def options(self, step_number=1, lr=None):
        """The te_adamw_options of a step, as a dict (library defaults filled in)."""
        o = ll.adamw_defaults()
        lr = lr if lr is not None else self.lr
        if lr is not None:
            o["lr"] = lr
        if self.betas is not None:
            if len(self.betas) != 2:
                raise InvalidArgument("argument 'betas': expected (beta1, beta2), got %r"
                                      % (self.betas,))
            o["beta1"], o["beta2"] = self.betas
        for name in ("eps", "weight_decay", "max_grad_norm"):
            value = getattr(self, name)
            if value is not None:
                o[name] = value
        for name in ("lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm"):
            v = o[name]
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise InvalidArgument("argument '%s': expected a number, got %r" % (name, v))
            o[name] = float(v)
        if not isinstance(step_number, numbers.Integral) or isinstance(step_number, bool):
            raise InvalidArgument("argument 'step_number': expected an int (1-based), got %r"
                                  % (step_number,))
        o["step"] = int(step_number)
        return o

    def step(self, ctx, step_number, lr=None, *, grad_norm=None):
        """One fused update of every param (te_adamw_step). step_number: this update's
        1-based number (bias corrections); lr overrides the optimizer's for this step.
        grad_norm: a float32 one-element array on the context's device that receives the
        global gradient norm, or True (CPU contexts: returned as a float). Returns grad_norm
        (None when not asked)."""
        h = check_context(ctx)
        opts = self.options(step_number, lr)
        want_float = grad_norm is True
        if want_float:
            grad_norm = np.zeros(1, np.float32)
        a_norm = one_float(ctx, grad_norm, "grad_norm", True) if grad_norm is not None else None
        entries, adapted = [], [a_norm]
        for i, p in enumerate(self.params):
            a_p = _hp(ctx, p.param, "params[%d].param" % i, writable=True)
            a_g = _hp(ctx, p.grad, "params[%d].grad" % i)
            a_m = _hp(ctx, p.exp_avg, "params[%d].exp_avg" % i, writable=True)
            a_v = _hp(ctx, p.exp_avg_sq, "params[%d].exp_avg_sq" % i, writable=True)
            a_w = _hp(ctx, p.model_weight, "params[%d].model_weight" % i, writable=True) \
                if p.model_weight is not None else None
            kind, handle, gemm = _owner(p.owner, p.owner_gemm, i)
            adapted += [a_p, a_g, a_m, a_v, a_w]
            entries.append((a_p.desc, a_g.desc, a_m.desc, a_v.desc,
                            a_w.desc if a_w is not None else None, 1 if p.weight_decay else 0,
                            kind, handle, gemm))
        follow_streams(ctx, *adapted)
        ll.adamw_step(h, opts, a_norm.desc[0] if a_norm is not None else 0, entries)
        if want_float:
            return float(grad_norm[0])
        return grad_norm

    def __len__(self):
        return len(self.params)

    def __repr__(self):
        return "<libte.AdamW %d params lr=%s>" % (len(self.params), self.lr)
