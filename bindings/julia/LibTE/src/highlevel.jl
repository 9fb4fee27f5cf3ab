# The hand-written layer over the generated wrappers (gen/libte_api.jl).
#
# Ownership. Every handle lives in a mutable Julia object with a finalizer and an explicit,
# idempotent `close`. libte requires linears and backward contexts to be destroyed before their
# context; the GC finalizes in no particular order, so a Context counts its live children and a
# `close` of the context (or its finalizer) only marks it: the context is destroyed when it is
# marked and its last child is gone. Children hold a Julia reference to their Context, so the
# object outlives them.
#
# Threads. A te_context and what was made with it are used by one thread at a time. Every call
# here holds the context's ReentrantLock (holding it also stops finalizers from running on this
# thread); a finalizer that finds the lock taken by another thread re-registers itself and runs
# at a later GC, as Base's documentation for `finalizer` recommends.

export LibTEError, Context, Recipe, Linear, BackwardCtx, Residuals, Group, NcclId, TensorView,
       autocast, autocast_state, forward!, forward, forward_compute!, forward_save, backward!,
       activation!, activation_backward!, describe, recipe_key, scaling_state, save_state,
       load_state!, nccl_unique_id
# Also public, not exported: LibTE.version, status_string, options, stats, synchronize, device,
# flush_backward, set_stream, residual_tensors, group_id, group_rank, group_size, abort,
# shape, dtype_of, and every generated te_* / TE_* name.

# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

"""
    LibTEError(status, message)

A libte call failed. `status` is the `te_status` (e.g. `TE_ERROR_INVALID_ARGUMENT`), `message`
the calling thread's `te_last_error()` text, which names the function, the argument, and what was
expected versus received.
"""
struct LibTEError <: Exception
    status::te_status
    message::String
end

"""`status_string(s)`: the name of a `te_status`, e.g. `"TE_ERROR_INVALID_ARGUMENT"`."""
status_string(s::Integer) = unsafe_string(te_status_string(te_status(s)))

Base.showerror(io::IO, e::LibTEError) = print(io, "LibTEError(", status_string(e.status), "): ", e.message)

# Throws on a failed status. te_last_error() is thread-local and valid until this thread's next
# libte call: it is read right away, with no Julia code in between that could yield.
@inline function check(status::Integer)
    status == TE_SUCCESS && return nothing
    throw(LibTEError(status, unsafe_string(te_last_error())))
end

"""`LibTE.version()`: the version of the libte library actually loaded."""
version() = VersionNumber(unsafe_string(te_version_string()))

# ---------------------------------------------------------------------------------------------
# Plain-data helpers for the generated (immutable) structs
# ---------------------------------------------------------------------------------------------

# An all-zero value of an isbits struct (what `T x = {0};` is in C).
function zeroed(::Type{T}) where {T}
    isbitstype(T) || throw(ArgumentError("$T is not a plain-data type"))
    buf = zeros(UInt8, sizeof(T))
    return GC.@preserve buf unsafe_load(Ptr{T}(pointer(buf)))
end

# A copy of the struct `x` with some fields replaced: with(opts; amax_history_len = 16).
function with(x::T; kw...) where {T}
    for k in keys(kw)
        hasfield(T, k) || throw(ArgumentError("$T has no field $k"))
    end
    vals = ntuple(fieldcount(T)) do i
        f = fieldname(T, i)
        haskey(kw, f) ? convert(fieldtype(T, i), kw[f]) : getfield(x, i)
    end
    return T(vals...)
end

# A struct the library fills: zeroed, with struct_size set (te_autocast_state, te_context_stats, ...).
sized(::Type{T}) where {T} = with(zeroed(T); struct_size = sizeof(T))

# Runs an `_init` function on a fresh value and returns it.
function initialized(init, ::Type{T}, args...) where {T}
    r = Ref(sized(T))
    check(init(r, args...))
    return r[]
end

_bool(x::Bool) = Int32(x)
_bool(x::Integer) = (x == 0 || x == 1) ? Int32(x) : throw(ArgumentError("expected a boolean, got $x"))

# ---------------------------------------------------------------------------------------------
# Tensors: views of Julia arrays
# ---------------------------------------------------------------------------------------------

const _DTYPE_BYTES = Dict{Int32,Int}(TE_DTYPE_F32 => 4, TE_DTYPE_F16 => 2, TE_DTYPE_BF16 => 2,
                                     TE_DTYPE_E4M3 => 1, TE_DTYPE_E5M2 => 1, TE_DTYPE_I32 => 4)

"""
    dtype_of(T)

The `te_dtype` of a Julia element type: `Float32 -> TE_DTYPE_F32`, `Float16 -> TE_DTYPE_F16`,
`Int32 -> TE_DTYPE_I32` (sequence offsets: attention's and RoPE's `cu_seqlens`).
BF16 and the FP8 formats have no Base Julia type: view `UInt16` / `UInt8` arrays with an explicit
dtype, `TensorView(A, TE_DTYPE_BF16)`.
"""
dtype_of(::Type{Float32}) = TE_DTYPE_F32
dtype_of(::Type{Float16}) = TE_DTYPE_F16
dtype_of(::Type{Int32}) = TE_DTYPE_I32
dtype_of(::Type{T}) where {T} =
    throw(ArgumentError("no libte dtype for $T: use Float32, Float16 or Int32, or TensorView(A, dtype) for BF16/FP8 bits"))

