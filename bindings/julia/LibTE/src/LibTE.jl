"""
    LibTE

Julia bindings of libte, FP8 training behind a stable C ABI (`te/te.h`).

Two layers:

  * `src/gen/libte_api.jl`, generated from the header by `scripts/gen_julia_bindings.py`: every
    enum, `#define`, struct and `TE_API` function of `te.h` as Julia constants, isbits structs
    and raw `ccall` wrappers (`LibTE.te_linear_forward(...)` returns a `te_status`).
  * `src/highlevel.jl`, hand-written: [`Context`](@ref), [`Recipe`](@ref), [`Linear`](@ref),
    [`BackwardCtx`](@ref), [`Group`](@ref) with finalizers and `close`, [`autocast`](@ref),
    tensor views over Julia arrays, and [`LibTEError`](@ref) for every failed call; and
    `src/ops.jl`, the FP8 primitives ([`quantize`](@ref), [`cast_transpose`](@ref),
    [`dequantize`](@ref), [`amax`](@ref), [`gemm`](@ref)) over [`Float8Array`](@ref)s; and
    `src/norm.jl`, LayerNorm and RMSNorm ([`norm_forward`](@ref), [`norm_backward`](@ref)); and
    `src/modules.jl`, the transformer modules ([`LayerNormLinear`](@ref),
    [`LayerNormMLP`](@ref), [`GroupedLinear`](@ref)); and `src/attention.jl`, scaled
    dot-product attention ([`Attention`](@ref): BSHD or THD with `Int32` offsets, masks, GQA,
    FP8, residuals in caller memory) and RoPE ([`rope_forward!`](@ref),
    [`rope_backward!`](@ref)); and `src/training.jl`, the training step's glue ([`add!`](@ref),
    [`split_columns`](@ref), [`concat_columns`](@ref), [`embedding_forward!`](@ref),
    [`embedding_backward!`](@ref), [`cross_entropy!`](@ref)) and the fused [`AdamW`](@ref)
    optimizer; and `src/checkpoint.jl`, [`Checkpoint`](@ref)s of named tensors and bytes.

# Finding the library

Every `ccall` names `libte == "libte.so.0"`, the library's soname, so the dynamic loader finds it
on its usual search path (`LD_LIBRARY_PATH`, the system directories). When `ENV["LIBTE_PATH"]` is
set (to the library file, or to the directory holding `libte.so.0`) at load time, `__init__` opens
that file first; the loader then resolves every later `"libte.so.0"` lookup to the copy already
loaded (it matches loaded objects by soname), so no search path is needed. This is read at run
time, not baked into the precompiled package.

# Memory layout

Julia arrays are column-major and `te_tensor` is row-major, so a Julia array is described to libte
with its dimensions reversed, without copying: a Julia `Matrix` of size `(k, m)` is the row-major
libte tensor `[m, k]`. A libte weight `W [out, in]` is therefore a Julia `in × out` matrix, a batch
of activations `x [tokens, in]` is a Julia `in × tokens` matrix (features first, one column per
token, as in Flux.jl), and `y = x W^T + b` reads, in Julia terms, `y = W' * x .+ b`.
"""
module LibTE

using Libdl

"""The library's soname: the name every generated `ccall` uses."""
const libte = "libte.so.0"

include("gen/libte_api.jl")
include("highlevel.jl")
include("ops.jl")
include("norm.jl")
include("modules.jl")
include("attention.jl")
include("training.jl")
include("checkpoint.jl")

const _libte_handle = Ref{Ptr{Cvoid}}(C_NULL)

"""
    LibTE.libte_path()

The file `ENV["LIBTE_PATH"]` names (the variable may also name the directory holding
`libte.so.0`), or `nothing` when it is unset.
"""
function libte_path()
    p = get(ENV, "LIBTE_PATH", "")
    isempty(p) && return nothing
    return isdir(p) ? joinpath(p, libte) : p
end

function __init__()
    p = libte_path()
    if p !== nothing
        # Loaded by path, the library then satisfies every ccall's "libte.so.0" (see above).
        h = Libdl.dlopen(p, Libdl.RTLD_NOW | Libdl.RTLD_GLOBAL; throw_error=false)
        if h === nothing
            @warn "LibTE: cannot load LIBTE_PATH=$(ENV["LIBTE_PATH"]); falling back to the loader's search for $libte"
        else
            _libte_handle[] = h
        end
    end
    return nothing
end

end # module
