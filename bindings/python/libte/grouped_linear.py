"""GroupedLinear: num_gemms experts sharing in/out features (TE's GroupedLinear, mixture of
experts). A call splits x's rows into consecutive groups of m_splits[i] tokens; group i goes
through expert i: y_i = x_i W_i^T + b_i.

    m = libte.GroupedLinear(ctx, 4, 64, 32)
    with libte.autocast(ctx, recipe=recipe):
        y, bwd = m.forward(x, [10, 0, 30, 24], weights, biases)   # lists of 4 arrays
    dx, dw, db = bwd.backward(dy)                                  # dw, db: lists of 4 arrays
"""

import numbers

from . import _constants as C
from ._arrays import te_dtype
from ._lowlevel import ll
from ._module import Module, ModuleBackwardContext, ModuleResiduals, gradients_type
from .errors import InvalidArgument
from .linear import _positive
from .tensor import as_input, check_context, follow_streams, new_output

__all__ = ["GroupedLinear", "GroupedLinearResiduals", "GroupedLinearBackwardContext",
           "GroupedLinearGradients"]

GroupedLinearGradients = gradients_type(
    "GroupedLinearGradients", "dx dw db",
    """GroupedLinear's backward results: dx [..., in], dw a list of num_gemms arrays [out, in],
    db a list of num_gemms arrays [out] (None without bias); None for each one skipped. An
    expert that got no tokens gets dW = 0 (nothing added with fuse_wgrad_accumulation) and
    db = 0.""")


def _sequence(values, n, name, allow_none=False):
    """values as a list of n items: a list/tuple, or anything iterable over its first axis (a
    stacked array [n, ...])."""
    if values is None and allow_none:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") \
            or not hasattr(values, "__len__"):
        raise InvalidArgument("argument '%s': expected a sequence of %d arrays, got %s"
                              % (name, n, type(values).__name__))
    items = list(values)
    if len(items) != n:
        raise InvalidArgument("argument '%s': expected num_gemms (%d) entries, got %d"
                              % (name, n, len(items)))
    return items


def _splits(m_splits, n):
    if isinstance(m_splits, (str, bytes)) or not hasattr(m_splits, "__iter__"):
        raise InvalidArgument("argument 'm_splits': expected a sequence of %d ints, got %s"
                              % (n, type(m_splits).__name__))
    counts = list(m_splits)
    if len(counts) != n:
        raise InvalidArgument("argument 'm_splits': expected num_gemms (%d) counts, got %d"
                              % (n, len(counts)))
    out = []
    for i, c in enumerate(counts):
        if not isinstance(c, numbers.Integral) or isinstance(c, bool):
            raise InvalidArgument("argument 'm_splits[%d]': expected an int, got %r" % (i, c))
        out.append(int(c))
    return out


class GroupedLinearResiduals(ModuleResiduals):
    """What GroupedLinear's backward needs (opaque: only `fp8` is exposed)."""


class GroupedLinearBackwardContext(ModuleBackwardContext):
    """A GroupedLinear forward's saved context."""

    def backward(self, dy, *, dx=None, dw=None, db=None, once=False):
        """From dy [..., out]: dx [..., in], dw and db per expert. dx: None for a new array,
        False to skip it, or an array to write into. dw, db: None for new arrays, False to skip
        the whole list, or a sequence of num_gemms arrays to write into (with
        fuse_wgrad_accumulation, dw must be your float32 main_grads, which the wgrads are added
        into). once=True frees the residuals on return. Returns GroupedLinearGradients."""
        m = self._module
        n = m.num_gemms
        lists = []
        for name, given, shape, code, present, main_grad in (
                ("dw", dw, (m.out_features, m.in_features),
                 C.DTYPE_F32 if m.fuse_wgrad_accumulation else m._dtype, True,
                 m.fuse_wgrad_accumulation),
                ("db", db, (m.out_features,), m._dtype, m.bias, False)):
            if given is False or (given is None and not present):
                lists.append(None)
            elif given is None:
                if main_grad:
                    raise InvalidArgument("argument 'dw': a module with fuse_wgrad_accumulation "
                                          "needs the float32 main_grads to add dW into")
                lists.append((shape, code))  # allocated below, once dy is adapted
            else:
                lists.append(_sequence(given, n, name))
        (h_ctx, h), a_dy, outs = self._gradients(dy, (
            ("dx", dx, (None, m.in_features), m._dtype, True, False),))
        ctx = m._ctx
        arrays, adapted = [], []
        for name, entry in zip(("dw", "db"), lists):
            if entry is None:
                arrays.append(None)
                adapted.append(None)
                continue
            if isinstance(entry, tuple):
                shape, code = entry
                entry = [new_output((a_dy,), shape, code, name) for _ in range(n)]
            arrays.append(entry)
            adapted.append([as_input(ctx, a, "%s[%d]" % (name, i), writable=True)
                            for i, a in enumerate(entry)])
        (dx_arr, a_dx), = outs
        follow_streams(ctx, a_dy, a_dx, *(a for lst in adapted if lst for a in lst))
        ll.grouped_linear_backward(h_ctx, h, a_dy.desc, a_dx.desc if a_dx else None,
                                   *([a.desc for a in lst] if lst is not None else None
                                     for lst in adapted), once)
        if once:
            self._consumed = True
        return GroupedLinearGradients(dx_arr, *arrays)


