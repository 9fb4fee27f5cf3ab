# LayerNorm and RMSNorm over libte's last dimension (te_norm_forward / te_norm_backward): the
# Python binding's libte.norm_forward and the Rust crate's Context::norm_forward.
#
# Layout, as everywhere in LibTE: libte's last dimension is the Julia **first** one, so a batch
# `x` of Julia size `hidden × tokens` is normalised column by column (one column per token);
# `gamma` and `beta` are vectors of length `hidden`; `mu` and `rsigma` have one Float32 per
# column (libte's rows: every dimension but the first, multiplied). The FP8 transpose `out_t`
# of libte's `[hidden, rows]` is a Julia `rows × hidden` array.

export norm_forward!, norm_forward, norm_backward!, norm_backward

_norm_kind(k::Integer) = te_norm_kind(k)
_norm_kind(k::Symbol) = k === :layernorm ? TE_NORM_LAYERNORM : k === :rmsnorm ? TE_NORM_RMSNORM :
                        throw(ArgumentError("kind must be :layernorm, :rmsnorm or a te_norm_kind, got :$k"))

function _norm_options(kind, eps, zero_centered_gamma)
    return with(initialized(te_norm_options_init, te_norm_options); kind = _norm_kind(kind),
                eps = Float32(eps), zero_centered_gamma = _bool(zero_centered_gamma))
end

# libte's rows of an array or Float8Array (all dimensions but libte's last, i.e. Julia's first).
_norm_rows(A) = prod(size(A)[2:end])  # 1 for a vector: prod(()) == 1

"""
    norm_forward!(out, ctx, x, gamma, beta = nothing; kind = :layernorm, eps = 1f-5,
                  zero_centered_gamma = false, out_t = nothing, mu = nothing, rsigma = nothing,
                  scale = nothing, amax = nothing, amax_epsilon = 0, power_of_2_scales = false) -> out

Normalises each column of `x` (a `Float32` / `Float16` array, or a `TensorView`; libte's last
dimension is the Julia first): `kind = :layernorm` gives `(x - mean) / sqrt(var + eps) .* gamma
.+ beta` (`beta` required), `:rmsnorm` gives `x / sqrt(mean(x.^2) + eps) .* gamma` (`beta` must
be `nothing`). With `zero_centered_gamma` the scale applied is `1 .+ gamma`.

`out` (`x`'s size, or `nothing` when `out_t` is given) is an array of any of libte's
high-precision types or a [`Float8Array`](@ref) (per-tensor scaling); `out_t`, a `Float8Array`
of Julia size `(rows, hidden)`, receives the FP8 transpose. FP8 outputs use `scale` (a number or
a one-element `Vector{Float32}`: delayed scaling), or without one the output's own amax (current
scaling, with `amax_epsilon` and `power_of_2_scales`). `amax` (a `Vector{Float32}`) has max |y|
max-accumulated into its first element, whatever the output type. `mu` (LayerNorm only) and
`rsigma`, `Vector{Float32}`s of one value per column, receive the statistics the backward needs.
"""
function norm_forward!(out, ctx::Context, x, gamma, beta = nothing; kind = :layernorm, eps::Real = 1.0f-5,
                       zero_centered_gamma::Bool = false, out_t = nothing, mu = nothing, rsigma = nothing,
                       scale = nothing, amax = nothing, amax_epsilon::Real = 0, power_of_2_scales::Bool = false)
    xv, gv, bv = TensorView(x), TensorView(gamma), _view_or_null(beta)
    ov, otv, mv, rv = _view_or_null(out), _view_or_null(out_t), _view_or_null(mu), _view_or_null(rsigma)
    rx, rg, rb = te_tensor[xv.t], te_tensor[gv.t], _ref_or_null(bv)
    ro, rot, rm, rr = _ref_or_null(ov), _ref_or_null(otv), _ref_or_null(mv), _ref_or_null(rv)
    s, a = _one_float(scale, "scale"), _amax_buffer(amax)
    opts = Ref(_norm_options(kind, eps, zero_centered_gamma))
    _with(ctx) do
        GC.@preserve xv gv bv ov otv mv rv rx rg rb ro rot rm rr s a begin
            q = Ref(_quantize_options(s, a, amax_epsilon, power_of_2_scales))
            GC.@preserve q begin
                args = with(initialized(te_norm_forward_args_init, te_norm_forward_args);
                            input = _ptr(rx), weight = _ptr(rg), bias = _ptr(rb), output = _ptr(ro),
                            output_t = _ptr(rot), mu = _ptr(rm), rsigma = _ptr(rr),
                            quantize = Base.unsafe_convert(Ptr{te_quantize_options}, q))
                check(te_norm_forward(ctx, opts, Ref(args)))
            end
        end
    end
    return out
