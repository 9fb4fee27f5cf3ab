# The transformer modules: LayerNormLinear, LayerNormMLP and GroupedLinear (te_layernorm_linear_*,
# te_layernorm_mlp_*, te_grouped_linear_*), with Linear's shape: a module object owning the
# handle, `forward!` / `forward` / the split `forward_compute!` + `forward_save` returning a
# backward context, `backward!` with keyword gradients, `scaling_state`, `save_state` /
# `load_state!`. The Python binding's libte.LayerNormLinear & co. and the Rust crate's.
#
# Layout, as everywhere in LibTE: Julia arrays are libte tensors with their dimensions
# reversed. x is `features × tokens`, a weight libte stores `[out, in]` is a Julia `in × out`
# matrix (`y = W' * x .+ b`), gamma / beta / biases are vectors.
#
# Lifetimes: te.h has libte reference x and gamma (always) and the weights (in high precision)
# until the backward context is destroyed; the residuals and backward contexts keep those arrays
# alive (their `keepalive`).

export LayerNormLinear, LayerNormLinearResiduals, LayerNormLinearBackwardCtx, LayerNormMLP,
       LayerNormMLPResiduals, LayerNormMLPBackwardCtx, GroupedLinear, GroupedLinearResiduals,
       GroupedLinearBackwardCtx

# ---------------------------------------------------------------------------------------------
# What the three share
# ---------------------------------------------------------------------------------------------

# Views and te_tensor Refs of the arguments `xs` (each an array, a TensorView or nothing), and
# the tensors to keep alive past the call.
_views(xs...) = map(_view_or_null, xs)
_refs(vs) = map(_ref_or_null, vs)

# A copy of a te_tensor libte owns (host memory), as a Julia array of the reversed dimensions:
# Float32 / Float16 / Int32 / UInt16 (BF16 bits) arrays, a Float8Array for FP8; nothing for NULL data.
function _copy_tensor(t::te_tensor)
    t.data == C_NULL && return nothing
    t.dtype in (TE_DTYPE_E4M3, TE_DTYPE_E5M2) && return _copy_fp8(t)
    T = t.dtype == TE_DTYPE_F32 ? Float32 : t.dtype == TE_DTYPE_F16 ? Float16 :
        t.dtype == TE_DTYPE_I32 ? Int32 : UInt16
    dims = reverse(ntuple(i -> Int(t.shape[i]), Int(t.ndim)))
    A = Array{T}(undef, dims...)
    GC.@preserve A unsafe_copyto!(pointer(A), Ptr{T}(t.data), length(A))
    return A
end

_backward_args(once::Bool) =
    Ref(with(initialized(te_linear_backward_args_init, te_linear_backward_args);
             flags = once ? TE_BACKWARD_ONCE : Cuint(0)))

# One scaling state through `get(info, history, capacity)` (the module's getter with its other
# arguments bound); the context's lock is held by the caller.
function _read_scaling_state(get, history::Bool)
    info = Ref(sized(te_scaling_state_info))
    check(get(info, C_NULL, 0))
    h = nothing
    if history
        h = zeros(Float32, max(Int(info[].amax_history_len), 0))
        check(get(info, h, length(h)))
    end
    return (info[], h)
end

# The state bytes through `save(buf, capacity, size)`; the context's lock is held by the caller.
function _save_state_bytes(save)
    n = Ref{Csize_t}(0)
    check(save(C_NULL, 0, n))
    buf = zeros(UInt8, n[])
    check(save(buf, length(buf), n))
    return resize!(buf, n[])
end

function _check_present(what, has::Bool, x, name)
    has == (x !== nothing) ||
        throw(ArgumentError(has ? "this $what has $name: pass it" : "this $what has no $name: pass nothing"))
    return nothing
end

# A module's residuals: the struct libte filled lives in `storage`; `handle` points into it
# (C_NULL once saved or released).
function _new_residuals(::Type{R}, ctx::Context, storage, keep) where {R}
    # caller holds ctx.lock and has registered the child
    r = R(Base.unsafe_convert(Ptr{eltype(storage)}, storage), ctx, keep, storage)
    finalizer(_finalize_child, r)
    return r
end

function _new_module_backward(::Type{B}, ctx::Context, handle, keep) where {B}
    # caller holds ctx.lock and has registered the child
    b = B(handle, ctx, keep)
    finalizer(_finalize_child, b)
    return b
end

# forward_save for any module: `save(ctx, module, storage, out)` is its te_*_forward_save.
function _forward_save(save, ::Type{B}, res, m) where {B}
    ctx = m.ctx
    res.ctx === ctx || throw(ArgumentError("the residuals and the module belong to different contexts"))
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        _live(res)
        _live(m)
        check(save(ctx.handle, m.handle, res.storage, out))
        keep = res.keepalive
        res.handle = C_NULL  # the storage now belongs to the backward context
        res.keepalive = nothing
        _new_module_backward(B, ctx, out[], keep)  # takes over res's registration
    end
end

# ---------------------------------------------------------------------------------------------
# LayerNormLinear
# ---------------------------------------------------------------------------------------------

