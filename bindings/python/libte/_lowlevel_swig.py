"""The low-level interface over the SWIG extension libte._te_swig (bindings/swig/te.i).

Same functions, arguments, results and errors as _lowlevel_ctypes (see its docstring). Where a
SWIG wrapper already has the interface's shape it is exported as is - te_autocast_begin/end are
called with no Python frame in between - and failed calls raise through the error factory
registered below.
"""

from . import _constants as C
from . import _te_swig as _te  # ImportError when not built: _lowlevel falls back to ctypes
from ._names import buffer_bytes, check_name, check_path
from ._nccl_id import id_bytes
from .errors import InvalidArgument, Unsupported, error_for_status

NAME = "swig"

_te.te_swig_set_error_factory(error_for_status)

SIZEOF = {name: _te.te_swig_sizeof(name) for name in (
    "te_tensor", "te_context_options", "te_context_stats", "te_recipe_options", "te_nccl_id",
    "te_group_nccl_options", "te_autocast_options", "te_autocast_state", "te_linear_options",
    "te_linear_forward_args", "te_linear_residuals", "te_linear_backward_args",
    "te_scaling_state_info", "te_quantize_options", "te_gemm_options", "te_norm_options",
    "te_norm_forward_args", "te_layernorm_linear_options", "te_layernorm_linear_forward_args",
    "te_layernorm_linear_residuals", "te_layernorm_linear_grads", "te_layernorm_mlp_options",
    "te_layernorm_mlp_forward_args", "te_layernorm_mlp_residuals", "te_layernorm_mlp_grads",
    "te_grouped_linear_options", "te_grouped_linear_forward_args",
    "te_grouped_linear_residuals", "te_attention_options", "te_attention_forward_args",
    "te_attention_residuals", "te_attention_grads", "te_rope_options",
    "te_cross_entropy_options", "te_adamw_param", "te_adamw_options")}

version = _te.te_version
version_string = _te.te_version_string
status_string = _te.te_status_string
last_error = _te.te_last_error


# ---- tensors -----------------------------------------------------------------------------------

def tensor_scale_inv_count(dtype, shape, scaling):
    return _te.te_tensor_scale_inv_count((1, dtype, tuple(shape), 0, 0, 1, scaling))


def tensor_from_dlpack(managed_ptr, versioned, fp8_dtype):
    return _te.te_tensor_from_dlpack(managed_ptr, 1 if versioned else 0, fp8_dtype)


# ---- context -----------------------------------------------------------------------------------

def context_create(device):
    opts = _te.te_context_options()
    if device is not None:
        opts.use_default_device = 0
        d = opts.device
        d.type, d.index = device
    return _te.te_context_create(opts)


context_destroy = _te.te_context_destroy
context_get_device = _te.te_context_get_device
context_synchronize = _te.te_context_synchronize


def context_set_stream(ctx, stream):
    _te.te_context_set_stream(ctx, stream or None)


def context_get_stats(ctx):
    s = _te.te_context_stats()
    _te.te_context_get_stats(ctx, s)
    return s.scopes_closed, s.bucket_updates, s.amax_reductions, s.states_updated


# ---- recipes -----------------------------------------------------------------------------------

def _recipe_dict(o):
    return {name: getattr(o, name) for name in C.RECIPE_FIELDS}


def recipe_defaults(kind):
    o = _te.te_recipe_options()
    _te.te_recipe_options_init(o, kind)
    return _recipe_dict(o)


def recipe_create(fields):
    o = _te.te_recipe_options()
    for name in C.RECIPE_FIELDS:
        setattr(o, name, fields[name])
    return _te.te_recipe_create(o)


def recipe_retain(r):
    _te.te_recipe_retain(r)


recipe_release = _te.te_recipe_release
recipe_key = _te.te_recipe_key
recipe_describe = _te.te_recipe_describe


def recipe_get_options(r):
    o = _te.te_recipe_options()
    _te.te_recipe_get_options(r, o)
    return _recipe_dict(o)


# ---- groups ------------------------------------------------------------------------------------

