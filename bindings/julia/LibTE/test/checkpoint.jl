# Included by runtests.jl (inside its "LibTE" testset; `filled` and `thrown` come from there):
# checkpoints round-trip exactly through a buffer and a file, and refuse what te.h says.

ckpt_invalid(f, func) = (e = thrown(f); e isa LibTEError && e.status == TE_ERROR_INVALID_ARGUMENT && startswith(e.message, func))

@testset "Checkpoint: round trips and refusals" begin
    ctx = Context()
    W = filled(5, 12; seed = 1)                   # libte [12, 5]
    ids = Int32[3, -7, typemax(Int32), typemin(Int32), 0]
    h = Float16.(filled(4, 3, 2; seed = 2))
    ck = Checkpoint()
    @test length(ck) == 0
    put_tensor!(ck, ctx, "model.fc1.weight", W)
    put_tensor!(ck, ctx, "data.ids", ids)
    put_tensor!(ck, ctx, "h", h)
    put_bytes!(ck, "step", reinterpret(UInt8, [Int64(42)]))
    put_bytes!(ck, "note", "hello")
    put_bytes!(ck, "empty", UInt8[])

    function check_sample(c)
        @test sort(record_names(c)) == ["data.ids", "empty", "h", "model.fc1.weight", "note", "step"]
        @test length(c) == 6 && haskey(c, "h") && !haskey(c, "nope")
        @test get_tensor!(zeros(Float32, 5, 12), c, ctx, "model.fc1.weight") == W
        @test get_tensor!(zeros(Int32, 5), c, ctx, "data.ids") == ids
        @test get_tensor!(zeros(Float16, 4, 3, 2), c, ctx, "h") == h
        @test reinterpret(Int64, get_bytes(c, "step")) == [42]
        @test String(get_bytes(c, "note")) == "hello"
        @test get_bytes(c, "empty") == UInt8[]
    end
    check_sample(ck)
    bytes = serialize_checkpoint(ck)
    @test bytes[1:6] == Vector{UInt8}(codeunits("TECKPT"))
    back = deserialize_checkpoint(bytes)
    check_sample(back)
    @test serialize_checkpoint(Checkpoint(bytes)) == bytes
    path = tempname()
    write_checkpoint(ck, path)
    @test read(path) == bytes
    check_sample(read_checkpoint(path))
    rm(path)

    # Replacing a record; a 255-byte name is the longest.
    put_bytes!(ck, "step", UInt8[1, 2])
    @test get_bytes(ck, "step") == UInt8[1, 2] && length(ck) == 6
    put_bytes!(ck, "n"^255, UInt8[1])

    # Refusals, outputs untouched.
    out = fill(9.0f0, 5, 12)
    @test ckpt_invalid(() -> get_tensor!(out, ck, ctx, "nope"), "te_checkpoint_get_tensor")
    @test ckpt_invalid(() -> get_tensor!(fill(9.0f0, 12, 5), ck, ctx, "model.fc1.weight"), "te_checkpoint_get_tensor")
    @test ckpt_invalid(() -> get_tensor!(fill(Int32(9), 5, 12), ck, ctx, "model.fc1.weight"), "te_checkpoint_get_tensor")
    @test ckpt_invalid(() -> get_tensor!(fill(9.0f0, 2), ck, ctx, "step"), "te_checkpoint_get_tensor")
    @test all(out .== 9.0f0)
    @test ckpt_invalid(() -> get_bytes(ck, "model.fc1.weight"), "te_checkpoint_get_bytes")
    @test ckpt_invalid(() -> put_bytes!(ck, "", UInt8[1]), "te_checkpoint_put_bytes")
    @test ckpt_invalid(() -> put_bytes!(ck, "n"^256, UInt8[1]), "te_checkpoint_put_bytes")
    @test thrown(() -> put_bytes!(ck, "a\0b", UInt8[1])) isa ArgumentError
    fp8 = Float8Array(undef, :e4m3, 4, 4)
    @test ckpt_invalid(() -> put_tensor!(ck, ctx, "fp8", fp8), "te_checkpoint_put_tensor")
    @test length(ck) == 7

    # Truncated or corrupted bytes and files are refused.
    for cut in (0, 5, 6, length(bytes) ÷ 2, length(bytes) - 1)
        @test ckpt_invalid(() -> deserialize_checkpoint(bytes[1:cut]), "te_checkpoint_deserialize")
    end
    @test all(1:7:length(bytes)) do i
        bad = copy(bytes)
        bad[i] ⊻= 0x5a
        thrown(() -> deserialize_checkpoint(bad)) isa LibTEError
    end
    bad = copy(bytes)
    bad[length(bad) ÷ 2] ⊻= 0x01
    path = tempname()
    write(path, bad)
    @test ckpt_invalid(() -> read_checkpoint(path), "te_checkpoint_read")
    rm(path)
    @test ckpt_invalid(() -> read_checkpoint(path), "te_checkpoint_read")   # no such file

    # close is idempotent; a closed checkpoint is an ArgumentError, not a crash.
    close(ck)
    close(ck)
    @test !isopen(ck)
    @test_throws ArgumentError length(ck)