"""
    LayerNormLinear(ctx, in_features, out_features; bias = true, activation_dtype = Float32,
                    fuse_wgrad_accumulation = false, normalization = :layernorm, eps = 1f-5,
                    zero_centered_gamma = false)

The FP8 state of a norm followed by a linear layer, `y = norm(x) W^T + b` (TE's
LayerNormLinear). Under FP8 with delayed scaling the norm writes the GEMM's FP8 input. The
parameters stay yours: `gamma` and `beta` (LayerNorm only) vectors of length `in_features`,
`W` an `in × out` matrix (libte's `[out, in]`), `b` a vector of length `out`; x is
`in × tokens`, y `out × tokens`. `normalization` is `:layernorm` or `:rmsnorm` (or a
`te_norm_kind`). In FP8, tokens, `in` and `out` must be multiples of 16.
"""
mutable struct LayerNormLinear <: ContextChild
    handle::Ptr{te_layernorm_linear}
    ctx::Context
    keepalive::Any
    in_features::Int
    out_features::Int
    bias::Bool
    normalization::te_norm_kind

    function LayerNormLinear(ctx::Context, in_features::Integer, out_features::Integer; bias::Bool = true,
                             activation_dtype = Float32, fuse_wgrad_accumulation::Bool = false,
                             normalization = :layernorm, eps::Real = 1.0f-5,
                             zero_centered_gamma::Bool = false)
        kind = _norm_kind(normalization)
        opts = with(initialized(te_layernorm_linear_options_init, te_layernorm_linear_options);
                    in_features = in_features, out_features = out_features, bias = _bool(bias),
                    activation_dtype = _activation_dtype(activation_dtype),
                    fuse_wgrad_accumulation = _bool(fuse_wgrad_accumulation), normalization = kind,
                    eps = Float32(eps), zero_centered_gamma = _bool(zero_centered_gamma))
        out = Ref{Ptr{te_layernorm_linear}}(C_NULL)
        _with(ctx) do
            check(te_layernorm_linear_create(out, ctx, Ref(opts)))
            _register(ctx)
        end
        m = new(out[], ctx, nothing, Int(in_features), Int(out_features), bias, kind)
        finalizer(_finalize_child, m)
        return m
    end
end

_destroy!(m::LayerNormLinear) = _release_child!(m, te_layernorm_linear_destroy)
Base.cconvert(::Type{Ptr{Cvoid}}, m::LayerNormLinear) = m
Base.unsafe_convert(::Type{Ptr{Cvoid}}, m::LayerNormLinear) = _live(m)
Base.show(io::IO, m::LayerNormLinear) =
    print(io, "LayerNormLinear(", m.in_features, " => ", m.out_features,
          m.normalization == TE_NORM_RMSNORM ? ", rmsnorm" : "", m.bias ? "" : ", bias=false",
          isopen(m) ? "" : ", closed", ")")

"""
    LayerNormLinearBackwardCtx

What a [`LayerNormLinear`](@ref) forward saved (`te_layernorm_linear_backward_ctx`); keeps the
forward's arrays alive. Pass it to [`backward!`](@ref); `close` it (or leave it to the GC).
"""
mutable struct LayerNormLinearBackwardCtx <: ContextChild
    handle::Ptr{te_layernorm_linear_backward_ctx}
    ctx::Context
    keepalive::Any
end

_destroy!(b::LayerNormLinearBackwardCtx) = _release_child!(b, te_layernorm_linear_backward_ctx_destroy)

"""
    LayerNormLinearResiduals

[`forward_compute!`](@ref)'s result for a [`LayerNormLinear`](@ref): hand it to
[`forward_save`](@ref), inspect it with [`residual_tensors`](@ref LibTE.residual_tensors), or
`close` it.
"""
mutable struct LayerNormLinearResiduals <: ContextChild
    handle::Ptr{te_layernorm_linear_residuals}
    ctx::Context
    keepalive::Any
    storage::Base.RefValue{te_layernorm_linear_residuals}
end

_destroy!(r::LayerNormLinearResiduals) = _release_child!(r, _ -> te_layernorm_linear_residuals_release(r.storage))

# Runs `call(args)` with the te_layernorm_linear_forward_args of the views (rooted throughout).
function _lnl_call(call, m::LayerNormLinear, y, x, gamma, beta, W, b, ln_out, weight_unchanged)
    _check_present("LayerNormLinear", m.bias, b, "a bias b")
    _check_present("LayerNormLinear", m.normalization == TE_NORM_LAYERNORM, beta, "a LayerNorm beta")
    vs = _views(y, x, gamma, beta, W, b, ln_out)
    ry, rx, rg, rbeta, rw, rb, rln = _refs(vs)
    GC.@preserve vs ry rx rg rbeta rw rb rln begin
        args = with(initialized(te_layernorm_linear_forward_args_init, te_layernorm_linear_forward_args);
                    input = _ptr(rx), ln_weight = _ptr(rg), ln_bias = _ptr(rbeta), weight = _ptr(rw),
                    bias = _ptr(rb), weight_unchanged = _bool(weight_unchanged), ln_out = _ptr(rln))
        return call(Ref(args), ry)
    end
end

