# The training-step ops a model written against libte needs between its modules (te_add,
# te_split_columns / te_concat_columns, te_embedding_*, te_cross_entropy) and the fused AdamW
# step (te_adamw_step), whose parameters may name the module (Linear, LayerNormLinear,
# LayerNormMLP) whose FP8 weight cache the step refreshes.
#
# Layout, as everywhere in LibTE: a Julia array is a libte tensor with its dimensions reversed.
# libte's "columns" (the last dimension) are a Julia array's FIRST dimension: x `[rows, c]` is a
# Julia `c × rows` matrix, an embedding table `[vocab, dim]` is a Julia `dim × vocab` matrix,
# logits `[n, vocab]` a Julia `vocab × n` matrix. Token ids and targets are `Int32` arrays of
# libte's 0-based row numbers (as attention's offsets): id 0 is the table's first column.

export add!, add, split_columns!, split_columns, concat_columns!, concat_columns, embedding_forward!,
       embedding_forward, embedding_backward!, cross_entropy!, cross_entropy, AdamW, AdamWParam,
       add_param!, step!

# te_tensor structs for C live in 1-element Vectors, not Refs (as in highlevel.jl: Julia 1.5 may
# reuse a non-escaping Ref's stack slot). An output that is one of the inputs (in place) is
# passed as one struct for both, as te.h allows.
_same(a, b) = a === b

# ---------------------------------------------------------------------------------------------
# add, split, concat
# ---------------------------------------------------------------------------------------------

"""
    add!(y, ctx, a, b) -> y

`y = a + b` elementwise (fp32 arithmetic, rounded once to y's dtype); `a`, `b` and `y` of one
element type (Float32, Float16, or BF16 bits viewed with `TensorView(A, TE_DTYPE_BF16)`) and one
shape. `y` may be `a` or `b` (in place).
"""
function add!(y, ctx::Context, a, b)
    yv, av, bv = TensorView(y), TensorView(a), TensorView(b)
    ry = te_tensor[yv.t]
    ra = _same(y, a) ? ry : te_tensor[av.t]
    rb = _same(y, b) ? ry : te_tensor[bv.t]
    _with(ctx) do
        GC.@preserve yv av bv ry ra rb begin
            check(te_add(ctx, ra, rb, ry))
        end
    end
    return y
end

"""`add(ctx, a, b) -> a + b`: [`add!`](@ref) into a new array."""
add(ctx::Context, a::DenseArray, b) = add!(similar(a), ctx, a, b)

# One contiguous Vector{te_tensor} for a list of tensors, and pointers to its entries (valid
# while the vector is preserved).
# (libte checks the count, 1 to 64, and reports it.)
_tensor_list(views) = te_tensor[v.t for v in views]

_tensor_ptrs(ts::Vector{te_tensor}) = Ptr{te_tensor}[pointer(ts, i) for i in 1:length(ts)]

"""
    split_columns!(outputs, ctx, x) -> outputs

Splits x by libte columns — a Julia array's first dimension: `x` is `(c_1 + ... + c_n) × rest...`
— into `outputs[i]`, `c_i × rest...` (or any array of `c_i * prod(rest)` elements whose first
dimension is `c_i`). One element type throughout (FP8 codes included: bytes are moved);
1 to 64 outputs, not overlapping `x`. Exact copies.
"""
function split_columns!(outputs::AbstractVector, ctx::Context, x)
    xv = TensorView(x)
    ovs = [TensorView(o) for o in outputs]
    ts = _tensor_list(ovs)
    rx = te_tensor[xv.t]
    _with(ctx) do
        GC.@preserve xv ovs ts rx begin
            ptrs = _tensor_ptrs(ts)
            GC.@preserve ptrs check(te_split_columns(ctx, rx, ptrs, length(ts)))
        end
    end
    return outputs
end

"""
    split_columns(ctx, x, sizes) -> Vector of arrays

[`split_columns!`](@ref) into new arrays: part i has `sizes[i]` rows of the first dimension and
`x`'s other dimensions (e.g. a fused QKV projection's output into q, k and v).
"""
function split_columns(ctx::Context, x::DenseArray, sizes)
    rest = size(x)[2:end]
    outs = [similar(x, Int(c), rest...) for c in sizes]
    return split_columns!(outs, ctx, x)
end