end

"""
    norm_forward(ctx, x, gamma, beta = nothing; kind = :layernorm, dtype = nothing,
                 transpose = false, kw...) -> (out, out_t, mu, rsigma)

[`norm_forward!`](@ref) into new outputs: `out` like `x` (element type `eltype(x)`), or a
[`Float8Array`](@ref) when `dtype` is `:e4m3` / `:e5m2`; with `transpose = true` also `out_t`, a
`Float8Array` (`dtype`, else `:e4m3`) of Julia size `(rows, hidden)`, else `nothing`; `mu`
(LayerNorm; `nothing` for RMSNorm) and `rsigma`, `Vector{Float32}`s of length `rows`.
"""
function norm_forward(ctx::Context, x::DenseArray, gamma, beta = nothing; kind = :layernorm, dtype = nothing,
                      transpose::Bool = false, kw...)
    rows, hidden = _norm_rows(x), size(x, 1)
    out = dtype === nothing ? similar(x) : Float8Array(undef, dtype, size(x)...)
    out_t = transpose ? Float8Array(undef, dtype === nothing ? :e4m3 : dtype, rows, hidden) : nothing
    mu = _norm_kind(kind) == TE_NORM_LAYERNORM ? zeros(Float32, rows) : nothing
    rsigma = zeros(Float32, rows)
    norm_forward!(out, ctx, x, gamma, beta; kind = kind, out_t = out_t, mu = mu, rsigma = rsigma, kw...)
    return out, out_t, mu, rsigma
end

"""
    norm_backward!(dx, dgamma, dbeta, ctx, dy, x, gamma, mu, rsigma; kind = :layernorm,
                   eps = 1f-5, zero_centered_gamma = false) -> (dx, dgamma, dbeta)

The norm's gradients from `dy` (`x`'s size and type) and the forward's `x`, `gamma` and
statistics (`mu`: LayerNorm only, `nothing` for RMSNorm). `dx` is like `x`, `dgamma` and `dbeta`
(LayerNorm only) like `gamma`; any of them may be `nothing` to skip it. `dgamma` and `dbeta` are
written, not accumulated, and the same inputs give the same bits.
"""
function norm_backward!(dx, dgamma, dbeta, ctx::Context, dy, x, gamma, mu, rsigma; kind = :layernorm,
                        eps::Real = 1.0f-5, zero_centered_gamma::Bool = false)
    dyv, xv, gv, mv, rv = TensorView(dy), TensorView(x), TensorView(gamma), _view_or_null(mu), TensorView(rsigma)
    dxv, dgv, dbv = _view_or_null(dx), _view_or_null(dgamma), _view_or_null(dbeta)
    rdy, rx, rg, rm, rr = te_tensor[dyv.t], te_tensor[xv.t], te_tensor[gv.t], _ref_or_null(mv), te_tensor[rv.t]
    rdx, rdg, rdb = _ref_or_null(dxv), _ref_or_null(dgv), _ref_or_null(dbv)
    opts = Ref(_norm_options(kind, eps, zero_centered_gamma))
    _with(ctx) do
        GC.@preserve dyv xv gv mv rv dxv dgv dbv rm rdx rdg rdb begin
            check(te_norm_backward(ctx, opts, rdy, rx, rg, _ptr(rm), rr, _ptr(rdx), _ptr(rdg), _ptr(rdb)))
        end
    end
    return dx, dgamma, dbeta
end

"""
    norm_backward(ctx, dy, x, gamma, mu, rsigma; kind = :layernorm, kw...) -> (dx, dgamma, dbeta)

[`norm_backward!`](@ref) into new arrays (`dbeta` is `nothing` for RMSNorm).
"""
function norm_backward(ctx::Context, dy, x::DenseArray, gamma::DenseArray, mu, rsigma; kind = :layernorm, kw...)
    dbeta = _norm_kind(kind) == TE_NORM_LAYERNORM ? similar(gamma) : nothing
    return norm_backward!(similar(x), similar(gamma), dbeta, ctx, dy, x, gamma, mu, rsigma; kind = kind, kw...)
end