"""
    forward!(y, m::LayerNormLinear, x, gamma, beta, W, b = nothing; weight_unchanged = false,
             ln_out = nothing) -> LayerNormLinearBackwardCtx

`y = norm(x) W^T + b` (Julia: `y .= W' * norm(x) .+ b`, the norm over each column of `x`), in
FP8 inside an enabled [`autocast`](@ref) scope. `beta` is `nothing` for RMSNorm, `b` for a
module without bias. `ln_out`, an array like `x`, receives norm(x) (TE's
`return_layernorm_output`).
"""
function forward!(y, m::LayerNormLinear, x, gamma, beta, W, b = nothing; weight_unchanged::Bool = false,
                  ln_out = nothing)
    out = Ref{Ptr{te_layernorm_linear_backward_ctx}}(C_NULL)
    ctx = m.ctx
    return _with(ctx) do
        _lnl_call(m, y, x, gamma, beta, W, b, ln_out, weight_unchanged) do args, ry
            check(te_layernorm_linear_forward(ctx, m, args, ry, out))
        end
        _register(ctx)
        _new_module_backward(LayerNormLinearBackwardCtx, ctx, out[], (x, gamma, beta, W, b))
    end
end

"""
    forward(m::LayerNormLinear, x, gamma, beta, W, b = nothing; kw...) -> (y, bwd)

[`forward!`](@ref) into a new `y` of `x`'s element type, `out × tokens...`.
"""
function forward(m::LayerNormLinear, x::DenseArray{T}, gamma, beta, W, b = nothing; kw...) where {T}
    y = similar(x, T, (m.out_features, size(x)[2:end]...))
    return y, forward!(y, m, x, gamma, beta, W, b; kw...)
end

"""
    forward_compute!(y, m::LayerNormLinear, x, gamma, beta, W, b = nothing; weight_unchanged,
                     ln_out) -> LayerNormLinearResiduals

The pure-compute half of [`forward!`](@ref); pack the result with [`forward_save`](@ref).
"""
function forward_compute!(y, m::LayerNormLinear, x, gamma, beta, W, b = nothing; weight_unchanged::Bool = false,
                          ln_out = nothing)
    storage = Ref(sized(te_layernorm_linear_residuals))
    ctx = m.ctx
    return _with(ctx) do
        _lnl_call(m, y, x, gamma, beta, W, b, ln_out, weight_unchanged) do args, ry
            check(te_layernorm_linear_forward_compute(ctx, m, args, ry, storage))
        end
        _register(ctx)
        _new_residuals(LayerNormLinearResiduals, ctx, storage, (x, gamma, beta, W, b))
    end
end

"""`forward_save(res::LayerNormLinearResiduals, m::LayerNormLinear) -> LayerNormLinearBackwardCtx`"""
forward_save(res::LayerNormLinearResiduals, m::LayerNormLinear) =
    _forward_save(te_layernorm_linear_forward_save, LayerNormLinearBackwardCtx, res, m)

"""
    residual_tensors(res::LayerNormLinearResiduals) -> (ln_out_t, weight_t, mu, rsigma, fp8)

Copies of what the forward saved: after an FP8 forward, norm(x)^T and W^T as
[`Float8Array`](@ref)s (Julia `tokens × in` and `out × in`); else norm(x) (`in × tokens`) and W;
`mu` (LayerNorm; `nothing` for RMSNorm) and `rsigma`, one Float32 per token.
"""
function residual_tensors(res::LayerNormLinearResiduals)
    return _with(res.ctx) do
        _live(res)
        r = res.storage[]
        (ln_out_t = _copy_tensor(r.ln_out_t), weight_t = _copy_tensor(r.weight_t), mu = _copy_tensor(r.mu),
         rsigma = _copy_tensor(r.rsigma), fp8 = r.fp8 != 0)
    end
end

"""
    backward!(bwd::LayerNormLinearBackwardCtx, dy; dx = nothing, dln_weight = nothing,
              dln_bias = nothing, dw = nothing, db = nothing, once = false)

From `dy` (`out × tokens`): `dx` (like x, through the norm), `dln_weight` / `dln_bias` (dgamma,
dbeta: LayerNorm only), `dw` (like W; Float32 and added into with `fuse_wgrad_accumulation`),
`db`. Each left `nothing` is skipped. Callable again with the same results until closed, unless
`once = true` (`TE_BACKWARD_ONCE`: a later call throws).
"""
function backward!(bwd::LayerNormLinearBackwardCtx, dy; dx = nothing, dln_weight = nothing, dln_bias = nothing,
                   dw = nothing, db = nothing, once::Bool = false)
    vs = _views(dy, dx, dln_weight, dln_bias, dw, db)
    rdy, rdx, rdg, rdbeta, rdw, rdb = _refs(vs)
    ctx = bwd.ctx
    _with(ctx) do
        h = _live(bwd)
        GC.@preserve vs rdy rdx rdg rdbeta rdw rdb begin
            grads = with(initialized(te_layernorm_linear_grads_init, te_layernorm_linear_grads);
                         dx = _ptr(rdx), dln_weight = _ptr(rdg), dln_bias = _ptr(rdbeta), dw = _ptr(rdw),
                         db = _ptr(rdb))
            check(te_layernorm_linear_backward(ctx, h, rdy, Ref(grads), _backward_args(once)))
        end
    end
    return nothing