group_create_single = _te.te_group_create_single
group_destroy = _te.te_group_destroy
group_abort = _te.te_group_abort
nccl_get_unique_id = _te.te_nccl_get_unique_id  # bytes of length NCCL_ID_BYTES


def group_create_nccl(comm):
    return _te.te_group_create_nccl(comm or None)


# Checked here too (te.i's typemap would say the same), so both backends raise alike.
_nccl_id = id_bytes


def group_nccl_options_defaults():
    return {"timeout_ms": _te.te_group_nccl_options().timeout_ms}


def group_init_nccl(rank, nranks, nccl_id):
    return _te.te_group_init_nccl(rank, nranks, _nccl_id(nccl_id))


def group_init_nccl_with_options(rank, nranks, nccl_id, timeout_ms):
    o = _te.te_group_nccl_options()
    o.timeout_ms = timeout_ms
    return _te.te_group_init_nccl_with_options(rank, nranks, _nccl_id(nccl_id), o)

group_id = _te.te_group_id
group_rank = _te.te_group_rank
group_size = _te.te_group_size


# ---- autocast: the hot path ----------------------------------------------------------------------

def autocast_options(enabled, calibrating, recipe, group):
    o = _te.te_autocast_options()
    o.enabled = 1 if enabled else 0
    o.calibrating = 1 if calibrating else 0
    o.recipe = recipe
    o.group = group
    return o


autocast_begin = _te.te_autocast_begin  # (ctx, opts) -> token
autocast_end = _te.te_autocast_end      # (ctx, token)
autocast_flush_backward = _te.te_autocast_flush_backward


def autocast_get_state(ctx):
    s = _te.te_autocast_state()
    _te.te_autocast_get_state(ctx, s)
    r = s.recipe
    return (s.enabled, s.calibrating, s.depth, _te.te_recipe_key(r) if r is not None else 0,
            _te.te_recipe_describe(r) if r is not None else "")


# ---- linear ------------------------------------------------------------------------------------

def linear_create(ctx, in_features, out_features, bias, dtype, fuse_wgrad_accumulation):
    o = _te.te_linear_options()
    o.in_features = in_features
    o.out_features = out_features
    o.bias = 1 if bias else 0
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    return _te.te_linear_create(ctx, o)


linear_destroy = _te.te_linear_destroy


def linear_forward_compute(ctx, lin, x, w, b, weight_unchanged, y):
    res = _te.te_linear_residuals()
    _te.te_swig_linear_forward_compute(ctx, lin, x, w, b, 1 if weight_unchanged else 0, y, res)
    return res


residuals_tensors = _te.te_swig_residuals_tensors
residuals_release = _te.te_linear_residuals_release
linear_forward_save = _te.te_linear_forward_save


def linear_forward(ctx, lin, x, w, b, weight_unchanged, y):
    return _te.te_swig_linear_forward(ctx, lin, x, w, b, 1 if weight_unchanged else 0, y)


def linear_backward(ctx, bwd, dy, dx, dw, db, once):
    _te.te_swig_linear_backward(ctx, bwd, dy, dx, dw, db, 1 if once else 0)


linear_backward_ctx_destroy = _te.te_linear_backward_ctx_destroy


def linear_residuals_size(ctx, lin, x, w, b):
    return _te.te_swig_linear_residuals_size(ctx, lin, x, w, b)


def linear_forward_compute_into(ctx, lin, x, w, b, weight_unchanged, y, residuals, nbytes):
    _te.te_swig_linear_forward_compute_into(ctx, lin, x, w, b, 1 if weight_unchanged else 0, y,
                                            residuals or None, nbytes)


def linear_backward_from(ctx, lin, x, w, b, residuals, nbytes, dy, dx, dw, db, once):
    _te.te_swig_linear_backward_from(ctx, lin, x, w, b, residuals or None, nbytes, dy, dx, dw,
                                     db, 1 if once else 0)