"""
    concat_columns!(y, ctx, parts) -> y

The inverse of [`split_columns!`](@ref): `y` (`sum(c_i) × rest...`) from `parts[i]` (`c_i × rest...`).
"""
function concat_columns!(y, ctx::Context, parts::AbstractVector)
    yv = TensorView(y)
    pvs = [TensorView(p) for p in parts]
    ts = _tensor_list(pvs)
    ry = te_tensor[yv.t]
    _with(ctx) do
        GC.@preserve yv pvs ts ry begin
            ptrs = _tensor_ptrs(ts)
            GC.@preserve ptrs check(te_concat_columns(ctx, ptrs, length(ts), ry))
        end
    end
    return y
end

"""`concat_columns(ctx, parts) -> y`: [`concat_columns!`](@ref) into a new array."""
function concat_columns(ctx::Context, parts::AbstractVector)
    isempty(parts) && throw(ArgumentError("concat_columns: no parts"))
    p1 = first(parts)
    y = similar(p1, sum(size(p, 1) for p in parts), size(p1)[2:end]...)
    return concat_columns!(y, ctx, parts)
end

# ---------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------

"""
    embedding_forward!(y, ctx, table, ids) -> y

Token embedding, a gather: column t of `y` is column `ids[t] + 1` of `table` (`table` is
`dim × vocab` — libte's `[vocab, dim]` — of Float32, Float16 or BF16 bits; `ids` an `Int32`
array of 0-based ids, any shape; `y` is `dim × size(ids)...` of the table's element type). An
id outside `[0, vocab)`: a `LibTEError` naming the position, nothing written (CPU).
"""
function embedding_forward!(y, ctx::Context, table, ids)
    yv, tv, iv = TensorView(y), TensorView(table), TensorView(ids)
    ry, rt, ri = te_tensor[yv.t], te_tensor[tv.t], te_tensor[iv.t]
    _with(ctx) do
        GC.@preserve yv tv iv ry rt ri check(te_embedding_forward(ctx, rt, ri, ry))
    end
    return y
end

"""`embedding_forward(ctx, table, ids) -> y`: [`embedding_forward!`](@ref) into a new array."""
embedding_forward(ctx::Context, table::DenseArray, ids::DenseArray) =
    embedding_forward!(similar(table, size(table, 1), size(ids)...), ctx, table, ids)

"""
    embedding_backward!(dtable, ctx, ids, dy; accumulate = false) -> dtable

The embedding's gradient, a scatter-add: column `ids[t] + 1` of `dtable` (Float32
`dim × vocab`) gets column t of `dy` (`dim × n`, Float32/Float16/BF16) added. `dtable` is zeroed
first unless `accumulate` (e.g. onto a tied LM head's dW). Deterministic: each column sums its
tokens in increasing t, in fp32.
"""
function embedding_backward!(dtable, ctx::Context, ids, dy; accumulate::Bool = false)
    dv, iv, yv = TensorView(dtable), TensorView(ids), TensorView(dy)
    rd, ri, ry = te_tensor[dv.t], te_tensor[iv.t], te_tensor[yv.t]
    _with(ctx) do
        GC.@preserve dv iv yv rd ri ry check(te_embedding_backward(ctx, ri, ry, rd, _bool(accumulate)))
    end
    return dtable
end

# ---------------------------------------------------------------------------------------------
# Cross-entropy
# ---------------------------------------------------------------------------------------------

"""
    cross_entropy!(loss, ctx, logits, targets; dlogits = nothing, ignore_index = -100,
                   grad_scale = 1) -> loss

Softmax cross-entropy fused over the vocabulary, the mean over the tokens whose target is not
`ignore_index`: `loss[1] = mean_t (logsumexp(logits[:, t]) - logits[targets[t] + 1, t])`
(`logits` is `vocab × n`, libte's `[n, vocab]`, Float32/Float16/BF16 bits; `targets` `n`
0-based `Int32`s; `loss` a one-element `Vector{Float32}`). With `dlogits` (logits' type and
size, or `logits` itself: in place) it also writes
`grad_scale * (softmax - onehot(target)) / count` (zero columns for ignored tokens). No counted
token: loss 0, zero gradient. A target outside `[0, vocab)` other than `ignore_index`: a
`LibTEError` naming the token (CPU).
"""
function cross_entropy!(loss, ctx::Context, logits, targets; dlogits = nothing,
                        ignore_index::Integer = -100, grad_scale::Real = 1)
    opts = with(initialized(te_cross_entropy_options_init, te_cross_entropy_options);
                ignore_index = Int32(ignore_index), grad_scale = Float32(grad_scale))
    lv, tv, sv = TensorView(logits), TensorView(targets), TensorView(loss)
    dv = dlogits === nothing ? nothing : TensorView(dlogits)
    rl, rt, rs = te_tensor[lv.t], te_tensor[tv.t], te_tensor[sv.t]
    rd = dlogits === nothing ? Ptr{te_tensor}(C_NULL) : _same(dlogits, logits) ? rl : te_tensor[dv.t]
    _with(ctx) do
        GC.@preserve lv tv sv dv rl rt rs rd check(te_cross_entropy(ctx, Ref(opts), rl, rt, rs, rd))
    end
    return loss