end

"""
    scaling_state(m::LayerNormLinear, role; history = false) -> (info, history)

The GEMM's scaling state for `role` (`TE_ROLE_INPUT`: the norm's FP8 output, `TE_ROLE_WEIGHT`,
`TE_ROLE_GRAD_OUTPUT`), as for a [`Linear`](@ref).
"""
function scaling_state(m::LayerNormLinear, role::Integer; history::Bool = false)
    ctx = m.ctx
    return _with(ctx) do
        _read_scaling_state((info, h, n) -> te_layernorm_linear_get_scaling_state(ctx, m, role, info, h, n), history)
    end
end

"""`save_state(m) -> Vector{UInt8}`: the module's FP8 state, bit-exact (any module)."""
function save_state(m::LayerNormLinear)
    ctx = m.ctx
    return _with(() -> _save_state_bytes((buf, n, size) -> te_layernorm_linear_state_save(ctx, m, buf, n, size)), ctx)
end

function load_state!(m::LayerNormLinear, bytes::Vector{UInt8})
    ctx = m.ctx
    _with(() -> check(te_layernorm_linear_state_load(ctx, m, bytes, length(bytes))), ctx)
    return m
end

# ---------------------------------------------------------------------------------------------
# LayerNormMLP
# ---------------------------------------------------------------------------------------------

"""
    LayerNormMLP(ctx, hidden_size, ffn_hidden_size; bias = true, activation = :gelu,
                 activation_dtype = Float32, fuse_wgrad_accumulation = false,
                 normalization = :layernorm, eps = 1f-5, zero_centered_gamma = false)

The FP8 state of `y = fc2(act(fc1(norm(x))))` (TE's LayerNormMLP). `activation` is `:gelu`,
`:relu`, `:srelu` or the gated `:swiglu` / `:geglu` (or a `te_activation`). Julia layout: x and
y are `hidden × tokens`, `W1` is `hidden × fc1_rows` (libte's `[fc1_rows, hidden]`, with
`fc1_rows = ffn`, or `2ffn` gated, gate columns first), `b1` a vector of `fc1_rows`, `W2` is
`ffn × hidden`, `b2` a vector of `hidden`.
"""
mutable struct LayerNormMLP <: ContextChild
    handle::Ptr{te_layernorm_mlp}
    ctx::Context
    keepalive::Any
    hidden_size::Int
    ffn_hidden_size::Int
    fc1_rows::Int
    bias::Bool
    normalization::te_norm_kind

    function LayerNormMLP(ctx::Context, hidden_size::Integer, ffn_hidden_size::Integer; bias::Bool = true,
                          activation = :gelu, activation_dtype = Float32, fuse_wgrad_accumulation::Bool = false,
                          normalization = :layernorm, eps::Real = 1.0f-5, zero_centered_gamma::Bool = false)
        kind, act = _norm_kind(normalization), _act(activation)
        opts = with(initialized(te_layernorm_mlp_options_init, te_layernorm_mlp_options);
                    hidden_size = hidden_size, ffn_hidden_size = ffn_hidden_size, bias = _bool(bias),
                    activation = act, activation_dtype = _activation_dtype(activation_dtype),
                    fuse_wgrad_accumulation = _bool(fuse_wgrad_accumulation), normalization = kind,
                    eps = Float32(eps), zero_centered_gamma = _bool(zero_centered_gamma))
        out = Ref{Ptr{te_layernorm_mlp}}(C_NULL)
        _with(ctx) do
            check(te_layernorm_mlp_create(out, ctx, Ref(opts)))
            _register(ctx)
        end
        gated = act == TE_ACTIVATION_SWIGLU || act == TE_ACTIVATION_GEGLU
        m = new(out[], ctx, nothing, Int(hidden_size), Int(ffn_hidden_size),
                Int(ffn_hidden_size) * (gated ? 2 : 1), bias, kind)
        finalizer(_finalize_child, m)
        return m
    end
end

_destroy!(m::LayerNormMLP) = _release_child!(m, te_layernorm_mlp_destroy)
Base.cconvert(::Type{Ptr{Cvoid}}, m::LayerNormMLP) = m
Base.unsafe_convert(::Type{Ptr{Cvoid}}, m::LayerNormMLP) = _live(m)
Base.show(io::IO, m::LayerNormMLP) =
    print(io, "LayerNormMLP(", m.hidden_size, " => ", m.ffn_hidden_size, " => ", m.hidden_size,
          m.bias ? "" : ", bias=false", isopen(m) ? "" : ", closed", ")")

"""`LayerNormMLPBackwardCtx`: what a [`LayerNormMLP`](@ref) forward saved; see [`backward!`](@ref)."""
mutable struct LayerNormMLPBackwardCtx <: ContextChild
    handle::Ptr{te_layernorm_mlp_backward_ctx}
    ctx::Context
    keepalive::Any
end

_destroy!(b::LayerNormMLPBackwardCtx) = _release_child!(b, te_layernorm_mlp_backward_ctx_destroy)

"""`LayerNormMLPResiduals`: [`forward_compute!`](@ref)'s result for a [`LayerNormMLP`](@ref)."""
mutable struct LayerNormMLPResiduals <: ContextChild
    handle::Ptr{te_layernorm_mlp_residuals}
    ctx::Context
    keepalive::Any
    storage::Base.RefValue{te_layernorm_mlp_residuals}