def linear_get_scaling_state(ctx, lin, role, history_cap):
    import array
    info = _te.te_scaling_state_info()
    history = array.array("f", bytes(4 * history_cap)) if history_cap else None
    _te.te_linear_get_scaling_state(ctx, lin, role, info, history)
    n = min(history_cap, info.amax_history_len)
    return (info.scale, info.scale_inv, info.amax_history_len, info.fp8_dtype,
            list(history[:n]) if history is not None else [])


def linear_state_save(ctx, lin):
    size = _te.te_linear_state_save(ctx, lin, None)
    buf = bytearray(size)
    size = _te.te_linear_state_save(ctx, lin, buf)
    return bytes(buf[:size])


linear_state_load = _te.te_linear_state_load


# ---- activations and primitives ----------------------------------------------------------------

activation_forward = _te.te_activation_forward
activation_backward = _te.te_activation_backward


def quantize(ctx, x, out, scale, amax, amax_epsilon, power_of_2_scales):
    _te.te_swig_quantize(ctx, x, out, None, scale or None, amax or None, amax_epsilon,
                         1 if power_of_2_scales else 0, 0)


def cast_transpose(ctx, x, out, out_t, scale, amax, amax_epsilon, power_of_2_scales):
    _te.te_swig_quantize(ctx, x, out, out_t, scale or None, amax or None, amax_epsilon,
                         1 if power_of_2_scales else 0, 1)


dequantize = _te.te_dequantize
amax = _te.te_amax


def gemm(ctx, a, b, d, transa, transb, epilogue, bias, gelu_input, accumulate, split_accumulator):
    _te.te_swig_gemm(ctx, a, b, d, 1 if transa else 0, 1 if transb else 0, epilogue, bias,
                     gelu_input, 1 if accumulate else 0, 1 if split_accumulator else 0)


# ---- normalization -----------------------------------------------------------------------------

def norm_defaults():
    o = _te.te_norm_options()
    return {"kind": o.kind, "eps": o.eps, "zero_centered_gamma": o.zero_centered_gamma}


def norm_forward(ctx, kind, eps, zero_centered_gamma, x, gamma, beta, out, out_t, mu, rsigma,
                 quantize):
    if quantize is None:
        _te.te_swig_norm_forward(ctx, kind, eps, zero_centered_gamma, x, gamma, beta, out, out_t,
                                 mu, rsigma, 0, None, None, 0.0, 0)
    else:
        scale, amax, amax_epsilon, power_of_2_scales = quantize
        _te.te_swig_norm_forward(ctx, kind, eps, zero_centered_gamma, x, gamma, beta, out, out_t,
                                 mu, rsigma, 1, scale or None, amax or None, amax_epsilon,
                                 power_of_2_scales)


norm_backward = _te.te_swig_norm_backward


# ---- transformer modules: LayerNormLinear, LayerNormMLP, GroupedLinear ------------------------

def _scaling_state(getter, ctx, m, selector, role, history_cap):
    import array
    info = _te.te_scaling_state_info()
    history = array.array("f", bytes(4 * history_cap)) if history_cap else None
    getter(ctx, m, *selector, role, info, history)
    n = min(history_cap, info.amax_history_len)
    return (info.scale, info.scale_inv, info.amax_history_len, info.fp8_dtype,
            list(history[:n]) if history is not None else [])


def _state_save(saver, ctx, m):
    size = saver(ctx, m, None)
    buf = bytearray(size)
    size = saver(ctx, m, buf)
    return bytes(buf[:size])


# LayerNormLinear

def layernorm_linear_create(ctx, in_features, out_features, bias, dtype, fuse_wgrad_accumulation,
                            normalization, eps, zero_centered_gamma):
    o = _te.te_layernorm_linear_options()
    o.in_features = in_features
    o.out_features = out_features
    o.bias = 1 if bias else 0
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    o.normalization = normalization
    o.eps = eps
    o.zero_centered_gamma = 1 if zero_centered_gamma else 0
    return _te.te_layernorm_linear_create(ctx, o)


layernorm_linear_destroy = _te.te_layernorm_linear_destroy


