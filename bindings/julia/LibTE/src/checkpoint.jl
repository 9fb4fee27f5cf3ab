# Checkpoints (te_checkpoint_*): named records — tensors (weights, optimizer moments) and byte
# strings (the modules' save_state bytes, the step, a data position) — in one versioned,
# checksummed file or buffer. A tensor is stored with its libte dtype and row-major shape, so a
# Julia `k × m` array is the record `[m, k]` and reads back into a `k × m` array.

export Checkpoint, put_tensor!, put_bytes!, get_tensor!, get_bytes, record_names, record_info,
       write_checkpoint, read_checkpoint, serialize_checkpoint, deserialize_checkpoint

"""
    Checkpoint()
    Checkpoint(bytes::Vector{UInt8})   (= deserialize_checkpoint(bytes))

A libte checkpoint, kept in host memory: [`put_tensor!`](@ref) / [`put_bytes!`](@ref) add (or
replace) named records, [`get_tensor!`](@ref) / [`get_bytes`](@ref) copy them out,
[`record_names`](@ref) (also `keys`) lists them, [`write_checkpoint`](@ref) writes the file
(atomically: beside it, then renamed), [`read_checkpoint`](@ref) reads one and
[`serialize_checkpoint`](@ref) / [`deserialize_checkpoint`](@ref) do the same in memory.
Reading checks the magic, the version, every length and the CRC-32: a truncated or corrupted
checkpoint is a `LibTEError` naming what is wrong. Names are 1 to 255 bytes. Freed by `close`
or the GC; use one checkpoint from one thread at a time.
"""
mutable struct Checkpoint
    handle::Ptr{te_checkpoint}

    function Checkpoint(h::Ptr{te_checkpoint})
        h == C_NULL && throw(LibTEError(TE_ERROR_INTERNAL, "libte returned a NULL checkpoint"))
        ck = new(h)
        finalizer(_destroy!, ck)
        return ck
    end
end

function Checkpoint()
    out = Ref{Ptr{te_checkpoint}}(C_NULL)
    check(te_checkpoint_create(out))
    return Checkpoint(out[])
end

Checkpoint(bytes::AbstractVector{UInt8}) = deserialize_checkpoint(bytes)

function _destroy!(ck::Checkpoint)
    if ck.handle != C_NULL
        te_checkpoint_destroy(ck.handle)
        ck.handle = C_NULL
    end
    return nothing
end

"""`close(ck::Checkpoint)`: frees it now (idempotent)."""
Base.close(ck::Checkpoint) = _destroy!(ck)
Base.isopen(ck::Checkpoint) = ck.handle != C_NULL

function _live(ck::Checkpoint)
    ck.handle == C_NULL && throw(ArgumentError("this libte Checkpoint is closed"))
    return ck.handle
end

# ccall(..., Ptr{te_checkpoint}, ck): the handle, the object rooted for the call.
Base.cconvert(::Type{Ptr{Cvoid}}, ck::Checkpoint) = ck
Base.unsafe_convert(::Type{Ptr{Cvoid}}, ck::Checkpoint) = _live(ck)

# A name libte can take: a Cstring cannot hold a NUL (libte checks the length, 1..255 bytes).
function _record_name(name::AbstractString)
    occursin('\0', name) && throw(ArgumentError("a checkpoint record name cannot contain a NUL byte: $(repr(name))"))
    return String(name)
end

"""
    put_tensor!(ck, ctx, name, A) -> ck

Adds (or replaces) record `name`: a copy of the array `A` (or `TensorView`) with its libte dtype
and shape. FP8 tensors are refused: store their high-precision source.
"""
function put_tensor!(ck::Checkpoint, ctx::Context, name::AbstractString, A)
    n = _record_name(name)
    v = TensorView(A)
    r = te_tensor[v.t]
    _with(ctx) do
        GC.@preserve v r check(te_checkpoint_put_tensor(ck, ctx, n, r))
    end
    return ck
end

"""
    put_bytes!(ck, name, bytes) -> ck

Adds (or replaces) byte record `name`: a copy of `bytes` (a `Vector{UInt8}`, or a `String`'s
bytes).
"""
function put_bytes!(ck::Checkpoint, name::AbstractString, bytes::AbstractVector{UInt8})
    n = _record_name(name)
    data = bytes isa Vector{UInt8} ? bytes : Vector{UInt8}(bytes)
    GC.@preserve data check(te_checkpoint_put_bytes(ck, n, pointer(data), length(data)))
    return ck
end

put_bytes!(ck::Checkpoint, name::AbstractString, s::AbstractString) = put_bytes!(ck, name, Vector{UInt8}(codeunits(s)))

"""
    get_tensor!(A, ck, ctx, name) -> A

Copies tensor record `name` into `A`, which must have the stored dtype and (reversed) shape.
No such record, a byte record, another dtype or shape: a `LibTEError` naming it, `A` unchanged.
"""
function get_tensor!(A, ck::Checkpoint, ctx::Context, name::AbstractString)
    n = _record_name(name)
    v = TensorView(A)
    r = te_tensor[v.t]
    _with(ctx) do
        GC.@preserve v r check(te_checkpoint_get_tensor(ck, ctx, n, r))
    end
    return A
end

# The Julia element type holding a dtype's values or bits (BF16 as UInt16 bits, as TensorView takes them).
const _RECORD_ELTYPE = Dict{Int32,DataType}(TE_DTYPE_F32 => Float32, TE_DTYPE_F16 => Float16,
                                            TE_DTYPE_BF16 => UInt16, TE_DTYPE_I32 => Int32)