end

_destroy!(r::LayerNormMLPResiduals) = _release_child!(r, _ -> te_layernorm_mlp_residuals_release(r.storage))

function _mlp_call(call, m::LayerNormMLP, y, x, gamma, beta, W1, b1, W2, b2, ln_out, weight_unchanged)
    _check_present("LayerNormMLP", m.bias, b1, "fc1 and fc2 biases")
    _check_present("LayerNormMLP", m.bias, b2, "fc1 and fc2 biases")
    _check_present("LayerNormMLP", m.normalization == TE_NORM_LAYERNORM, beta, "a LayerNorm beta")
    vs = _views(y, x, gamma, beta, W1, b1, W2, b2, ln_out)
    ry, rx, rg, rbeta, rw1, rb1, rw2, rb2, rln = _refs(vs)
    GC.@preserve vs ry rx rg rbeta rw1 rb1 rw2 rb2 rln begin
        args = with(initialized(te_layernorm_mlp_forward_args_init, te_layernorm_mlp_forward_args);
                    input = _ptr(rx), ln_weight = _ptr(rg), ln_bias = _ptr(rbeta), fc1_weight = _ptr(rw1),
                    fc1_bias = _ptr(rb1), fc2_weight = _ptr(rw2), fc2_bias = _ptr(rb2),
                    weight_unchanged = _bool(weight_unchanged), ln_out = _ptr(rln))
        return call(Ref(args), ry)
    end
end

"""
    forward!(y, m::LayerNormMLP, x, gamma, beta, W1, b1, W2, b2; weight_unchanged = false,
             ln_out = nothing) -> LayerNormMLPBackwardCtx

`y = fc2(act(fc1(norm(x))))` (Julia: `W2' * act(W1' * norm(x) .+ b1) .+ b2`), in FP8 inside an
enabled [`autocast`](@ref) scope (the norm writes fc1's FP8 input, the activation fc2's).
`beta` is `nothing` for RMSNorm, `b1` and `b2` for a block without bias.
"""
function forward!(y, m::LayerNormMLP, x, gamma, beta, W1, b1, W2, b2; weight_unchanged::Bool = false,
                  ln_out = nothing)
    out = Ref{Ptr{te_layernorm_mlp_backward_ctx}}(C_NULL)
    ctx = m.ctx
    return _with(ctx) do
        _mlp_call(m, y, x, gamma, beta, W1, b1, W2, b2, ln_out, weight_unchanged) do args, ry
            check(te_layernorm_mlp_forward(ctx, m, args, ry, out))
        end
        _register(ctx)
        _new_module_backward(LayerNormMLPBackwardCtx, ctx, out[], (x, gamma, beta, W1, b1, W2, b2))
    end
end

"""`forward(m::LayerNormMLP, x, gamma, beta, W1, b1, W2, b2; kw...) -> (y, bwd)`"""
function forward(m::LayerNormMLP, x::DenseArray{T}, gamma, beta, W1, b1, W2, b2; kw...) where {T}
    y = similar(x, T, (m.hidden_size, size(x)[2:end]...))
    return y, forward!(y, m, x, gamma, beta, W1, b1, W2, b2; kw...)
end

"""`forward_compute!(y, m::LayerNormMLP, x, gamma, beta, W1, b1, W2, b2; kw...) -> LayerNormMLPResiduals`"""
function forward_compute!(y, m::LayerNormMLP, x, gamma, beta, W1, b1, W2, b2; weight_unchanged::Bool = false,
                          ln_out = nothing)
    storage = Ref(sized(te_layernorm_mlp_residuals))
    ctx = m.ctx
    return _with(ctx) do
        _mlp_call(m, y, x, gamma, beta, W1, b1, W2, b2, ln_out, weight_unchanged) do args, ry
            check(te_layernorm_mlp_forward_compute(ctx, m, args, ry, storage))
        end
        _register(ctx)
        _new_residuals(LayerNormMLPResiduals, ctx, storage, (x, gamma, beta, W1, b1, W2, b2))
    end
end

"""`forward_save(res::LayerNormMLPResiduals, m::LayerNormMLP) -> LayerNormMLPBackwardCtx`"""
forward_save(res::LayerNormMLPResiduals, m::LayerNormMLP) =
    _forward_save(te_layernorm_mlp_forward_save, LayerNormMLPBackwardCtx, res, m)

"""
    residual_tensors(res::LayerNormMLPResiduals)
        -> (ln_out_t, fc1_weight_t, fc1_out, act_out_t, fc2_weight_t, mu, rsigma, fp8)

Copies of what the forward saved: FP8 ones as [`Float8Array`](@ref)s (transposes: Julia
`tokens × hidden`, `fc1_rows × hidden`, `tokens × ffn`, `hidden × ffn`), else norm(x), W1,
act(fc1_out) and W2; `fc1_out` (the activation's input, `fc1_rows × tokens`) always in the
activation dtype.
"""
function residual_tensors(res::LayerNormMLPResiduals)
    return _with(res.ctx) do
        _live(res)
        r = res.storage[]
        (ln_out_t = _copy_tensor(r.ln_out_t), fc1_weight_t = _copy_tensor(r.fc1_weight_t),
         fc1_out = _copy_tensor(r.fc1_out), act_out_t = _copy_tensor(r.act_out_t),
         fc2_weight_t = _copy_tensor(r.fc2_weight_t), mu = _copy_tensor(r.mu), rsigma = _copy_tensor(r.rsigma),
         fp8 = r.fp8 != 0)
    end
