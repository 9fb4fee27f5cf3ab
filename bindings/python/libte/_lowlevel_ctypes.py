"""The low-level interface over ctypes: one Python function per C call, no policy.

Both backends (this one and _lowlevel_swig) expose the same functions with the same arguments,
results and errors; libte's public classes are written against that interface only (see
_lowlevel.py). Conventions shared with the SWIG backend:

- a handle is an opaque object (here an int address, never 0); None is NULL;
- a tensor is a TensorDesc tuple (data, dtype, shape, device_type, device_index, scale_inv,
  scaling), every pointer an int; None is a NULL tensor;
- a failed call raises errors.error_for_status(status, te_last_error()).

Speed: every function pointer gets argtypes/restype once at import; pointer arguments are passed
as ints through c_void_p; te_tensor and options structs on the per-call path are packed into
per-thread scratch buffers instead of being allocated per call.
"""

import ctypes
import struct
import threading
from ctypes import (POINTER, Structure, byref, c_char_p, c_float, c_int, c_int32, c_int64,
                    c_size_t, c_uint32, c_uint64, c_void_p)

from . import _constants as C
from ._names import buffer_bytes, check_name, check_path
from ._nccl_id import id_bytes
from ._loader import load
from .errors import InvalidArgument, Unsupported, error_for_status

NAME = "ctypes"

_lib = load()


# ---- structs (layouts checked against sizeof() in the tests through the SWIG module) ----------

class te_device(Structure):
    _fields_ = [("type", c_int), ("index", c_int32)]


class te_tensor(Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("ndim", c_int32),
                ("shape", c_int64 * C.MAX_DIMS), ("device", te_device),
                ("scale_inv", c_void_p), ("scaling", c_int)]


class te_context_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("use_default_device", c_int32), ("device", te_device)]


class te_context_stats(Structure):
    _fields_ = [("struct_size", c_size_t), ("scopes_closed", c_uint64),
                ("bucket_updates", c_uint64), ("amax_reductions", c_uint64),
                ("states_updated", c_uint64)]


class te_recipe_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("format", c_int),
                ("margin", c_int32), ("amax_history_len", c_int32), ("amax_algo", c_int),
                ("reduce_amax", c_int32), ("power_of_2_scales", c_int32),
                ("amax_epsilon", c_float), ("fprop_split_accumulator", c_int32),
                ("dgrad_split_accumulator", c_int32), ("wgrad_split_accumulator", c_int32)]


class te_nccl_id(Structure):
    _fields_ = [("internal", ctypes.c_char * C.NCCL_ID_BYTES)]


class te_group_nccl_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("timeout_ms", c_int32)]


class te_autocast_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("enabled", c_int32), ("calibrating", c_int32),
                ("recipe", c_void_p), ("group", c_void_p)]


class te_autocast_state(Structure):
    _fields_ = [("struct_size", c_size_t), ("enabled", c_int32), ("calibrating", c_int32),
                ("recipe", c_void_p), ("depth", c_int32)]


class te_linear_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("in_features", c_int64), ("out_features", c_int64),
                ("bias", c_int32), ("activation_dtype", c_int),
                ("fuse_wgrad_accumulation", c_int32)]


class te_linear_forward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("input", c_void_p), ("weight", c_void_p),
                ("bias", c_void_p), ("weight_unchanged", c_int32)]


class te_linear_residuals(Structure):
    _fields_ = [("struct_size", c_size_t), ("input_t", te_tensor), ("weight_t", te_tensor),
                ("fp8", c_int32), ("internal", c_void_p)]


class te_linear_backward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("flags", c_uint32)]


class te_scaling_state_info(Structure):
    _fields_ = [("struct_size", c_size_t), ("scale", c_float), ("scale_inv", c_float),
                ("amax_history_len", c_int32), ("fp8_dtype", c_int)]


class te_quantize_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("scale", c_void_p), ("amax", c_void_p),
                ("amax_epsilon", c_float), ("power_of_2_scales", c_int32)]


class te_gemm_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("transa", c_int32), ("transb", c_int32),
                ("epilogue", c_int), ("bias", c_void_p), ("gelu_input", c_void_p),
                ("accumulate", c_int32), ("use_split_accumulator", c_int32)]


class te_norm_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("eps", c_float),
                ("zero_centered_gamma", c_int32)]


class te_norm_forward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("input", c_void_p), ("weight", c_void_p),
                ("bias", c_void_p), ("output", c_void_p), ("output_t", c_void_p),
                ("mu", c_void_p), ("rsigma", c_void_p), ("quantize", c_void_p)]


class te_layernorm_linear_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("in_features", c_int64), ("out_features", c_int64),
                ("bias", c_int32), ("activation_dtype", c_int),
                ("fuse_wgrad_accumulation", c_int32), ("normalization", c_int), ("eps", c_float),
                ("zero_centered_gamma", c_int32)]


class te_layernorm_linear_forward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("input", c_void_p), ("ln_weight", c_void_p),
                ("ln_bias", c_void_p), ("weight", c_void_p), ("bias", c_void_p),
                ("weight_unchanged", c_int32), ("ln_out", c_void_p)]


class te_layernorm_linear_residuals(Structure):
    _fields_ = [("struct_size", c_size_t), ("ln_out_t", te_tensor), ("weight_t", te_tensor),
                ("mu", te_tensor), ("rsigma", te_tensor), ("fp8", c_int32),
                ("internal", c_void_p)]


class te_layernorm_linear_grads(Structure):
    _fields_ = [("struct_size", c_size_t), ("dx", c_void_p), ("dln_weight", c_void_p),
                ("dln_bias", c_void_p), ("dw", c_void_p), ("db", c_void_p)]


class te_layernorm_mlp_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("hidden_size", c_int64),
                ("ffn_hidden_size", c_int64), ("bias", c_int32), ("activation", c_int),
                ("activation_dtype", c_int), ("fuse_wgrad_accumulation", c_int32),
                ("normalization", c_int), ("eps", c_float), ("zero_centered_gamma", c_int32)]


class te_layernorm_mlp_forward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("input", c_void_p), ("ln_weight", c_void_p),
                ("ln_bias", c_void_p), ("fc1_weight", c_void_p), ("fc1_bias", c_void_p),
                ("fc2_weight", c_void_p), ("fc2_bias", c_void_p), ("weight_unchanged", c_int32),
                ("ln_out", c_void_p)]


class te_layernorm_mlp_residuals(Structure):
    _fields_ = [("struct_size", c_size_t), ("ln_out_t", te_tensor), ("fc1_weight_t", te_tensor),
                ("fc1_out", te_tensor), ("act_out_t", te_tensor), ("fc2_weight_t", te_tensor),
                ("mu", te_tensor), ("rsigma", te_tensor), ("fp8", c_int32),
                ("internal", c_void_p)]


class te_layernorm_mlp_grads(Structure):
    _fields_ = [("struct_size", c_size_t), ("dx", c_void_p), ("dln_weight", c_void_p),
                ("dln_bias", c_void_p), ("dfc1_weight", c_void_p), ("dfc1_bias", c_void_p),
                ("dfc2_weight", c_void_p), ("dfc2_bias", c_void_p)]


class te_grouped_linear_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("num_gemms", c_int32), ("in_features", c_int64),
                ("out_features", c_int64), ("bias", c_int32), ("activation_dtype", c_int),
                ("fuse_wgrad_accumulation", c_int32)]


class te_grouped_linear_forward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("input", c_void_p), ("m_splits", c_void_p),
                ("weights", c_void_p), ("biases", c_void_p), ("weight_unchanged", c_int32)]


class te_grouped_linear_residuals(Structure):
    _fields_ = [("struct_size", c_size_t), ("fp8", c_int32), ("internal", c_void_p)]


class te_attention_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("num_heads", c_int32), ("num_kv_heads", c_int32),
                ("head_dim", c_int32), ("softmax_scale", c_float), ("mask", c_int),
                ("activation_dtype", c_int), ("fp8", c_int32)]


class te_attention_forward_args(Structure):
    _fields_ = [("struct_size", c_size_t), ("q", c_void_p), ("k", c_void_p), ("v", c_void_p),
                ("cu_seqlens_q", c_void_p), ("cu_seqlens_kv", c_void_p),
                ("max_seqlen_q", c_int64), ("max_seqlen_kv", c_int64)]


class te_attention_residuals(Structure):
    _fields_ = [("struct_size", c_size_t), ("q", te_tensor), ("k", te_tensor), ("v", te_tensor),
                ("o", te_tensor), ("lse", te_tensor), ("fp8", c_int32), ("internal", c_void_p)]


class te_attention_grads(Structure):
    _fields_ = [("struct_size", c_size_t), ("dq", c_void_p), ("dk", c_void_p), ("dv", c_void_p)]


class te_rope_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("rot_dim", c_int32), ("interleaved", c_int32)]


class te_cross_entropy_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("ignore_index", c_int32), ("grad_scale", c_float)]


class te_adamw_param(Structure):
    _fields_ = [("struct_size", c_size_t), ("param", c_void_p), ("grad", c_void_p),
                ("exp_avg", c_void_p), ("exp_avg_sq", c_void_p), ("model_weight", c_void_p),
                ("weight_decay", c_int32), ("owner_kind", c_int), ("owner", c_void_p),
                ("owner_gemm", c_int32)]


class te_adamw_options(Structure):
    _fields_ = [("struct_size", c_size_t), ("lr", c_float), ("beta1", c_float),
                ("beta2", c_float), ("eps", c_float), ("weight_decay", c_float),
                ("step", c_int64), ("max_grad_norm", c_float), ("grad_norm", c_void_p)]