end

"""`cross_entropy(ctx, logits, targets; kw...) -> Float32`: [`cross_entropy!`](@ref)'s loss."""
cross_entropy(ctx::Context, logits, targets; kw...) =
    cross_entropy!(zeros(Float32, 1), ctx, logits, targets; kw...)[1]

# ---------------------------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------------------------

"""
    AdamWParam

One parameter of an [`AdamW`](@ref) optimizer (made by [`add_param!`](@ref)): the Float32
master weight `param` (updated in place), its gradient `grad` (Float32/Float16/BF16, refilled by
the caller before each step), the Float32 moments `exp_avg` / `exp_avg_sq`, an optional
`model_weight` that receives the new weight rounded to its type, whether weight decay applies,
and the module whose FP8 weight cache the step refreshes (`owner`: a `Linear`,
`LayerNormLinear` or `LayerNormMLP` with `gemm` `:fc1` / `:fc2`).
"""
struct AdamWParam
    param::Any
    grad::Any
    exp_avg::Any
    exp_avg_sq::Any
    model_weight::Any
    weight_decay::Bool
    owner::Any
    gemm::Any
end

"""
    AdamW(; lr, beta1, beta2, eps, weight_decay, max_grad_norm)

A fused AdamW optimizer (`te_adamw_step`: PyTorch's `torch.optim.AdamW` formulas in fp32): the
hyper-parameters (defaults from `te_adamw_options_init`: lr 1e-3, betas 0.9 / 0.999, eps 1e-8,
weight_decay 0.01, max_grad_norm 0 = no clipping), the number of the next step (1-based,
advanced by each successful [`step!`](@ref)) and its parameters ([`add_param!`](@ref)). The
fields may be changed between steps (a learning-rate schedule; `next_step` when resuming).
"""
mutable struct AdamW
    lr::Float32
    beta1::Float32
    beta2::Float32
    eps::Float32
    weight_decay::Float32
    max_grad_norm::Float32
    next_step::Int64
    params::Vector{AdamWParam}
end

function AdamW(; lr = nothing, beta1 = nothing, beta2 = nothing, eps = nothing,
               weight_decay = nothing, max_grad_norm = nothing)
    d = initialized(te_adamw_options_init, te_adamw_options)
    pick(v, dflt) = v === nothing ? dflt : Float32(v)
    return AdamW(pick(lr, d.lr), pick(beta1, d.beta1), pick(beta2, d.beta2), pick(eps, d.eps),
                 pick(weight_decay, d.weight_decay), pick(max_grad_norm, d.max_grad_norm),
                 Int64(1), AdamWParam[])
end

Base.show(io::IO, o::AdamW) =
    print(io, "AdamW(lr=", o.lr, ", betas=(", o.beta1, ", ", o.beta2, "), eps=", o.eps,
          ", weight_decay=", o.weight_decay, ", max_grad_norm=", o.max_grad_norm,
          ", next_step=", o.next_step, ", ", length(o.params), " params)")

