# Attention (te_attention_*) and rotary position embedding (te_rope_*), with the modules' shape:
# an `Attention` object owning the handle, `forward!` / `forward` / the split
# `forward_compute!` + `forward_save` returning a backward context, `backward!` with keyword
# gradients, `scaling_state`, `save_state` / `load_state!`, and the caller-memory residual calls
# (`residuals_size`, `forward_compute_into!`, `backward_from!`).
#
# Layout, as everywhere in LibTE: Julia arrays are libte tensors with their dimensions reversed.
# BSHD (fixed lengths): libte's q `[batch, seq_q, heads, head_dim]` is a Julia
# `head_dim × heads × seq_q × batch` array, k and v `head_dim × kv_heads × seq_kv × batch`.
# THD (variable lengths): q is `head_dim × heads × tokens_q`, k and v
# `head_dim × kv_heads × tokens_kv`, with `cu_seqlens_q` / `cu_seqlens_kv` `Vector{Int32}`s of
# `batch + 1` offsets (0-based row offsets, as TE's cu_seqlens) and `max_seqlen_q` /
# `max_seqlen_kv` bounding the lengths. RoPE's `freqs` (libte's F32 `[positions, rot_dim / 2]`)
# is a Julia `(rot_dim ÷ 2) × positions` Float32 matrix.
#
# Lifetimes: te.h has libte reference q, k, v and the offsets (in high precision) and o (always)
# until the backward context is destroyed; the residuals and backward contexts keep those arrays
# alive (their `keepalive`).

export Attention, AttentionResiduals, AttentionBackwardCtx, residuals_size, forward_compute_into!,
       backward_from!, rope_forward!, rope_forward, rope_backward!, rope_backward

# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

_attn_mask(m::Integer) = te_attn_mask(m)
_attn_mask(m::Symbol) = m === :none ? TE_ATTN_MASK_NONE : m === :causal ? TE_ATTN_MASK_CAUSAL :
                        m === :causal_bottom_right ? TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT :
                        throw(ArgumentError("mask must be :none, :causal or :causal_bottom_right, got :$m"))

"""
    Attention(ctx, num_heads, head_dim; num_kv_heads = 0, softmax_scale = 0, mask = :none,
              activation_dtype = Float32, fp8 = false)

Scaled dot-product attention (TE's DotProductAttention): `O = softmax(scale * Q K^T + mask) V`
for every sequence and query head. `num_kv_heads` (0: `num_heads`) must divide `num_heads`
(GQA/MQA: query head h reads kv head `h ÷ (num_heads ÷ num_kv_heads)`, 0-based); `head_dim` is a
multiple of 8 up to 256; `softmax_scale` 0 means `1 / sqrt(head_dim)`; `mask` is `:none`,
`:causal` (key j visible to query i iff j <= i) or `:causal_bottom_right` (iff
j <= i + seq_kv - seq_q), or a `te_attn_mask`. With `fp8 = true` (TE's `fp8_dpa`) it runs in FP8
inside FP8 [`autocast`](@ref) scopes of delayed or current scaling. See the top of
`src/attention.jl` for the array layouts (BSHD and THD).
"""
mutable struct Attention <: ContextChild
    handle::Ptr{te_attention}
    ctx::Context
    keepalive::Any
    num_heads::Int
    num_kv_heads::Int
    head_dim::Int
    mask::te_attn_mask
    fp8::Bool

    function Attention(ctx::Context, num_heads::Integer, head_dim::Integer; num_kv_heads::Integer = 0,
                       softmax_scale::Real = 0, mask = :none, activation_dtype = Float32, fp8::Bool = false)
        mk = _attn_mask(mask)
        opts = with(initialized(te_attention_options_init, te_attention_options);
                    num_heads = Int32(num_heads), num_kv_heads = Int32(num_kv_heads),
                    head_dim = Int32(head_dim), softmax_scale = Float32(softmax_scale), mask = mk,
                    activation_dtype = _activation_dtype(activation_dtype), fp8 = _bool(fp8))
        out = Ref{Ptr{te_attention}}(C_NULL)
        _with(ctx) do
            check(te_attention_create(out, ctx, Ref(opts)))
            _register(ctx)
        end
        kvh = num_kv_heads == 0 ? Int(num_heads) : Int(num_kv_heads)
        m = new(out[], ctx, nothing, Int(num_heads), kvh, Int(head_dim), mk, fp8)
        finalizer(_finalize_child, m)
        return m
    end