SIZEOF = {cls.__name__: ctypes.sizeof(cls) for cls in (
    te_tensor, te_context_options, te_context_stats, te_recipe_options, te_nccl_id,
    te_group_nccl_options, te_autocast_options,
    te_autocast_state, te_linear_options, te_linear_forward_args, te_linear_residuals,
    te_linear_backward_args, te_scaling_state_info, te_quantize_options, te_gemm_options,
    te_norm_options, te_norm_forward_args, te_layernorm_linear_options,
    te_layernorm_linear_forward_args, te_layernorm_linear_residuals, te_layernorm_linear_grads,
    te_layernorm_mlp_options, te_layernorm_mlp_forward_args, te_layernorm_mlp_residuals,
    te_layernorm_mlp_grads, te_grouped_linear_options, te_grouped_linear_forward_args,
    te_grouped_linear_residuals, te_attention_options, te_attention_forward_args,
    te_attention_residuals, te_attention_grads, te_rope_options, te_cross_entropy_options,
    te_adamw_param, te_adamw_options)}


# ---- function prototypes ---------------------------------------------------------------------

def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = argtypes
    return f


_P = c_void_p
_S = c_int  # te_status
_version = _fn("te_version", ctypes.c_uint)
_version_string = _fn("te_version_string", c_char_p)
_status_string = _fn("te_status_string", c_char_p, c_int)
_last_error = _fn("te_last_error", c_char_p)
_scale_inv_count = _fn("te_tensor_scale_inv_count", _S, _P, _P)
_from_dlpack = _fn("te_tensor_from_dlpack", _S, _P, _P, c_int, c_int)
_context_options_init = _fn("te_context_options_init", _S, _P)
_context_create = _fn("te_context_create", _S, _P, _P)
_context_destroy = _fn("te_context_destroy", None, _P)
_context_get_device = _fn("te_context_get_device", _S, _P, _P)
_context_set_stream = _fn("te_context_set_stream", _S, _P, _P)
_context_synchronize = _fn("te_context_synchronize", _S, _P)
_context_get_stats = _fn("te_context_get_stats", _S, _P, _P)
_recipe_options_init = _fn("te_recipe_options_init", _S, _P, c_int)
_recipe_create = _fn("te_recipe_create", _S, _P, _P)
_recipe_retain = _fn("te_recipe_retain", _P, _P)
_recipe_release = _fn("te_recipe_release", None, _P)
_recipe_key = _fn("te_recipe_key", c_uint64, _P)
_recipe_describe = _fn("te_recipe_describe", c_char_p, _P)
_recipe_get_options = _fn("te_recipe_get_options", _S, _P, _P)
_group_create_single = _fn("te_group_create_single", _S, _P)
_group_create_nccl = _fn("te_group_create_nccl", _S, _P, _P)
_nccl_get_unique_id = _fn("te_nccl_get_unique_id", _S, _P)
_group_nccl_options_init = _fn("te_group_nccl_options_init", _S, _P)
_group_init_nccl = _fn("te_group_init_nccl", _S, _P, c_int32, c_int32, _P)
_group_init_nccl_with_options = _fn("te_group_init_nccl_with_options", _S, _P, c_int32, c_int32,
                                    _P, _P)
_group_abort = _fn("te_group_abort", _S, _P)
_group_destroy = _fn("te_group_destroy", None, _P)
_group_id = _fn("te_group_id", c_uint64, _P)
_group_rank = _fn("te_group_rank", c_int32, _P)
_group_size = _fn("te_group_size", c_int32, _P)
_autocast_options_init = _fn("te_autocast_options_init", _S, _P)
_autocast_begin = _fn("te_autocast_begin", _S, _P, _P, _P)
_autocast_end = _fn("te_autocast_end", _S, _P, c_uint64)
_autocast_get_state = _fn("te_autocast_get_state", _S, _P, _P)
_autocast_flush_backward = _fn("te_autocast_flush_backward", _S, _P)
_linear_options_init = _fn("te_linear_options_init", _S, _P)
_linear_create = _fn("te_linear_create", _S, _P, _P, _P)
_linear_destroy = _fn("te_linear_destroy", None, _P)
_linear_forward_compute = _fn("te_linear_forward_compute", _S, _P, _P, _P, _P, _P)
_linear_residuals_release = _fn("te_linear_residuals_release", None, _P)
_linear_forward_save = _fn("te_linear_forward_save", _S, _P, _P, _P, _P)
_linear_forward = _fn("te_linear_forward", _S, _P, _P, _P, _P, _P)
_linear_backward = _fn("te_linear_backward", _S, _P, _P, _P, _P, _P, _P, _P)
_linear_backward_ctx_destroy = _fn("te_linear_backward_ctx_destroy", None, _P)
# Residuals in the caller's memory (absent from libraries built before them: Unsupported).
_linear_residuals_size = getattr(_lib, "te_linear_residuals_size", None) and _fn(
    "te_linear_residuals_size", _S, _P, _P, _P, POINTER(c_size_t))
_linear_forward_compute_into = getattr(_lib, "te_linear_forward_compute_into", None) and _fn(
    "te_linear_forward_compute_into", _S, _P, _P, _P, _P, _P, c_size_t)
_linear_backward_from = getattr(_lib, "te_linear_backward_from", None) and _fn(
    "te_linear_backward_from", _S, _P, _P, _P, _P, c_size_t, _P, _P, _P, _P, _P)
_linear_get_scaling_state = _fn("te_linear_get_scaling_state", _S, _P, _P, c_int, _P, _P,
                                c_size_t)
_linear_state_save = _fn("te_linear_state_save", _S, _P, _P, _P, c_size_t, POINTER(c_size_t))
_linear_state_load = _fn("te_linear_state_load", _S, _P, _P, _P, c_size_t)
_activation_forward = _fn("te_activation_forward", _S, _P, c_int, _P, _P)
_activation_backward = _fn("te_activation_backward", _S, _P, c_int, _P, _P, _P)
_quantize = _fn("te_quantize", _S, _P, _P, _P, _P)
_cast_transpose = _fn("te_cast_transpose", _S, _P, _P, _P, _P, _P)
_dequantize = _fn("te_dequantize", _S, _P, _P, _P)
_amax = _fn("te_amax", _S, _P, _P, _P)
_gemm = _fn("te_gemm", _S, _P, _P, _P, _P, _P)
_norm_options_init = _fn("te_norm_options_init", _S, _P)
_norm_forward_args_init = _fn("te_norm_forward_args_init", _S, _P)
_norm_forward = _fn("te_norm_forward", _S, _P, _P, _P)
_norm_backward = _fn("te_norm_backward", _S, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P)


def _module_fns(prefix, selector_args=()):
    """The prototypes every transformer module shares (te_linear's contract), as a dict by the
    name after the prefix. `selector_args`: the get_scaling_state arguments before the role
    (LayerNormMLP's gemm, GroupedLinear's expert). A library that lacks the module's symbols
    (older than the module) gets no dict: the calls then raise Unsupported."""
    if not hasattr(_lib, "te_%s_create" % prefix):
        return None
    f = lambda name, restype, *args: _fn("te_%s_%s" % (prefix, name), restype, *args)
    return {
        "options_init": f("options_init", _S, _P),
        "create": f("create", _S, _P, _P, _P),
        "destroy": f("destroy", None, _P),
        "forward_args_init": f("forward_args_init", _S, _P),
        "forward_compute": f("forward_compute", _S, _P, _P, _P, _P, _P),
        "residuals_release": f("residuals_release", None, _P),
        "forward_save": f("forward_save", _S, _P, _P, _P, _P),
        "forward": f("forward", _S, _P, _P, _P, _P, _P),
        "backward_ctx_destroy": f("backward_ctx_destroy", None, _P),
        "get_scaling_state": f("get_scaling_state", _S, _P, _P, *selector_args, c_int, _P, _P,
                               c_size_t),
        "state_save": f("state_save", _S, _P, _P, _P, c_size_t, POINTER(c_size_t)),
        "state_load": f("state_load", _S, _P, _P, _P, c_size_t),
    }


def _caller_residual_fns(fns, prefix):
    """Adds the residuals-in-the-caller's-memory trio to a module's dict when the library has
    it (libraries built before it raise Unsupported from those calls)."""
    if fns is not None and hasattr(_lib, "te_%s_residuals_size" % prefix):
        fns["residuals_size"] = _fn("te_%s_residuals_size" % prefix, _S, _P, _P, _P,
                                    POINTER(c_size_t))
        fns["forward_compute_into"] = _fn("te_%s_forward_compute_into" % prefix, _S, _P, _P,
                                          _P, _P, _P, c_size_t)
        fns["backward_from"] = _fn("te_%s_backward_from" % prefix, _S, _P, _P, _P, _P,
                                   c_size_t, _P, _P, _P)


_lnl = _module_fns("layernorm_linear")
if _lnl is not None:
    _lnl["grads_init"] = _fn("te_layernorm_linear_grads_init", _S, _P)
    _lnl["backward"] = _fn("te_layernorm_linear_backward", _S, _P, _P, _P, _P, _P)
_mlp = _module_fns("layernorm_mlp", (c_int,))
if _mlp is not None:
    _mlp["grads_init"] = _fn("te_layernorm_mlp_grads_init", _S, _P)
    _mlp["backward"] = _fn("te_layernorm_mlp_backward", _S, _P, _P, _P, _P, _P)
