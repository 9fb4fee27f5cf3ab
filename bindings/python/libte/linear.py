"""Linear: an FP8 linear layer's state, with forward split as TE splits _Linear
(forward_compute -> Residuals, forward_save -> BackwardContext) and a repeatable backward."""

import numbers

import numpy as np

from . import _constants as C
from ._arrays import host_copy, host_floats, te_dtype
from ._handle import NativeHandle, closed_error
from ._lowlevel import ll
from .errors import InvalidArgument, InvalidState
from .tensor import Float8Tensor, as_input, check_context, follow_streams, new_output

__all__ = ["Linear", "Residuals", "BackwardContext", "ScalingState"]

_ROLES = {"input": C.ROLE_INPUT, "weight": C.ROLE_WEIGHT, "grad_output": C.ROLE_GRAD_OUTPUT}


class ScalingState(tuple):
    """One scaling state of a layer: scale, scale_inv, amax_history_len (0 before first FP8
    use), fp8_dtype name, and the amax history (slot 0 = the current amax) as float32."""
    __slots__ = ()
    scale = property(lambda s: s[0])
    scale_inv = property(lambda s: s[1])
    amax_history_len = property(lambda s: s[2])
    fp8_dtype = property(lambda s: s[3])
    amax_history = property(lambda s: s[4])

    def __repr__(self):
        return ("ScalingState(scale=%r, scale_inv=%r, amax_history_len=%d, fp8_dtype=%r)"
                % (self.scale, self.scale_inv, self.amax_history_len, self.fp8_dtype))


def _residual_copy(desc, name):
    """A host copy of one residual tensor: a Float8Tensor for FP8, else an array."""
    if desc[1] in C.FP8_DTYPES:
        count = ll.tensor_scale_inv_count(desc[1], desc[2], desc[6])
        return Float8Tensor(host_copy(desc, name), host_floats(desc[5], count), desc[1], desc[6])
    return host_copy(desc, name)


class _Saved:
    """What a residuals/backward pair shares: the residual descriptions, and the caller arrays
    they may alias (kept alive until the backward context is gone)."""
    __slots__ = ("input_t", "weight_t", "fp8", "keep")

    def __init__(self, tensors, keep):
        self.input_t, self.weight_t, self.fp8 = tensors
        self.keep = keep


class Residuals:
    """forward_compute's result: the exact tensors backward needs (FP8 x^T and W^T with their
    scale_inv, or x and W after a high-precision forward). Hand it to Linear.forward_save, or
    release() it. input_t / weight_t return host copies."""

    def __init__(self, linear, native, saved):
        self._linear = linear
        self._native = native
        self._saved = saved
        linear._ctx._adopt(self)

    @property
    def closed(self):
        return self._native.ptr is None

    def _check(self):
        if self._native.ptr is None:
            raise InvalidState("Residuals are released or were saved into a BackwardContext")

    @property
    def fp8(self):
        return self._saved.fp8

    @property
    def input_t(self):
        self._check()
        return _residual_copy(self._saved.input_t, "Residuals.input_t")

    @property
    def weight_t(self):
        self._check()
        return _residual_copy(self._saved.weight_t, "Residuals.weight_t")

    def release(self):
        self._native.release()

    close = release

    def __repr__(self):
        return "<libte.Residuals fp8=%s%s>" % (self._saved.fp8, " closed" if self.closed else "")