def layernorm_linear_forward_compute(ctx, m, x, gamma, beta, w, b, weight_unchanged, ln_out, y):
    res = _te.te_layernorm_linear_residuals()
    _te.te_swig_layernorm_linear_forward_compute(ctx, m, x, gamma, beta, w, b,
                                                 1 if weight_unchanged else 0, ln_out, y, res)
    return res


layernorm_linear_residuals_tensors = _te.te_swig_layernorm_linear_residuals_tensors
layernorm_linear_residuals_release = _te.te_layernorm_linear_residuals_release
layernorm_linear_forward_save = _te.te_layernorm_linear_forward_save


def layernorm_linear_forward(ctx, m, x, gamma, beta, w, b, weight_unchanged, ln_out, y):
    return _te.te_swig_layernorm_linear_forward(ctx, m, x, gamma, beta, w, b,
                                                1 if weight_unchanged else 0, ln_out, y)


def layernorm_linear_backward(ctx, bwd, dy, dx, dgamma, dbeta, dw, db, once):
    _te.te_swig_layernorm_linear_backward(ctx, bwd, dy, dx, dgamma, dbeta, dw, db,
                                          1 if once else 0)


layernorm_linear_backward_ctx_destroy = _te.te_layernorm_linear_backward_ctx_destroy


def layernorm_linear_get_scaling_state(ctx, m, role, history_cap):
    return _scaling_state(_te.te_layernorm_linear_get_scaling_state, ctx, m, (), role,
                          history_cap)


def layernorm_linear_state_save(ctx, m):
    return _state_save(_te.te_layernorm_linear_state_save, ctx, m)


layernorm_linear_state_load = _te.te_layernorm_linear_state_load


# LayerNormMLP

def layernorm_mlp_create(ctx, hidden_size, ffn_hidden_size, bias, activation, dtype,
                         fuse_wgrad_accumulation, normalization, eps, zero_centered_gamma):
    o = _te.te_layernorm_mlp_options()
    o.hidden_size = hidden_size
    o.ffn_hidden_size = ffn_hidden_size
    o.bias = 1 if bias else 0
    o.activation = activation
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    o.normalization = normalization
    o.eps = eps
    o.zero_centered_gamma = 1 if zero_centered_gamma else 0
    return _te.te_layernorm_mlp_create(ctx, o)


layernorm_mlp_destroy = _te.te_layernorm_mlp_destroy


def layernorm_mlp_forward_compute(ctx, m, x, gamma, beta, w1, b1, w2, b2, weight_unchanged,
                                  ln_out, y):
    res = _te.te_layernorm_mlp_residuals()
    _te.te_swig_layernorm_mlp_forward_compute(ctx, m, x, gamma, beta, w1, b1, w2, b2,
                                              1 if weight_unchanged else 0, ln_out, y, res)
    return res


layernorm_mlp_residuals_tensors = _te.te_swig_layernorm_mlp_residuals_tensors
layernorm_mlp_residuals_release = _te.te_layernorm_mlp_residuals_release
layernorm_mlp_forward_save = _te.te_layernorm_mlp_forward_save


def layernorm_mlp_forward(ctx, m, x, gamma, beta, w1, b1, w2, b2, weight_unchanged, ln_out, y):
    return _te.te_swig_layernorm_mlp_forward(ctx, m, x, gamma, beta, w1, b1, w2, b2,
                                             1 if weight_unchanged else 0, ln_out, y)


def layernorm_mlp_backward(ctx, bwd, dy, dx, dgamma, dbeta, dw1, db1, dw2, db2, once):
    _te.te_swig_layernorm_mlp_backward(ctx, bwd, dy, dx, dgamma, dbeta, dw1, db1, dw2, db2,
                                       1 if once else 0)


layernorm_mlp_backward_ctx_destroy = _te.te_layernorm_mlp_backward_ctx_destroy


def layernorm_mlp_get_scaling_state(ctx, m, gemm, role, history_cap):
    return _scaling_state(_te.te_layernorm_mlp_get_scaling_state, ctx, m, (gemm,), role,
                          history_cap)