"""
    TensorView(A::DenseArray)
    TensorView(A::DenseArray, dtype; scale_inv = nothing, scaling = TE_SCALING_PER_TENSOR)

A `te_tensor` describing the memory of the Julia array `A`, without copying, and keeping `A`
alive. Julia arrays are column-major, libte tensors row-major: the libte shape is `A`'s
dimensions **reversed**, so a Julia `k × m` matrix is the libte tensor `[m, k]` (the same bytes).

The second form views raw bits: `UInt16` as `TE_DTYPE_BF16`, `UInt8` as `TE_DTYPE_E4M3` /
`TE_DTYPE_E5M2` (FP8 needs `scale_inv`, a `Vector{Float32}` of
`te_tensor_scale_inv_count` floats, also kept alive). Every function below that takes a tensor
accepts either a `TensorView` or a plain `Array{Float32}` / `Array{Float16}`.
"""
mutable struct TensorView
    t::te_tensor
    data::Any       # the array whose memory t.data points into
    scale_inv::Any  # the Vector{Float32} t.scale_inv points into, or nothing
end

function TensorView(A::DenseArray, dtype::Integer; scale_inv::Union{Nothing,DenseVector{Float32}} = nothing,
                    scaling::Integer = TE_SCALING_PER_TENSOR, device::te_device = te_device(TE_DEVICE_CPU, 0))
    nd = ndims(A)
    1 <= nd <= TE_MAX_DIMS || throw(ArgumentError("libte tensors have 1 to $TE_MAX_DIMS dimensions, got $nd"))
    haskey(_DTYPE_BYTES, dtype) || throw(ArgumentError("unknown te_dtype $dtype"))
    sizeof(eltype(A)) == _DTYPE_BYTES[dtype] ||
        throw(ArgumentError("$(eltype(A)) elements are $(sizeof(eltype(A))) bytes, dtype $dtype needs $(_DTYPE_BYTES[dtype])"))
    isbitstype(eltype(A)) || throw(ArgumentError("element type $(eltype(A)) is not plain data"))
    dims = reverse(size(A))  # column-major (k, m) == row-major [m, k]
    shape = ntuple(i -> i <= nd ? Int64(dims[i]) : Int64(0), Val(Int(TE_MAX_DIMS)))
    sp = scale_inv === nothing ? Ptr{Cfloat}(C_NULL) : Ptr{Cfloat}(pointer(scale_inv))
    t = te_tensor(Ptr{Cvoid}(pointer(A)), dtype, Int32(nd), shape, device, sp, scaling)
    return TensorView(t, A, scale_inv)
end

TensorView(A::DenseArray) = TensorView(A, dtype_of(eltype(A)))
TensorView(v::TensorView) = v
TensorView(A::AbstractArray) =
    throw(ArgumentError("libte needs contiguous memory: pass an Array (or another DenseArray), not a $(typeof(A))"))

"""`shape(v)`: the row-major libte shape of a tensor view (the Julia dimensions reversed)."""
shape(v::TensorView) = Tuple(v.t.shape[1:v.t.ndim])

# ---------------------------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------------------------

"""
    Context(; device = :cpu)

A libte execution context: one device, one stream, one autocast stack. `device` is `:cpu`,
`:default` (CUDA 0 when usable, else the CPU), or `(:cuda, ordinal)`. Julia arrays live in host
memory, so the array-taking functions here need a CPU context.

Freed by `close(ctx)` or by the GC; in both cases only after every [`Linear`](@ref),
[`BackwardCtx`](@ref) and [`Residuals`](@ref) made with it is gone. Use one context per thread.
"""
mutable struct Context
    handle::Ptr{te_context}
    lock::ReentrantLock
    children::Int
    closing::Bool
    groups::Vector{Any}  # the Groups its autocast scopes used, each retained until the context goes

    function Context(; device = :cpu)
        out = Ref{Ptr{te_context}}(C_NULL)
        if device === :default
            check(te_context_create(out, C_NULL))
        else
            dev = device === :cpu ? te_device(TE_DEVICE_CPU, 0) :
                  (device isa Tuple && length(device) == 2 && device[1] === :cuda) ?
                  te_device(TE_DEVICE_CUDA, Int32(device[2])) :
                  throw(ArgumentError("device must be :cpu, :default or (:cuda, ordinal), got $device"))
            opts = with(initialized(te_context_options_init, te_context_options);
                        use_default_device = 0, device = dev)
            check(te_context_create(out, Ref(opts)))
        end
        ctx = new(out[], ReentrantLock(), 0, false, Any[])
        finalizer(_finalize_context, ctx)
        return ctx
    end
end

Base.isopen(ctx::Context) = !ctx.closing

# ccall(..., Ptr{te_context}, ctx): a Context passes its handle and stays rooted for the call.
Base.cconvert(::Type{Ptr{Cvoid}}, ctx::Context) = ctx
Base.unsafe_convert(::Type{Ptr{Cvoid}}, ctx::Context) = _live(ctx)