class BackwardContext:
    """The saved context of one forward: call backward() on it (again and again, until close(),
    unless once=True was given)."""

    def __init__(self, linear, ptr, saved):
        self._linear = linear
        self._native = NativeHandle(ptr, ll.linear_backward_ctx_destroy, linear._ctx._native)
        self._saved = saved
        self._consumed = False
        linear._ctx._adopt(self)

    def _handle(self):
        h = self._native.ptr
        if h is None:
            raise closed_error("BackwardContext")
        return h

    @property
    def closed(self):
        return self._native.ptr is None

    @property
    def fp8(self):
        return self._saved.fp8

    @property
    def input_t(self):
        self._check_residuals()
        return _residual_copy(self._saved.input_t, "BackwardContext.input_t")

    @property
    def weight_t(self):
        self._check_residuals()
        return _residual_copy(self._saved.weight_t, "BackwardContext.weight_t")

    def _check_residuals(self):
        self._handle()
        if self._consumed:
            raise InvalidState("BackwardContext: its residuals were freed by backward(once=True)")
        if self._saved.input_t is None:
            raise InvalidState("BackwardContext: made by Linear.forward, which does not expose "
                               "residuals; use forward_compute + forward_save")

    def backward(self, dy, *, dx=None, dw=None, db=None, once=False):
        """dx = dy W, dw = dy^T x, db = sum of dy over tokens. Each of dx, dw, db: None to get
        a new array, False to skip it, or an array to write into. With fuse_wgrad_accumulation
        dw must be the caller's float32 main_grad, which dW is added into. once=True frees the
        residuals on return (later calls raise InvalidState). Returns (dx, dw, db)."""
        lin = self._linear
        ctx = lin._ctx
        h_ctx = ctx._handle()
        h = self._handle()
        a_dy = as_input(ctx, dy, "dy")
        tokens = tuple(a_dy.desc[2][:-1])
        outs = []
        for name, given, shape, code in (
                ("dx", dx, tokens + (lin.in_features,), lin._dtype),
                ("dw", dw, (lin.out_features, lin.in_features),
                 C.DTYPE_F32 if lin.fuse_wgrad_accumulation else lin._dtype),
                ("db", db, (lin.out_features,), lin._dtype)):
            if given is False or (name == "db" and given is None and not lin.bias):
                outs.append((None, None))
                continue
            if given is None:
                if name == "dw" and lin.fuse_wgrad_accumulation:
                    raise InvalidArgument("argument 'dw': a layer with fuse_wgrad_accumulation "
                                          "needs the float32 main_grad to add dW into")
                given = new_output((a_dy,), shape, code, name)
            outs.append((given, as_input(ctx, given, name, writable=True)))
        follow_streams(ctx, a_dy, *(a for _, a in outs))
        ll.linear_backward(h_ctx, h, a_dy.desc, *(a.desc if a is not None else None
                                                  for _, a in outs), once)
        if once:
            self._consumed = True
        return tuple(arr for arr, _ in outs)

    def close(self):
        self._native.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<libte.BackwardContext fp8=%s%s>" % (self._saved.fp8,
                                                     " closed" if self.closed else "")


def _positive(value, name):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1 \
            or value > 2 ** 62:
        raise InvalidArgument("argument '%s': expected a positive int, got %r" % (name, value))
    return int(value)


