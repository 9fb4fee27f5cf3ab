"""libte.torch: libte's FP8 modules as torch.nn.Modules, for eager PyTorch, torch.compile
(fullgraph, no graph breaks) and CUDA graphs.

    import libte.torch as lt
    model = torch.nn.Sequential(lt.Linear(1024, 4096), torch.nn.GELU(), lt.Linear(4096, 1024))
    with lt.autocast(recipe=lt.DelayedScaling()):
        y = model(x)            # or a torch.compile'd model
    y.sum().backward()

Each module's forward and backward are torch.library custom ops in the "libte" namespace
(libte::linear_fwd, ...) over the C library's residuals-in-the-caller's-memory calls: saved
tensors are torch tensors, so autograd, torch.compile and CUDA-graph capture own them all.
See bindings/python/README.md ("PyTorch") for the supported patterns.
"""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError("libte.torch needs PyTorch (pip install torch): %s" % e) from e

from ._runtime import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format,
                       autocast, context, fp8_autocast, retain_residuals)
from ..recipe import Recipe
from .linear import Linear
from .layernorm import LayerNormLinear, LayerNormMLP
from .grouped_linear import GroupedLinear
from .attention import DotProductAttention, RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = ["DelayedScaling", "DotProductAttention", "Float8BlockScaling", "Float8CurrentScaling",
           "Format", "GroupedLinear", "LayerNormLinear", "LayerNormMLP", "Linear", "Recipe",
           "RotaryPositionEmbedding", "apply_rotary_pos_emb", "autocast", "context",
           "fp8_autocast", "retain_residuals"]