function _live(ctx::Context)
    ctx.closing && throw(ArgumentError("the libte Context is closed"))
    return ctx.handle
end

# Destroys the C context when it is marked for closing and has no live children. Lock held.
function _maybe_destroy(ctx::Context)
    if ctx.closing && ctx.children == 0 && ctx.handle != C_NULL
        te_context_destroy(ctx.handle)
        ctx.handle = C_NULL
        foreach(_release, ctx.groups)
        empty!(ctx.groups)
    end
    return nothing
end

"""
    close(ctx::Context)

Marks the context closed: no new calls may use it. The C context is destroyed now if nothing made
with it is alive, else when the last of those is closed or collected. Idempotent.
"""
function Base.close(ctx::Context)
    lock(ctx.lock) do
        ctx.closing = true
        _maybe_destroy(ctx)
    end
    return nothing
end

# A finalizer's body: runs f() holding lk, or, when lk is in use on another thread, registers
# the finalizer fin for obj again to try at a later GC (a finalizer must not block).
function _locked_or_later(f, fin, obj, lk::ReentrantLock)
    if !trylock(lk)
        finalizer(fin, obj)
        return nothing
    end
    try
        f()
    finally
        unlock(lk)
    end
    return nothing
end

function _finalize_context(ctx::Context)
    _locked_or_later(_finalize_context, ctx, ctx.lock) do
        ctx.closing = true
        _maybe_destroy(ctx)
    end
    return nothing
end

# Runs f() holding the context's lock, after checking it is open.
@inline function _with(f, ctx::Context)
    lock(ctx.lock)
    try
        _live(ctx)
        return f()
    finally
        unlock(ctx.lock)
    end
end

"""`device(ctx)`: the context's `te_device` (`.type` is `TE_DEVICE_CPU` or `TE_DEVICE_CUDA`)."""
function device(ctx::Context)
    out = Ref(zeroed(te_device))
    _with(() -> check(te_context_get_device(ctx, out)), ctx)
    return out[]
end

"""`synchronize(ctx)`: waits for the context's work (a no-op on the CPU)."""
synchronize(ctx::Context) = (_with(() -> check(te_context_synchronize(ctx)), ctx); nothing)

"""`stats(ctx)`: the `te_context_stats` counters (scopes closed, bucket updates, ...)."""
function stats(ctx::Context)
    out = Ref(sized(te_context_stats))
    _with(() -> check(te_context_get_stats(ctx, out)), ctx)
    return out[]
end

"""
    flush_backward(ctx)

Runs the amax reduction and gradient-scale update that the pass's first FP8 backward would
otherwise trigger (`te_autocast_flush_backward`): for a pass whose backward never reaches that
module.
"""
flush_backward(ctx::Context) = (_with(() -> check(te_autocast_flush_backward(ctx)), ctx); nothing)

"""
    set_stream(ctx, stream::Ptr{Cvoid})

The CUDA stream (`cudaStream_t`) the context's work is ordered on; `C_NULL` is the legacy
default stream. A CPU context accepts only `C_NULL` (anything else: `TE_ERROR_INVALID_ARGUMENT`).
"""
set_stream(ctx::Context, stream::Ptr{Cvoid}) = (_with(() -> check(te_context_set_stream(ctx, stream)), ctx); nothing)

# A handle made with a context: counted, destroyed before it.
abstract type ContextChild end

function _register(ctx::Context)
    # caller holds ctx.lock
    ctx.children += 1
    return nothing
end

function _release_child!(obj::ContextChild, destroy)
    # caller holds obj.ctx.lock
    if obj.handle != C_NULL
        destroy(obj.handle)
        obj.handle = C_NULL
        obj.ctx.children -= 1
        _maybe_destroy(obj.ctx)
    end
    obj.keepalive = nothing
    return nothing
end

function _finalize_child(obj::ContextChild)
    _locked_or_later(() -> _destroy!(obj), _finalize_child, obj, obj.ctx.lock)
    return nothing
end

function Base.close(obj::ContextChild)
    lock(obj.ctx.lock) do
        _destroy!(obj)
    end
    return nothing
end

Base.isopen(obj::ContextChild) = obj.handle != C_NULL

function _live(obj::ContextChild)
    obj.handle == C_NULL && throw(ArgumentError("this libte $(typeof(obj)) is closed"))
    return obj.handle
end

# ---------------------------------------------------------------------------------------------
# Recipes and groups
# ---------------------------------------------------------------------------------------------