class Linear:
    """An FP8 linear layer's state (scaling states, FP8 weight cache) on a context. The
    parameters stay yours: weight [out_features, in_features] and bias [out_features] are
    passed to every forward.

    dtype: the activation dtype of x, W, b, y, dy, dx, dw ('float32', 'bfloat16', 'float16').
    """

    def __init__(self, ctx, in_features, out_features, bias=True, dtype="float32",
                 fuse_wgrad_accumulation=False):
        h_ctx = check_context(ctx)
        self.in_features = _positive(in_features, "in_features")
        self.out_features = _positive(out_features, "out_features")
        self.bias = bool(bias)
        self._dtype = te_dtype(dtype)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self._ctx = ctx
        self._native = NativeHandle(
            ll.linear_create(h_ctx, self.in_features, self.out_features, self.bias, self._dtype,
                             self.fuse_wgrad_accumulation),
            ll.linear_destroy, ctx._native)
        ctx._adopt(self)

    @property
    def dtype(self):
        return C.DTYPE_NAMES[self._dtype]

    @property
    def context(self):
        return self._ctx

    @property
    def closed(self):
        return self._native.ptr is None

    def _handles(self):
        h_ctx = self._ctx._handle()
        h = self._native.ptr
        if h is None:
            raise closed_error("Linear")
        return h_ctx, h

    def _forward_operands(self, x, weight, bias, out):
        ctx = self._ctx
        a_x = as_input(ctx, x, "x")
        a_w = as_input(ctx, weight, "weight")
        a_b = as_input(ctx, bias, "bias") if bias is not None else None
        if out is None:
            out = new_output((a_x, a_w, a_b), tuple(a_x.desc[2][:-1]) + (self.out_features,),
                             self._dtype, "out")
        a_y = as_input(ctx, out, "out", writable=True)
        follow_streams(ctx, a_x, a_w, a_b, a_y)
        return a_x, a_w, a_b, a_y, out

    def forward_compute(self, x, weight, bias=None, *, weight_unchanged=False, out=None):
        """Pure compute: y = x W^T (+ b), in FP8 inside an enabled autocast scope. Returns
        (y, Residuals). weight_unchanged=True reuses the cached FP8 weight (TE's
        is_first_microbatch=False)."""
        h_ctx, h = self._handles()
        a_x, a_w, a_b, a_y, out = self._forward_operands(x, weight, bias, out)
        res = ll.linear_forward_compute(h_ctx, h, a_x.desc, a_w.desc,
                                        a_b.desc if a_b is not None else None,
                                        weight_unchanged, a_y.desc)
        native = NativeHandle(res, ll.residuals_release, self._ctx._native)
        saved = _Saved(ll.residuals_tensors(res), (a_x.keep, a_w.keep))
        return out, Residuals(self, native, saved)

    def forward_save(self, residuals):
        """The context-saving step: packs residuals into a BackwardContext (taking them
        over: the Residuals object is closed afterwards)."""
        if not isinstance(residuals, Residuals):
            raise InvalidArgument("argument 'residuals': expected libte.Residuals, got %s"
                                  % type(residuals).__name__)
        h_ctx, h = self._handles()
        residuals._check()
        if residuals._linear is not self:
            raise InvalidArgument("argument 'residuals': they come from another Linear")
        ptr = ll.linear_forward_save(h_ctx, h, residuals._native.ptr)
        # The backward context owns the storage now; releasing the emptied struct is a no-op.
        residuals._native.release()
        return BackwardContext(self, ptr, residuals._saved)

    def forward(self, x, weight, bias=None, *, weight_unchanged=False, out=None):
        """forward_compute + forward_save: returns (y, BackwardContext)."""
        h_ctx, h = self._handles()
        a_x, a_w, a_b, a_y, out = self._forward_operands(x, weight, bias, out)
        ptr = ll.linear_forward(h_ctx, h, a_x.desc, a_w.desc,
                                a_b.desc if a_b is not None else None, weight_unchanged,
                                a_y.desc)
        # forward() hands back no residuals: fp8, input_t and weight_t are unknown here.
        return out, BackwardContext(self, ptr, _Saved((None, None, None), (a_x.keep, a_w.keep)))

    def backward(self, bwd, dy, *, dx=None, dw=None, db=None, once=False):
        """bwd.backward(...): see BackwardContext.backward."""
        if not isinstance(bwd, BackwardContext):
            raise InvalidArgument("argument 'bwd': expected libte.BackwardContext, got %s"
                                  % type(bwd).__name__)
        if bwd._linear is not self:
            raise InvalidArgument("argument 'bwd': it comes from another Linear")
        return bwd.backward(dy, dx=dx, dw=dw, db=db, once=once)

    def scaling_state(self, role, history=True):
        """The scaling state for role 'input', 'weight' or 'grad_output'."""
        code = _ROLES.get(role) if isinstance(role, str) else None
        if code is None:
            raise InvalidArgument("argument 'role': expected 'input', 'weight' or "
                                  "'grad_output', got %r" % (role,))
        h_ctx, h = self._handles()
        cap = 0
        if history:
            cap = ll.linear_get_scaling_state(h_ctx, h, code, 0)[2]
        scale, scale_inv, hist_len, dtype, hist = ll.linear_get_scaling_state(h_ctx, h, code, cap)
        return ScalingState((scale, scale_inv, hist_len, C.DTYPE_NAMES.get(dtype, str(dtype)),
                             np.asarray(hist, np.float32)))

    def state_dict(self):
        """te_linear_state_save: the FP8 state (histories, scales) as bytes."""
        h_ctx, h = self._handles()
        return ll.linear_state_save(h_ctx, h)

    def load_state_dict(self, state):
        """te_linear_state_load from what state_dict() returned; bit-exact."""
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise InvalidArgument("argument 'state': expected bytes, got %s"
                                  % type(state).__name__)
        h_ctx, h = self._handles()
        ll.linear_state_load(h_ctx, h, bytes(state))

    def close(self):
        """Frees the layer's state. Backward contexts made from it stay usable."""
        self._native.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<libte.Linear in=%d out=%d bias=%s dtype=%s%s>" % (
            self.in_features, self.out_features, self.bias, self.dtype,
            " closed" if self.closed else "")
