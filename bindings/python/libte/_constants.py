"""The C header's enumerations and limits, with the names Python callers use for them.

Values are te.h's (append-only there); only this module spells them out.
"""

# te_status
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_INVALID_STATE = 2
ERROR_UNSUPPORTED = 3
ERROR_OUT_OF_MEMORY = 4
ERROR_CUDA = 5
ERROR_CUBLAS = 6
ERROR_NCCL = 7
ERROR_INTERNAL = 8

# te_device_type
DEVICE_CPU = 0
DEVICE_CUDA = 1

# te_dtype
DTYPE_F32 = 0
DTYPE_F16 = 1
DTYPE_BF16 = 2
DTYPE_E4M3 = 3
DTYPE_E5M2 = 4
DTYPE_I32 = 5  # int32: sequence offsets (attention's and RoPE's cu_seqlens)
FP8_DTYPES = (DTYPE_E4M3, DTYPE_E5M2)
DTYPE_NAMES = {DTYPE_F32: "float32", DTYPE_F16: "float16", DTYPE_BF16: "bfloat16",
               DTYPE_E4M3: "float8_e4m3fn", DTYPE_E5M2: "float8_e5m2", DTYPE_I32: "int32"}
DTYPE_ITEMSIZE = {DTYPE_F32: 4, DTYPE_F16: 2, DTYPE_BF16: 2, DTYPE_E4M3: 1, DTYPE_E5M2: 1,
                  DTYPE_I32: 4}

# te_scaling_mode
SCALING_PER_TENSOR = 0
SCALING_BLOCK_1X128 = 1
SCALING_BLOCK_128X128 = 2

MAX_DIMS = 8
AUTOCAST_MAX_DEPTH = 64
GROUPED_LINEAR_MAX_GEMMS = 1024
NCCL_ID_BYTES = 128  # sizeof(te_nccl_id), as ncclUniqueId

# te_recipe_kind
RECIPE_DELAYED = 0
RECIPE_CURRENT = 1
RECIPE_BLOCK = 2

# te_format
FORMAT_HYBRID = 0
FORMAT_E4M3 = 1

# te_amax_algo
AMAX_MAX = 0
AMAX_MOST_RECENT = 1

# te_tensor_role
ROLE_INPUT = 0
ROLE_WEIGHT = 1
ROLE_GRAD_OUTPUT = 2

# te_activation
ACTIVATION_RELU = 0
ACTIVATION_GELU = 1
ACTIVATION_SWIGLU = 2
ACTIVATION_GEGLU = 3
ACTIVATION_SRELU = 4
GATED_ACTIVATIONS = (ACTIVATION_SWIGLU, ACTIVATION_GEGLU)

# te_mlp_gemm
MLP_FC1 = 0
MLP_FC2 = 1

# te_module_kind: which module a te_adamw_param's owner is
MODULE_NONE = 0
MODULE_LINEAR = 1
MODULE_LAYERNORM_LINEAR = 2
MODULE_LAYERNORM_MLP = 3

# te_split_columns / te_concat_columns: 1 <= n <= this
MAX_COLUMN_PARTS = 64

# te_norm_kind
NORM_LAYERNORM = 0
NORM_RMSNORM = 1

# te_epilogue
EPILOGUE_NONE = 0
EPILOGUE_BIAS = 1
EPILOGUE_GELU = 2
EPILOGUE_BIAS_GELU = 3

BACKWARD_ONCE = 1

# te_attn_mask
ATTN_MASK_NONE = 0
ATTN_MASK_CAUSAL = 1
ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 2
ATTN_MASK_NAMES = {ATTN_MASK_NONE: "no_mask", ATTN_MASK_CAUSAL: "causal",
                   ATTN_MASK_CAUSAL_BOTTOM_RIGHT: "causal_bottom_right"}

# te_attention_tensor: the scaling states of FP8 attention
ATTN_Q = 0
ATTN_K = 1
ATTN_V = 2
ATTN_S = 3   # the softmax output P
ATTN_DO = 4  # backward: dO
ATTN_DP = 5  # backward: dS = P * (dP - D)
ATTN_TENSOR_NAMES = {ATTN_Q: "q", ATTN_K: "k", ATTN_V: "v", ATTN_S: "s", ATTN_DO: "do",
                     ATTN_DP: "dp"}

# The fields of te_recipe_options after struct_size, in header order.
RECIPE_FIELDS = ("kind", "format", "margin", "amax_history_len", "amax_algo", "reduce_amax",
                 "power_of_2_scales", "amax_epsilon", "fprop_split_accumulator",
                 "dgrad_split_accumulator", "wgrad_split_accumulator")