"""
    Recipe(kind = TE_RECIPE_DELAYED_SCALING; fields...)

An immutable, reference-counted FP8 recipe. `kind` is `TE_RECIPE_DELAYED_SCALING`,
`TE_RECIPE_CURRENT_SCALING` or `TE_RECIPE_BLOCK_SCALING`, or the symbols `:delayed`, `:current`,
`:block`. The keyword arguments override fields of `te_recipe_options` after TE's defaults for
`kind`, e.g. `Recipe(:delayed; amax_history_len = 16, format = TE_FORMAT_HYBRID)`. Invalid
values throw a [`LibTEError`](@ref) naming the field. Freed by `close` or the GC; it may be shared
between threads and contexts.
"""
mutable struct Recipe
    handle::Ptr{te_recipe}

    function Recipe(kind = TE_RECIPE_DELAYED_SCALING; fields...)
        k = kind === :delayed ? TE_RECIPE_DELAYED_SCALING :
            kind === :current ? TE_RECIPE_CURRENT_SCALING :
            kind === :block ? TE_RECIPE_BLOCK_SCALING :
            kind isa Integer ? te_recipe_kind(kind) :
            throw(ArgumentError("recipe kind must be a te_recipe_kind or :delayed, :current, :block"))
        opts = initialized(te_recipe_options_init, te_recipe_options, k)
        haskey(fields, :kind) && throw(ArgumentError("pass the kind positionally"))
        opts = with(opts; fields...)  # Bools convert to the Int32 flags
        out = Ref{Ptr{te_recipe}}(C_NULL)
        check(te_recipe_create(out, Ref(opts)))
        r = new(out[])
        finalizer(close, r)  # te_recipe_release is thread-safe: no lock needed
        return r
    end
end

Base.cconvert(::Type{Ptr{Cvoid}}, r::Recipe) = r
Base.unsafe_convert(::Type{Ptr{Cvoid}}, r::Recipe) = _live(r)

function _live(r::Recipe)
    r.handle == C_NULL && throw(ArgumentError("this libte Recipe is closed"))
    return r.handle
end

Base.isopen(r::Recipe) = r.handle != C_NULL

"""`close(r::Recipe)`: drops this object's reference (open autocast scopes keep their own)."""
function Base.close(r::Recipe)
    h = r.handle
    r.handle = C_NULL
    h != C_NULL && te_recipe_release(h)
    return nothing
end

"""`describe(r)`: the recipe's canonical description, e.g. `"delayed_scaling(format=HYBRID,...)"`."""
describe(r::Recipe) = GC.@preserve r unsafe_string(te_recipe_describe(_live(r)))

"""`recipe_key(r)`: a `UInt64` equal for recipes with equal numerics (within one process)."""
recipe_key(r::Recipe) = GC.@preserve r te_recipe_key(_live(r))

"""`options(r)`: the recipe's `te_recipe_options`."""
function options(r::Recipe)
    out = Ref(sized(te_recipe_options))
    GC.@preserve r check(te_recipe_get_options(_live(r), out))
    return out[]
end

Base.show(io::IO, r::Recipe) = print(io, "Recipe(", isopen(r) ? describe(r) : "closed", ")")

"""
    Group()                                            # single rank: reductions are no-ops
    Group(rank, nranks, id::NcclId; timeout_ms = nothing)   # NCCL: libte owns the communicator
    Group(nccl_comm::Ptr{Cvoid})                        # NCCL: borrows your ncclComm_t

A process group for amax reductions; pass it to [`autocast`](@ref) as `group`. The NCCL forms
need a build with NCCL and a usable GPU (else a [`LibTEError`](@ref) with
`TE_ERROR_UNSUPPORTED`). `Group(rank, nranks, id)` is collective (every rank calls it with the
same [`NcclId`](@ref), on its current CUDA device) and fails with `TE_ERROR_NCCL` when not all
ranks join within `timeout_ms` (libte's default: 10 minutes). A borrowed communicator must
outlive the group. Freed by `close` or the GC, but not before the last context whose scopes used
it: a context keeps its groups until it is destroyed (its buckets reduce over them later).
`LibTE.group_id`, `LibTE.group_rank`, `LibTE.group_size`, `LibTE.abort`.
"""
mutable struct Group
    handle::Ptr{te_group}
    # This object's reference plus one per context whose scopes used the group: the handle is
    # destroyed when the last is dropped, so a context never outlives a group it reduces over.
    refs::Threads.Atomic{Int}
    closed::Threads.Atomic{Bool}

    # Takes over a handle (the outer constructors' common tail).
    function Group(::Val{:handle}, h::Ptr{te_group})
        g = new(h, Threads.Atomic{Int}(1), Threads.Atomic{Bool}(false))
        finalizer(close, g)
        return g
    end
end

_retain(g::Group) = (Threads.atomic_add!(g.refs, 1); g)

function _release(g::Group)
    if Threads.atomic_sub!(g.refs, 1) == 1  # that was the last reference
        h = g.handle
        g.handle = C_NULL
        te_group_destroy(h)
    end
    return nothing
end

_new_group(h::Ptr{te_group}) = Group(Val(:handle), h)

function Group()
    out = Ref{Ptr{te_group}}(C_NULL)
    check(te_group_create_single(out))
    return _new_group(out[])
end

"""
    NcclId

An NCCL unique id (`te_nccl_id`, 128 bytes): made by [`nccl_unique_id`](@ref) on one rank and
shared with the others out of band, as bytes: `Vector{UInt8}(id)` and `NcclId(bytes)`.
"""
struct NcclId
    raw::te_nccl_id
end

function NcclId(bytes::AbstractVector{UInt8})
    length(bytes) == sizeof(te_nccl_id) ||
        throw(ArgumentError("an NCCL id is $(sizeof(te_nccl_id)) bytes, got $(length(bytes))"))
    return NcclId(te_nccl_id(ntuple(i -> reinterpret(Cchar, bytes[i]), Val(sizeof(te_nccl_id)))))
end