end

@testset "Checkpoint: a Linear's state and weights restore exactly" begin
    ctx = Context()
    r = Recipe(:delayed)
    lin = Linear(ctx, 16, 16)
    x, W, b = filled(16, 16; seed = 1), filled(16, 16; seed = 2), zeros(Float32, 16)
    y = zeros(Float32, 16, 16)
    autocast(ctx; recipe = r) do
        forward!(y, lin, x, W, b)
    end
    ck = Checkpoint()
    put_bytes!(ck, "fc.state", save_state(lin))
    put_tensor!(ck, ctx, "fc.weight", W)
    path = tempname()
    write_checkpoint(ck, path)
    back = read_checkpoint(path)
    rm(path)
    lin2 = Linear(ctx, 16, 16)
    load_state!(lin2, get_bytes(back, "fc.state"))
    W2 = get_tensor!(zeros(Float32, 16, 16), back, ctx, "fc.weight")
    @test W2 == W
    @test save_state(lin2) == save_state(lin)
    ya, yb = zeros(Float32, 16, 16), zeros(Float32, 16, 16)
    autocast(ctx; recipe = r) do
        forward!(ya, lin, x, W, b)
        forward!(yb, lin2, x, W2, b)
    end
    @test ya == yb
end

@testset "Checkpoint: record_info" begin
    ctx = Context()
    W = filled(5, 12; seed = 1)                   # libte [12, 5]
    ids = Int32[3, -7, typemax(Int32), typemin(Int32), 0]
    hbits = UInt16[0x3f80, 0xc000, 0x0001, 0x7f7f, 0x8000, 0x4049]   # BF16 bits, 3 × 2
    hbits = reshape(hbits, 3, 2)                  # libte [2, 3]
    ck = Checkpoint()
    put_tensor!(ck, ctx, "w", W)
    put_tensor!(ck, ctx, "ids", ids)
    put_tensor!(ck, ctx, "h", TensorView(hbits, LibTE.TE_DTYPE_BF16))
    put_bytes!(ck, "step", reinterpret(UInt8, [Int64(42)]))
    put_bytes!(ck, "empty", UInt8[])
    for c in (ck, deserialize_checkpoint(serialize_checkpoint(ck)))
        @test record_info(c, "w") == (kind = :tensor, dtype = LibTE.TE_DTYPE_F32, eltype = Float32,
                                      dims = (5, 12), shape = (12, 5), size = 60 * 4)
        @test record_info(c, "ids") == (kind = :tensor, dtype = LibTE.TE_DTYPE_I32, eltype = Int32,
                                        dims = (5,), shape = (5,), size = 5 * 4)
        @test record_info(c, "h") == (kind = :tensor, dtype = LibTE.TE_DTYPE_BF16, eltype = UInt16,
                                      dims = (3, 2), shape = (2, 3), size = 6 * 2)
        @test record_info(c, "step") == (kind = :bytes, dtype = nothing, eltype = nothing,
                                         dims = nothing, shape = nothing, size = 8)
        @test record_info(c, "empty").kind === :bytes && record_info(c, "empty").size == 0
        # Allocating from the info is enough for get_tensor!.
        for (name, A) in (("w", W), ("ids", ids), ("h", hbits))
            info = record_info(c, name)
            @test info.size == prod(info.dims) * sizeof(info.eltype)
            out = Array{info.eltype}(undef, info.dims...)
            @test get_tensor!(TensorView(out, info.dtype), c, ctx, name).data == A
        end
    end
    @test ckpt_invalid(() -> record_info(ck, "nope"), "te_checkpoint_record_info")
    @test occursin("nope", thrown(() -> record_info(ck, "nope")).message)
    @test ckpt_invalid(() -> record_info(ck, ""), "te_checkpoint_record_info")
    @test thrown(() -> record_info(ck, "a\0b")) isa ArgumentError
    @test length(ck) == 5
    close(ck)
    @test_throws ArgumentError record_info(ck, "w")
end