"""
    record_info(ck, name) -> NamedTuple

What record `name` holds, without copying it (`te_checkpoint_record_info`), so that a reader can
allocate the array [`get_tensor!`](@ref) fills:

- a tensor record: `(kind = :tensor, dtype, eltype, dims, shape, size)`: `dtype` its libte dtype
  (`TE_DTYPE_F32`, ...), `eltype` the Julia element type holding it (`Float32`, `Float16`,
  `Int32`; `UInt16` bits for BF16, read through `TensorView(A, TE_DTYPE_BF16)`), `dims` the
  Julia array's dimensions, `shape` the row-major libte shape (`dims` reversed), `size` its
  payload in bytes;
- a byte record: `(kind = :bytes, dtype = nothing, eltype = nothing, dims = nothing,
  shape = nothing, size)`.

```julia
info = record_info(ck, "model.fc1.weight")
A = get_tensor!(TensorView(Array{info.eltype}(undef, info.dims...), info.dtype), ck, ctx, "model.fc1.weight").data
```

No such record: a `LibTEError` naming `te_checkpoint_record_info`.
"""
function record_info(ck::Checkpoint, name::AbstractString)
    n = _record_name(name)
    is_tensor = Ref{Int32}(0)
    r = te_tensor[te_tensor(C_NULL, TE_DTYPE_F32, Int32(0), ntuple(_ -> Int64(0), Val(Int(TE_MAX_DIMS))),
                            te_device(TE_DEVICE_CPU, 0), C_NULL, TE_SCALING_PER_TENSOR)]
    size = Ref{Csize_t}(0)
    GC.@preserve r check(te_checkpoint_record_info(ck, n, is_tensor, r, size))
    if is_tensor[] == 0
        return (kind = :bytes, dtype = nothing, eltype = nothing, dims = nothing, shape = nothing,
                size = Int(size[]))
    end
    t = r[1]
    shape = Tuple(Int.(t.shape[1:t.ndim]))
    return (kind = :tensor, dtype = t.dtype, eltype = get(_RECORD_ELTYPE, t.dtype, nothing),
            dims = reverse(shape), shape = shape, size = Int(size[]))
end

"""`get_bytes(ck, name) -> Vector{UInt8}`: a copy of byte record `name`."""
function get_bytes(ck::Checkpoint, name::AbstractString)
    n = _record_name(name)
    len = Ref{Csize_t}(0)
    check(te_checkpoint_get_bytes(ck, n, C_NULL, 0, len))
    buf = Vector{UInt8}(undef, len[])
    GC.@preserve buf check(te_checkpoint_get_bytes(ck, n, pointer(buf), length(buf), len))
    return resize!(buf, Int(len[]))
end

"""`length(ck)`: the number of records."""
function Base.length(ck::Checkpoint)
    count = Ref{Csize_t}(0)
    check(te_checkpoint_count(ck, count))
    return Int(count[])
end

"""`record_names(ck) -> Vector{String}`: the records' names, in libte's order (also `keys(ck)`)."""
function record_names(ck::Checkpoint)
    names = String[]
    for i in 0:length(ck)-1
        p = Ref{Ptr{Cchar}}(C_NULL)
        check(te_checkpoint_name(ck, i, p))
        # Valid until the checkpoint changes: copied now.
        push!(names, unsafe_string(p[]))
    end
    return names
end

Base.keys(ck::Checkpoint) = record_names(ck)
Base.haskey(ck::Checkpoint, name::AbstractString) = name in record_names(ck)

Base.show(io::IO, ck::Checkpoint) =
    isopen(ck) ? print(io, "Checkpoint(", length(ck), " records)") : print(io, "Checkpoint(closed)")

"""`write_checkpoint(ck, path) -> path`: writes the file (beside it, then renamed over it)."""
function write_checkpoint(ck::Checkpoint, path::AbstractString)
    check(te_checkpoint_write(ck, String(path)))
    return path
end

"""`read_checkpoint(path) -> Checkpoint`: reads a checkpoint file, checked as described on [`Checkpoint`](@ref)."""
function read_checkpoint(path::AbstractString)
    out = Ref{Ptr{te_checkpoint}}(C_NULL)
    check(te_checkpoint_read(out, String(path)))
    return Checkpoint(out[])
end

"""`serialize_checkpoint(ck) -> Vector{UInt8}`: the file's bytes, in memory."""
function serialize_checkpoint(ck::Checkpoint)
    len = Ref{Csize_t}(0)
    check(te_checkpoint_serialize(ck, C_NULL, 0, len))
    buf = Vector{UInt8}(undef, len[])
    GC.@preserve buf check(te_checkpoint_serialize(ck, pointer(buf), length(buf), len))
    return resize!(buf, Int(len[]))
end

"""`deserialize_checkpoint(bytes) -> Checkpoint`: parses [`serialize_checkpoint`](@ref)'s bytes (or a file's)."""
function deserialize_checkpoint(bytes::AbstractVector{UInt8})
    data = bytes isa Vector{UInt8} ? bytes : Vector{UInt8}(bytes)
    out = Ref{Ptr{te_checkpoint}}(C_NULL)
    GC.@preserve data check(te_checkpoint_deserialize(out, pointer(data), length(data)))
    return Checkpoint(out[])
end
