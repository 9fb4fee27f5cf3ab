# LibTE.jl tests, run for real by scripts/test_julia.sh (Julia 1.5.3 from Debian bullseye):
#   LIBTE_PATH=build/release/libte.so.0 julia --project=bindings/julia/LibTE bindings/julia/LibTE/test/runtests.jl
# or `julia --project=bindings/julia/LibTE -e 'using Pkg; Pkg.test()'`. Standard library only.
using Test
using LinearAlgebra
using Libdl
using LibTE
using LibTE: te_autocast_state, TE_SUCCESS, TE_ERROR_INVALID_ARGUMENT, TE_ERROR_INVALID_STATE,
             TE_ERROR_UNSUPPORTED, TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING,
             TE_RECIPE_BLOCK_SCALING, TE_FORMAT_HYBRID, TE_FORMAT_E4M3, TE_DTYPE_F32, TE_DTYPE_E4M3,
             TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_DEVICE_CPU, TE_VERSION_NUMBER, TE_API_FUNCTIONS,
             TE_DTYPE_E5M2, TE_DTYPE_F16, TE_SCALING_BLOCK_1X128, TE_ERROR_NCCL

# Deterministic data without the Random stdlib's version-dependent streams.
function filled(dims...; seed = 1, scale = 1.0f0)
    A = Array{Float32}(undef, dims...)
    s = UInt64(seed)
    for i in eachindex(A)
        s = s * 0x5851f42d4c957f2d + 0x14057b7ef767814f
        A[i] = scale * (Float32((s >> 40) % 1000) / 500.0f0 - 1.0f0)
    end
    return A
end

# The exception f() throws, or nothing.
thrown(f) = try
    f()
    nothing
catch e
    e
end

relerr(a, b) = norm(Float64.(a) .- Float64.(b)) / max(norm(Float64.(b)), eps())