Base.Vector{UInt8}(id::NcclId) = UInt8[reinterpret(UInt8, c) for c in id.raw.internal]
Base.:(==)(a::NcclId, b::NcclId) = a.raw.internal == b.raw.internal

"""`nccl_unique_id() -> NcclId`: a new NCCL id (`te_nccl_get_unique_id`), on one rank."""
function nccl_unique_id()
    out = Ref(zeroed(te_nccl_id))
    check(te_nccl_get_unique_id(out))
    return NcclId(out[])
end

function Group(rank::Integer, nranks::Integer, id::NcclId; timeout_ms::Union{Nothing,Integer} = nothing)
    out = Ref{Ptr{te_group}}(C_NULL)
    if timeout_ms === nothing
        check(te_group_init_nccl(out, Int32(rank), Int32(nranks), Ref(id.raw)))
    else
        opts = with(initialized(te_group_nccl_options_init, te_group_nccl_options); timeout_ms = Int32(timeout_ms))
        check(te_group_init_nccl_with_options(out, Int32(rank), Int32(nranks), Ref(id.raw), Ref(opts)))
    end
    return _new_group(out[])
end

function Group(nccl_comm::Ptr{Cvoid})
    out = Ref{Ptr{te_group}}(C_NULL)
    check(te_group_create_nccl(out, nccl_comm))
    return _new_group(out[])
end

function _live(g::Group)
    g.closed[] && throw(ArgumentError("this libte Group is closed"))
    return g.handle
end

Base.isopen(g::Group) = !g.closed[]

"""
`close(g::Group)`: no new scope may use the group; it is destroyed now, or when the last context
whose scopes used it is destroyed. Idempotent.
"""
function Base.close(g::Group)
    Threads.atomic_cas!(g.closed, false, true) || _release(g)
    return nothing
end

"""`group_id(g)`: the group's process-unique id (never 0)."""
group_id(g::Group) = GC.@preserve g te_group_id(_live(g))
"""`group_rank(g)`: this process's rank in the group."""
group_rank(g::Group) = Int(GC.@preserve g te_group_rank(_live(g)))
"""`group_size(g)`: the number of ranks."""
group_size(g::Group) = Int(GC.@preserve g te_group_size(_live(g)))

"""
    abort(g::Group)

Aborts the NCCL communicator the group owns (from a watchdog thread, when a peer died), so a
`synchronize` blocked on one of its reductions returns; afterwards every reduction over the group
fails: close it and make a new one. `TE_ERROR_INVALID_STATE` for a single-rank group or a
borrowed communicator. Aborting twice is a no-op.
"""
abort(g::Group) = (GC.@preserve g check(te_group_abort(_live(g))); nothing)

Base.show(io::IO, g::Group) =
    print(io, isopen(g) ? "Group(rank $(group_rank(g)) of $(group_size(g)), id $(group_id(g)))" : "Group(closed)")

# ---------------------------------------------------------------------------------------------
# Autocast
# ---------------------------------------------------------------------------------------------

"""
    autocast(f, ctx; enabled = true, recipe = nothing, calibrating = false, group = nothing)

Runs `f()` inside an FP8 autocast scope on `ctx` and returns its result:

```julia
autocast(ctx; recipe = Recipe(:delayed; amax_history_len = 16)) do
    forward!(y, lin, x, W, b)
end
```

The scope always ends, also when `f` throws (the scope is closed in a `finally`; an error from
closing it is only raised when `f` itself succeeded). `recipe = nothing` is the default delayed
scaling recipe; `enabled = false` runs the same code in high precision; `calibrating = true`
records amaxes without FP8 compute. When no enclosing scope is enabled, ending it updates the
forward scaling factors.
"""
function autocast(f, ctx::Context; enabled::Bool = true, recipe::Union{Nothing,Recipe} = nothing,
                  calibrating::Bool = false, group::Union{Nothing,Group} = nothing)
    opts = initialized(te_autocast_options_init, te_autocast_options)
    token = Ref{te_autocast_token}(0)
    lock(ctx.lock)
    try
        GC.@preserve recipe group begin
            opts = with(opts; enabled = _bool(enabled), calibrating = _bool(calibrating),
                        recipe = recipe === nothing ? C_NULL : _live(recipe),
                        group = group === nothing ? C_NULL : _live(group))
            check(te_autocast_begin(ctx, Ref(opts), token))  # the scope retains the recipe
            group === nothing || any(g -> g === group, ctx.groups) || push!(ctx.groups, _retain(group))
        end
    finally
        unlock(ctx.lock)
    end
    ok = false
    try
        result = f()
        ok = true
        return result
    finally
        status = lock(() -> ctx.handle == C_NULL ? TE_SUCCESS : te_autocast_end(ctx.handle, token[]), ctx.lock)
        ok && check(status)
    end
end

"""
    autocast_state(ctx)

The innermost scope, as a `te_autocast_state`: `.depth` open scopes, `.enabled`,
`.calibrating`, `.recipe` (a raw pointer).
"""
function autocast_state(ctx::Context)
    out = Ref(sized(te_autocast_state))
    _with(() -> check(te_autocast_get_state(ctx, out)), ctx)
    return out[]
end

# ---------------------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------------------

_activation_dtype(d::Integer) = te_dtype(d)
_activation_dtype(::Type{T}) where {T} = dtype_of(T)