_grouped = _module_fns("grouped_linear", (c_int32,))
_caller_residual_fns(_lnl, "layernorm_linear")
_caller_residual_fns(_mlp, "layernorm_mlp")
_caller_residual_fns(_grouped, "grouped_linear")
if _grouped is not None and "backward_from" in _grouped:  # dx, dw[], db[] instead of grads
    _grouped["backward_from"] = _fn("te_grouped_linear_backward_from", _S, _P, _P, _P, _P,
                                    c_size_t, _P, _P, _P, _P, _P)
if _grouped is not None:
    _grouped["backward"] = _fn("te_grouped_linear_backward", _S, _P, _P, _P, _P, _P, _P, _P)
_attn = _module_fns("attention")
if _attn is not None:
    _attn["grads_init"] = _fn("te_attention_grads_init", _S, _P)
    _attn["backward"] = _fn("te_attention_backward", _S, _P, _P, _P, _P, _P)
    _attn["residuals_size"] = _fn("te_attention_residuals_size", _S, _P, _P, _P,
                                  POINTER(c_size_t))
    _attn["forward_compute_into"] = _fn("te_attention_forward_compute_into", _S, _P, _P, _P, _P,
                                        _P, c_size_t)
    # inputs and o, then the residual block, d_o, grads, backward args
    _attn["backward_from"] = _fn("te_attention_backward_from", _S, _P, _P, _P, _P, _P, c_size_t,
                                 _P, _P, _P)
_rope = None
if hasattr(_lib, "te_rope_forward"):
    _rope = {"options_init": _fn("te_rope_options_init", _S, _P),
             "forward": _fn("te_rope_forward", _S, _P, _P, _P, _P, _P, _P),
             "backward": _fn("te_rope_backward", _S, _P, _P, _P, _P, _P, _P)}

# Training-step ops and checkpoints (absent from a libte.so built before them: Unsupported).
_TRAINING_FNS = (
    ("add", "te_add", _S, _P, _P, _P, _P),
    ("split_columns", "te_split_columns", _S, _P, _P, _P, c_size_t),
    ("concat_columns", "te_concat_columns", _S, _P, _P, c_size_t, _P),
    ("embedding_forward", "te_embedding_forward", _S, _P, _P, _P, _P),
    ("embedding_backward", "te_embedding_backward", _S, _P, _P, _P, _P, c_int32),
    ("cross_entropy_options_init", "te_cross_entropy_options_init", _S, _P),
    ("cross_entropy", "te_cross_entropy", _S, _P, _P, _P, _P, _P, _P),
    ("adamw_param_init", "te_adamw_param_init", _S, _P),
    ("adamw_options_init", "te_adamw_options_init", _S, _P),
    ("adamw_step", "te_adamw_step", _S, _P, _P, _P, c_size_t),
    ("checkpoint_create", "te_checkpoint_create", _S, _P),
    ("checkpoint_destroy", "te_checkpoint_destroy", None, _P),
    ("checkpoint_put_tensor", "te_checkpoint_put_tensor", _S, _P, _P, c_char_p, _P),
    ("checkpoint_put_bytes", "te_checkpoint_put_bytes", _S, _P, c_char_p, _P, c_size_t),
    ("checkpoint_get_tensor", "te_checkpoint_get_tensor", _S, _P, _P, c_char_p, _P),
    ("checkpoint_get_bytes", "te_checkpoint_get_bytes", _S, _P, c_char_p, _P, c_size_t,
     POINTER(c_size_t)),
    ("checkpoint_count", "te_checkpoint_count", _S, _P, POINTER(c_size_t)),
    ("checkpoint_name", "te_checkpoint_name", _S, _P, c_size_t, POINTER(c_char_p)),
    ("checkpoint_write", "te_checkpoint_write", _S, _P, c_char_p),
    ("checkpoint_read", "te_checkpoint_read", _S, _P, c_char_p),
    ("checkpoint_serialize", "te_checkpoint_serialize", _S, _P, _P, c_size_t, POINTER(c_size_t)),
    ("checkpoint_deserialize", "te_checkpoint_deserialize", _S, _P, _P, c_size_t),
    ("checkpoint_record_info", "te_checkpoint_record_info", _S, _P, c_char_p, POINTER(c_int32),
     _P, POINTER(c_size_t)),
)
_train = {key: _fn(name, restype, *argtypes) for key, name, restype, *argtypes in _TRAINING_FNS
          if hasattr(_lib, name)}


def _raise(status):
    raise error_for_status(status, _last_error().decode("utf-8", "replace"))


# ---- per-thread scratch: te_tensor structs and argument structs reused call after call --------

# '@' = native sizes and alignment: exactly te_tensor's layout (data, dtype, ndim, shape[8],
# device {type, index}, scale_inv, scaling).
_TENSOR = struct.Struct("@Pii8qiiPi")
_PAD = tuple((0,) * (C.MAX_DIMS - n) for n in range(C.MAX_DIMS + 1))
_N_TENSORS = 16  # LayerNormMLP's backward_from: x, gamma, beta, 2 x (W, b), dy, 7 gradients


class _Scratch(threading.local):
    def __init__(self):
        self.tensors = [te_tensor() for _ in range(_N_TENSORS)]
        self.addrs = [ctypes.addressof(t) for t in self.tensors]
        self.fwd = te_linear_forward_args(ctypes.sizeof(te_linear_forward_args))
        self.fwd_addr = ctypes.addressof(self.fwd)
        self.qopts = te_quantize_options(ctypes.sizeof(te_quantize_options))
        self.gopts = te_gemm_options(ctypes.sizeof(te_gemm_options))
        self.nopts = te_norm_options(ctypes.sizeof(te_norm_options))
        self.nargs = te_norm_forward_args(ctypes.sizeof(te_norm_forward_args))
        self.nqopts = te_quantize_options(ctypes.sizeof(te_quantize_options))
        self.size = c_size_t()


_scratch = _Scratch()


def _tensor(slot, desc):
    """Packs desc into this thread's scratch te_tensor `slot`; its address, or None for None."""
    if desc is None:
        return None
    data, dtype, shape, device_type, device_index, scale_inv, scaling = desc
    s = _scratch
    _TENSOR.pack_into(s.tensors[slot], 0, data or 0, dtype, len(shape), *shape,
                      *_PAD[len(shape)], device_type, device_index, scale_inv or 0, scaling)
    return s.addrs[slot]


def _desc(t):
    """te_tensor -> TensorDesc."""
    n = t.ndim if 0 < t.ndim <= C.MAX_DIMS else 0
    return (t.data or 0, t.dtype, tuple(t.shape[:n]), t.device.type, t.device.index,
            t.scale_inv or 0, t.scaling)


# ---- versions and errors -----------------------------------------------------------------------

def version():
    return _version()


def version_string():
    return _version_string().decode()


def status_string(status):
    return _status_string(status).decode()


def last_error():
    return _last_error().decode("utf-8", "replace")


# ---- tensors -----------------------------------------------------------------------------------

def tensor_scale_inv_count(dtype, shape, scaling):
    count = c_int64()
    st = _scale_inv_count(byref(count), _tensor(0, (1, dtype, shape, 0, 0, 1, scaling)))
    if st:
        _raise(st)
    return count.value


def tensor_from_dlpack(managed_ptr, versioned, fp8_dtype):
    """TensorDesc of a DLManagedTensor(Versioned) at address managed_ptr."""
    out = te_tensor()
    st = _from_dlpack(byref(out), managed_ptr, 1 if versioned else 0, fp8_dtype)
    if st:
        _raise(st)
    return _desc(out)


# ---- context -----------------------------------------------------------------------------------

def context_create(device):
    """device: None for the default device, else (device_type, index)."""
    opts = te_context_options()
    st = _context_options_init(byref(opts))
    if st:
        _raise(st)
    if device is not None:
        opts.use_default_device = 0
        opts.device.type, opts.device.index = device
    h = c_void_p()
    st = _context_create(byref(h), byref(opts))
    if st:
        _raise(st)
    return h.value


def context_destroy(ctx):
    _context_destroy(ctx)


def context_get_device(ctx):
    d = te_device()
    st = _context_get_device(ctx, byref(d))
    if st:
        _raise(st)
    return d.type, d.index


def context_set_stream(ctx, stream):
    st = _context_set_stream(ctx, stream or None)
    if st:
        _raise(st)


def context_synchronize(ctx):
    st = _context_synchronize(ctx)
    if st:
        _raise(st)


def context_get_stats(ctx):
    """(scopes_closed, bucket_updates, amax_reductions, states_updated)."""
    s = te_context_stats(ctypes.sizeof(te_context_stats))
    st = _context_get_stats(ctx, byref(s))
    if st:
        _raise(st)
    return s.scopes_closed, s.bucket_updates, s.amax_reductions, s.states_updated


# ---- recipes -----------------------------------------------------------------------------------

def _recipe_dict(o):
    return {name: getattr(o, name) for name in C.RECIPE_FIELDS}


def recipe_defaults(kind):
    """te_recipe_options_init(kind) as a dict of C.RECIPE_FIELDS."""
    o = te_recipe_options()
    st = _recipe_options_init(byref(o), kind)
    if st:
        _raise(st)
    return _recipe_dict(o)


def recipe_create(fields):
    """A new recipe (refcount 1) from a dict of C.RECIPE_FIELDS."""
    o = te_recipe_options(ctypes.sizeof(te_recipe_options))
    for name in C.RECIPE_FIELDS:
        setattr(o, name, fields[name])
    h = c_void_p()
    st = _recipe_create(byref(h), byref(o))
    if st:
        _raise(st)
    return h.value