end

_destroy!(m::Attention) = _release_child!(m, te_attention_destroy)
Base.cconvert(::Type{Ptr{Cvoid}}, m::Attention) = m
Base.unsafe_convert(::Type{Ptr{Cvoid}}, m::Attention) = _live(m)
Base.show(io::IO, m::Attention) =
    print(io, "Attention(", m.num_heads, " heads",
          m.num_kv_heads == m.num_heads ? "" : ", $(m.num_kv_heads) kv heads", ", head_dim ", m.head_dim,
          m.mask == TE_ATTN_MASK_CAUSAL ? ", causal" :
          m.mask == TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT ? ", causal_bottom_right" : "",
          m.fp8 ? ", fp8" : "", isopen(m) ? "" : ", closed", ")")

"""
    AttentionBackwardCtx

What an [`Attention`](@ref) forward saved (`te_attention_backward_ctx`); keeps the forward's q,
k, v, offsets and o alive. Pass it to [`backward!`](@ref); `close` it (or leave it to the GC).
"""
mutable struct AttentionBackwardCtx <: ContextChild
    handle::Ptr{te_attention_backward_ctx}
    ctx::Context
    keepalive::Any
end

_destroy!(b::AttentionBackwardCtx) = _release_child!(b, te_attention_backward_ctx_destroy)

"""
    AttentionResiduals

[`forward_compute!`](@ref)'s result for an [`Attention`](@ref): hand it to
[`forward_save`](@ref), inspect it with [`residual_tensors`](@ref LibTE.residual_tensors), or
`close` it.
"""
mutable struct AttentionResiduals <: ContextChild
    handle::Ptr{te_attention_residuals}
    ctx::Context
    keepalive::Any
    storage::Base.RefValue{te_attention_residuals}
end

_destroy!(r::AttentionResiduals) = _release_child!(r, _ -> te_attention_residuals_release(r.storage))

_offsets_view(x) = x === nothing ? nothing :
    (x isa TensorView ? x : x isa DenseVector{Int32} ? TensorView(x) :
     throw(ArgumentError("sequence offsets must be a Vector{Int32} (batch + 1 entries), got $(typeof(x))")))

# The te_tensor structs of `views` (each a TensorView or nothing) in one heap array, and
# `ptr(i)`, the pointer to the i-th (NULL for nothing). Pointers into a Vector stay valid while
# it is rooted; a pointer to a `Ref` that the compiler may place on the stack does not always
# (seen with Julia 1.5 for structs pointed to from another struct), hence no `_ptr(Ref(...))` here.
function _tensor_structs(views)
    ts = te_tensor[v === nothing ? zeroed(te_tensor) : v.t for v in views]
    ptr(i) = views[i] === nothing ? Ptr{te_tensor}(C_NULL) : pointer(ts, i)
    return ts, ptr
end

# Runs `call(args, ro)` with the te_attention_forward_args of the views (rooted throughout) and
# `ro`, o's te_tensor as a Ref for the ccall (or nothing when `o` is: residuals_size).
function _attn_call(call, o, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv)
    (cu_seqlens_q === nothing) == (cu_seqlens_kv === nothing) ||
        throw(ArgumentError("THD needs both cu_seqlens_q and cu_seqlens_kv (BSHD: neither)"))
    ov = _view_or_null(o)
    vs = (TensorView(q), TensorView(k), TensorView(v), _offsets_view(cu_seqlens_q), _offsets_view(cu_seqlens_kv))
    ts, ptr = _tensor_structs(vs)
    ro = ov === nothing ? nothing : Ref(ov.t)
    GC.@preserve ov vs ts ro begin
        args = with(initialized(te_attention_forward_args_init, te_attention_forward_args);
                    q = ptr(1), k = ptr(2), v = ptr(3), cu_seqlens_q = ptr(4), cu_seqlens_kv = ptr(5),
                    max_seqlen_q = Int64(max_seqlen_q), max_seqlen_kv = Int64(max_seqlen_kv))
        return call(Ref(args), ro)
    end