"""
    Linear(ctx, in_features, out_features; bias = true, activation_dtype = Float32,
           fuse_wgrad_accumulation = false)

The FP8 state of a linear layer `y = x W^T + b` (scaling states, the FP8 weight cache); the
parameters stay yours. `activation_dtype` is `Float32`, `Float16` or a `te_dtype` (e.g.
`TE_DTYPE_BF16` with `UInt16` arrays viewed through [`TensorView`](@ref)); x, W, b, y, dy and dx
all have it. Note libte's default is BF16; this constructor defaults to `Float32` because Julia
has no BF16 array type in Base.

With the column-major convention (see [`TensorView`](@ref)): `x` is a Julia `in × tokens`
matrix, `W` an `in × out` matrix (libte's `[out, in]`), `b` a vector of length `out`, and `y` an
`out × tokens` matrix: `y == W' * x .+ b`. In FP8, tokens, `in` and `out` must be multiples of 16.
"""
mutable struct Linear <: ContextChild
    handle::Ptr{te_linear}
    ctx::Context
    keepalive::Any
    in_features::Int
    out_features::Int
    bias::Bool

    function Linear(ctx::Context, in_features::Integer, out_features::Integer; bias::Bool = true,
                    activation_dtype = Float32, fuse_wgrad_accumulation::Bool = false)
        opts = with(initialized(te_linear_options_init, te_linear_options);
                    in_features = in_features, out_features = out_features, bias = _bool(bias),
                    activation_dtype = _activation_dtype(activation_dtype),
                    fuse_wgrad_accumulation = _bool(fuse_wgrad_accumulation))
        out = Ref{Ptr{te_linear}}(C_NULL)
        _with(ctx) do
            check(te_linear_create(out, ctx, Ref(opts)))
            _register(ctx)
        end
        lin = new(out[], ctx, nothing, Int(in_features), Int(out_features), bias)
        finalizer(_finalize_child, lin)
        return lin
    end
end

_destroy!(lin::Linear) = _release_child!(lin, te_linear_destroy)

Base.cconvert(::Type{Ptr{Cvoid}}, lin::Linear) = lin
Base.unsafe_convert(::Type{Ptr{Cvoid}}, lin::Linear) = _live(lin)

Base.show(io::IO, lin::Linear) =
    print(io, "Linear(", lin.in_features, " => ", lin.out_features, lin.bias ? "" : ", bias=false",
          isopen(lin) ? "" : ", closed", ")")

"""
    BackwardCtx

What a forward saved for its backward (`te_linear_backward_ctx`). It keeps the forward's `x` and
`W` arrays alive (a high-precision forward references them instead of copying). Pass it to
[`backward!`](@ref); free it with `close` (or leave it to the GC).
"""
mutable struct BackwardCtx <: ContextChild
    handle::Ptr{te_linear_backward_ctx}
    ctx::Context
    keepalive::Any
end

_destroy!(b::BackwardCtx) = _release_child!(b, te_linear_backward_ctx_destroy)

function _new_backward(ctx::Context, handle::Ptr{te_linear_backward_ctx}, keepalive)
    # caller holds ctx.lock and has registered the child
    b = BackwardCtx(handle, ctx, keepalive)
    finalizer(_finalize_child, b)
    return b
end

"""
    Residuals

The first half of a split forward ([`forward_compute!`](@ref)): what backward needs, before it
is packed into a [`BackwardCtx`](@ref) by [`forward_save`](@ref). `close` frees residuals never saved.
"""
mutable struct Residuals <: ContextChild
    handle::Ptr{te_linear_residuals}  # points into `storage`; C_NULL once saved or released
    ctx::Context
    keepalive::Any
    storage::Base.RefValue{te_linear_residuals}
end

# The C call takes the struct the handle points into, which `storage` keeps rooted.
_destroy!(r::Residuals) = _release_child!(r, _ -> te_linear_residuals_release(r.storage))

function _check_bias(lin::Linear, b)
    lin.bias == (b !== nothing) ||
        throw(ArgumentError(lin.bias ? "this Linear has a bias: pass b" : "this Linear has no bias: pass b = nothing"))
    return nothing
end

# te_linear_forward_args pointing at the tensor structs inside rx, rw, rb (the caller keeps
# those Refs rooted with GC.@preserve while the result is in use).
function _args_value(rx, rw, rb, weight_unchanged::Bool)
    args = initialized(te_linear_forward_args_init, te_linear_forward_args)
    return with(args; input = _ptr(rx), weight = _ptr(rw), bias = _ptr(rb),
                weight_unchanged = _bool(weight_unchanged))
end

_view_or_null(x) = x === nothing ? nothing : TensorView(x)
# A te_tensor for C in a 1-element Vector, not a Ref: C structs hold pointers to these (args,
# grads), and Julia 1.5 may place a non-escaping Ref on the stack and reuse its slot inside a
# GC.@preserve block (seen: a stale args->ln_out in a forward); a Vector's memory is on the heap
# and stays put while rooted. ccall takes a Vector{te_tensor} for a `te_tensor *` as it does a Ref.
_ref_or_null(v) = v === nothing ? nothing : te_tensor[v.t]
_ptr(r) = r === nothing ? Ptr{te_tensor}(C_NULL) : Base.unsafe_convert(Ptr{te_tensor}, r)

