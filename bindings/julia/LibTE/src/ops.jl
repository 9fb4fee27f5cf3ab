# FP8 primitives: quantize / cast-transpose / dequantize / amax / GEMM on Julia arrays (the
# Python binding's libte.ops and the Rust crate's Context::quantize & co.).
#
# Layout, as everywhere in LibTE: a Julia array is described to libte with its dimensions
# reversed (column-major (k, m) == row-major [m, k], the same bytes). FP8 data lives in a
# `Float8Array`: the codes as a `UInt8` array with the Julia dimensions, and the float32
# `scale_inv` libte writes next to them.

export Float8Array, quantize, quantize!, cast_transpose, cast_transpose!, dequantize,
       dequantize!, amax, gemm, gemm!

_fp8_dtype(d::Integer) = te_dtype(d)
_fp8_dtype(d::Symbol) = d === :e4m3 ? TE_DTYPE_E4M3 : d === :e5m2 ? TE_DTYPE_E5M2 :
                        throw(ArgumentError("FP8 dtype must be :e4m3, :e5m2 or a te_dtype, got :$d"))

_scaling_mode(s::Integer) = te_scaling_mode(s)
_scaling_mode(s::Symbol) = s === :per_tensor ? TE_SCALING_PER_TENSOR :
                           s === :block_1x128 ? TE_SCALING_BLOCK_1X128 :
                           s === :block_128x128 ? TE_SCALING_BLOCK_128X128 :
                           throw(ArgumentError("scaling must be :per_tensor, :block_1x128, :block_128x128 or a te_scaling_mode, got :$s"))

# How many float32 scale_inv an FP8 tensor of the libte shape `shape` needs.
function _scale_inv_count(dtype, shape::Tuple, scaling)
    nd = length(shape)
    1 <= nd <= TE_MAX_DIMS || throw(ArgumentError("libte tensors have 1 to $TE_MAX_DIMS dimensions, got $nd"))
    dims = ntuple(i -> i <= nd ? Int64(shape[i]) : Int64(0), Val(Int(TE_MAX_DIMS)))
    t = te_tensor(C_NULL, dtype, Int32(nd), dims, te_device(TE_DEVICE_CPU, 0), C_NULL, scaling)
    n = Ref{Int64}(0)
    check(te_tensor_scale_inv_count(n, Ref(t)))
    return Int(n[])
end

"""
    Float8Array(undef, dtype, dims...; scaling = :per_tensor)

FP8 data as libte reads and writes it: `codes`, a `UInt8` array of the Julia dimensions `dims`
(libte's shape is `reverse(dims)`), and `scale_inv`, the `Vector{Float32}` of dequantization
factors (one for `:per_tensor`, one per 1x128 block or 128x128 tile of the row-major matrix for
`:block_1x128` / `:block_128x128`). `dtype` is `:e4m3` or `:e5m2` (or the `te_dtype`).
[`quantize`](@ref) and [`cast_transpose`](@ref) return them, [`dequantize`](@ref) and
[`gemm`](@ref) take them; `TensorView(f)` describes one to the raw wrappers.
"""
struct Float8Array{N}
    codes::Array{UInt8,N}
    scale_inv::Vector{Float32}
    dtype::te_dtype
    scaling::te_scaling_mode
end

function Float8Array(::UndefInitializer, dtype, dims::Integer...; scaling = :per_tensor)
    d, s = _fp8_dtype(dtype), _scaling_mode(scaling)
    d in (TE_DTYPE_E4M3, TE_DTYPE_E5M2) || throw(ArgumentError("not an FP8 dtype: $d"))
    n = _scale_inv_count(d, reverse(Int.(dims)), s)
    return Float8Array(zeros(UInt8, dims...), ones(Float32, n), d, s)
end

Base.size(f::Float8Array) = size(f.codes)
Base.ndims(f::Float8Array) = ndims(f.codes)
TensorView(f::Float8Array) = TensorView(f.codes, f.dtype; scale_inv = f.scale_inv, scaling = f.scaling)

Base.show(io::IO, f::Float8Array) =
    print(io, "Float8Array(", f.dtype == TE_DTYPE_E4M3 ? "e4m3" : "e5m2", ", ",
          join(size(f), "×"), f.scaling == TE_SCALING_PER_TENSOR ? "" : ", block-scaled", ")")

# A one-float buffer libte reads (`scale`) or max-accumulates into (`amax`).
_one_float(::Nothing, name) = nothing
_one_float(x::Real, name) = Float32[x]
function _one_float(x::DenseVector{Float32}, name)
    isempty(x) && throw(ArgumentError("$name: expected one Float32, got an empty vector"))
    return x