def recipe_retain(r):
    _recipe_retain(r)


def recipe_release(r):
    _recipe_release(r)


def recipe_key(r):
    return _recipe_key(r)


def recipe_describe(r):
    return _recipe_describe(r).decode()


def recipe_get_options(r):
    o = te_recipe_options(ctypes.sizeof(te_recipe_options))
    st = _recipe_get_options(r, byref(o))
    if st:
        _raise(st)
    return _recipe_dict(o)


# ---- groups ------------------------------------------------------------------------------------

def group_create_single():
    h = c_void_p()
    st = _group_create_single(byref(h))
    if st:
        _raise(st)
    return h.value


def group_create_nccl(comm):
    """A group borrowing the ncclComm_t at address `comm` (an int; 0 or None is NULL)."""
    h = c_void_p()
    st = _group_create_nccl(byref(h), comm or None)
    if st:
        _raise(st)
    return h.value


def _nccl_id(nccl_id):
    """bytes-like of NCCL_ID_BYTES -> a te_nccl_id; None -> None (NULL)."""
    data = id_bytes(nccl_id)
    if data is None:
        return None
    out = te_nccl_id()
    ctypes.memmove(byref(out), data, C.NCCL_ID_BYTES)
    return byref(out)


def nccl_get_unique_id():
    """A new NCCL unique id: bytes of length NCCL_ID_BYTES."""
    out = te_nccl_id()
    st = _nccl_get_unique_id(byref(out))
    if st:
        _raise(st)
    return ctypes.string_at(byref(out), C.NCCL_ID_BYTES)


def group_nccl_options_defaults():
    """te_group_nccl_options_init as a dict: {'timeout_ms': ...}."""
    o = te_group_nccl_options()
    st = _group_nccl_options_init(byref(o))
    if st:
        _raise(st)
    return {"timeout_ms": o.timeout_ms}


def group_init_nccl(rank, nranks, nccl_id):
    """te_group_init_nccl; nccl_id: bytes of length NCCL_ID_BYTES (None is NULL)."""
    h = c_void_p()
    st = _group_init_nccl(byref(h), rank, nranks, _nccl_id(nccl_id))
    if st:
        _raise(st)
    return h.value


def group_init_nccl_with_options(rank, nranks, nccl_id, timeout_ms):
    o = te_group_nccl_options()
    st = _group_nccl_options_init(byref(o))
    if st:
        _raise(st)
    o.timeout_ms = timeout_ms
    h = c_void_p()
    st = _group_init_nccl_with_options(byref(h), rank, nranks, _nccl_id(nccl_id), byref(o))
    if st:
        _raise(st)
    return h.value


def group_abort(g):
    st = _group_abort(g)
    if st:
        _raise(st)


def group_destroy(g):
    _group_destroy(g)


def group_id(g):
    return _group_id(g)


def group_rank(g):
    return _group_rank(g)


def group_size(g):
    return _group_size(g)


# ---- autocast: the hot path ----------------------------------------------------------------------

class AutocastOptions:
    """A prebuilt te_autocast_options plus the token slot its begin calls write: one object per
    libte.autocast, so begin/end allocate nothing."""

    __slots__ = ("opts", "addr", "token", "token_addr")

    def __init__(self, enabled, calibrating, recipe, group):
        o = te_autocast_options()
        st = _autocast_options_init(byref(o))
        if st:
            _raise(st)
        o.enabled = 1 if enabled else 0
        o.calibrating = 1 if calibrating else 0
        o.recipe = recipe
        o.group = group
        self.opts = o
        self.addr = ctypes.addressof(o)
        self.token = c_uint64()
        self.token_addr = ctypes.addressof(self.token)


def autocast_options(enabled, calibrating, recipe, group):
    return AutocastOptions(enabled, calibrating, recipe, group)


def autocast_begin(ctx, opts):
    st = _autocast_begin(ctx, opts.addr, opts.token_addr)
    if st:
        _raise(st)
    return opts.token.value


def autocast_end(ctx, token):
    st = _autocast_end(ctx, token)
    if st:
        _raise(st)


def autocast_get_state(ctx):
    """(enabled, calibrating, depth, recipe key or 0, recipe description or '')."""
    s = te_autocast_state(ctypes.sizeof(te_autocast_state))
    st = _autocast_get_state(ctx, byref(s))
    if st:
        _raise(st)
    return (s.enabled, s.calibrating, s.depth, _recipe_key(s.recipe),
            _recipe_describe(s.recipe).decode())


def autocast_flush_backward(ctx):
    st = _autocast_flush_backward(ctx)
    if st:
        _raise(st)


# ---- linear ------------------------------------------------------------------------------------

def linear_create(ctx, in_features, out_features, bias, dtype, fuse_wgrad_accumulation):
    o = te_linear_options()
    st = _linear_options_init(byref(o))
    if st:
        _raise(st)
    o.in_features = in_features
    o.out_features = out_features
    o.bias = 1 if bias else 0
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    h = c_void_p()
    st = _linear_create(byref(h), ctx, byref(o))
    if st:
        _raise(st)
    return h.value


def linear_destroy(lin):
    _linear_destroy(lin)


def _forward_args(x, w, b, weight_unchanged):
    s = _scratch
    f = s.fwd
    f.input = _tensor(0, x)
    f.weight = _tensor(1, w)
    f.bias = _tensor(2, b)
    f.weight_unchanged = 1 if weight_unchanged else 0
    return s.fwd_addr


def linear_forward_compute(ctx, lin, x, w, b, weight_unchanged, y):
    """Runs forward_compute; returns the filled residuals (an opaque object for
    residuals_tensors / residuals_release / linear_forward_save)."""
    res = te_linear_residuals(ctypes.sizeof(te_linear_residuals))
    st = _linear_forward_compute(ctx, lin, _forward_args(x, w, b, weight_unchanged),
                                 _tensor(3, y), byref(res))
    if st:
        _raise(st)
    return res


def residuals_tensors(res):
    """(input_t TensorDesc, weight_t TensorDesc, fp8 flag)."""
    return _desc(res.input_t), _desc(res.weight_t), bool(res.fp8)


def residuals_release(res):
    _linear_residuals_release(byref(res))


def linear_forward_save(ctx, lin, res):
    h = c_void_p()
    st = _linear_forward_save(ctx, lin, byref(res), byref(h))
    if st:
        _raise(st)
    return h.value


def linear_forward(ctx, lin, x, w, b, weight_unchanged, y):
    h = c_void_p()
    st = _linear_forward(ctx, lin, _forward_args(x, w, b, weight_unchanged), _tensor(3, y),
                         byref(h))
    if st:
        _raise(st)
    return h.value


_BACKWARD_ARGS = (te_linear_backward_args(ctypes.sizeof(te_linear_backward_args), 0),
                  te_linear_backward_args(ctypes.sizeof(te_linear_backward_args),
                                          C.BACKWARD_ONCE))
_BACKWARD_ADDRS = tuple(ctypes.addressof(a) for a in _BACKWARD_ARGS)