class GroupedLinear(Module):
    """The FP8 state of num_gemms linear experts (three scaling states each). Parameters stay
    yours: per expert a weight [out_features, in_features] and a bias [out_features], passed
    to every forward as sequences of num_gemms arrays (lists, or stacked arrays
    [num_gemms, ...], which are taken row by row)."""

    _LL = "grouped_linear"
    _Residuals = GroupedLinearResiduals
    _Backward = GroupedLinearBackwardContext

    def __init__(self, ctx, num_gemms, in_features, out_features, bias=True, dtype="float32",
                 fuse_wgrad_accumulation=False):
        h_ctx = check_context(ctx)
        n = _positive(num_gemms, "num_gemms")
        if n > C.GROUPED_LINEAR_MAX_GEMMS:
            raise InvalidArgument("argument 'num_gemms': expected 1..%d "
                                  "(TE_GROUPED_LINEAR_MAX_GEMMS), got %d"
                                  % (C.GROUPED_LINEAR_MAX_GEMMS, n))
        self.num_gemms = n
        self.in_features = _positive(in_features, "in_features")
        self.out_features = _positive(out_features, "out_features")
        self.bias = bool(bias)
        self._dtype = te_dtype(dtype)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self._own(ctx, ll.grouped_linear_create(h_ctx, n, self.in_features, self.out_features,
                                                self.bias, self._dtype,
                                                self.fuse_wgrad_accumulation))

    def _operands(self, x, m_splits, weights, biases, out):
        ctx = self._ctx
        n = self.num_gemms
        splits = _splits(m_splits, n)
        weights = _sequence(weights, n, "weights")
        biases = _sequence(biases, n, "biases", allow_none=True)
        a_x = as_input(ctx, x, "x")
        a_ws = [as_input(ctx, w, "weights[%d]" % i) for i, w in enumerate(weights)]
        a_bs = ([as_input(ctx, b, "biases[%d]" % i) for i, b in enumerate(biases)]
                if biases is not None else None)
        everything = [a_x] + a_ws + (a_bs or [])
        out, a_y = self._output(out, everything, tuple(a_x.desc[2][:-1]) + (self.out_features,),
                                "out")
        follow_streams(ctx, *everything, a_y)
        keep = tuple(a.keep for a in everything)
        return (a_x.desc, splits, [a.desc for a in a_ws],
                [a.desc for a in a_bs] if a_bs is not None else None), (out, a_y), keep

    def forward_compute(self, x, m_splits, weights, biases=None, *, weight_unchanged=False,
                        out=None):
        """Pure compute: y_i = x_i W_i^T (+ b_i) for the consecutive row groups of m_splits
        (num_gemms ints >= 0 summing to x's rows; under FP8 each group is padded to 16 rows
        inside the library). biases None iff the module has no bias. Returns
        (y, GroupedLinearResiduals). weight_unchanged=True reuses every cached FP8 weight."""
        h_ctx, h = self._handles()
        args, (out, a_y), keep = self._operands(x, m_splits, weights, biases, out)
        res = ll.grouped_linear_forward_compute(h_ctx, h, *args, weight_unchanged, a_y.desc)
        return out, self._residuals(res, {}, ll.grouped_linear_residuals_fp8(res), keep)

    def forward(self, x, m_splits, weights, biases=None, *, weight_unchanged=False, out=None):
        """forward_compute + forward_save: (y, GroupedLinearBackwardContext)."""
        h_ctx, h = self._handles()
        args, (out, a_y), keep = self._operands(x, m_splits, weights, biases, out)
        ptr = ll.grouped_linear_forward(h_ctx, h, *args, weight_unchanged, a_y.desc)
        return out, self._backward_context(ptr, keep)

    def scaling_state(self, role, expert=0, history=True):
        """Expert `expert`'s scaling state for role 'input', 'weight' or 'grad_output'."""
        if not isinstance(expert, numbers.Integral) or isinstance(expert, bool):
            raise InvalidArgument("argument 'expert': expected an int, got %r" % (expert,))
        if not -2 ** 31 <= expert < 2 ** 31:  # int32_t in C, which checks the range
            raise InvalidArgument("argument 'expert': expected 0..%d, got %d"
                                  % (self.num_gemms - 1, expert))
        return self._scaling_state((int(expert),), role, history)

    def __repr__(self):
        return "<libte.GroupedLinear num_gemms=%d in=%d out=%d bias=%s dtype=%s%s>" % (
            self.num_gemms, self.in_features, self.out_features, self.bias, self.dtype,
            " closed" if self.closed else "")