end
_one_float(x, name) = throw(ArgumentError("$name: expected a number or a Vector{Float32}, got $(typeof(x))"))
_fptr(::Nothing) = Ptr{Cfloat}(C_NULL)
_fptr(v::DenseVector{Float32}) = pointer(v)

# te_quantize_options pointing into the (rooted) buffers.
function _quantize_options(scale, amax, amax_epsilon, power_of_2_scales)
    opts = initialized(te_quantize_options_init, te_quantize_options)
    return with(opts; scale = _fptr(scale), amax = _fptr(amax), amax_epsilon = Float32(amax_epsilon),
                power_of_2_scales = _bool(power_of_2_scales))
end

function _amax_buffer(amax)
    amax === nothing && return nothing
    amax isa DenseVector{Float32} && !isempty(amax) ||
        throw(ArgumentError("amax: expected a non-empty Vector{Float32} to accumulate into, got $(typeof(amax))"))
    return amax
end

"""
    quantize!(out::Float8Array, ctx, x; scale = nothing, amax = nothing, amax_epsilon = 0,
              power_of_2_scales = false) -> out

`out.codes = saturate(x * scale)` in `out`'s FP8 format, and `out.scale_inv = 1 / scale` (per
block for block scaling). `x` is a `Float32` / `Float16` array (or a `TensorView`) of `out`'s
size. `scale` (a number or a one-element `Vector{Float32}`) is the per-tensor scale of delayed
scaling; without it the scale is computed from `x`'s amax (current scaling, clamped by
`amax_epsilon`, optionally a power of 2). `amax`, a `Vector{Float32}`, has `x`'s amax
max-accumulated into its first element.
"""
function quantize!(out::Float8Array, ctx::Context, x; scale = nothing, amax = nothing,
                   amax_epsilon::Real = 0, power_of_2_scales::Bool = false)
    xv, ov = TensorView(x), TensorView(out)
    rx, ro = te_tensor[xv.t], te_tensor[ov.t]
    s, a = _one_float(scale, "scale"), _amax_buffer(amax)
    _with(ctx) do
        GC.@preserve xv ov s a begin
            opts = Ref(_quantize_options(s, a, amax_epsilon, power_of_2_scales))
            check(te_quantize(ctx, rx, ro, opts))
        end
    end
    return out
end

"""
    quantize(ctx, x; dtype = :e4m3, scaling = :per_tensor, kw...) -> Float8Array

[`quantize!`](@ref) into a new [`Float8Array`](@ref) of `x`'s size.
"""
function quantize(ctx::Context, x::DenseArray; dtype = :e4m3, scaling = :per_tensor, kw...)
    out = Float8Array(undef, dtype, size(x)...; scaling = scaling)
    return quantize!(out, ctx, x; kw...)
end

"""
    cast_transpose!(out, out_t, ctx, x; scale, amax, amax_epsilon, power_of_2_scales) -> (out, out_t)

Quantizes the matrix `x` into `out` (of `x`'s size) and `out_t`, its transpose (Julia size
`reverse(size(x))`: the libte tensor `[cols, rows]`), in one pass; either may be `nothing`.
Per-tensor scaling: `out_t.codes == permutedims(out.codes)` with the same scale. Options as in
[`quantize!`](@ref).
"""
function cast_transpose!(out::Union{Nothing,Float8Array}, out_t::Union{Nothing,Float8Array}, ctx::Context, x;
                         scale = nothing, amax = nothing, amax_epsilon::Real = 0, power_of_2_scales::Bool = false)
    xv = TensorView(x)
    ov, otv = _view_or_null(out), _view_or_null(out_t)
    rx, ro, rot = te_tensor[xv.t], _ref_or_null(ov), _ref_or_null(otv)
    s, a = _one_float(scale, "scale"), _amax_buffer(amax)
    _with(ctx) do
        GC.@preserve xv ov otv ro rot s a begin
            opts = Ref(_quantize_options(s, a, amax_epsilon, power_of_2_scales))
            check(te_cast_transpose(ctx, rx, _ptr(ro), _ptr(rot), opts))
        end
    end
    return out, out_t
end

"""
    cast_transpose(ctx, x::AbstractMatrix; dtype = :e4m3, scaling = :per_tensor, kw...) -> (out, out_t)

[`cast_transpose!`](@ref) into two new [`Float8Array`](@ref)s.
"""
function cast_transpose(ctx::Context, x::DenseMatrix; dtype = :e4m3, scaling = :per_tensor, kw...)
    out = Float8Array(undef, dtype, size(x)...; scaling = scaling)
    out_t = Float8Array(undef, dtype, reverse(size(x))...; scaling = scaling)
    return cast_transpose!(out, out_t, ctx, x; kw...)