end

"""
    backward!(bwd::LayerNormMLPBackwardCtx, dy; dx, dln_weight, dln_bias, dfc1_weight, dfc1_bias,
              dfc2_weight, dfc2_bias, once = false)

Every gradient of the block from `dy` (`hidden × tokens`), each shaped like its parameter (or
x); each left `nothing` is skipped. With `fuse_wgrad_accumulation` the weight gradients
(Float32) are added into.
"""
function backward!(bwd::LayerNormMLPBackwardCtx, dy; dx = nothing, dln_weight = nothing, dln_bias = nothing,
                   dfc1_weight = nothing, dfc1_bias = nothing, dfc2_weight = nothing, dfc2_bias = nothing,
                   once::Bool = false)
    vs = _views(dy, dx, dln_weight, dln_bias, dfc1_weight, dfc1_bias, dfc2_weight, dfc2_bias)
    rdy, rdx, rdg, rdbeta, rdw1, rdb1, rdw2, rdb2 = _refs(vs)
    ctx = bwd.ctx
    _with(ctx) do
        h = _live(bwd)
        GC.@preserve vs rdy rdx rdg rdbeta rdw1 rdb1 rdw2 rdb2 begin
            grads = with(initialized(te_layernorm_mlp_grads_init, te_layernorm_mlp_grads);
                         dx = _ptr(rdx), dln_weight = _ptr(rdg), dln_bias = _ptr(rdbeta),
                         dfc1_weight = _ptr(rdw1), dfc1_bias = _ptr(rdb1), dfc2_weight = _ptr(rdw2),
                         dfc2_bias = _ptr(rdb2))
            check(te_layernorm_mlp_backward(ctx, h, rdy, Ref(grads), _backward_args(once)))
        end
    end
    return nothing
end

_mlp_gemm(g::Integer) = te_mlp_gemm(g)
_mlp_gemm(g::Symbol) = g === :fc1 ? TE_MLP_FC1 : g === :fc2 ? TE_MLP_FC2 :
                       throw(ArgumentError("gemm must be :fc1, :fc2 or a te_mlp_gemm, got :$g"))

"""
    scaling_state(m::LayerNormMLP, gemm, role; history = false) -> (info, history)

The scaling state of GEMM `gemm` (`:fc1` / `:fc2`, or `TE_MLP_FC1` / `TE_MLP_FC2`) for `role`.
"""
function scaling_state(m::LayerNormMLP, gemm, role::Integer; history::Bool = false)
    g = _mlp_gemm(gemm)
    ctx = m.ctx
    return _with(ctx) do
        _read_scaling_state((info, h, n) -> te_layernorm_mlp_get_scaling_state(ctx, m, g, role, info, h, n), history)
    end
end

function save_state(m::LayerNormMLP)
    ctx = m.ctx
    return _with(() -> _save_state_bytes((buf, n, size) -> te_layernorm_mlp_state_save(ctx, m, buf, n, size)), ctx)
end

function load_state!(m::LayerNormMLP, bytes::Vector{UInt8})
    ctx = m.ctx
    _with(() -> check(te_layernorm_mlp_state_load(ctx, m, bytes, length(bytes))), ctx)
    return m
end

# ---------------------------------------------------------------------------------------------
# GroupedLinear
# ---------------------------------------------------------------------------------------------

"""
    GroupedLinear(ctx, num_gemms, in_features, out_features; bias = true,
                  activation_dtype = Float32, fuse_wgrad_accumulation = false)

The FP8 state of `num_gemms` linear experts (TE's GroupedLinear). A forward splits the tokens
(the columns of x, `in × tokens`) into consecutive groups of `m_splits[i]` (counts may be 0
and need not be multiples of 16: under FP8 each group is padded inside the library); group `i`
goes through expert `i`: `y_i = W_i' * x_i .+ b_i`. The weights are a vector of `num_gemms`
`in × out` matrices, the biases a vector of `num_gemms` vectors. Experts are numbered from 1
here (libte's `expert` is 0-based).
"""
mutable struct GroupedLinear <: ContextChild
    handle::Ptr{te_grouped_linear}
    ctx::Context
    keepalive::Any
    num_gemms::Int
    in_features::Int
    out_features::Int
    bias::Bool

    function GroupedLinear(ctx::Context, num_gemms::Integer, in_features::Integer, out_features::Integer;
                           bias::Bool = true, activation_dtype = Float32, fuse_wgrad_accumulation::Bool = false)
        1 <= num_gemms <= TE_GROUPED_LINEAR_MAX_GEMMS ||  # an Int32 in C, which checks the same range
            throw(ArgumentError("num_gemms must be in 1:$TE_GROUPED_LINEAR_MAX_GEMMS, got $num_gemms"))
        opts = with(initialized(te_grouped_linear_options_init, te_grouped_linear_options);
                    num_gemms = num_gemms, in_features = in_features,
                    out_features = out_features, bias = _bool(bias),
                    activation_dtype = _activation_dtype(activation_dtype),
                    fuse_wgrad_accumulation = _bool(fuse_wgrad_accumulation))
        out = Ref{Ptr{te_grouped_linear}}(C_NULL)
        _with(ctx) do
            check(te_grouped_linear_create(out, ctx, Ref(opts)))
            _register(ctx)
        end
        m = new(out[], ctx, nothing, Int(num_gemms), Int(in_features), Int(out_features), bias)
        finalizer(_finalize_child, m)
        return m
    end