"""
    forward!(y, lin, x, W, b = nothing; weight_unchanged = false) -> BackwardCtx

`y = x W^T + b` (Julia: `y .= W' * x .+ b`) through libte, in FP8 inside an enabled
[`autocast`](@ref) scope and in high precision outside one. Writes `y` (`out × tokens`) and
returns the [`BackwardCtx`](@ref) for [`backward!`](@ref). `weight_unchanged = true` reuses the
FP8 copy of `W` cached by the last FP8 forward (TE's `is_first_microbatch = false`).
"""
function forward!(y, lin::Linear, x, W, b = nothing; weight_unchanged::Bool = false)
    _check_bias(lin, b)
    yv, xv, wv, bv = TensorView(y), TensorView(x), TensorView(W), _view_or_null(b)
    ry, rx, rw, rb = te_tensor[yv.t], te_tensor[xv.t], te_tensor[wv.t], _ref_or_null(bv)
    out = Ref{Ptr{te_linear_backward_ctx}}(C_NULL)
    ctx = lin.ctx
    return _with(ctx) do
        GC.@preserve yv xv wv bv rx rw rb begin
            args = Ref(_args_value(rx, rw, rb, weight_unchanged))
            check(te_linear_forward(ctx, lin, args, ry, out))
        end
        _register(ctx)
        _new_backward(ctx, out[], (x, W))
    end
end

"""
    forward(lin, x, W, b = nothing; weight_unchanged = false) -> (y, BackwardCtx)

[`forward!`](@ref) into a new `y` of `x`'s element type, `out × tokens...`.
"""
function forward(lin::Linear, x::DenseArray{T}, W, b = nothing; kw...) where {T}
    y = similar(x, T, (lin.out_features, size(x)[2:end]...))
    bwd = forward!(y, lin, x, W, b; kw...)
    return y, bwd
end

"""
    forward_compute!(y, lin, x, W, b = nothing; weight_unchanged = false) -> Residuals

The pure-compute half of [`forward!`](@ref) (`te_linear_forward_compute`); pack the result
with [`forward_save`](@ref) when the framework wants the two halves apart (PyTorch's `forward` /
`setup_context`).
"""
function forward_compute!(y, lin::Linear, x, W, b = nothing; weight_unchanged::Bool = false)
    _check_bias(lin, b)
    yv, xv, wv, bv = TensorView(y), TensorView(x), TensorView(W), _view_or_null(b)
    ry, rx, rw, rb = te_tensor[yv.t], te_tensor[xv.t], te_tensor[wv.t], _ref_or_null(bv)
    storage = Ref(sized(te_linear_residuals))
    ctx = lin.ctx
    return _with(ctx) do
        GC.@preserve yv xv wv bv rx rw rb begin
            args = Ref(_args_value(rx, rw, rb, weight_unchanged))
            check(te_linear_forward_compute(ctx, lin, args, ry, storage))
        end
        _register(ctx)
        r = Residuals(Base.unsafe_convert(Ptr{te_linear_residuals}, storage), ctx, (x, W), storage)
        finalizer(_finalize_child, r)
        r
    end
end

"""
    residual_tensors(res::Residuals) -> (input_t, weight_t, fp8)

What the forward saved for the backward, as copies: after an FP8 forward, x^T and W^T as
[`Float8Array`](@ref)s (libte's `[in, tokens]` and `[in, out]`, i.e. Julia `tokens × in` and
`out × in`) and `fp8 = true`; after a high-precision forward, the caller's `x` and `W` and
`fp8 = false`.
"""
function residual_tensors(res::Residuals)
    return _with(res.ctx) do
        _live(res)
        r = res.storage[]
        r.fp8 == 0 && return (res.keepalive[1], res.keepalive[2], false)
        (_copy_fp8(r.input_t), _copy_fp8(r.weight_t), true)
    end
end

# A Float8Array copy of an FP8 te_tensor libte owns (host memory).
function _copy_fp8(t::te_tensor)
    dims = reverse(ntuple(i -> Int(t.shape[i]), Int(t.ndim)))
    f = Float8Array(undef, t.dtype, dims...; scaling = t.scaling)
    GC.@preserve f begin
        unsafe_copyto!(pointer(f.codes), Ptr{UInt8}(t.data), length(f.codes))
        unsafe_copyto!(pointer(f.scale_inv), t.scale_inv, length(f.scale_inv))
    end
    return f
end

"""
    forward_save(res::Residuals, lin::Linear) -> BackwardCtx

Packs residuals into a backward context (`te_linear_forward_save`); `res` is consumed.
"""
function forward_save(res::Residuals, lin::Linear)
    ctx = lin.ctx
    res.ctx === ctx || throw(ArgumentError("the Residuals and the Linear belong to different contexts"))
    out = Ref{Ptr{te_linear_backward_ctx}}(C_NULL)
    return _with(ctx) do
        _live(res)
        check(te_linear_forward_save(ctx, lin, res.storage, out))
        # the residuals' storage now belongs to the backward context: this object is spent
        keep = res.keepalive
        res.handle = C_NULL
        res.keepalive = nothing
        _new_backward(ctx, out[], keep)  # takes over res's registration with the context
    end