end

"""
    forward!(o, m::Attention, q, k, v; cu_seqlens_q = nothing, cu_seqlens_kv = nothing,
             max_seqlen_q = 0, max_seqlen_kv = 0) -> AttentionBackwardCtx

Writes the attention's output `o` (like `q`) and returns the backward context. BSHD without the
keywords, THD with both offset vectors (`Vector{Int32}`, `batch + 1` entries) and the length
bounds. `o` is referenced by the backward: leave it unchanged until the context is closed.
"""
function forward!(o, m::Attention, q, k, v; cu_seqlens_q = nothing, cu_seqlens_kv = nothing,
                  max_seqlen_q::Integer = 0, max_seqlen_kv::Integer = 0)
    out = Ref{Ptr{te_attention_backward_ctx}}(C_NULL)
    ctx = m.ctx
    return _with(ctx) do
        _attn_call(o, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) do args, ro
            check(te_attention_forward(ctx, m, args, ro, out))
        end
        _register(ctx)
        _new_module_backward(AttentionBackwardCtx, ctx, out[], (q, k, v, o, cu_seqlens_q, cu_seqlens_kv))
    end
end

"""
    forward(m::Attention, q, k, v; kw...) -> (o, bwd)

[`forward!`](@ref) into a new `o` like `q`.
"""
function forward(m::Attention, q::DenseArray, k, v; kw...)
    o = similar(q)
    return o, forward!(o, m, q, k, v; kw...)
end

"""
    forward_compute!(o, m::Attention, q, k, v; kw...) -> AttentionResiduals

The pure-compute half of [`forward!`](@ref); pack the result with [`forward_save`](@ref).
"""
function forward_compute!(o, m::Attention, q, k, v; cu_seqlens_q = nothing, cu_seqlens_kv = nothing,
                          max_seqlen_q::Integer = 0, max_seqlen_kv::Integer = 0)
    storage = Ref(sized(te_attention_residuals))
    ctx = m.ctx
    return _with(ctx) do
        _attn_call(o, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) do args, ro
            check(te_attention_forward_compute(ctx, m, args, ro, storage))
        end
        _register(ctx)
        _new_residuals(AttentionResiduals, ctx, storage, (q, k, v, o, cu_seqlens_q, cu_seqlens_kv))
    end
end

"""`forward_save(res::AttentionResiduals, m::Attention) -> AttentionBackwardCtx`"""
forward_save(res::AttentionResiduals, m::Attention) =
    _forward_save(te_attention_forward_save, AttentionBackwardCtx, res, m)

"""
    residual_tensors(res::AttentionResiduals) -> (q, k, v, o, lse, fp8)

Copies of what the forward saved: q, k, v (after an FP8 forward the E4M3
[`Float8Array`](@ref)s, else the caller's arrays, copied), o, and `lse`, the rows' log-sum-exp
(libte's F32 `[tokens_q, heads]`, a Julia `heads × tokens_q` matrix).
"""
function residual_tensors(res::AttentionResiduals)
    return _with(res.ctx) do
        _live(res)
        r = res.storage[]
        (q = _copy_tensor(r.q), k = _copy_tensor(r.k), v = _copy_tensor(r.v), o = _copy_tensor(r.o),
         lse = _copy_tensor(r.lse), fp8 = r.fp8 != 0)
    end
end

# Runs `call(grads)` with the te_attention_grads of the views (rooted throughout).
function _attn_grads_call(call, dq, dk, dv)
    vs = (_view_or_null(dq), _view_or_null(dk), _view_or_null(dv))
    ts, ptr = _tensor_structs(vs)
    GC.@preserve vs ts begin
        grads = with(initialized(te_attention_grads_init, te_attention_grads); dq = ptr(1), dk = ptr(2), dv = ptr(3))
        return call(Ref(grads))
    end
end