end

_destroy!(m::GroupedLinear) = _release_child!(m, te_grouped_linear_destroy)
Base.cconvert(::Type{Ptr{Cvoid}}, m::GroupedLinear) = m
Base.unsafe_convert(::Type{Ptr{Cvoid}}, m::GroupedLinear) = _live(m)
Base.show(io::IO, m::GroupedLinear) =
    print(io, "GroupedLinear(", m.num_gemms, " × ", m.in_features, " => ", m.out_features,
          m.bias ? "" : ", bias=false", isopen(m) ? "" : ", closed", ")")

"""`GroupedLinearBackwardCtx`: what a [`GroupedLinear`](@ref) forward saved; see [`backward!`](@ref)."""
mutable struct GroupedLinearBackwardCtx <: ContextChild
    handle::Ptr{te_grouped_linear_backward_ctx}
    ctx::Context
    keepalive::Any
    num_gemms::Int
end

# Backward contexts are made by _new_module_backward(B, ctx, handle, keep); this one also knows
# how many experts its gradient vectors must have.
GroupedLinearBackwardCtx(handle, ctx::Context, keep) =
    GroupedLinearBackwardCtx(handle, ctx, keep, length(keep[2]))

_destroy!(b::GroupedLinearBackwardCtx) = _release_child!(b, te_grouped_linear_backward_ctx_destroy)

"""`GroupedLinearResiduals`: [`forward_compute!`](@ref)'s result for a [`GroupedLinear`](@ref)."""
mutable struct GroupedLinearResiduals <: ContextChild
    handle::Ptr{te_grouped_linear_residuals}
    ctx::Context
    keepalive::Any
    storage::Base.RefValue{te_grouped_linear_residuals}
end

_destroy!(r::GroupedLinearResiduals) = _release_child!(r, _ -> te_grouped_linear_residuals_release(r.storage))

# libte reads num_gemms entries of every array: a shorter one would be read past its end.
function _per_expert(m::GroupedLinear, xs, name)
    xs isa AbstractVector || throw(ArgumentError("$name must be a vector of $(m.num_gemms) arrays, got $(typeof(xs))"))
    length(xs) == m.num_gemms ||
        throw(ArgumentError("$name must have num_gemms = $(m.num_gemms) entries, got $(length(xs))"))
    return xs
end

# te_tensor structs of the views and a C array of pointers to them (keep both rooted).
function _tensor_array(views)
    ts = te_tensor[v.t for v in views]
    ps = Ptr{te_tensor}[pointer(ts, i) for i in 1:length(ts)]
    return ts, ps
end

function _grouped_call(call, m::GroupedLinear, y, x, m_splits, Ws, bs, weight_unchanged)
    _check_present("GroupedLinear", m.bias, bs, "biases")
    splits = Int64[s for s in _per_expert(m, m_splits, "m_splits")]
    wv = map(TensorView, _per_expert(m, Ws, "weights"))
    bv = bs === nothing ? nothing : map(TensorView, _per_expert(m, bs, "biases"))
    wts, wps = _tensor_array(wv)
    bts, bps = bv === nothing ? (nothing, nothing) : _tensor_array(bv)
    yv, xv = TensorView(y), TensorView(x)
    ry, rx = te_tensor[yv.t], te_tensor[xv.t]
    GC.@preserve splits wv bv wts wps bts bps yv xv ry rx begin
        args = with(initialized(te_grouped_linear_forward_args_init, te_grouped_linear_forward_args);
                    input = _ptr(rx), m_splits = pointer(splits), weights = pointer(wps),
                    biases = bps === nothing ? Ptr{Ptr{te_tensor}}(C_NULL) : pointer(bps),
                    weight_unchanged = _bool(weight_unchanged))
        return call(Ref(args), ry)
    end
end

"""
    forward!(y, m::GroupedLinear, x, m_splits, Ws, bs = nothing; weight_unchanged = false)
        -> GroupedLinearBackwardCtx

`y_i = W_i' * x_i .+ b_i` for the consecutive column groups of `m_splits` (`num_gemms` counts
summing to x's tokens), in FP8 inside an enabled [`autocast`](@ref) scope. `Ws`: `num_gemms`
`in × out` matrices; `bs`: `num_gemms` vectors, `nothing` without bias.
"""
function forward!(y, m::GroupedLinear, x, m_splits, Ws, bs = nothing; weight_unchanged::Bool = false)
    out = Ref{Ptr{te_grouped_linear_backward_ctx}}(C_NULL)
    ctx = m.ctx
    return _with(ctx) do
        _grouped_call(m, y, x, m_splits, Ws, bs, weight_unchanged) do args, ry
            check(te_grouped_linear_forward(ctx, m, args, ry, out))
        end
        _register(ctx)
        _new_module_backward(GroupedLinearBackwardCtx, ctx, out[], (x, Ws, bs))
    end