def layernorm_mlp_state_save(ctx, m):
    return _state_save(_te.te_layernorm_mlp_state_save, ctx, m)


layernorm_mlp_state_load = _te.te_layernorm_mlp_state_load


# GroupedLinear (absent from a module built against a libte.so without it: see build.py)

_GROUPED = hasattr(_te, "te_swig_grouped_linear_forward")


def _grouped():
    if not _GROUPED:
        raise Unsupported("te_grouped_linear_create: the loaded libte.so (%s) does not export "
                          "te_grouped_linear_*; rebuild libte" % _te.te_version_string())


def _at_most(values, name):
    if len(values) > C.GROUPED_LINEAR_MAX_GEMMS:
        raise InvalidArgument("argument '%s': expected at most %d entries "
                              "(TE_GROUPED_LINEAR_MAX_GEMMS), got %d"
                              % (name, C.GROUPED_LINEAR_MAX_GEMMS, len(values)))


def grouped_linear_create(ctx, num_gemms, in_features, out_features, bias, dtype,
                          fuse_wgrad_accumulation):
    _grouped()
    o = _te.te_grouped_linear_options()
    o.num_gemms = num_gemms
    o.in_features = in_features
    o.out_features = out_features
    o.bias = 1 if bias else 0
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    return _te.te_grouped_linear_create(ctx, o)


def grouped_linear_destroy(g):
    _te.te_grouped_linear_destroy(g)


def grouped_linear_forward_compute(ctx, g, x, m_splits, weights, biases, weight_unchanged, y):
    _grouped()
    _at_most(m_splits, "m_splits")
    _at_most(weights, "weights")
    if biases is not None:
        _at_most(biases, "biases")
    res = _te.te_grouped_linear_residuals()
    _te.te_swig_grouped_linear_forward_compute(ctx, g, x, m_splits, weights, biases,
                                               1 if weight_unchanged else 0, y, res)
    return res


def grouped_linear_residuals_fp8(res):
    return bool(res.fp8)


def grouped_linear_residuals_release(res):
    _te.te_grouped_linear_residuals_release(res)


def grouped_linear_forward_save(ctx, g, res):
    return _te.te_grouped_linear_forward_save(ctx, g, res)


def grouped_linear_forward(ctx, g, x, m_splits, weights, biases, weight_unchanged, y):
    _grouped()
    _at_most(m_splits, "m_splits")
    _at_most(weights, "weights")
    if biases is not None:
        _at_most(biases, "biases")
    return _te.te_swig_grouped_linear_forward(ctx, g, x, m_splits, weights, biases,
                                              1 if weight_unchanged else 0, y)


def grouped_linear_backward(ctx, bwd, dy, dx, dw, db, once):
    for arr, name in ((dw, "dw"), (db, "db")):
        if arr is not None:
            _at_most(arr, name)
    _te.te_swig_grouped_linear_backward(ctx, bwd, dy, dx, dw, db, 1 if once else 0)


def grouped_linear_backward_ctx_destroy(bwd):
    _te.te_grouped_linear_backward_ctx_destroy(bwd)


def grouped_linear_get_scaling_state(ctx, g, expert, role, history_cap):
    return _scaling_state(_te.te_grouped_linear_get_scaling_state, ctx, g, (expert,), role,
                          history_cap)


def grouped_linear_state_save(ctx, g):
    return _state_save(_te.te_grouped_linear_state_save, ctx, g)


def grouped_linear_state_load(ctx, g, data):
    _te.te_grouped_linear_state_load(ctx, g, data)


# ---- residuals in the caller's memory: LayerNormLinear, LayerNormMLP ---------------------------

def layernorm_linear_residuals_size(ctx, m, x, gamma, beta, w, b):
    return _te.te_swig_layernorm_linear_residuals_size(ctx, m, x, gamma, beta, w, b)