"""
    backward!(bwd::AttentionBackwardCtx, d_o; dq = nothing, dk = nothing, dv = nothing,
              once = false)

From `d_o` (like q): `dq`, `dk`, `dv`, each like its input, written (not accumulated; dk and dv
sum the query heads of each GQA group); each left `nothing` is skipped. Callable again with the
same results until closed, unless `once = true` (`TE_BACKWARD_ONCE`: a later call throws).
"""
function backward!(bwd::AttentionBackwardCtx, d_o; dq = nothing, dk = nothing, dv = nothing, once::Bool = false)
    dov = TensorView(d_o)
    rdo = Ref(dov.t)
    ctx = bwd.ctx
    _with(ctx) do
        h = _live(bwd)
        GC.@preserve dov rdo begin
            _attn_grads_call(dq, dk, dv) do grads
                check(te_attention_backward(ctx, h, rdo, grads, _backward_args(once)))
            end
        end
    end
    return nothing
end

"""
    residuals_size(m::Attention, q, k, v; kw...) -> Int

The bytes of residual memory [`forward_compute_into!`](@ref) needs for these inputs under the
innermost autocast scope as it is now (never 0: the LSE, and under FP8 the E4M3 Q, K, V). Reads
only shapes. The keywords are [`forward!`](@ref)'s.
"""
function residuals_size(m::Attention, q, k, v; cu_seqlens_q = nothing, cu_seqlens_kv = nothing,
                        max_seqlen_q::Integer = 0, max_seqlen_kv::Integer = 0)
    n = Ref{Csize_t}(0)
    ctx = m.ctx
    _with(ctx) do
        _attn_call(nothing, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) do args, _
            check(te_attention_residuals_size(ctx, m, args, n))
        end
    end
    return Int(n[])
end

function _residual_memory(residuals)
    residuals isa DenseVector{UInt8} ||
        throw(ArgumentError("residual memory must be a Vector{UInt8} (16-byte aligned, as Julia allocates), got $(typeof(residuals))"))
    return residuals
end

"""
    forward_compute_into!(o, m::Attention, q, k, v, residuals::Vector{UInt8}; kw...)

[`forward_compute!`](@ref) keeping the residuals in `residuals` (at least
[`residuals_size`](@ref) bytes; a Julia `Vector{UInt8}` is 16-byte aligned as libte needs)
instead of library-owned storage; nothing is kept alive: [`backward_from!`](@ref) takes the
inputs and `o` again. Each pending forward needs memory of its own.
"""
function forward_compute_into!(o, m::Attention, q, k, v, residuals; cu_seqlens_q = nothing,
                               cu_seqlens_kv = nothing, max_seqlen_q::Integer = 0, max_seqlen_kv::Integer = 0)
    mem = _residual_memory(residuals)
    ctx = m.ctx
    _with(ctx) do
        _attn_call(o, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) do args, ro
            GC.@preserve mem check(te_attention_forward_compute_into(ctx, m, args, ro, mem, length(mem)))
        end
    end
    return nothing
end

"""
    backward_from!(m::Attention, q, k, v, o, residuals, d_o; dq = nothing, dk = nothing,
                   dv = nothing, once = false, kw...)

The backward of a [`forward_compute_into!`](@ref): the forward's inputs and output again (they
may have moved), the residual memory it filled, and `d_o`; gradients as [`backward!`](@ref).
Repeatable with identical results until a `once = true` call. The other keywords are
[`forward!`](@ref)'s.
"""
function backward_from!(m::Attention, q, k, v, o, residuals, d_o; dq = nothing, dk = nothing, dv = nothing,
                        once::Bool = false, cu_seqlens_q = nothing, cu_seqlens_kv = nothing,
                        max_seqlen_q::Integer = 0, max_seqlen_kv::Integer = 0)
    mem = _residual_memory(residuals)
    dov = TensorView(d_o)
    rdo = Ref(dov.t)
    ctx = m.ctx
    _with(ctx) do
        _attn_call(o, q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv) do args, ro
            GC.@preserve mem dov rdo begin
                _attn_grads_call(dq, dk, dv) do grads
                    check(te_attention_backward_from(ctx, m, args, ro, mem, length(mem), rdo, grads,
                                                     _backward_args(once)))
                end
            end
        end
    end
    return nothing
end