end

"""
    backward!(bwd, dy; dx = nothing, dw = nothing, db = nothing, once = false)

Gradients of the forward that made `bwd`: `dx = dy W` (Julia: `W * dy`, `in × tokens`),
`dW = dy^T x` (Julia: `x * dy'`, `in × out`, like `W`), `db = sum over tokens of dy`. Leave any
of them `nothing` to skip it. With the layer's `fuse_wgrad_accumulation`, `dw` (F32) is added to
instead of overwritten. `once = true` (`TE_BACKWARD_ONCE`) frees the saved FP8 tensors as soon
as it returns; a second call then throws.
"""
function backward!(bwd::BackwardCtx, dy; dx = nothing, dw = nothing, db = nothing, once::Bool = false)
    dyv, dxv, dwv, dbv = TensorView(dy), _view_or_null(dx), _view_or_null(dw), _view_or_null(db)
    rdy, rdx, rdw, rdb = te_tensor[dyv.t], _ref_or_null(dxv), _ref_or_null(dwv), _ref_or_null(dbv)
    args = with(initialized(te_linear_backward_args_init, te_linear_backward_args);
                flags = once ? TE_BACKWARD_ONCE : Cuint(0))
    ctx = bwd.ctx
    _with(ctx) do
        h = _live(bwd)
        GC.@preserve dyv dxv dwv dbv rdy rdx rdw rdb begin
            check(te_linear_backward(ctx, h, rdy, _ptr(rdx), _ptr(rdw), _ptr(rdb), Ref(args)))
        end
    end
    return nothing
end

"""
    scaling_state(lin, role; history = false) -> (info, history)

A copy of one of the layer's scaling states (`role`: `TE_ROLE_INPUT`, `TE_ROLE_WEIGHT`,
`TE_ROLE_GRAD_OUTPUT`): a `te_scaling_state_info` (`.scale`, `.scale_inv`,
`.amax_history_len`, `.fp8_dtype`) and, with `history = true`, the amax history (current amax
first), else `nothing`.
"""
function scaling_state(lin::Linear, role::Integer; history::Bool = false)
    info = Ref(sized(te_scaling_state_info))
    ctx = lin.ctx
    return _with(ctx) do
        check(te_linear_get_scaling_state(ctx, lin, role, info, C_NULL, 0))
        h = nothing
        if history
            h = zeros(Float32, max(Int(info[].amax_history_len), 0))
            check(te_linear_get_scaling_state(ctx, lin, role, info, h, length(h)))
        end
        (info[], h)
    end
end

"""`save_state(lin) -> Vector{UInt8}`: the layer's FP8 state (histories, scales), bit-exact."""
function save_state(lin::Linear)
    ctx = lin.ctx
    return _with(ctx) do
        n = Ref{Csize_t}(0)
        check(te_linear_state_save(ctx, lin, C_NULL, 0, n))
        buf = zeros(UInt8, n[])
        check(te_linear_state_save(ctx, lin, buf, length(buf), n))
        resize!(buf, n[])
    end
end

"""`load_state!(lin, bytes)`: restores what [`save_state`](@ref) wrote."""
function load_state!(lin::Linear, bytes::Vector{UInt8})
    ctx = lin.ctx
    _with(() -> check(te_linear_state_load(ctx, lin, bytes, length(bytes))), ctx)
    return lin
end

# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------

_act(a::Integer) = te_activation(a)
_act(a::Symbol) = a === :relu ? TE_ACTIVATION_RELU : a === :gelu ? TE_ACTIVATION_GELU :
                  a === :swiglu ? TE_ACTIVATION_SWIGLU : a === :geglu ? TE_ACTIVATION_GEGLU :
                  a === :srelu ? TE_ACTIVATION_SRELU :
                  throw(ArgumentError("activation must be :relu, :gelu, :swiglu, :geglu, :srelu or a te_activation"))

"""
    activation!(y, ctx, act, x)

`y = act(x)` elementwise (`act`: `:relu`, `:gelu` (tanh approximation), `:srelu` (squared
ReLU), the gated `:swiglu` / `:geglu`, or a `te_activation`). For the gated ones the libte
*last* dimension is halved, i.e. the Julia **first** dimension: `x` is `2n × tokens` (gate rows
first), `y` is `n × tokens`.
"""
function activation!(y, ctx::Context, act, x)
    yv, xv = TensorView(y), TensorView(x)
    ry, rx = te_tensor[yv.t], te_tensor[xv.t]
    _with(ctx) do
        GC.@preserve yv xv check(te_activation_forward(ctx, _act(act), rx, ry))
    end
    return y
end

"""`activation_backward!(dx, ctx, act, x, dy)`: `dx = dy .* act'(x)`."""
function activation_backward!(dx, ctx::Context, act, x, dy)
    dxv, xv, dyv = TensorView(dx), TensorView(x), TensorView(dy)
    rdx, rx, rdy = te_tensor[dxv.t], te_tensor[xv.t], te_tensor[dyv.t]
    _with(ctx) do
        GC.@preserve dxv xv dyv check(te_activation_backward(ctx, _act(act), rx, rdy, rdx))
    end
    return dx
end