def layernorm_linear_forward_compute_into(ctx, m, x, gamma, beta, w, b, weight_unchanged, y,
                                          residuals, nbytes):
    _te.te_swig_layernorm_linear_forward_compute_into(ctx, m, x, gamma, beta, w, b,
                                                      1 if weight_unchanged else 0, y,
                                                      residuals or None, nbytes)


def layernorm_linear_backward_from(ctx, m, x, gamma, beta, w, b, residuals, nbytes, dy, dx,
                                   dgamma, dbeta, dw, db, once):
    _te.te_swig_layernorm_linear_backward_from(ctx, m, x, gamma, beta, w, b, residuals or None,
                                               nbytes, dy, dx, dgamma, dbeta, dw, db,
                                               1 if once else 0)


def layernorm_mlp_residuals_size(ctx, m, x, gamma, beta, w1, b1, w2, b2):
    return _te.te_swig_layernorm_mlp_residuals_size(ctx, m, x, gamma, beta, w1, b1, w2, b2)


def layernorm_mlp_forward_compute_into(ctx, m, x, gamma, beta, w1, b1, w2, b2, weight_unchanged,
                                       y, residuals, nbytes):
    _te.te_swig_layernorm_mlp_forward_compute_into(ctx, m, x, gamma, beta, w1, b1, w2, b2,
                                                   1 if weight_unchanged else 0, y,
                                                   residuals or None, nbytes)


def layernorm_mlp_backward_from(ctx, m, x, gamma, beta, w1, b1, w2, b2, residuals, nbytes, dy,
                                dx, dgamma, dbeta, dw1, db1, dw2, db2, once):
    _te.te_swig_layernorm_mlp_backward_from(ctx, m, x, gamma, beta, w1, b1, w2, b2,
                                            residuals or None, nbytes, dy, dx, dgamma, dbeta, dw1,
                                            db1, dw2, db2, 1 if once else 0)


# ---- residuals in the caller's memory: GroupedLinear -------------------------------------------

def _grouped_caller(name):
    _grouped()
    f = getattr(_te, name, None)
    if f is None:
        raise Unsupported("%s: this SWIG module predates GroupedLinear's residuals in the "
                          "caller's memory; rebuild it (bindings/swig/build.py)" % name)
    return f


def _grouped_lists(m_splits, weights, biases):
    if m_splits is not None:
        _at_most(m_splits, "m_splits")
    if weights is not None:
        _at_most(weights, "weights")
    if biases is not None:
        _at_most(biases, "biases")


def grouped_linear_residuals_size(ctx, g, x, m_splits, weights, biases):
    f = _grouped_caller("te_swig_grouped_linear_residuals_size")
    _grouped_lists(m_splits, weights, biases)
    return f(ctx, g, x, m_splits, weights, biases)


def grouped_linear_forward_compute_into(ctx, g, x, m_splits, weights, biases, weight_unchanged,
                                        y, residuals, nbytes):
    f = _grouped_caller("te_swig_grouped_linear_forward_compute_into")
    _grouped_lists(m_splits, weights, biases)
    f(ctx, g, x, m_splits, weights, biases, 1 if weight_unchanged else 0, y, residuals or None,
      nbytes)


def grouped_linear_backward_from(ctx, g, x, m_splits, weights, biases, residuals, nbytes, dy, dx,
                                 dw, db, once):
    f = _grouped_caller("te_swig_grouped_linear_backward_from")
    _grouped_lists(m_splits, weights, biases)
    for arr, name in ((dw, "dw"), (db, "db")):
        if arr is not None:
            _at_most(arr, name)
    f(ctx, g, 1 if x is not None else 0, x, m_splits, weights, biases, residuals or None, nbytes,
      dy, dx, dw, db, 1 if once else 0)


# ---- attention and RoPE (absent from a module built against a libte.so without them) ----------

_ATTENTION = hasattr(_te, "te_swig_attention_forward")


def _attention(name="te_attention_create"):
    if not _ATTENTION:
        raise Unsupported("%s: the loaded libte.so (%s) does not export te_attention_* / "
                          "te_rope_* (or the SWIG module was built before them); rebuild libte "
                          "and the module (bindings/swig/build.py)"
                          % (name, _te.te_version_string()))