@testset "LibTE" begin
    @testset "library and generated wrappers" begin
        @test LibTE.version() == VersionNumber(TE_VERSION_NUMBER ÷ 10000, (TE_VERSION_NUMBER ÷ 100) % 100,
                                               TE_VERSION_NUMBER % 100)
        @test LibTE.te_version() == TE_VERSION_NUMBER
        @test LibTE.status_string(TE_ERROR_INVALID_ARGUMENT) == "TE_ERROR_INVALID_ARGUMENT"
        # every TE_API function of the header is wrapped, and the loaded library exports it
        header = joinpath(@__DIR__, "..", "..", "..", "..", "capi", "include", "te", "te.h")
        if isfile(header)
            declared = Set(Symbol(m.captures[1]) for m in
                           eachmatch(r"TE_API[^;(]*?\b(te_\w+)\s*\(", read(header, String)))
            @test Set(TE_API_FUNCTIONS) == declared
        end
        @test all(f -> isdefined(LibTE, f), TE_API_FUNCTIONS)
        lib = Libdl.dlopen(LibTE.libte)
        @test all(f -> Libdl.dlsym(lib, f; throw_error = false) !== nothing, TE_API_FUNCTIONS)
        if LibTE.libte_path() !== nothing  # LIBTE_PATH names the copy every ccall uses
            @test realpath(Libdl.dlpath(lib)) == realpath(LibTE.libte_path())
        end
        # the generated structs are plain data of the C sizes (check_abi.py verifies every one)
        @test sizeof(LibTE.te_tensor) == 104
        @test isbitstype(LibTE.te_linear_residuals)
        @test sizeof(LibTE.te_recipe_options) == 56
    end

    @testset "recipes" begin
        r = Recipe(:delayed; amax_history_len = 16)
        @test startswith(describe(r), "delayed_scaling(")
        @test LibTE.options(r).amax_history_len == 16
        @test LibTE.options(r).format == TE_FORMAT_HYBRID
        @test recipe_key(r) != 0
        @test recipe_key(Recipe(:delayed; amax_history_len = 16)) == recipe_key(r)
        @test recipe_key(Recipe(:delayed; amax_history_len = 32)) != recipe_key(r)
        @test startswith(describe(Recipe(TE_RECIPE_CURRENT_SCALING)), "current_scaling(")
        b = Recipe(:block)
        @test startswith(describe(b), "block_scaling(")
        @test LibTE.options(b).format == TE_FORMAT_E4M3
        @test LibTE.options(b).power_of_2_scales == 1
        @test occursin("delayed_scaling", sprint(show, r))

        # invalid options: a LibTEError carrying te_last_error()'s message, naming the field
        err = try
            Recipe(:delayed; amax_history_len = 0)
            nothing
        catch e
            e
        end
        @test err isa LibTEError
        @test err.status == TE_ERROR_INVALID_ARGUMENT
        @test occursin("amax_history_len", err.message)
        @test occursin("TE_ERROR_INVALID_ARGUMENT", sprint(showerror, err))
        @test_throws LibTEError Recipe(:delayed; margin = -1)
        @test_throws ArgumentError Recipe(:delayed; no_such_field = 1)
        @test_throws ArgumentError Recipe(:nonsense)

        close(r)
        close(r)  # idempotent
        @test !isopen(r)
        @test_throws ArgumentError describe(r)
    end

    @testset "context" begin
        ctx = Context()
        @test LibTE.device(ctx).type == TE_DEVICE_CPU
        LibTE.synchronize(ctx)
        @test LibTE.stats(ctx).scopes_closed == 0
        close(ctx)
        @test !isopen(ctx)
        @test_throws ArgumentError LibTE.synchronize(ctx)
        close(ctx)
        @test_throws ArgumentError Context(; device = :tpu)
    end

    @testset "autocast" begin
        ctx = Context()
        recipe = Recipe(:delayed; amax_history_len = 16)
        @test autocast_state(ctx).depth == 0
        @test autocast_state(ctx).enabled == 0
        v = autocast(ctx; recipe = recipe) do
            s = autocast_state(ctx)
            @test s.depth == 1
            @test s.enabled == 1
            @test s.recipe == recipe.handle
            autocast(ctx; enabled = false) do
                @test autocast_state(ctx).depth == 2
                @test autocast_state(ctx).enabled == 0
            end
            42
        end
        @test v == 42
        @test autocast_state(ctx).depth == 0
        @test LibTE.stats(ctx).scopes_closed == 2

        # the scope ends even when the block throws, and the block's error is what propagates
        @test_throws DomainError autocast(ctx) do
            @test autocast_state(ctx).depth == 1
            throw(DomainError(1, "inside the scope"))
        end
        @test autocast_state(ctx).depth == 0

        # calibrating: high precision, amaxes recorded
        autocast(ctx; enabled = false, calibrating = true) do
            @test autocast_state(ctx).calibrating == 1
        end
        g = Group()
        autocast(() -> nothing, ctx; recipe = recipe, group = g)
        @test autocast_state(ctx).depth == 0
        close(g)
        close(ctx)
    end

    @testset "Linear forward/backward vs a Float64 reference" begin
        ctx = Context()
        tokens, nin, nout = 32, 64, 48
        # Julia layout: x is in × tokens, W is in × out (libte's [out, in]), y is out × tokens.
        x = filled(nin, tokens; seed = 1)
        W = filled(nin, nout; seed = 2, scale = 0.125f0)
        b = filled(nout; seed = 3, scale = 0.5f0)
        dy = filled(nout, tokens; seed = 4)
        X, Wd, B, DY = Float64.(x), Float64.(W), Float64.(b), Float64.(dy)
        Yref = Wd' * X .+ B          # y = x W^T + b, in column-major terms
        DXref = Wd * DY              # dx = dy W
        DWref = X * DY'              # dW = dy^T x, stored like W (in × out)
        DBref = vec(sum(DY; dims = 2))

        lin = Linear(ctx, nin, nout)
        @test lin.in_features == nin && lin.bias
        # Outside autocast: high precision, close to the Float64 reference.
        y = zeros(Float32, nout, tokens)
        bwd = forward!(y, lin, x, W, b)
        @test relerr(y, Yref) < 1e-5
        dx, dW, db = zeros(Float32, nin, tokens), zeros(Float32, nin, nout), zeros(Float32, nout)
        backward!(bwd, dy; dx = dx, dw = dW, db = db)
        @test relerr(dx, DXref) < 1e-5
        @test relerr(dW, DWref) < 1e-5
        @test relerr(db, DBref) < 1e-5
        # callable again without `once`
        dx2 = zeros(Float32, nin, tokens)
        backward!(bwd, dy; dx = dx2)
        @test dx2 == dx
        close(bwd)
        @test_throws ArgumentError backward!(bwd, dy; dx = dx)

        # Inside an FP8 scope: E4M3 operands, close to the reference within FP8 precision.
        recipe = Recipe(:delayed; amax_history_len = 16)
        y8 = zeros(Float32, nout, tokens)
        bwd8 = autocast(ctx; recipe = recipe) do
            forward!(y8, lin, x, W, b)
        end
        @test relerr(y8, Yref) < 0.1
        @test y8 != y  # it really ran in FP8
        dx8, dW8, db8 = zeros(Float32, nin, tokens), zeros(Float32, nin, nout), zeros(Float32, nout)
        backward!(bwd8, dy; dx = dx8, dw = dW8, db = db8, once = true)
        @test relerr(dx8, DXref) < 0.1
        @test relerr(dW8, DWref) < 0.1
        @test relerr(db8, DBref) < 1e-3
        # TE_BACKWARD_ONCE: a second backward is an INVALID_STATE error
        err = try
            backward!(bwd8, dy; dx = dx8)
            nothing
        catch e
            e
        end
        @test err isa LibTEError && err.status == TE_ERROR_INVALID_STATE
        close(bwd8)

        # The scope's end updated the forward scaling states from this step's amaxes (the
        # history has rolled: this step's amax is in it, slot 1 is the next step's, still 0).
        info, hist = scaling_state(lin, TE_ROLE_INPUT; history = true)
        @test info.amax_history_len == 16
        @test length(hist) == 16
        @test maximum(hist) ≈ maximum(abs, x)
        @test info.scale ≈ 448 / maximum(abs, x)  # E4M3's max over the amax, margin 0
        @test info.scale_inv ≈ 1 / info.scale

        # The split forward: compute, then save.
        y2 = zeros(Float32, nout, tokens)
        res = forward_compute!(y2, lin, x, W, b)
        @test y2 == y
        bwd2 = forward_save(res, lin)
        @test !isopen(res)
        db2 = zeros(Float32, nout)
        backward!(bwd2, dy; db = db2)
        @test db2 ≈ db
        close(bwd2)
        res2 = forward_compute!(y2, lin, x, W, b)
        close(res2)  # released without saving

        # forward (allocating)
        y3, bwd3 = forward(lin, x, W, b)
        @test size(y3) == (nout, tokens) && y3 == y
        close(bwd3)

        # Scaling state round trip.
        bytes = save_state(lin)
        @test !isempty(bytes)
        lin2 = Linear(ctx, nin, nout)
        load_state!(lin2, bytes)
        @test save_state(lin2) == bytes

        # No bias.
        nb = Linear(ctx, nin, nout; bias = false)
        bwdnb = forward!(y, nb, x, W)
        @test relerr(y, Wd' * X) < 1e-5
        close(bwdnb)
        @test_throws ArgumentError forward!(y, nb, x, W, b)

        # Activations: GELU forward/backward against the tanh formula.
        h = filled(nout, tokens; seed = 5, scale = 3.0f0)
        a = similar(h)
        activation!(a, ctx, :gelu, h)
        gelu(v) = 0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v^3)))
        @test relerr(a, gelu.(Float64.(h))) < 1e-5
        da = ones(Float32, size(h))
        dh = similar(h)
        activation_backward!(dh, ctx, :gelu, h, da)
        fd = (gelu.(Float64.(h) .+ 1e-4) .- gelu.(Float64.(h) .- 1e-4)) ./ 2e-4
        @test relerr(dh, fd) < 1e-4
        r = similar(h)
        activation!(r, ctx, :relu, h)
        @test r == max.(h, 0)

        close(lin); close(lin2); close(nb)
        close(ctx)
    end

    @testset "bad input -> LibTEError with te_last_error's message" begin
        ctx = Context()
        lin = Linear(ctx, 64, 32)
        x = zeros(Float32, 48, 16)   # in_features 48, the layer wants 64
        W = zeros(Float32, 64, 32)
        b = zeros(Float32, 32)
        y = zeros(Float32, 32, 16)
        err = try
            forward!(y, lin, x, W, b)
            nothing
        catch e
            e
        end
        @test err isa LibTEError
        @test err.status == TE_ERROR_INVALID_ARGUMENT
        @test occursin("te_linear_forward", err.message)
        @test occursin("LibTEError(TE_ERROR_INVALID_ARGUMENT): te_linear_forward", sprint(showerror, err))

        # FP8 needs multiples of 16: 8 tokens is UNSUPPORTED inside an enabled scope...
        x8, y8 = zeros(Float32, 64, 8), zeros(Float32, 32, 8)
        err = try
            autocast(() -> forward!(y8, lin, x8, W, b), ctx)
            nothing
        catch e
            e
        end
        @test err isa LibTEError && err.status == TE_ERROR_UNSUPPORTED
        @test autocast_state(ctx).depth == 0  # the failed forward still closed the scope
        # ...and fine in high precision.
        close(forward!(y8, lin, x8, W, b))

        # Wrong dtype: the layer's activations are F32.
        @test_throws LibTEError forward!(y, lin, zeros(Float16, 64, 16), W, b)
        # Bad Linear options
        @test_throws LibTEError Linear(ctx, 0, 32)
        # Julia-side checks
        @test_throws ArgumentError TensorView(zeros(Int, 3))
        @test_throws ArgumentError TensorView(view(zeros(Float32, 4, 4), 1:2, 1:2))
        @test_throws ArgumentError TensorView(zeros(Float32, ntuple(_ -> 1, 9)...))
        close(lin)
        close(ctx)
    end

    @testset "tensor views: column-major Julia = reversed row-major shape" begin
        A = zeros(Float32, 3, 5, 7)
        v = TensorView(A)
        @test LibTE.shape(v) == (7, 5, 3)
        @test v.t.dtype == TE_DTYPE_F32
        @test LibTE.te_tensor_numel(Ref(v.t)) == 105
        bits = zeros(UInt8, 16, 16)
        s = Float32[1.0]
        f8 = TensorView(bits, TE_DTYPE_E4M3; scale_inv = s)
        @test f8.t.scale_inv == pointer(s)
        n = Ref{Int64}(0)
        @test LibTE.te_tensor_scale_inv_count(n, Ref(f8.t)) == TE_SUCCESS
        @test n[] == 1
    end

    @testset "FP8 primitives: quantize, cast_transpose, dequantize, amax" begin
        ctx = Context()
        x = filled(64, 32; seed = 7, scale = 3.0f0)   # Julia 64 × 32 = libte [32, 64]
        @test amax(ctx, x) == maximum(abs, x)
        @test isnan(amax(ctx, Float32[1, NaN, 2]))

        # Current scaling (no scale given): scale = 448 / amax, codes decode to x within E4M3's
        # precision (3 mantissa bits: relative error <= 2^-4 per element).
        q = quantize(ctx, x)
        @test q isa Float8Array && size(q) == size(x) && q.dtype == TE_DTYPE_E4M3
        @test length(q.scale_inv) == 1
        @test q.scale_inv[1] ≈ maximum(abs, x) / 448
        d = dequantize(ctx, q)
        @test size(d) == size(x) && eltype(d) == Float32
        @test all(abs.(d .- x) .<= abs.(x) ./ 16 .+ 1e-6)
        @test maximum(abs, d) ≈ maximum(abs, x)
        @test eltype(dequantize(ctx, q; T = Float16)) == Float16

        # Delayed scaling: the given scale is used, scale_inv = 1 / scale; amax accumulates.
        acc = Float32[0.5]
        q2 = quantize(ctx, x; dtype = :e5m2, scale = 2.0f0, amax = acc)
        @test q2.dtype == TE_DTYPE_E5M2 && q2.scale_inv[1] == 0.5f0
        @test acc[1] == max(0.5f0, maximum(abs, x))
        @test relerr(dequantize(ctx, q2), x) < 0.2
        # Into an existing Float8Array; power-of-2 scales keep only the exponent.
        q3 = Float8Array(undef, :e4m3, size(x)...)
        quantize!(q3, ctx, x; power_of_2_scales = true)
        @test significand(q3.scale_inv[1]) == 1  # a power of 2

        # cast_transpose: per tensor, out_t is exactly the transpose of out, same scale.
        out, out_t = cast_transpose(ctx, x)
        @test size(out_t) == reverse(size(x))
        @test out.codes == q.codes
        @test out_t.codes == permutedims(out.codes)
        @test out_t.scale_inv == out.scale_inv
        o1, o2 = cast_transpose!(nothing, Float8Array(undef, :e4m3, 32, 64), ctx, x)
        @test o1 === nothing && o2.codes == out_t.codes

        # Block scaling: one scale_inv per 1x128 block of each row of libte's [rows, cols].
        xb = filled(256, 32; seed = 8)               # libte [32, 256]: 2 blocks per row
        qb = quantize(ctx, xb; scaling = :block_1x128)
        @test qb.scaling == TE_SCALING_BLOCK_1X128 && length(qb.scale_inv) == 32 * 2
        @test relerr(dequantize(ctx, qb), xb) < 0.05

        # Errors: libte's, and the Julia side's.
        @test_throws ArgumentError quantize(ctx, x; dtype = :e3m4)
        @test_throws LibTEError quantize!(Float8Array(undef, :e4m3, 16, 16), ctx, x)   # shape
        @test_throws LibTEError quantize(ctx, x; scaling = :block_1x128, scale = 1.0f0)
        @test_throws ArgumentError quantize(ctx, x; amax = 1.0)
        close(ctx)
    end

    @testset "GEMM vs a Float64 reference" begin
        ctx = Context()
        # libte D[m, n] = op(A)[m, k] op(B)[k, n]; in Julia terms D = op(B) * op(A).
        m, n, k = 32, 48, 64
        A = filled(k, m; seed = 11)          # libte A [m, k]
        B = filled(n, k; seed = 12)          # libte B [k, n]
        D = gemm(ctx, A, B)
        @test size(D) == (n, m)
        @test relerr(D, Float64.(B) * Float64.(A)) < 1e-5
        Bt = permutedims(B)                  # libte [n, k]
        @test relerr(gemm(ctx, A, Bt; transb = true), Float64.(B) * Float64.(A)) < 1e-5
        At = permutedims(A)
        @test relerr(gemm(ctx, At, B; transa = true), Float64.(B) * Float64.(A)) < 1e-5
        # bias + GELU epilogue, pre-GELU values kept; accumulate adds the old D.
        bias = filled(n; seed = 13)
        pre = zeros(Float32, n, m)
        G = gemm(ctx, A, B; bias = bias, gelu = true, gelu_input = pre)
        ref = Float64.(B) * Float64.(A) .+ Float64.(bias)
        gelu64(v) = 0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v^3)))
        @test relerr(pre, ref) < 1e-5
        @test relerr(G, gelu64.(ref)) < 1e-5
        D2 = copy(D)
        gemm!(D2, ctx, A, B; accumulate = true)
        @test relerr(D2, 2 .* Float64.(D)) < 1e-5
        @test_throws ArgumentError gemm(ctx, A, B; accumulate = true)

        # FP8: both operands K-major (transa = false, transb = true: D = B' * A in Julia), the
        # result that of the dequantized operands, accumulated in fp32.
        qa = quantize(ctx, A)                # libte [m, k]
        qb = quantize(ctx, Bt; dtype = :e4m3) # Julia k × n: libte [n, k]
        D8 = gemm(ctx, qa, qb; transb = true)
        @test size(D8) == (n, m)
        Ad, Bd = Float64.(dequantize(ctx, qa)), Float64.(dequantize(ctx, qb))
        @test relerr(D8, Bd' * Ad) < 1e-5
        @test relerr(D8, Float64.(B) * Float64.(A)) < 0.1
        # ...and cuBLASLt's rules on every backend
        err = try
            gemm(ctx, qa, qb)
            nothing
        catch e
            e
        end
        @test err isa LibTEError && err.status in (TE_ERROR_INVALID_ARGUMENT, TE_ERROR_UNSUPPORTED)
        @test_throws LibTEError gemm(ctx, quantize(ctx, A; dtype = :e5m2), quantize(ctx, Bt; dtype = :e5m2); transb = true)
        close(ctx)
    end

    @testset "groups, NCCL ids, flush_backward, residuals, streams" begin
        g = Group()
        @test LibTE.group_rank(g) == 0 && LibTE.group_size(g) == 1
        @test LibTE.group_id(g) != 0 && LibTE.group_id(Group()) != LibTE.group_id(g)
        @test occursin("rank 0 of 1", sprint(show, g))
        err = try
            LibTE.abort(g)  # a single-rank group has no communicator
            nothing
        catch e
            e
        end
        @test err isa LibTEError && err.status == TE_ERROR_INVALID_STATE
        close(g)
        @test !isopen(g)
        @test_throws ArgumentError LibTE.group_rank(g)

        # NCCL needs a GPU (and a build with NCCL): here it may be unsupported.
        bytes = UInt8.(0:127)
        @test Vector{UInt8}(NcclId(bytes)) == bytes
        @test_throws ArgumentError NcclId(zeros(UInt8, 3))
        id = try
            nccl_unique_id()
        catch e
            e
        end
        if id isa NcclId
            @test length(Vector{UInt8}(id)) == 128
        else
            @test id isa LibTEError && id.status in (TE_ERROR_UNSUPPORTED, TE_ERROR_NCCL)
        end
        e = thrown(() -> Group(0, 2, NcclId(bytes); timeout_ms = 1000))  # rank 1 never joins
        @test e isa LibTEError && e.status in (TE_ERROR_UNSUPPORTED, TE_ERROR_NCCL)
        e = thrown(() -> Group(Ptr{Cvoid}(C_NULL)))
        @test e isa LibTEError && e.status in (TE_ERROR_UNSUPPORTED, TE_ERROR_INVALID_ARGUMENT)

        ctx = Context()
        @test_throws LibTEError LibTE.set_stream(ctx, Ptr{Cvoid}(UInt(0x1000)))  # a CPU context
        LibTE.set_stream(ctx, Ptr{Cvoid}(C_NULL))
        lin = Linear(ctx, 64, 32)
        x, W, b = filled(64, 32; seed = 21), filled(64, 32; seed = 22, scale = 0.125f0), zeros(Float32, 32)
        y = zeros(Float32, 32, 32)
        recipe = Recipe(:delayed; amax_history_len = 4)
        g2 = Group()
        res = autocast(() -> forward_compute!(y, lin, x, W, b), ctx; recipe = recipe, group = g2)
        xt, wt, fp8 = LibTE.residual_tensors(res)
        @test fp8
        @test size(xt) == (32, 64) && size(wt) == (32, 64)   # libte x^T [in, tokens], W^T [in, out]
        @test relerr(dequantize(ctx, xt), permutedims(x)) < 0.1
        @test relerr(dequantize(ctx, wt), permutedims(W)) < 0.1
        bwd = forward_save(res, lin)
        # The pass's backward reduction can be flushed without running the backward.
        before = LibTE.stats(ctx).bucket_updates
        LibTE.flush_backward(ctx)
        LibTE.flush_backward(ctx)  # nothing pending: a no-op
        @test LibTE.stats(ctx).bucket_updates == before
        backward!(bwd, ones(Float32, 32, 32); dw = zeros(Float32, 64, 32), once = true)
        LibTE.flush_backward(ctx)
        @test LibTE.stats(ctx).bucket_updates > before   # the pass's backward bucket was reduced
        close(bwd)
        res2 = forward_compute!(y, lin, x, W, b)   # high precision: the caller's arrays
        xh, wh, fp8h = LibTE.residual_tensors(res2)
        @test !fp8h && xh === x && wh === W
        close(res2)
        # The context keeps its scopes' groups: closing one only marks it.
        close(g2)
        @test !isopen(g2) && g2.handle != C_NULL
        @test_throws ArgumentError autocast(() -> nothing, ctx; group = g2)
        close(lin); close(ctx)
        @test g2.handle == C_NULL   # freed with the context
    end

    @testset "LayerNorm and RMSNorm vs a Float64 reference" begin
        ctx = Context()
        hidden, tokens = 40, 6
        x = filled(hidden, tokens; seed = 11, scale = 2.0f0)   # Julia 40 × 6 = libte [6, 40]
        gamma = 1 .+ 0.5f0 .* filled(hidden; seed = 12)
        beta = 0.5f0 .* filled(hidden; seed = 13)
        dy = filled(hidden, tokens; seed = 14)
        # One column per token: mean and variance over the first (libte's last) dimension.
        function norm_reference(kind, zcg)
            X, g = Float64.(x), Float64.(gamma) .+ (zcg ? 1 : 0)
            mu = kind === :layernorm ? vec(sum(X; dims = 1)) ./ hidden : zeros(tokens)
            C = X .- mu'
            rs = 1 ./ sqrt.(vec(sum(C .^ 2; dims = 1)) ./ hidden .+ Float64(1.0f-5))
            xh = C .* rs'
            y = xh .* g .+ (kind === :layernorm ? Float64.(beta) : 0)
            dyg = Float64.(dy) .* g
            c1 = vec(sum(dyg .* xh; dims = 1)) ./ hidden
            c2 = kind === :layernorm ? vec(sum(dyg; dims = 1)) ./ hidden : zeros(tokens)
            dx = rs' .* (dyg .- xh .* c1' .- c2')
            return y, mu, rs, dx, vec(sum(Float64.(dy) .* xh; dims = 2)), vec(sum(Float64.(dy); dims = 2))
        end
        for kind in (:layernorm, :rmsnorm), zcg in (false, true)
            b = kind === :layernorm ? beta : nothing
            y, yt, mu, rs = norm_forward(ctx, x, gamma, b; kind = kind, zero_centered_gamma = zcg)
            ry, rmu, rrs, rdx, rdg, rdb = norm_reference(kind, zcg)
            @test yt === nothing && size(y) == size(x) && eltype(y) == Float32
            # fp32 with short fixed-order sums against Float64: a few ulps
            @test maximum(abs.(y .- ry)) < 1e-5 * (1 + maximum(abs, ry))
            @test maximum(abs.(rs .- rrs) ./ rrs) < 1e-5
            if kind === :layernorm
                @test maximum(abs.(mu .- rmu)) < 1e-6
            else
                @test mu === nothing
            end
            dx, dg, db = norm_backward(ctx, dy, x, gamma, mu, rs; kind = kind, zero_centered_gamma = zcg)
            @test relerr(dx, rdx) < 1e-5
            @test relerr(dg, rdg) < 1e-5
            if kind === :layernorm
                @test relerr(db, rdb) < 1e-5
            else
                @test db === nothing
            end
            dx2, dg2, _ = norm_backward(ctx, dy, x, gamma, mu, rs; kind = kind, zero_centered_gamma = zcg)
            @test dx2 == dx && dg2 == dg   # deterministic: dgamma is written, not accumulated
        end

        # FP8: the codes are libte's own cast of the Float32 output; out_t is their transpose.
        v = norm_forward(ctx, x, gamma, beta)[1]
        acc = Float32[0]
        q, qt, _, _ = norm_forward(ctx, x, gamma, beta; dtype = :e4m3, transpose = true, scale = 16.0f0,
                                   amax = acc)
        @test q isa Float8Array && size(q) == size(x) && size(qt) == (tokens, hidden)
        @test q.codes == quantize(ctx, v; scale = 16.0f0).codes
        @test qt.codes == permutedims(q.codes)
        @test q.scale_inv[1] == qt.scale_inv[1] == 1 / 16.0f0
        @test acc[1] == maximum(abs, v)
        # Current scaling: the scale comes from the output's own amax.
        c = norm_forward(ctx, x, gamma, beta; dtype = :e5m2)[1]
        @test c.scale_inv[1] == 1 / (57344.0f0 / maximum(abs, v))
        @test c.codes == quantize(ctx, v; dtype = :e5m2).codes
        # A Float32 output and only its FP8 transpose, into given arrays.
        y2, t2 = zeros(Float32, size(x)), Float8Array(undef, :e4m3, tokens, hidden)
        norm_forward!(y2, ctx, x, gamma, beta; out_t = t2)
        @test y2 == v
        @test t2.codes == permutedims(quantize(ctx, v; scale = 1 / t2.scale_inv[1]).codes)

        # Errors: libte's (naming the function and argument), and the Julia side's.
        e = thrown(() -> norm_forward(ctx, x, gamma, beta; kind = :rmsnorm))
        @test e isa LibTEError && occursin("te_norm_forward: argument 'args->bias'", e.message)
        e = thrown(() -> norm_forward(ctx, x, gamma, beta; eps = 0))
        @test e isa LibTEError && occursin("'opts->eps'", e.message)
        e = thrown(() -> norm_forward(ctx, x, gamma[1:20], beta))
        @test e isa LibTEError && occursin("'args->weight'", e.message)
        e = thrown(() -> norm_backward(ctx, dy, x, gamma, nothing, ones(Float32, tokens)))
        @test e isa LibTEError && occursin("te_norm_backward: argument 'mu'", e.message)
        @test_throws ArgumentError norm_forward(ctx, x, gamma, beta; kind = :batchnorm)
        close(ctx)
    end

    @testset "GeGLU and SReLU" begin
        ctx = Context()
        x = filled(16, 4; seed = 21)   # libte [4, 16]: the gates are Julia rows 1:8
        gelu64(v) = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v^3)))
        # te.h has both; a library that does not implement one yet rejects it naming 'act'.
        y = zeros(Float32, 8, 4)
        e = thrown(() -> activation!(y, ctx, :geglu, x))
        if e === nothing
            @test maximum(abs.(y .- gelu64.(Float64.(x[1:8, :])) .* Float64.(x[9:16, :]))) < 1e-5
        else
            @test e isa LibTEError && occursin("argument 'act'", e.message)
        end
        s = zeros(Float32, 16, 4)
        e = thrown(() -> activation!(s, ctx, :srelu, x))
        if e === nothing
            @test maximum(abs.(s .- max.(x, 0) .^ 2)) < 1e-6
            ds = activation_backward!(zeros(Float32, 16, 4), ctx, :srelu, x, ones(Float32, 16, 4))
            @test maximum(abs.(ds .- 2 .* max.(x, 0))) < 1e-6
        else
            @test e isa LibTEError && occursin("argument 'act'", e.message)
        end
        @test_throws ArgumentError activation!(y, ctx, :tanh, x)
        close(ctx)
    end

    @testset "finalizers and close order" begin
        # Children closed after their context (or collected in any order) are fine: the context
        # is destroyed with its last child.
        ctx = Context()
        lin = Linear(ctx, 16, 16)
        x, W, b, y = ones(Float32, 16, 16), ones(Float32, 16, 16), zeros(Float32, 16), zeros(Float32, 16, 16)
        bwd = forward!(y, lin, x, W, b)
        close(ctx)
        @test ctx.handle != C_NULL   # two children alive
        @test_throws ArgumentError forward!(y, lin, x, W, b)
        close(lin)
        @test ctx.handle != C_NULL
        close(bwd)
        @test ctx.handle == C_NULL
        # And by the GC alone.
        for _ in 1:3
            let c = Context(), l = Linear(c, 16, 16)
                forward!(y, l, x, W, b)
            end
        end
        GC.gc(); GC.gc()
        @test true
    end
end