def linear_backward(ctx, bwd, dy, dx, dw, db, once):
    st = _linear_backward(ctx, bwd, _tensor(0, dy), _tensor(1, dx), _tensor(2, dw),
                          _tensor(3, db), _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def linear_backward_ctx_destroy(bwd):
    _linear_backward_ctx_destroy(bwd)


# Residuals in the caller's memory: `residuals` is an int address (0 or None: NULL).

def _no_caller_residuals():
    raise Unsupported("this libte has no te_linear_residuals_size / forward_compute_into / "
                      "backward_from (built before they existed)")


def linear_residuals_size(ctx, lin, x, w, b):
    """te_linear_residuals_size: bytes of residual memory (x, w, b: shapes only; data may be
    0)."""
    if not _linear_residuals_size:
        _no_caller_residuals()
    size = _scratch.size
    st = _linear_residuals_size(ctx, lin, _forward_args(x, w, b, False), byref(size))
    if st:
        _raise(st)
    return size.value


def linear_forward_compute_into(ctx, lin, x, w, b, weight_unchanged, y, residuals, nbytes):
    if not _linear_forward_compute_into:
        _no_caller_residuals()
    st = _linear_forward_compute_into(ctx, lin, _forward_args(x, w, b, weight_unchanged),
                                      _tensor(3, y), residuals or None, nbytes)
    if st:
        _raise(st)


def linear_backward_from(ctx, lin, x, w, b, residuals, nbytes, dy, dx, dw, db, once):
    """te_linear_backward_from; x, w, b all None: inputs NULL (FP8 forwards only)."""
    if not _linear_backward_from:
        _no_caller_residuals()
    inputs = (None if x is None and w is None and b is None
              else _forward_args(x, w, b, False))
    st = _linear_backward_from(ctx, lin, inputs, residuals or None, nbytes, _tensor(3, dy),
                               _tensor(4, dx), _tensor(5, dw), _tensor(6, db),
                               _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def linear_get_scaling_state(ctx, lin, role, history_cap):
    """(scale, scale_inv, amax_history_len, fp8_dtype, history floats as a list)."""
    info = te_scaling_state_info(ctypes.sizeof(te_scaling_state_info))
    history = (c_float * max(history_cap, 1))()
    st = _linear_get_scaling_state(ctx, lin, role, byref(info), history, history_cap)
    if st:
        _raise(st)
    n = min(history_cap, info.amax_history_len)
    return info.scale, info.scale_inv, info.amax_history_len, info.fp8_dtype, list(history[:n])


def linear_state_save(ctx, lin):
    size = c_size_t()
    st = _linear_state_save(ctx, lin, None, 0, byref(size))
    if st:
        _raise(st)
    buf = ctypes.create_string_buffer(size.value)
    st = _linear_state_save(ctx, lin, buf, size.value, byref(size))
    if st:
        _raise(st)
    return buf.raw[:size.value]


def linear_state_load(ctx, lin, data):
    st = _linear_state_load(ctx, lin, data, len(data))
    if st:
        _raise(st)


# ---- activations and primitives ----------------------------------------------------------------

def activation_forward(ctx, act, x, y):
    st = _activation_forward(ctx, act, _tensor(0, x), _tensor(1, y))
    if st:
        _raise(st)


def activation_backward(ctx, act, x, dy, dx):
    st = _activation_backward(ctx, act, _tensor(0, x), _tensor(1, dy), _tensor(2, dx))
    if st:
        _raise(st)


def _quantize_options(scale, amax, amax_epsilon, power_of_2_scales):
    q = _scratch.qopts
    q.scale = scale or None
    q.amax = amax or None
    q.amax_epsilon = amax_epsilon
    q.power_of_2_scales = 1 if power_of_2_scales else 0
    return byref(q)


def quantize(ctx, x, out, scale, amax, amax_epsilon, power_of_2_scales):
    st = _quantize(ctx, _tensor(0, x), _tensor(1, out),
                   _quantize_options(scale, amax, amax_epsilon, power_of_2_scales))
    if st:
        _raise(st)


def cast_transpose(ctx, x, out, out_t, scale, amax, amax_epsilon, power_of_2_scales):
    st = _cast_transpose(ctx, _tensor(0, x), _tensor(1, out), _tensor(2, out_t),
                         _quantize_options(scale, amax, amax_epsilon, power_of_2_scales))
    if st:
        _raise(st)


def dequantize(ctx, x, out):
    st = _dequantize(ctx, _tensor(0, x), _tensor(1, out))
    if st:
        _raise(st)


def amax(ctx, x, out_ptr):
    st = _amax(ctx, _tensor(0, x), out_ptr)
    if st:
        _raise(st)


def gemm(ctx, a, b, d, transa, transb, epilogue, bias, gelu_input, accumulate, split_accumulator):
    g = _scratch.gopts
    g.transa = 1 if transa else 0
    g.transb = 1 if transb else 0
    g.epilogue = epilogue
    g.bias = _tensor(3, bias)
    g.gelu_input = _tensor(4, gelu_input)
    g.accumulate = 1 if accumulate else 0
    g.use_split_accumulator = 1 if split_accumulator else 0
    st = _gemm(ctx, _tensor(0, a), _tensor(1, b), _tensor(2, d), byref(g))
    if st:
        _raise(st)


# ---- normalization -----------------------------------------------------------------------------

def norm_defaults():
    """te_norm_options_init as a dict: {'kind', 'eps', 'zero_centered_gamma'}."""
    o = te_norm_options()
    st = _norm_options_init(byref(o))
    if st:
        _raise(st)
    return {"kind": o.kind, "eps": o.eps, "zero_centered_gamma": o.zero_centered_gamma}


def _norm_options(kind, eps, zero_centered_gamma):
    o = _scratch.nopts
    o.kind = kind
    o.eps = eps
    o.zero_centered_gamma = zero_centered_gamma
    return byref(o)


def norm_forward(ctx, kind, eps, zero_centered_gamma, x, gamma, beta, out, out_t, mu, rsigma,
                 quantize):
    """te_norm_forward. quantize: None (the field NULL), or (scale, amax, amax_epsilon,
    power_of_2_scales) with scale and amax addresses (0 or None for NULL)."""
    a = _scratch.nargs
    a.input = _tensor(0, x)
    a.weight = _tensor(1, gamma)
    a.bias = _tensor(2, beta)
    a.output = _tensor(3, out)
    a.output_t = _tensor(4, out_t)
    a.mu = _tensor(5, mu)
    a.rsigma = _tensor(6, rsigma)
    if quantize is None:
        a.quantize = None
    else:
        scale, amax, amax_epsilon, power_of_2_scales = quantize
        q = _scratch.nqopts
        q.scale = scale or None
        q.amax = amax or None
        q.amax_epsilon = amax_epsilon
        q.power_of_2_scales = power_of_2_scales
        a.quantize = ctypes.addressof(q)
    st = _norm_forward(ctx, _norm_options(kind, eps, zero_centered_gamma), byref(a))
    if st:
        _raise(st)


def norm_backward(ctx, kind, eps, zero_centered_gamma, dy, x, gamma, mu, rsigma, dx, dgamma,
                  dbeta):
    st = _norm_backward(ctx, _norm_options(kind, eps, zero_centered_gamma), _tensor(0, dy),
                        _tensor(1, x), _tensor(2, gamma), _tensor(3, mu), _tensor(4, rsigma),
                        _tensor(5, dx), _tensor(6, dgamma), _tensor(7, dbeta))
    if st:
        _raise(st)


# ---- transformer modules: LayerNormLinear, LayerNormMLP, GroupedLinear ------------------------

def _module(fns, prefix):
    if fns is None:
        raise Unsupported("te_%s_create: the loaded libte.so (%s) does not export te_%s_*; "
                          "rebuild libte" % (prefix, version_string(), prefix))
    return fns


def _options(fns, cls):
    o = cls()
    st = fns["options_init"](byref(o))
    if st:
        _raise(st)
    return o


def _create(fns, ctx, opts):
    h = c_void_p()
    st = fns["create"](byref(h), ctx, byref(opts))
    if st:
        _raise(st)
    return h.value


def _forward_compute(fns, ctx, m, args, y, res):
    st = fns["forward_compute"](ctx, m, args, _tensor(11, y), byref(res))
    if st:
        _raise(st)
    return res


def _forward(fns, ctx, m, args, y):
    h = c_void_p()
    st = fns["forward"](ctx, m, args, _tensor(11, y), byref(h))
    if st:
        _raise(st)
    return h.value


def _forward_save(fns, ctx, m, res):
    h = c_void_p()
    st = fns["forward_save"](ctx, m, byref(res), byref(h))
    if st:
        _raise(st)
    return h.value


def _scaling_state(fns, ctx, m, selector, role, history_cap):
    info = te_scaling_state_info(ctypes.sizeof(te_scaling_state_info))
    history = (c_float * max(history_cap, 1))()
    st = fns["get_scaling_state"](ctx, m, *selector, role, byref(info), history, history_cap)
    if st:
        _raise(st)
    n = min(history_cap, info.amax_history_len)
    return info.scale, info.scale_inv, info.amax_history_len, info.fp8_dtype, list(history[:n])


def _state_save(fns, ctx, m):
    size = c_size_t()
    st = fns["state_save"](ctx, m, None, 0, byref(size))
    if st:
        _raise(st)
    buf = ctypes.create_string_buffer(size.value)
    st = fns["state_save"](ctx, m, buf, size.value, byref(size))
    if st:
        _raise(st)
    return buf.raw[:size.value]


def _state_load(fns, ctx, m, data):
    st = fns["state_load"](ctx, m, data, len(data))
    if st:
        _raise(st)


# LayerNormLinear

def layernorm_linear_create(ctx, in_features, out_features, bias, dtype, fuse_wgrad_accumulation,
                            normalization, eps, zero_centered_gamma):
    fns = _module(_lnl, "layernorm_linear")
    o = _options(fns, te_layernorm_linear_options)
    o.in_features = in_features
    o.out_features = out_features
    o.bias = 1 if bias else 0
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    o.normalization = normalization
    o.eps = eps
    o.zero_centered_gamma = 1 if zero_centered_gamma else 0
    return _create(fns, ctx, o)


def layernorm_linear_destroy(m):
    _lnl["destroy"](m)


def _lnl_args(x, gamma, beta, w, b, weight_unchanged, ln_out):
    a = te_layernorm_linear_forward_args(ctypes.sizeof(te_layernorm_linear_forward_args))
    a.input = _tensor(0, x)
    a.ln_weight = _tensor(1, gamma)
    a.ln_bias = _tensor(2, beta)
    a.weight = _tensor(3, w)
    a.bias = _tensor(4, b)
    a.weight_unchanged = 1 if weight_unchanged else 0
    a.ln_out = _tensor(5, ln_out)
    return byref(a)


def layernorm_linear_forward_compute(ctx, m, x, gamma, beta, w, b, weight_unchanged, ln_out, y):
    res = te_layernorm_linear_residuals(ctypes.sizeof(te_layernorm_linear_residuals))
    return _forward_compute(_module(_lnl, "layernorm_linear"), ctx, m,
                            _lnl_args(x, gamma, beta, w, b, weight_unchanged, ln_out), y, res)


def layernorm_linear_residuals_tensors(res):
    """(ln_out_t, weight_t, mu, rsigma) TensorDescs and the fp8 flag; mu's data is 0 for
    RMSNorm."""
    return (_desc(res.ln_out_t), _desc(res.weight_t), _desc(res.mu), _desc(res.rsigma),
            bool(res.fp8))


def layernorm_linear_residuals_release(res):
    _lnl["residuals_release"](byref(res))


def layernorm_linear_forward_save(ctx, m, res):
    return _forward_save(_lnl, ctx, m, res)


def layernorm_linear_forward(ctx, m, x, gamma, beta, w, b, weight_unchanged, ln_out, y):
    return _forward(_module(_lnl, "layernorm_linear"), ctx, m,
                    _lnl_args(x, gamma, beta, w, b, weight_unchanged, ln_out), y)


def layernorm_linear_backward(ctx, bwd, dy, dx, dgamma, dbeta, dw, db, once):
    g = te_layernorm_linear_grads(ctypes.sizeof(te_layernorm_linear_grads))
    g.dx = _tensor(1, dx)
    g.dln_weight = _tensor(2, dgamma)
    g.dln_bias = _tensor(3, dbeta)
    g.dw = _tensor(4, dw)
    g.db = _tensor(5, db)
    st = _lnl["backward"](ctx, bwd, _tensor(0, dy), byref(g), _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def _caller_fns(fns, prefix):
    fns = _module(fns, prefix)
    if "residuals_size" not in fns:
        raise Unsupported("te_%s_residuals_size: the loaded libte.so (%s) predates residuals in "
                          "the caller's memory; rebuild libte" % (prefix, version_string()))
    return fns


def _residuals_size(fns, ctx, m, args):
    size = _scratch.size
    st = fns["residuals_size"](ctx, m, args, byref(size))
    if st:
        _raise(st)
    return size.value


def _forward_compute_into(fns, ctx, m, args, y, residuals, nbytes):
    st = fns["forward_compute_into"](ctx, m, args, _tensor(15, y), residuals or None, nbytes)
    if st:
        _raise(st)


def layernorm_linear_residuals_size(ctx, m, x, gamma, beta, w, b):
    return _residuals_size(_caller_fns(_lnl, "layernorm_linear"), ctx, m,
                           _lnl_args(x, gamma, beta, w, b, False, None))


def layernorm_linear_forward_compute_into(ctx, m, x, gamma, beta, w, b, weight_unchanged, y,
                                          residuals, nbytes):
    _forward_compute_into(_caller_fns(_lnl, "layernorm_linear"), ctx, m,
                          _lnl_args(x, gamma, beta, w, b, weight_unchanged, None), y,
                          residuals, nbytes)


def layernorm_linear_backward_from(ctx, m, x, gamma, beta, w, b, residuals, nbytes, dy, dx,
                                   dgamma, dbeta, dw, db, once):
    fns = _caller_fns(_lnl, "layernorm_linear")
    g = te_layernorm_linear_grads(ctypes.sizeof(te_layernorm_linear_grads))
    g.dx = _tensor(7, dx)
    g.dln_weight = _tensor(8, dgamma)
    g.dln_bias = _tensor(9, dbeta)
    g.dw = _tensor(10, dw)
    g.db = _tensor(11, db)
    st = fns["backward_from"](ctx, m, _lnl_args(x, gamma, beta, w, b, False, None),
                              residuals or None, nbytes, _tensor(6, dy), byref(g),
                              _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def layernorm_linear_backward_ctx_destroy(bwd):
    _lnl["backward_ctx_destroy"](bwd)


def layernorm_linear_get_scaling_state(ctx, m, role, history_cap):
    return _scaling_state(_lnl, ctx, m, (), role, history_cap)


def layernorm_linear_state_save(ctx, m):
    return _state_save(_lnl, ctx, m)


def layernorm_linear_state_load(ctx, m, data):
    _state_load(_lnl, ctx, m, data)


# LayerNormMLP

def layernorm_mlp_create(ctx, hidden_size, ffn_hidden_size, bias, activation, dtype,
                         fuse_wgrad_accumulation, normalization, eps, zero_centered_gamma):
    fns = _module(_mlp, "layernorm_mlp")
    o = _options(fns, te_layernorm_mlp_options)
    o.hidden_size = hidden_size
    o.ffn_hidden_size = ffn_hidden_size
    o.bias = 1 if bias else 0
    o.activation = activation
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    o.normalization = normalization
    o.eps = eps
    o.zero_centered_gamma = 1 if zero_centered_gamma else 0
    return _create(fns, ctx, o)


def layernorm_mlp_destroy(m):
    _mlp["destroy"](m)


def _mlp_args(x, gamma, beta, w1, b1, w2, b2, weight_unchanged, ln_out):
    a = te_layernorm_mlp_forward_args(ctypes.sizeof(te_layernorm_mlp_forward_args))
    a.input = _tensor(0, x)
    a.ln_weight = _tensor(1, gamma)
    a.ln_bias = _tensor(2, beta)
    a.fc1_weight = _tensor(3, w1)
    a.fc1_bias = _tensor(4, b1)
    a.fc2_weight = _tensor(5, w2)
    a.fc2_bias = _tensor(6, b2)
    a.weight_unchanged = 1 if weight_unchanged else 0
    a.ln_out = _tensor(7, ln_out)
    return byref(a)


def layernorm_mlp_forward_compute(ctx, m, x, gamma, beta, w1, b1, w2, b2, weight_unchanged,
                                  ln_out, y):
    res = te_layernorm_mlp_residuals(ctypes.sizeof(te_layernorm_mlp_residuals))
    return _forward_compute(_module(_mlp, "layernorm_mlp"), ctx, m,
                            _mlp_args(x, gamma, beta, w1, b1, w2, b2, weight_unchanged, ln_out),
                            y, res)


def layernorm_mlp_residuals_tensors(res):
    """(ln_out_t, fc1_weight_t, fc1_out, act_out_t, fc2_weight_t, mu, rsigma) TensorDescs and
    the fp8 flag."""
    return (_desc(res.ln_out_t), _desc(res.fc1_weight_t), _desc(res.fc1_out),
            _desc(res.act_out_t), _desc(res.fc2_weight_t), _desc(res.mu), _desc(res.rsigma),
            bool(res.fp8))


def layernorm_mlp_residuals_release(res):
    _mlp["residuals_release"](byref(res))


def layernorm_mlp_forward_save(ctx, m, res):
    return _forward_save(_mlp, ctx, m, res)


def layernorm_mlp_forward(ctx, m, x, gamma, beta, w1, b1, w2, b2, weight_unchanged, ln_out, y):
    return _forward(_module(_mlp, "layernorm_mlp"), ctx, m,
                    _mlp_args(x, gamma, beta, w1, b1, w2, b2, weight_unchanged, ln_out), y)


def layernorm_mlp_backward(ctx, bwd, dy, dx, dgamma, dbeta, dw1, db1, dw2, db2, once):
    g = te_layernorm_mlp_grads(ctypes.sizeof(te_layernorm_mlp_grads))
    g.dx = _tensor(1, dx)
    g.dln_weight = _tensor(2, dgamma)
    g.dln_bias = _tensor(3, dbeta)
    g.dfc1_weight = _tensor(4, dw1)
    g.dfc1_bias = _tensor(5, db1)
    g.dfc2_weight = _tensor(6, dw2)
    g.dfc2_bias = _tensor(7, db2)
    st = _mlp["backward"](ctx, bwd, _tensor(0, dy), byref(g), _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def layernorm_mlp_residuals_size(ctx, m, x, gamma, beta, w1, b1, w2, b2):
    return _residuals_size(_caller_fns(_mlp, "layernorm_mlp"), ctx, m,
                           _mlp_args(x, gamma, beta, w1, b1, w2, b2, False, None))


def layernorm_mlp_forward_compute_into(ctx, m, x, gamma, beta, w1, b1, w2, b2, weight_unchanged,
                                       y, residuals, nbytes):
    _forward_compute_into(_caller_fns(_mlp, "layernorm_mlp"), ctx, m,
                          _mlp_args(x, gamma, beta, w1, b1, w2, b2, weight_unchanged, None), y,
                          residuals, nbytes)


def layernorm_mlp_backward_from(ctx, m, x, gamma, beta, w1, b1, w2, b2, residuals, nbytes, dy,
                                dx, dgamma, dbeta, dw1, db1, dw2, db2, once):
    fns = _caller_fns(_mlp, "layernorm_mlp")
    g = te_layernorm_mlp_grads(ctypes.sizeof(te_layernorm_mlp_grads))
    g.dx = _tensor(9, dx)
    g.dln_weight = _tensor(10, dgamma)
    g.dln_bias = _tensor(11, dbeta)
    g.dfc1_weight = _tensor(12, dw1)
    g.dfc1_bias = _tensor(13, db1)
    g.dfc2_weight = _tensor(14, dw2)
    g.dfc2_bias = _tensor(15, db2)
    st = fns["backward_from"](ctx, m, _mlp_args(x, gamma, beta, w1, b1, w2, b2, False, None),
                              residuals or None, nbytes, _tensor(8, dy), byref(g),
                              _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def layernorm_mlp_backward_ctx_destroy(bwd):
    _mlp["backward_ctx_destroy"](bwd)


def layernorm_mlp_get_scaling_state(ctx, m, gemm, role, history_cap):
    return _scaling_state(_mlp, ctx, m, (gemm,), role, history_cap)


def layernorm_mlp_state_save(ctx, m):
    return _state_save(_mlp, ctx, m)


def layernorm_mlp_state_load(ctx, m, data):
    _state_load(_mlp, ctx, m, data)


# GroupedLinear: arrays of tensors are lists of TensorDescs, m_splits a list of ints.

def grouped_linear_create(ctx, num_gemms, in_features, out_features, bias, dtype,
                          fuse_wgrad_accumulation):
    fns = _module(_grouped, "grouped_linear")
    o = _options(fns, te_grouped_linear_options)
    o.num_gemms = num_gemms
    o.in_features = in_features
    o.out_features = out_features
    o.bias = 1 if bias else 0
    o.activation_dtype = dtype
    o.fuse_wgrad_accumulation = 1 if fuse_wgrad_accumulation else 0
    return _create(fns, ctx, o)


def grouped_linear_destroy(g):
    _grouped["destroy"](g)


def _at_most(values, name):
    if len(values) > C.GROUPED_LINEAR_MAX_GEMMS:
        raise InvalidArgument("argument '%s': expected at most %d entries "
                              "(TE_GROUPED_LINEAR_MAX_GEMMS), got %d"
                              % (name, C.GROUPED_LINEAR_MAX_GEMMS, len(values)))


class _TensorArray:
    """A C array of te_tensor pointers over a list of TensorDescs (None entries are NULL),
    kept alive as long as this object. It always holds GROUPED_LINEAR_MAX_GEMMS pointers, NULL
    past the list: the library reads num_gemms of them, so a short list is an error naming the
    missing element, never a read past the array."""

    __slots__ = ("tensors", "pointers")

    def __init__(self, descs, name):
        _at_most(descs, name)
        n = len(descs)
        self.tensors = (te_tensor * max(n, 1))()
        self.pointers = (c_void_p * C.GROUPED_LINEAR_MAX_GEMMS)()
        base = ctypes.addressof(self.tensors)
        size = ctypes.sizeof(te_tensor)
        for i, desc in enumerate(descs):
            if desc is None:
                continue
            data, dtype, shape, device_type, device_index, scale_inv, scaling = desc
            _TENSOR.pack_into(self.tensors, i * size, data or 0, dtype, len(shape), *shape,
                              *_PAD[len(shape)], device_type, device_index, scale_inv or 0,
                              scaling)
            self.pointers[i] = base + i * size


def _grouped_args(x, m_splits, weights, biases, weight_unchanged):
    """The forward args and what they point to (to keep alive for the call)."""
    a = te_grouped_linear_forward_args(ctypes.sizeof(te_grouped_linear_forward_args))
    _at_most(m_splits, "m_splits")
    splits = (c_int64 * C.GROUPED_LINEAR_MAX_GEMMS)(*m_splits)
    w = _TensorArray(weights, "weights")
    b = _TensorArray(biases, "biases") if biases is not None else None
    a.input = _tensor(0, x)
    a.m_splits = ctypes.addressof(splits)
    a.weights = ctypes.addressof(w.pointers)
    a.biases = ctypes.addressof(b.pointers) if b is not None else None
    a.weight_unchanged = 1 if weight_unchanged else 0
    return a, (splits, w, b)


def grouped_linear_forward_compute(ctx, g, x, m_splits, weights, biases, weight_unchanged, y):
    fns = _module(_grouped, "grouped_linear")
    a, _keep = _grouped_args(x, m_splits, weights, biases, weight_unchanged)
    res = te_grouped_linear_residuals(ctypes.sizeof(te_grouped_linear_residuals))
    return _forward_compute(fns, ctx, g, byref(a), y, res)


def grouped_linear_residuals_fp8(res):
    return bool(res.fp8)


def grouped_linear_residuals_release(res):
    _grouped["residuals_release"](byref(res))


def grouped_linear_forward_save(ctx, g, res):
    return _forward_save(_grouped, ctx, g, res)


def grouped_linear_forward(ctx, g, x, m_splits, weights, biases, weight_unchanged, y):
    fns = _module(_grouped, "grouped_linear")
    a, _keep = _grouped_args(x, m_splits, weights, biases, weight_unchanged)
    return _forward(fns, ctx, g, byref(a), y)


def grouped_linear_backward(ctx, bwd, dy, dx, dw, db, once):
    """dw, db: lists of TensorDescs, or None to skip the whole array."""
    w = _TensorArray(dw, "dw") if dw is not None else None
    b = _TensorArray(db, "db") if db is not None else None
    st = _grouped["backward"](ctx, bwd, _tensor(0, dy), _tensor(1, dx),
                              ctypes.addressof(w.pointers) if w is not None else None,
                              ctypes.addressof(b.pointers) if b is not None else None,
                              _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def grouped_linear_residuals_size(ctx, g, x, m_splits, weights, biases):
    fns = _caller_fns(_grouped, "grouped_linear")
    a, _keep = _grouped_args(x, m_splits, weights, biases, False)
    return _residuals_size(fns, ctx, g, byref(a))


def grouped_linear_forward_compute_into(ctx, g, x, m_splits, weights, biases, weight_unchanged,
                                        y, residuals, nbytes):
    fns = _caller_fns(_grouped, "grouped_linear")
    a, _keep = _grouped_args(x, m_splits, weights, biases, weight_unchanged)
    _forward_compute_into(fns, ctx, g, byref(a), y, residuals, nbytes)


def grouped_linear_backward_from(ctx, g, x, m_splits, weights, biases, residuals, nbytes, dy, dx,
                                 dw, db, once):
    """x None: inputs NULL (FP8 forwards only). dw, db: lists of TensorDescs, or None."""
    fns = _caller_fns(_grouped, "grouped_linear")
    a = keep = None
    if x is not None:
        a, keep = _grouped_args(x, m_splits, weights, biases, False)
    w = _TensorArray(dw, "dw") if dw is not None else None
    b = _TensorArray(db, "db") if db is not None else None
    st = fns["backward_from"](ctx, g, byref(a) if a is not None else None, residuals or None,
                              nbytes, _tensor(1, dy), _tensor(2, dx),
                              ctypes.addressof(w.pointers) if w is not None else None,
                              ctypes.addressof(b.pointers) if b is not None else None,
                              _BACKWARD_ADDRS[1 if once else 0])
    del keep
    if st:
        _raise(st)


def grouped_linear_backward_ctx_destroy(bwd):
    _grouped["backward_ctx_destroy"](bwd)


def grouped_linear_get_scaling_state(ctx, g, expert, role, history_cap):
    return _scaling_state(_grouped, ctx, g, (expert,), role, history_cap)


def grouped_linear_state_save(ctx, g):
    return _state_save(_grouped, ctx, g)


def grouped_linear_state_load(ctx, g, data):
    _state_load(_grouped, ctx, g, data)


# Attention (absent from a libte.so built before it: Unsupported)

def attention_create(ctx, num_heads, num_kv_heads, head_dim, softmax_scale, mask, dtype, fp8):
    fns = _module(_attn, "attention")
    o = _options(fns, te_attention_options)
    o.num_heads = num_heads
    o.num_kv_heads = num_kv_heads
    o.head_dim = head_dim
    o.softmax_scale = softmax_scale
    o.mask = mask
    o.activation_dtype = dtype
    o.fp8 = 1 if fp8 else 0
    return _create(fns, ctx, o)


def attention_destroy(m):
    _attn["destroy"](m)


def _attn_args(q, k, v, cu_q, cu_kv, max_q, max_kv):
    a = te_attention_forward_args(ctypes.sizeof(te_attention_forward_args))
    a.q = _tensor(0, q)
    a.k = _tensor(1, k)
    a.v = _tensor(2, v)
    a.cu_seqlens_q = _tensor(3, cu_q)
    a.cu_seqlens_kv = _tensor(4, cu_kv)
    a.max_seqlen_q = max_q or 0
    a.max_seqlen_kv = max_kv or 0
    return byref(a)


def attention_forward_compute(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o):
    res = te_attention_residuals(ctypes.sizeof(te_attention_residuals))
    return _forward_compute(_module(_attn, "attention"), ctx, m,
                            _attn_args(q, k, v, cu_q, cu_kv, max_q, max_kv), o, res)


def attention_residuals_tensors(res):
    """(q, k, v, o, lse) TensorDescs and the fp8 flag."""
    return (_desc(res.q), _desc(res.k), _desc(res.v), _desc(res.o), _desc(res.lse),
            bool(res.fp8))


def attention_residuals_release(res):
    _attn["residuals_release"](byref(res))


def attention_forward_save(ctx, m, res):
    return _forward_save(_attn, ctx, m, res)


def attention_forward(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o):
    return _forward(_module(_attn, "attention"), ctx, m,
                    _attn_args(q, k, v, cu_q, cu_kv, max_q, max_kv), o)


def _attn_grads(slot, dq, dk, dv):
    g = te_attention_grads(ctypes.sizeof(te_attention_grads))
    g.dq = _tensor(slot, dq)
    g.dk = _tensor(slot + 1, dk)
    g.dv = _tensor(slot + 2, dv)
    return g


def attention_backward(ctx, bwd, d_o, dq, dk, dv, once):
    g = _attn_grads(1, dq, dk, dv)
    st = _attn["backward"](ctx, bwd, _tensor(0, d_o), byref(g),
                           _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def attention_backward_ctx_destroy(bwd):
    _attn["backward_ctx_destroy"](bwd)


def attention_residuals_size(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv):
    return _residuals_size(_module(_attn, "attention"), ctx, m,
                           _attn_args(q, k, v, cu_q, cu_kv, max_q, max_kv))


def attention_forward_compute_into(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o, residuals,
                                   nbytes):
    _forward_compute_into(_module(_attn, "attention"), ctx, m,
                          _attn_args(q, k, v, cu_q, cu_kv, max_q, max_kv), o, residuals, nbytes)


def attention_backward_from(ctx, m, q, k, v, cu_q, cu_kv, max_q, max_kv, o, residuals, nbytes,
                            d_o, dq, dk, dv, once):
    fns = _module(_attn, "attention")
    g = _attn_grads(7, dq, dk, dv)
    st = fns["backward_from"](ctx, m, _attn_args(q, k, v, cu_q, cu_kv, max_q, max_kv),
                              _tensor(5, o), residuals or None, nbytes, _tensor(6, d_o),
                              byref(g), _BACKWARD_ADDRS[1 if once else 0])
    if st:
        _raise(st)


def attention_get_scaling_state(ctx, m, which, history_cap):
    return _scaling_state(_attn, ctx, m, (), which, history_cap)


def attention_state_save(ctx, m):
    return _state_save(_attn, ctx, m)


def attention_state_load(ctx, m, data):
    _state_load(_attn, ctx, m, data)


# RoPE

def _rope_fns():
    if _rope is None:
        raise Unsupported("te_rope_forward: the loaded libte.so (%s) does not export te_rope_*; "
                          "rebuild libte" % version_string())
    return _rope


def _rope_options(fns, rot_dim, interleaved):
    o = te_rope_options()
    st = fns["options_init"](byref(o))
    if st:
        _raise(st)
    o.rot_dim = rot_dim
    o.interleaved = 1 if interleaved else 0
    return byref(o)


def rope_forward(ctx, rot_dim, interleaved, x, freqs, cu_seqlens, y):
    fns = _rope_fns()
    st = fns["forward"](ctx, _rope_options(fns, rot_dim, interleaved), _tensor(0, x),
                        _tensor(1, freqs), _tensor(2, cu_seqlens), _tensor(3, y))
    if st:
        _raise(st)


def rope_backward(ctx, rot_dim, interleaved, dy, freqs, cu_seqlens, dx):
    fns = _rope_fns()
    st = fns["backward"](ctx, _rope_options(fns, rot_dim, interleaved), _tensor(0, dy),
                         _tensor(1, freqs), _tensor(2, cu_seqlens), _tensor(3, dx))
    if st:
        _raise(st)


# ---- training-step ops ---------------------------------------------------------------------------

def _train_fn(key):
    f = _train.get(key)
    if f is None:
        raise Unsupported("te_%s: the loaded libte.so (%s) does not export it; rebuild libte"
                          % (key, version_string()))
    return f


def _call(key, *args):
    st = _train_fn(key)(*args)
    if st:
        _raise(st)


def add(ctx, a, b, y):
    _call("add", ctx, _tensor(0, a), _tensor(1, b), _tensor(2, y))


def split_columns(ctx, x, outputs):
    """outputs: a list of TensorDescs (None entries are NULL)."""
    arr = _TensorArray(outputs, "outputs")
    _call("split_columns", ctx, _tensor(0, x), ctypes.addressof(arr.pointers), len(outputs))


def concat_columns(ctx, inputs, y):
    arr = _TensorArray(inputs, "inputs")
    _call("concat_columns", ctx, ctypes.addressof(arr.pointers), len(inputs), _tensor(0, y))


def embedding_forward(ctx, table, ids, y):
    _call("embedding_forward", ctx, _tensor(0, table), _tensor(1, ids), _tensor(2, y))


def embedding_backward(ctx, ids, dy, dtable, accumulate):
    _call("embedding_backward", ctx, _tensor(0, ids), _tensor(1, dy), _tensor(2, dtable),
          1 if accumulate else 0)


def cross_entropy_defaults():
    """te_cross_entropy_options_init as a dict: {'ignore_index', 'grad_scale'}."""
    o = te_cross_entropy_options()
    _call("cross_entropy_options_init", byref(o))
    return {"ignore_index": o.ignore_index, "grad_scale": o.grad_scale}


def cross_entropy(ctx, ignore_index, grad_scale, logits, targets, loss, dlogits):
    fn = _train_fn("cross_entropy")
    o = te_cross_entropy_options()
    _call("cross_entropy_options_init", byref(o))
    o.ignore_index = ignore_index
    o.grad_scale = grad_scale
    st = fn(ctx, byref(o), _tensor(0, logits), _tensor(1, targets), _tensor(2, loss),
            _tensor(3, dlogits))
    if st:
        _raise(st)


ADAMW_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "step", "max_grad_norm")


def adamw_defaults():
    """te_adamw_options_init as a dict of ADAMW_FIELDS."""
    o = te_adamw_options()
    _call("adamw_options_init", byref(o))
    return {name: getattr(o, name) for name in ADAMW_FIELDS}


def adamw_param_defaults():
    """te_adamw_param_init as a dict: {'weight_decay', 'owner_kind', 'owner_gemm'}."""
    p = te_adamw_param()
    _call("adamw_param_init", byref(p))
    return {"weight_decay": p.weight_decay, "owner_kind": p.owner_kind,
            "owner_gemm": p.owner_gemm}


def adamw_step(ctx, options, grad_norm, params):
    """te_adamw_step. options: a dict of ADAMW_FIELDS; grad_norm: a device float's address (or
    0/None); params: a list of (param, grad, exp_avg, exp_avg_sq, model_weight, weight_decay,
    owner_kind, owner, owner_gemm), tensors as TensorDescs (or None), owner a module handle or
    None."""
    fn = _train_fn("adamw_step")
    o = te_adamw_options()
    _call("adamw_options_init", byref(o))
    for name in ADAMW_FIELDS:
        setattr(o, name, options[name])
    o.grad_norm = grad_norm or None
    n = len(params)
    arr = (te_adamw_param * max(n, 1))()
    tensors = (te_tensor * max(5 * n, 1))()
    base = ctypes.addressof(tensors)
    size = ctypes.sizeof(te_tensor)
    for i, entry in enumerate(params):
        (param, grad, exp_avg, exp_avg_sq, model_weight, weight_decay, owner_kind, owner,
         owner_gemm) = entry
        p = arr[i]
        _call("adamw_param_init", byref(p))
        ptrs = []
        for j, desc in enumerate((param, grad, exp_avg, exp_avg_sq, model_weight)):
            if desc is None:
                ptrs.append(None)
                continue
            data, dtype, shape, device_type, device_index, scale_inv, scaling = desc
            k = 5 * i + j
            _TENSOR.pack_into(tensors, k * size, data or 0, dtype, len(shape), *shape,
                              *_PAD[len(shape)], device_type, device_index, scale_inv or 0,
                              scaling)
            ptrs.append(base + k * size)
        p.param, p.grad, p.exp_avg, p.exp_avg_sq, p.model_weight = ptrs
        p.weight_decay = weight_decay
        p.owner_kind = owner_kind
        p.owner = owner or None
        p.owner_gemm = owner_gemm
    st = fn(ctx, byref(o), arr if n else None, n)
    del tensors
    if st:
        _raise(st)


# ---- checkpoints -------------------------------------------------------------------------------

def _name(name):
    return check_name(name)


def checkpoint_create():
    out = c_void_p()
    _call("checkpoint_create", byref(out))
    return out.value


def checkpoint_destroy(ck):
    f = _train.get("checkpoint_destroy")
    if f is not None:
        f(ck)


def checkpoint_put_tensor(ck, ctx, name, t):
    _call("checkpoint_put_tensor", ck, ctx, _name(name), _tensor(0, t))


def checkpoint_put_bytes(ck, name, data):
    """data: a bytes-like object, or None (NULL, size 0)."""
    if data is None:
        _call("checkpoint_put_bytes", ck, _name(name), None, 0)
        return
    raw = buffer_bytes(data)
    buf = ctypes.create_string_buffer(raw, max(len(raw), 1))
    _call("checkpoint_put_bytes", ck, _name(name), buf, len(raw))


def checkpoint_get_tensor(ck, ctx, name, t):
    _call("checkpoint_get_tensor", ck, ctx, _name(name), _tensor(0, t))


def checkpoint_get_bytes(ck, name):
    key = _name(name)
    size = c_size_t()
    _call("checkpoint_get_bytes", ck, key, None, 0, byref(size))
    buf = ctypes.create_string_buffer(max(size.value, 1))
    _call("checkpoint_get_bytes", ck, key, buf, size.value, byref(size))
    return buf.raw[:size.value]


def checkpoint_count(ck):
    count = c_size_t()
    _call("checkpoint_count", ck, byref(count))
    return count.value


def checkpoint_name(ck, index):
    """Record `index`'s name, as bytes."""
    name = c_char_p()
    _call("checkpoint_name", ck, index, byref(name))
    return name.value


def checkpoint_write(ck, path):
    _call("checkpoint_write", ck, check_path(path))


def checkpoint_read(path):
    out = c_void_p()
    _call("checkpoint_read", byref(out), check_path(path))
    return out.value


def checkpoint_serialize(ck):
    size = c_size_t()
    _call("checkpoint_serialize", ck, None, 0, byref(size))
    buf = ctypes.create_string_buffer(max(size.value, 1))
    _call("checkpoint_serialize", ck, buf, size.value, byref(size))
    return buf.raw[:size.value]


def checkpoint_deserialize(data):
    raw = buffer_bytes(data)
    buf = ctypes.create_string_buffer(raw, max(len(raw), 1))
    out = c_void_p()
    _call("checkpoint_deserialize", byref(out), buf, len(raw))
    return out.value


def checkpoint_record_info(ck, name):
    """(is_tensor, dtype, shape, size): dtype a te_dtype code and shape a tuple for a tensor
    record, both None for a byte record; size the payload's length in bytes."""
    is_tensor = c_int32()
    shape = te_tensor()
    size = c_size_t()
    _call("checkpoint_record_info", ck, _name(name), byref(is_tensor), byref(shape), byref(size))
    if not is_tensor.value:
        return False, None, None, size.value
    _, dtype, dims, *_ = _desc(shape)
    return True, dtype, dims, size.value