def attention_create(ctx, num_heads, num_kv_heads, head_dim, softmax_scale, mask, dtype, fp8):
    _attention()
    o = _te.te_attention_options()
    o.num_heads = num_heads
    o.num_kv_heads = num_kv_heads
    o.head_dim = head_dim
    o.softmax_scale = softmax_scale
    o.mask = mask
    o.activation_dtype = dtype
    o.fp8 = 1 if fp8 else 0
    return _te.te_attention_create(ctx, o)


def attention_destroy(m):
    _te.te_attention_destroy(m)


def attention_forward_compute(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o):
    _attention()
    res = _te.te_attention_residuals()
    _te.te_swig_attention_forward_compute(ctx, m, q, k, v, cu_q, cu_kv, max_q or 0, max_kv or 0,
                                          o, res)
    return res


def attention_residuals_tensors(res):
    return _te.te_swig_attention_residuals_tensors(res)


def attention_residuals_release(res):
    _te.te_attention_residuals_release(res)


def attention_forward_save(ctx, m, res):
    return _te.te_attention_forward_save(ctx, m, res)


def attention_forward(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o):
    _attention()
    return _te.te_swig_attention_forward(ctx, m, q, k, v, cu_q, cu_kv, max_q or 0, max_kv or 0, o)


def attention_backward(ctx, bwd, d_o, dq, dk, dv, once):
    _te.te_swig_attention_backward(ctx, bwd, d_o, dq, dk, dv, 1 if once else 0)


def attention_backward_ctx_destroy(bwd):
    _te.te_attention_backward_ctx_destroy(bwd)


def attention_residuals_size(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv):
    _attention()
    return _te.te_swig_attention_residuals_size(ctx, m, q, k, v, cu_q, cu_kv, max_q or 0,
                                                max_kv or 0)


def attention_forward_compute_into(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o, residuals,
                                   nbytes):
    _attention()
    _te.te_swig_attention_forward_compute_into(ctx, m, q, k, v, cu_q, cu_kv, max_q or 0,
                                               max_kv or 0, o, residuals or None, nbytes)


def attention_backward_from(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o, residuals, nbytes,
                            d_o, dq, dk, dv, once):
    _attention()
    _te.te_swig_attention_backward_from(ctx, m, q, k, v, cu_q, cu_kv, max_q or 0, max_kv or 0, o,
                                        residuals or None, nbytes, d_o, dq, dk, dv,
                                        1 if once else 0)


def attention_get_scaling_state(ctx, m, which, history_cap):
    return _scaling_state(_te.te_attention_get_scaling_state, ctx, m, (), which, history_cap)


def attention_state_save(ctx, m):
    return _state_save(_te.te_attention_state_save, ctx, m)


def attention_state_load(ctx, m, data):
    _te.te_attention_state_load(ctx, m, data)


def rope_forward(ctx, rot_dim, interleaved, x, freqs, cu_seqlens, y):
    _attention("te_rope_forward")
    _te.te_swig_rope(ctx, rot_dim, 1 if interleaved else 0, x, freqs, cu_seqlens, y, 0)


def rope_backward(ctx, rot_dim, interleaved, dy, freqs, cu_seqlens, dx):
    _attention("te_rope_backward")
    _te.te_swig_rope(ctx, rot_dim, 1 if interleaved else 0, dy, freqs, cu_seqlens, dx, 1)


# ---- training-step ops and checkpoints (weak in the module: a libte.so built before them lacks
# them, see te.i) ---------------------------------------------------------------------------------

def _fn(name):
    f = getattr(_te, name, None)
    exports = getattr(_te, "te_swig_exports", None)
    if f is None or exports is None or not exports(name):
        raise Unsupported("%s: the loaded libte.so (%s) does not export it (or the SWIG module "
                          "was built before it); rebuild libte and the module "
                          "(bindings/swig/build.py)" % (name, _te.te_version_string()))
    return f


def add(ctx, a, b, y):
    _fn("te_add")(ctx, a, b, y)