"""
    scaling_state(m::Attention, which; history = false) -> (info, history)

One FP8 scaling state: `which` is `TE_ATTN_Q`, `TE_ATTN_K`, `TE_ATTN_V`, `TE_ATTN_S` (the
softmax output), `TE_ATTN_DO` or `TE_ATTN_DP` (dS), as for a [`Linear`](@ref).
"""
function scaling_state(m::Attention, which::Integer; history::Bool = false)
    ctx = m.ctx
    return _with(ctx) do
        _read_scaling_state((info, h, n) -> te_attention_get_scaling_state(ctx, m, which, info, h, n), history)
    end
end

function save_state(m::Attention)
    ctx = m.ctx
    return _with(() -> _save_state_bytes((buf, n, size) -> te_attention_state_save(ctx, m, buf, n, size)), ctx)
end

function load_state!(m::Attention, bytes::Vector{UInt8})
    ctx = m.ctx
    _with(() -> check(te_attention_state_load(ctx, m, bytes, length(bytes))), ctx)
    return m
end

# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------

function _rope(f, y, ctx::Context, x, freqs, cu_seqlens, rot_dim, interleaved)
    opts = with(initialized(te_rope_options_init, te_rope_options);
                rot_dim = Int32(rot_dim), interleaved = _bool(interleaved))
    yv, xv, fv, cv = TensorView(y), TensorView(x), TensorView(freqs), _offsets_view(cu_seqlens)
    ry = Ref(yv.t)
    # In place (y === x): one struct for both, as te.h allows.
    rx = y === x ? ry : Ref(xv.t)
    rf = Ref(fv.t)
    rc = cv === nothing ? Ptr{te_tensor}(C_NULL) : Ref(cv.t)  # a Ref passed to ccall is rooted by it
    _with(ctx) do
        GC.@preserve yv xv fv cv ry rx rf rc begin
            check(f(ctx, Ref(opts), rx, rf, rc, ry))
        end
    end
    return y
end

"""
    rope_forward!(y, ctx, x, freqs; cu_seqlens = nothing, rot_dim = 0, interleaved = false) -> y

Rotary position embedding (TE's fused RoPE): the first `rot_dim` (0: all) features of every head
of `x` rotate by the angle `freqs[k, p]` (Julia indexing of the `(rot_dim ÷ 2) × positions`
Float32 matrix) of the token's position p in its sequence: pairs `(k, k + rot_dim/2)`
(GPT-NeoX), or `(2k, 2k+1)` with `interleaved = true` (GPT-J); `y1 = x1 cos - x2 sin`,
`y2 = x2 cos + x1 sin`; the other features are copied. `x` is BSHD (`head_dim × heads × seq ×
batch`) or, with `cu_seqlens` (`Vector{Int32}`), THD (`head_dim × heads × tokens`). `y` is like
`x` and may be `x` itself.
"""
rope_forward!(y, ctx::Context, x, freqs; cu_seqlens = nothing, rot_dim::Integer = 0, interleaved::Bool = false) =
    _rope(te_rope_forward, y, ctx, x, freqs, cu_seqlens, rot_dim, interleaved)

"""`rope_forward(ctx, x, freqs; kw...) -> y`: [`rope_forward!`](@ref) into a new array."""
rope_forward(ctx::Context, x::DenseArray, freqs; kw...) = rope_forward!(similar(x), ctx, x, freqs; kw...)

"""
    rope_backward!(dx, ctx, dy, freqs; cu_seqlens = nothing, rot_dim = 0, interleaved = false) -> dx

RoPE's backward, the inverse rotation; arguments as [`rope_forward!`](@ref).
"""
rope_backward!(dx, ctx::Context, dy, freqs; cu_seqlens = nothing, rot_dim::Integer = 0, interleaved::Bool = false) =
    _rope(te_rope_backward, dx, ctx, dy, freqs, cu_seqlens, rot_dim, interleaved)

"""`rope_backward(ctx, dy, freqs; kw...) -> dx`: [`rope_backward!`](@ref) into a new array."""
rope_backward(ctx::Context, dy::DenseArray, freqs; kw...) = rope_backward!(similar(dy), ctx, dy, freqs; kw...)