end

"""`forward(m::GroupedLinear, x, m_splits, Ws, bs = nothing; kw...) -> (y, bwd)`"""
function forward(m::GroupedLinear, x::DenseArray{T}, m_splits, Ws, bs = nothing; kw...) where {T}
    y = similar(x, T, (m.out_features, size(x)[2:end]...))
    return y, forward!(y, m, x, m_splits, Ws, bs; kw...)
end

"""`forward_compute!(y, m::GroupedLinear, x, m_splits, Ws, bs = nothing; kw...) -> GroupedLinearResiduals`"""
function forward_compute!(y, m::GroupedLinear, x, m_splits, Ws, bs = nothing; weight_unchanged::Bool = false)
    storage = Ref(sized(te_grouped_linear_residuals))
    ctx = m.ctx
    return _with(ctx) do
        _grouped_call(m, y, x, m_splits, Ws, bs, weight_unchanged) do args, ry
            check(te_grouped_linear_forward_compute(ctx, m, args, ry, storage))
        end
        _register(ctx)
        _new_residuals(GroupedLinearResiduals, ctx, storage, (x, Ws, bs))
    end
end

"""`forward_save(res::GroupedLinearResiduals, m::GroupedLinear) -> GroupedLinearBackwardCtx`"""
forward_save(res::GroupedLinearResiduals, m::GroupedLinear) =
    _forward_save(te_grouped_linear_forward_save, GroupedLinearBackwardCtx, res, m)

"""`residual_tensors(res::GroupedLinearResiduals) -> (fp8,)`: GroupedLinear's residuals are opaque."""
residual_tensors(res::GroupedLinearResiduals) =
    _with(() -> (_live(res); (fp8 = res.storage[].fp8 != 0,)), res.ctx)

"""
    backward!(bwd::GroupedLinearBackwardCtx, dy; dx = nothing, dw = nothing, db = nothing,
              once = false)

From `dy` (`out × tokens`): `dx` (like x), and per expert `dw` (a vector of `num_gemms`
`in × out` matrices; Float32 and added into with `fuse_wgrad_accumulation`) and `db` (a vector
of `num_gemms` vectors); `nothing` skips dx or a whole vector. An expert that got no tokens gets
dW = 0 (nothing added) and db = 0.
"""
function backward!(bwd::GroupedLinearBackwardCtx, dy; dx = nothing, dw = nothing, db = nothing, once::Bool = false)
    n = bwd.num_gemms
    for (name, v) in (("dw", dw), ("db", db))
        v === nothing || (v isa AbstractVector && length(v) == n) ||
            throw(ArgumentError("$name must be a vector of num_gemms = $n arrays, got $(typeof(v))" *
                                (v isa AbstractVector ? " of length $(length(v))" : "")))
    end
    dyv, dxv = TensorView(dy), _view_or_null(dx)
    wv = dw === nothing ? nothing : map(TensorView, dw)
    bv = db === nothing ? nothing : map(TensorView, db)
    wts, wps = wv === nothing ? (nothing, nothing) : _tensor_array(wv)
    bts, bps = bv === nothing ? (nothing, nothing) : _tensor_array(bv)
    rdy, rdx = te_tensor[dyv.t], _ref_or_null(dxv)
    ctx = bwd.ctx
    _with(ctx) do
        h = _live(bwd)
        GC.@preserve dyv dxv wv bv wts wps bts bps rdy rdx begin
            check(te_grouped_linear_backward(ctx, h, rdy, _ptr(rdx),
                                             wps === nothing ? Ptr{Ptr{te_tensor}}(C_NULL) : pointer(wps),
                                             bps === nothing ? Ptr{Ptr{te_tensor}}(C_NULL) : pointer(bps),
                                             _backward_args(once)))
        end
    end
    return nothing
end

"""
    scaling_state(m::GroupedLinear, expert, role; history = false) -> (info, history)

Expert `expert`'s (1-based) scaling state for `role`.
"""
function scaling_state(m::GroupedLinear, expert::Integer, role::Integer; history::Bool = false)
    1 <= expert <= m.num_gemms || throw(ArgumentError("expert must be in 1:$(m.num_gemms), got $expert"))
    ctx = m.ctx
    return _with(ctx) do
        _read_scaling_state((info, h, n) -> te_grouped_linear_get_scaling_state(ctx, m, Int32(expert - 1), role,
                                                                                 info, h, n), history)
    end
end

function save_state(m::GroupedLinear)
    ctx = m.ctx
    return _with(() -> _save_state_bytes((buf, n, size) -> te_grouped_linear_state_save(ctx, m, buf, n, size)), ctx)
end

function load_state!(m::GroupedLinear, bytes::Vector{UInt8})
    ctx = m.ctx
    _with(() -> check(te_grouped_linear_state_load(ctx, m, bytes, length(bytes))), ctx)
    return m
end
