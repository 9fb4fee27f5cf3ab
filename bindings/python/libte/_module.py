"""What every transformer module shares (LayerNormLinear, LayerNormMLP, GroupedLinear): te.h
gives them te_linear's contract point for point, so they share its Python shape too - a module
object owning the handle, forward_compute -> residuals, forward_save -> a backward context,
forward doing both, a repeatable backward (once=True frees it), scaling states, state bytes.

Each module names its low-level calls by a prefix (ll.<prefix>_forward_save, ...) and lists its
residual tensors; the classes here do the rest.
"""

import collections
import numbers

import numpy as np

from . import _constants as C
from ._arrays import host_copy, host_floats
from ._handle import NativeHandle, closed_error
from ._lowlevel import ll
from .errors import InvalidArgument, InvalidState
from .linear import ScalingState
from .tensor import Float8Tensor, as_input, new_output

_ROLES = {"input": C.ROLE_INPUT, "weight": C.ROLE_WEIGHT, "grad_output": C.ROLE_GRAD_OUTPUT}


def role_code(role):
    code = _ROLES.get(role) if isinstance(role, str) else None
    if code is None:
        raise InvalidArgument("argument 'role': expected 'input', 'weight' or 'grad_output', "
                              "got %r" % (role,))
    return code


def residual_copy(desc, name):
    """A host copy of one residual tensor: a Float8Tensor for FP8, an array otherwise, None
    for a tensor the forward did not keep (RMSNorm's mu)."""
    if not desc[0]:
        return None
    if desc[1] in C.FP8_DTYPES:
        count = ll.tensor_scale_inv_count(desc[1], desc[2], desc[6])
        return Float8Tensor(host_copy(desc, name), host_floats(desc[5], count), desc[1], desc[6])
    return host_copy(desc, name)


class Saved:
    """What a residuals/backward-context pair shares: the residual descriptions by name (None
    after a plain forward(), which hands none back), the fp8 flag, and the caller's arrays the
    forward referenced (x, gamma, the weights: te.h wants them alive until the backward context
    is destroyed)."""
    __slots__ = ("tensors", "fp8", "keep")

    def __init__(self, tensors, fp8, keep):
        self.tensors = tensors
        self.fp8 = fp8
        self.keep = keep


class ModuleResiduals:
    """forward_compute's result: the exact tensors the backward needs. Hand it to the module's
    forward_save, or release() it. Each residual tensor is a property giving a host copy."""

    def __init__(self, module, native, saved):
        self._module = module
        self._native = native
        self._saved = saved
        module._ctx._adopt(self)

    @property
    def closed(self):
        return self._native.ptr is None

    def _check(self):
        if self._native.ptr is None:
            raise InvalidState("%s are released or were saved into a backward context"
                               % type(self).__name__)

    @property
    def fp8(self):
        """Whether the forward ran in FP8."""
        return self._saved.fp8

    def _tensor(self, name):
        self._check()
        return residual_copy(self._saved.tensors[name], "%s.%s" % (type(self).__name__, name))

    def release(self):
        self._native.release()

    close = release

    def __repr__(self):
        return "<libte.%s fp8=%s%s>" % (type(self).__name__, self._saved.fp8,
                                        " closed" if self.closed else "")


class ModuleBackwardContext:
    """The saved context of one forward: call backward() on it again and again until close()
    (or once, with once=True). It keeps its module's context alive, and the caller's arrays
    the forward referenced."""

    def __init__(self, module, ptr, saved):
        self._module = module
        self._native = NativeHandle(ptr, getattr(ll, module._LL + "_backward_ctx_destroy"),
                                    module._ctx._native)
        self._saved = saved
        self._consumed = False
        module._ctx._adopt(self)

    def _handle(self):
        h = self._native.ptr
        if h is None:
            raise closed_error(type(self).__name__)
        return h

    @property
    def closed(self):
        return self._native.ptr is None

    @property
    def fp8(self):
        """Whether the forward ran in FP8 (None after a plain forward(), which does not say)."""
        return self._saved.fp8

    def _tensor(self, name):
        self._handle()
        if self._consumed:
            raise InvalidState("%s: its residuals were freed by backward(once=True)"
                               % type(self).__name__)
        if self._saved.tensors is None:
            raise InvalidState("%s: made by forward(), which does not expose residuals; use "
                               "forward_compute + forward_save" % type(self).__name__)
        return residual_copy(self._saved.tensors[name], "%s.%s" % (type(self).__name__, name))

    def _gradients(self, dy, specs):
        """Adapts dy and the gradient outputs. specs: (name, given, shape (after dy's leading
        dims when it starts with None), te dtype, present, main_grad) per output, where
        `present` says the module has that gradient (a bias, LayerNorm's beta) and `main_grad`
        that the caller must pass it (fused wgrad accumulation). Returns (handles, adapted dy,
        [(array or None, adapted or None)])."""
        ctx = self._module._ctx
        h_ctx = ctx._handle()
        h = self._handle()
        a_dy = as_input(ctx, dy, "dy")
        tokens = tuple(a_dy.desc[2][:-1])
        outs = []
        for name, given, shape, code, present, main_grad in specs:
            if given is False or (given is None and not present):
                outs.append((None, None))
                continue
            if given is None:
                if main_grad:
                    raise InvalidArgument("argument '%s': a module with fuse_wgrad_accumulation "
                                          "needs the float32 main_grad to add it into" % name)
                if shape[0] is None:
                    shape = tokens + tuple(shape[1:])
                given = new_output((a_dy,), shape, code, name)
            outs.append((given, as_input(ctx, given, name, writable=True)))
        return (h_ctx, h), a_dy, outs

    def close(self):
        self._native.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<libte.%s fp8=%s%s>" % (type(self).__name__, self._saved.fp8,
                                        " closed" if self.closed else "")