def split_columns(ctx, x, outputs):
    _at_most(outputs, "outputs")
    _fn("te_split_columns")(ctx, x, outputs, len(outputs))


def concat_columns(ctx, inputs, y):
    _at_most(inputs, "inputs")
    _fn("te_concat_columns")(ctx, inputs, len(inputs), y)


def embedding_forward(ctx, table, ids, y):
    _fn("te_embedding_forward")(ctx, table, ids, y)


def embedding_backward(ctx, ids, dy, dtable, accumulate):
    _fn("te_embedding_backward")(ctx, ids, dy, dtable, 1 if accumulate else 0)


def cross_entropy_defaults():
    _fn("te_cross_entropy")
    o = _te.te_cross_entropy_options()
    return {"ignore_index": o.ignore_index, "grad_scale": o.grad_scale}


def cross_entropy(ctx, ignore_index, grad_scale, logits, targets, loss, dlogits):
    f = _fn("te_cross_entropy")
    o = _te.te_cross_entropy_options()
    o.ignore_index = ignore_index
    o.grad_scale = grad_scale
    f(ctx, o, logits, targets, loss, dlogits)


ADAMW_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "step", "max_grad_norm")


def adamw_defaults():
    _fn("te_adamw_step")
    o = _te.te_adamw_options()
    return {name: getattr(o, name) for name in ADAMW_FIELDS}


def adamw_param_defaults():
    _fn("te_adamw_step")
    p = _te.te_adamw_param()
    return {"weight_decay": p.weight_decay, "owner_kind": int(p.owner_kind),
            "owner_gemm": p.owner_gemm}


def adamw_step(ctx, options, grad_norm, params):
    f = _fn("te_adamw_step")
    o = _te.te_adamw_options()
    for name in ADAMW_FIELDS:
        setattr(o, name, options[name])
    o.grad_norm = grad_norm or None
    f(ctx, o, [tuple(entry) for entry in params])


def checkpoint_create():
    return _fn("te_checkpoint_create")()


def checkpoint_destroy(ck):
    _te.te_checkpoint_destroy(ck)  # a no-op without te_checkpoint_* (no handle could exist)


def checkpoint_put_tensor(ck, ctx, name, t):
    _fn("te_checkpoint_put_tensor")(ck, ctx, check_name(name), t)


def checkpoint_put_bytes(ck, name, data):
    f = _fn("te_checkpoint_put_bytes")
    f(ck, check_name(name), buffer_bytes(data) if data is not None else None)


def checkpoint_get_tensor(ck, ctx, name, t):
    _fn("te_checkpoint_get_tensor")(ck, ctx, check_name(name), t)


def checkpoint_get_bytes(ck, name):
    f = _fn("te_checkpoint_get_bytes")
    key = check_name(name)
    size = f(ck, key, None)
    buf = bytearray(size)
    size = f(ck, key, buf)
    return bytes(buf[:size])


def checkpoint_count(ck):
    return _fn("te_checkpoint_count")(ck)


def checkpoint_name(ck, index):
    return _fn("te_checkpoint_name")(ck, index)


def checkpoint_write(ck, path):
    _fn("te_checkpoint_write")(ck, check_path(path))


def checkpoint_read(path):
    return _fn("te_checkpoint_read")(check_path(path))


def checkpoint_serialize(ck):
    f = _fn("te_checkpoint_serialize")
    size = f(ck, None)
    buf = bytearray(size)
    size = f(ck, buf)
    return bytes(buf[:size])


def checkpoint_deserialize(data):
    return _fn("te_checkpoint_deserialize")(buffer_bytes(data))


def checkpoint_record_info(ck, name):
    """(is_tensor, dtype, shape, size): dtype a te_dtype code and shape a tuple for a tensor
    record, both None for a byte record; size the payload's length in bytes."""
    is_tensor, t, size = _fn("te_checkpoint_record_info")(ck, check_name(name))
    if not is_tensor:
        return False, None, None, size
    return True, t[1], tuple(t[2]), size