"""
    add_param!(opt, param, grad; exp_avg = zeros, exp_avg_sq = zeros, model_weight = nothing,
               weight_decay = true, owner = nothing, gemm = nothing) -> AdamWParam

Adds a parameter to `opt`: the arrays are kept (not copied), so the caller refills `grad` in
place before each [`step!`](@ref) and reads `param` (and `model_weight`) after it. The moments
default to new zero arrays of `param`'s size. `owner`: the module whose weight `param` is
(`gemm = :fc1` / `:fc2` for a `LayerNormMLP`).
"""
function add_param!(opt::AdamW, param, grad; exp_avg = nothing, exp_avg_sq = nothing,
                    model_weight = nothing, weight_decay::Bool = true, owner = nothing, gemm = nothing)
    owner === nothing || owner isa Linear || owner isa LayerNormLinear || owner isa LayerNormMLP ||
        throw(ArgumentError("add_param!: owner must be a Linear, LayerNormLinear or LayerNormMLP, got $(typeof(owner))"))
    (owner isa LayerNormMLP) == (gemm !== nothing) ||
        throw(ArgumentError("add_param!: gemm (:fc1 or :fc2) goes with, and only with, a LayerNormMLP owner"))
    m = exp_avg === nothing ? zeros(Float32, size(param)) : exp_avg
    v = exp_avg_sq === nothing ? zeros(Float32, size(param)) : exp_avg_sq
    p = AdamWParam(param, grad, m, v, model_weight, weight_decay, owner,
                   gemm === nothing ? nothing : _mlp_gemm(gemm))
    push!(opt.params, p)
    return p
end

_owner_kind(::Nothing) = TE_MODULE_NONE
_owner_kind(::Linear) = TE_MODULE_LINEAR
_owner_kind(::LayerNormLinear) = TE_MODULE_LAYERNORM_LINEAR
_owner_kind(::LayerNormMLP) = TE_MODULE_LAYERNORM_MLP

"""
    step!(opt::AdamW, ctx; step = opt.next_step, lr = opt.lr) -> Float32

One fused update of every parameter of `opt` (step number `step`, learning rate `lr`); returns
the global gradient norm (before clipping). On success `opt.next_step` becomes `step + 1`;
on failure (a `LibTEError`: shapes, element types, a tensor given twice, options out of range,
an owner whose weight shape differs) nothing changes. Owners' FP8 weight caches are
re-quantized from the new weights, so their next forward may pass `weight_unchanged = true`.
"""
function step!(opt::AdamW, ctx::Context; step::Integer = opt.next_step, lr = nothing)
    isempty(opt.params) && throw(ArgumentError("step!: the optimizer has no parameters (add_param!)"))
    norm_out = zeros(Float32, 1)
    n = length(opt.params)
    # Every tensor descriptor in one vector (5 per parameter: param, grad, m, v, model weight),
    # the arrays they describe kept alive by `views`.
    views = Any[]
    ts = Vector{te_tensor}(undef, 5n)
    for (i, p) in enumerate(opt.params)
        for (j, a) in enumerate((p.param, p.grad, p.exp_avg, p.exp_avg_sq, p.model_weight))
            a === nothing && continue
            v = TensorView(a)
            push!(views, v)
            ts[5(i - 1) + j] = v.t
        end
    end
    owners = [p.owner for p in opt.params if p.owner !== nothing]
    base = initialized(te_adamw_param_init, te_adamw_param)
    _with(ctx) do
        GC.@preserve views ts owners norm_out begin
            raw = Vector{te_adamw_param}(undef, n)
            for (i, p) in enumerate(opt.params)
                tp(j) = pointer(ts, 5(i - 1) + j)
                owner = p.owner === nothing ? Ptr{Cvoid}(C_NULL) : Ptr{Cvoid}(_live(p.owner))
                raw[i] = with(base; param = tp(1), grad = tp(2), exp_avg = tp(3), exp_avg_sq = tp(4),
                              model_weight = p.model_weight === nothing ? Ptr{te_tensor}(C_NULL) : tp(5),
                              weight_decay = _bool(p.weight_decay), owner_kind = _owner_kind(p.owner),
                              owner = owner, owner_gemm = p.gemm === nothing ? Int32(0) : Int32(p.gemm))
            end
            opts = with(initialized(te_adamw_options_init, te_adamw_options);
                        lr = lr === nothing ? opt.lr : Float32(lr), beta1 = opt.beta1, beta2 = opt.beta2,
                        eps = opt.eps, weight_decay = opt.weight_decay, max_grad_norm = opt.max_grad_norm,
                        step = Int64(step), grad_norm = pointer(norm_out))
            GC.@preserve raw check(te_adamw_step(ctx, Ref(opts), raw, n))
        end
    end
    opt.next_step = Int64(step) + 1
    return norm_out[1]
end
