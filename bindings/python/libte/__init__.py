"""libte: FP8 training from Python, over libte's C ABI.

    import numpy as np, libte
    with libte.Context("cpu") as ctx:
        layer = libte.Linear(ctx, 64, 32)
        with libte.autocast(ctx, recipe=libte.Recipe(kind="delayed")):
            y, bwd = layer.forward(x, w, b)
        dx, dw, db = bwd.backward(dy)

The low-level calls go through the SWIG extension (libte._te_swig) when it is built, else
ctypes; LIBTE_BACKEND=ctypes|swig forces one. `libte.BACKEND` says which is in use.
"""

from . import _constants as constants
from ._loader import path as library_path
from ._lowlevel import BACKEND, ll as _ll
from .attention import (Attention, AttentionBackwardContext, AttentionGradients,
                        AttentionResiduals, rope_backward, rope_forward)
from .autocast import AutocastState, autocast
from .context import Context, ContextStats
from .errors import (CublasError, CudaError, Error, InternalError, InvalidArgument,
                     InvalidState, NcclError, OutOfMemory, Unsupported)
from .group import Group, nccl_unique_id
from .grouped_linear import (GroupedLinear, GroupedLinearBackwardContext, GroupedLinearGradients,
                             GroupedLinearResiduals)
from .layernorm_linear import (LayerNormLinear, LayerNormLinearBackwardContext,
                               LayerNormLinearGradients, LayerNormLinearResiduals)
from .layernorm_mlp import (LayerNormMLP, LayerNormMLPBackwardContext, LayerNormMLPGradients,
                            LayerNormMLPResiduals)
from .linear import BackwardContext, Linear, Residuals, ScalingState
from .norm import NormGradients, NormOutputs, norm_backward, norm_forward
from .checkpoint import Checkpoint
from .ops import (activation_backward, activation_forward, add, amax, cast_transpose,
                  concat_columns, dequantize, gemm, quantize, split_columns)
from .recipe import Recipe
from .tensor import Float8Tensor
from .training import (AdamW, AdamWParam, cross_entropy, embedding_backward,
                       embedding_forward)

__version__ = "0.1.0"


def version():
    """The loaded C library's version string ("MAJOR.MINOR.PATCH")."""
    return _ll.version_string()


def last_error():
    """te_last_error(): this thread's message for its last failed C call."""
    return _ll.last_error()


__all__ = ["AdamW", "AdamWParam", "Attention", "AttentionBackwardContext", "AttentionGradients", "AttentionResiduals",
           "AutocastState", "BACKEND", "BackwardContext", "Checkpoint", "Context",
           "ContextStats",
           "CublasError", "CudaError", "Error", "Float8Tensor", "Group", "GroupedLinear",
           "GroupedLinearBackwardContext", "GroupedLinearGradients", "GroupedLinearResiduals",
           "InternalError", "InvalidArgument", "InvalidState", "LayerNormLinear",
           "LayerNormLinearBackwardContext", "LayerNormLinearGradients",
           "LayerNormLinearResiduals", "LayerNormMLP", "LayerNormMLPBackwardContext",
           "LayerNormMLPGradients", "LayerNormMLPResiduals", "Linear", "NcclError",
           "NormGradients", "NormOutputs", "OutOfMemory", "Recipe", "Residuals", "ScalingState",
           "Unsupported",
           "activation_backward", "activation_forward", "add", "amax", "autocast",
           "cast_transpose", "concat_columns", "constants", "cross_entropy", "dequantize",
           "embedding_backward", "embedding_forward", "gemm", "last_error", "library_path",
           "nccl_unique_id", "norm_backward", "norm_forward", "quantize", "rope_backward",
           "rope_forward", "split_columns", "version"]