end

"""
    dequantize!(out, ctx, x::Float8Array) -> out

`out = codes * scale_inv` into a `Float32` / `Float16` array of `x`'s size.
"""
function dequantize!(out, ctx::Context, x::Float8Array)
    xv, ov = TensorView(x), TensorView(out)
    rx, ro = te_tensor[xv.t], te_tensor[ov.t]
    _with(ctx) do
        GC.@preserve xv ov check(te_dequantize(ctx, rx, ro))
    end
    return out
end

"""`dequantize(ctx, x::Float8Array; T = Float32)`: [`dequantize!`](@ref) into a new array."""
dequantize(ctx::Context, x::Float8Array; T::Type = Float32) = dequantize!(zeros(T, size(x)), ctx, x)

"""`amax(ctx, x) -> Float32`: `maximum(abs, x)` computed by libte (NaN when `x` holds one)."""
function amax(ctx::Context, x)
    xv = TensorView(x)
    rx = te_tensor[xv.t]
    out = Ref{Float32}(0)
    _with(ctx) do
        GC.@preserve xv check(te_amax(ctx, rx, out))
    end
    return out[]
end

# libte's row-major shape of an array or Float8Array.
_libte_shape(A) = reverse(size(A))

"""
    gemm!(D, ctx, A, B; transa = false, transb = false, bias = nothing, gelu = false,
          gelu_input = nothing, accumulate = false, use_split_accumulator = false) -> D

libte's GEMM, `D[m, n] = epilogue(op(A) op(B) (+ D))` on the row-major tensors, which in
Julia terms (every array's dimensions reversed) is

    D = epilogue(op(B) * op(A) (+ D)),   op(X) = X' when its trans flag is set

with `bias` (length `size(D, 1)`) added to every column and GELU applied when `gelu = true`
(`gelu_input`, like `D`, then receives the pre-GELU values). `A` and `B` are both
[`Float8Array`](@ref)s or both arrays of one high-precision element type; `D` is `Float32` or
`Float16`. FP8 follows cuBLASLt's rules on every backend: `transa = false`, `transb = true`
(in Julia: `D = B' * A`, both operands with the reduction dimension first), every dimension a
multiple of 16, not both E5M2.
"""
function gemm!(D, ctx::Context, A, B; transa::Bool = false, transb::Bool = false, bias = nothing,
               gelu::Bool = false, gelu_input = nothing, accumulate::Bool = false,
               use_split_accumulator::Bool = false)
    av, bv, dv = TensorView(A), TensorView(B), TensorView(D)
    biasv, gv = _view_or_null(bias), _view_or_null(gelu_input)
    ra, rb, rd, rbias, rg = te_tensor[av.t], te_tensor[bv.t], te_tensor[dv.t], _ref_or_null(biasv), _ref_or_null(gv)
    epilogue = bias === nothing ? (gelu ? TE_EPILOGUE_GELU : TE_EPILOGUE_NONE) :
               (gelu ? TE_EPILOGUE_BIAS_GELU : TE_EPILOGUE_BIAS)
    _with(ctx) do
        GC.@preserve av bv dv biasv gv rbias rg begin
            opts = with(initialized(te_gemm_options_init, te_gemm_options);
                        transa = _bool(transa), transb = _bool(transb), epilogue = epilogue,
                        bias = _ptr(rbias), gelu_input = _ptr(rg), accumulate = _bool(accumulate),
                        use_split_accumulator = _bool(use_split_accumulator))
            check(te_gemm(ctx, ra, rb, rd, Ref(opts)))
        end
    end
    return D
end

"""
    gemm(ctx, A, B; T = Float32, kw...) -> D

[`gemm!`](@ref) into a new `T` array of the right size (`accumulate` needs an existing `D`).
"""
function gemm(ctx::Context, A, B; T::Type = Float32, transa::Bool = false, transb::Bool = false, kw...)
    get(kw, :accumulate, false) && throw(ArgumentError("accumulate = true needs the existing D: use gemm!"))
    sa, sb = _libte_shape(A), _libte_shape(B)
    (length(sa) == 2 && length(sb) == 2) ||
        throw(ArgumentError("gemm needs matrices, got sizes $(size(A)) and $(size(B))"))
    m = transa ? sa[2] : sa[1]
    n = transb ? sb[1] : sb[2]
    D = zeros(T, n, m)  # libte's [m, n]
    return gemm!(D, ctx, A, B; transa = transa, transb = transb, kw...)
end