class Module:
    """A transformer module's FP8 state (scaling states, FP8 weight caches) on a context; its
    parameters stay the caller's and are passed to every forward."""

    _LL = None          # the low-level prefix: 'layernorm_linear', ...
    _Residuals = None   # the ModuleResiduals subclass
    _Backward = None    # the ModuleBackwardContext subclass

    def _own(self, ctx, ptr):
        self._ctx = ctx
        self._native = NativeHandle(ptr, getattr(ll, self._LL + "_destroy"), ctx._native)
        ctx._adopt(self)

    @property
    def dtype(self):
        """The activation dtype (of x, the parameters, y and the gradients)."""
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
            raise closed_error(type(self).__name__)
        return h_ctx, h

    def _output(self, out, inputs, shape, name):
        if out is None:
            out = new_output(inputs, shape, self._dtype, name)
        return out, as_input(self._ctx, out, name, writable=True)

    def _residuals(self, res, tensors, fp8, keep):
        native = NativeHandle(res, getattr(ll, self._LL + "_residuals_release"),
                              self._ctx._native)
        return self._Residuals(self, native, Saved(tensors, fp8, keep))

    def forward_save(self, residuals):
        """The context-saving step: packs residuals into a backward context (taking them over:
        the residuals object is closed afterwards)."""
        if not isinstance(residuals, self._Residuals):
            raise InvalidArgument("argument 'residuals': expected libte.%s, got %s"
                                  % (self._Residuals.__name__, type(residuals).__name__))
        h_ctx, h = self._handles()
        residuals._check()
        if residuals._module is not self:
            raise InvalidArgument("argument 'residuals': they come from another %s"
                                  % type(self).__name__)
        ptr = getattr(ll, self._LL + "_forward_save")(h_ctx, h, residuals._native.ptr)
        # The backward context owns the storage now; releasing the emptied struct is a no-op.
        residuals._native.release()
        return self._Backward(self, ptr, residuals._saved)

    def _backward_context(self, ptr, keep):
        # forward() hands back no residuals: fp8 and the residual tensors are unknown here.
        return self._Backward(self, ptr, Saved(None, None, keep))

    def backward(self, bwd, dy, **gradients):
        """bwd.backward(dy, ...): see the backward context's backward."""
        if not isinstance(bwd, self._Backward):
            raise InvalidArgument("argument 'bwd': expected libte.%s, got %s"
                                  % (self._Backward.__name__, type(bwd).__name__))
        if bwd._module is not self:
            raise InvalidArgument("argument 'bwd': it comes from another %s"
                                  % type(self).__name__)
        return bwd.backward(dy, **gradients)

    def _scaling_state(self, selector, role, history):
        code = role_code(role)
        h_ctx, h = self._handles()
        get = getattr(ll, self._LL + "_get_scaling_state")
        cap = get(h_ctx, h, *selector, code, 0)[2] if history else 0
        scale, scale_inv, hist_len, dtype, hist = get(h_ctx, h, *selector, code, cap)
        return ScalingState((scale, scale_inv, hist_len, C.DTYPE_NAMES.get(dtype, str(dtype)),
                             np.asarray(hist, np.float32)))

    def state_dict(self):
        """te_<module>_state_save: the FP8 state (every scaling state's history and scale) as
        bytes, a versioned format."""
        h_ctx, h = self._handles()
        return getattr(ll, self._LL + "_state_save")(h_ctx, h)

    def load_state_dict(self, state):
        """Restores what state_dict() returned (bit-exact; a module of the same shape)."""
        if not isinstance(state, (bytes, bytearray, memoryview)):
            raise InvalidArgument("argument 'state': expected bytes, got %s"
                                  % type(state).__name__)
        h_ctx, h = self._handles()
        getattr(ll, self._LL + "_state_load")(h_ctx, h, bytes(state))

    def close(self):
        """Frees the module's state. Backward contexts made from it stay usable."""
        self._native.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def gradients_type(name, fields, doc):
    t = collections.namedtuple(name, fields)
    t.__doc__ = doc
    return t


_NORMS = {"layernorm": C.NORM_LAYERNORM, "rmsnorm": C.NORM_RMSNORM}


def norm_code(normalization):
    code = _NORMS.get(normalization.lower()) if isinstance(normalization, str) else None
    if code is None:
        raise InvalidArgument("argument 'normalization': expected 'layernorm' or 'rmsnorm', "
                              "got %r" % (normalization,))
    return code


def real(value, name):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise InvalidArgument("argument '%s': expected a number, got %r" % (name, value))
    return float(value)
