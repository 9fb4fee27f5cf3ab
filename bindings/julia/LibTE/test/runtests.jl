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
             TE_DTYPE_E5M2, TE_DTYPE_F16, TE_SCALING_BLOCK_1X128, TE_ERROR_NCCL, TE_ROLE_GRAD_OUTPUT

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

    # ---- the transformer modules ------------------------------------------------------------
    # Float64 references in the Julia layout: x is features × tokens, a libte weight [out, in]
    # is an in × out matrix (y = W' * x .+ b), the norm runs down each column.
    function mod_norm(kind, x, g, b; zcg = false)
        local X, G, H, mu, rs, Y
        X, G = Float64.(x), Float64.(g) .+ (zcg ? 1 : 0)
        H = size(X, 1)
        mu = kind === :layernorm ? sum(X; dims = 1) ./ H : zeros(1, size(X, 2))
        rs = 1 ./ sqrt.(sum((X .- mu) .^ 2; dims = 1) ./ H .+ Float64(1.0f-5))
        Y = (X .- mu) .* rs .* G .+ (kind === :layernorm ? Float64.(b) : 0)
        return Y, vec(mu), vec(rs)
    end
    function mod_norm_backward(kind, dY, x, g; zcg = false)
        local X, G, H, mu, rs, xh, dyg, c1, c2
        X, G = Float64.(x), Float64.(g) .+ (zcg ? 1 : 0)
        H = size(X, 1)
        _, mu, rs = mod_norm(kind, x, g, zeros(H); zcg = zcg)
        xh = (X .- mu') .* rs'
        dyg = dY .* G
        c1 = sum(dyg .* xh; dims = 1) ./ H
        c2 = kind === :layernorm ? sum(dyg; dims = 1) ./ H : 0
        return rs' .* (dyg .- xh .* c1 .- c2), vec(sum(dY .* xh; dims = 2)), vec(sum(dY; dims = 2))
    end
    gelu_(v) = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v^3)))
    dgelu_(v) = (t = tanh(0.7978845608028654 * (v + 0.044715 * v^3));
                 0.5 * (1 + t) + 0.5 * v * (1 - t^2) * 0.7978845608028654 * (1 + 3 * 0.044715 * v^2))
    silu_(v) = v / (1 + exp(-v))
    dsilu_(v) = (s = 1 / (1 + exp(-v)); s * (1 + v * (1 - s)))
    plain_act = Dict(:relu => (v -> max(v, 0.0), v -> v > 0 ? 1.0 : 0.0), :gelu => (gelu_, dgelu_),
                     :srelu => (v -> max(v, 0.0)^2, v -> 2 * max(v, 0.0)), :swiglu => (silu_, dsilu_),
                     :geglu => (gelu_, dgelu_))
    gated_act(act) = act === :swiglu || act === :geglu
    function mod_act(act, h)
        local f, n
        f = plain_act[act][1]
        gated_act(act) || return f.(h)
        n = size(h, 1) ÷ 2
        return f.(h[1:n, :]) .* h[n+1:end, :]
    end
    function mod_act_backward(act, h, da)
        local f, df, n, a, l
        f, df = plain_act[act]
        gated_act(act) || return da .* df.(h)
        n = size(h, 1) ÷ 2
        a, l = h[1:n, :], h[n+1:end, :]
        return vcat(da .* l .* df.(a), da .* f.(a))
    end
    # |got - ref| <= tol * (|ref| + max|ref|): relative, or to the tensor's scale where it cancels.
    close_to(got, ref, tol) = all(abs.(Float64.(got) .- ref) .<= tol .* (abs.(ref) .+ maximum(abs, ref)))
    # Values exactly representable in E5M2 (and Float32): quantized with scale 1, exact.
    e5m2_exact(dims...; seed = 1) = Float32[(-1.5, -1.0, -0.5, -0.25, 0.0, 0.125, 0.375, 0.75, 1.25)[1 + Int(round(4 + 4 * v))]
                                            for v in filled(dims...; seed = seed)]
    deq(ctx, f) = Float64.(dequantize(ctx, f))

    @testset "LayerNormLinear vs a Float64 reference" begin
        ctx = Context()
        tokens, nin, nout = 32, 64, 48
        x = filled(nin, tokens; seed = 31, scale = 2.5f0) .+ 0.5f0
        gamma = 1 .+ 0.5f0 .* filled(nin; seed = 32)
        beta = 0.5f0 .* filled(nin; seed = 33)
        W = filled(nin, nout; seed = 34, scale = 0.2f0)
        b = filled(nout; seed = 35)
        dy = filled(nout, tokens; seed = 36)
        for (kind, zcg) in ((:layernorm, false), (:layernorm, true), (:rmsnorm, false), (:rmsnorm, true))
            m = LayerNormLinear(ctx, nin, nout; normalization = kind, zero_centered_gamma = zcg)
            bt = kind === :layernorm ? beta : nothing
            y, ln = zeros(Float32, nout, tokens), zeros(Float32, nin, tokens)
            res = forward_compute!(y, m, x, gamma, bt, W, b; ln_out = ln)
            LN, MU, RS = mod_norm(kind, x, gamma, beta; zcg = zcg)
            # fp32 statistics and a 64-term fp32 dot product: a few fp32 ulps of the scale
            @test close_to(ln, LN, 1e-6)
            @test close_to(y, Float64.(W)' * LN .+ Float64.(b), 1e-5)
            r = LibTE.residual_tensors(res)
            @test !r.fp8 && r.ln_out_t == ln && r.weight_t == W
            @test close_to(r.rsigma, RS, 1e-6)
            @test kind === :layernorm ? close_to(r.mu, MU, 1e-6) : r.mu === nothing
            bwd = forward_save(res, m)
            @test !isopen(res)
            g = (dx = zeros(Float32, nin, tokens), dg = zeros(Float32, nin), dbt = zeros(Float32, nin),
                 dw = zeros(Float32, nin, nout), db = zeros(Float32, nout))
            backward!(bwd, dy; dx = g.dx, dln_weight = g.dg, dln_bias = kind === :layernorm ? g.dbt : nothing,
                      dw = g.dw, db = g.db)
            DX, DG, DB = mod_norm_backward(kind, Float64.(W) * Float64.(dy), x, gamma; zcg = zcg)
            # the norm's backward cancels terms: 1e-4 of the scale
            @test close_to(g.dx, DX, 1e-4)
            @test close_to(g.dg, DG, 1e-4)
            kind === :layernorm && @test close_to(g.dbt, DB, 1e-4)
            @test close_to(g.dw, LN * Float64.(dy)', 1e-5)
            @test close_to(g.db, vec(sum(Float64.(dy); dims = 2)), 1e-5)
            dx2 = zeros(Float32, nin, tokens)
            backward!(bwd, dy; dx = dx2)   # retain-graph: the same bits again
            @test dx2 == g.dx
            close(bwd); close(m)
        end

        # FP8, delayed scaling: against the formulas on the operands libte quantized.
        m = LayerNormLinear(ctx, nin, nout)
        y = zeros(Float32, nout, tokens)
        res = autocast(ctx; recipe = Recipe(:delayed)) do
            forward_compute!(y, m, x, gamma, beta, W, b)
        end
        r = LibTE.residual_tensors(res)
        @test r.fp8 && r.ln_out_t isa Float8Array && size(r.ln_out_t) == (tokens, nin)
        @test r.ln_out_t.dtype == TE_DTYPE_E4M3 && size(r.weight_t) == (nout, nin)
        lnq, wq = deq(ctx, r.ln_out_t)', deq(ctx, r.weight_t)'   # in × tokens, in × out
        LN = mod_norm(:layernorm, x, gamma, beta)[1]
        # a fresh delayed-scaling state has scale 1: E4M3 rounding, half an ulp (2^-4
        # relative) plus half the smallest subnormal (2^-10)
        @test all(abs.(lnq .- LN) .<= abs.(LN) ./ 16 .+ 1 / 1024)
        @test close_to(y, wq' * lnq .+ Float64.(b), 1e-5)   # exact products, fp32 sums
        bwd = forward_save(res, m)
        dy8 = e5m2_exact(nout, tokens; seed = 37)            # quantized exactly (scale 1)
        dx, dw = zeros(Float32, nin, tokens), zeros(Float32, nin, nout)
        backward!(bwd, dy8; dx = dx, dw = dw)
        @test close_to(dx, mod_norm_backward(:layernorm, wq * Float64.(dy8), x, gamma)[1], 1e-4)
        @test close_to(dw, lnq * Float64.(dy8)', 1e-5)
        backward!(bwd, dy8; dx = dx, once = true)
        e = thrown(() -> backward!(bwd, dy8; dx = dx))
        @test e isa LibTEError && e.status == TE_ERROR_INVALID_STATE &&
              occursin("te_layernorm_linear_backward", e.message)

        # FP8, current scaling, against the unquantized formulas: E4M3 keeps 3 mantissa bits
        # (2^-4 relative at most, about 0.036 RMS per operand), so a product of two rounded
        # operands is near sqrt(2) * 0.036 = 0.05 relative (Frobenius): bound 0.08; dy in E5M2
        # (0.072 RMS) adds up to about 0.08 in the backward: bound 0.15.
        y8, bwd8 = autocast(ctx; recipe = Recipe(:current)) do
            forward(m, x, gamma, beta, W, b)
        end
        @test relerr(y8 .- b, Float64.(W)' * LN) < 0.08
        dx8, dw8 = zeros(Float32, nin, tokens), zeros(Float32, nin, nout)
        backward!(bwd8, dy; dx = dx8, dw = dw8, once = true)
        @test relerr(dx8, mod_norm_backward(:layernorm, Float64.(W) * Float64.(dy), x, gamma)[1]) < 0.15
        @test relerr(dw8, LN * Float64.(dy)') < 0.15

        # State round trip (bit-exact; training resumes identically).
        recipe = Recipe(:delayed; amax_history_len = 8)
        for step in 1:3
            bw = autocast(() -> forward!(y, m, x .* step, gamma, beta, W, b), ctx; recipe = recipe)
            backward!(bw, dy; dx = dx, once = true)
        end
        bytes = save_state(m)
        m2 = LayerNormLinear(ctx, nin, nout)
        @test save_state(m2) != bytes
        load_state!(m2, bytes)
        @test save_state(m2) == bytes
        for role in (TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT)
            @test scaling_state(m, role; history = true) == scaling_state(m2, role; history = true)
        end
        @test scaling_state(m, TE_ROLE_GRAD_OUTPUT)[1].fp8_dtype == TE_DTYPE_E5M2
        ya, yb = zeros(Float32, nout, tokens), zeros(Float32, nout, tokens)
        autocast(ctx; recipe = recipe) do
            forward!(ya, m, x, gamma, beta, W, b)
            forward!(yb, m2, x, gamma, beta, W, b)
        end
        @test ya == yb
        e = thrown(() -> load_state!(LayerNormLinear(ctx, nin, nout + 16), bytes))
        @test e isa LibTEError && occursin("te_layernorm_linear_state_load", e.message)

        # Errors: libte's naming the argument, and the Julia side's.
        e = thrown(() -> forward(m, x[1:32, :], gamma, beta, W, b))
        @test e isa LibTEError && e.status == TE_ERROR_INVALID_ARGUMENT &&
              occursin("te_layernorm_linear_forward: argument 'args->input'", e.message)
        e = thrown(() -> forward(m, x, gamma[1:32], beta, W, b))
        @test e isa LibTEError && occursin("'args->ln_weight'", e.message)
        e = thrown(() -> forward(m, x, gamma, beta, W, b; ln_out = zeros(Float32, nout, tokens)))
        @test e isa LibTEError && occursin("'args->ln_out'", e.message)
        _, bw = forward(m, x, gamma, beta, W, b)
        e = thrown(() -> backward!(bw, dy; dln_weight = zeros(Float32, nout)))
        @test e isa LibTEError && occursin("'grads->dln_weight'", e.message)
        e = autocast(() -> thrown(() -> forward(m, x[:, 1:10], gamma, beta, W, b)), ctx)
        @test e isa LibTEError && e.status == TE_ERROR_UNSUPPORTED
        e = thrown(() -> LayerNormLinear(ctx, nin, nout; eps = -1))
        @test e isa LibTEError && occursin("te_layernorm_linear_create", e.message) && occursin("eps", e.message)
        @test_throws ArgumentError forward(m, x, gamma, nothing, W, b)   # LayerNorm needs beta
        @test_throws ArgumentError forward(m, x, gamma, beta, W)         # the module has a bias
        @test_throws ArgumentError LayerNormLinear(ctx, nin, nout; normalization = :batchnorm)
        close(ctx)
    end

    @testset "LayerNormMLP vs a Float64 reference" begin
        ctx = Context()
        tokens, hidden, ffn = 32, 64, 96
        x = filled(hidden, tokens; seed = 41, scale = 2.5f0) .+ 0.5f0
        gamma = 1 .+ 0.5f0 .* filled(hidden; seed = 42)
        beta = 0.5f0 .* filled(hidden; seed = 43)
        dy = filled(hidden, tokens; seed = 44)
        params(rows) = (filled(hidden, rows; seed = 45, scale = 0.2f0), filled(rows; seed = 46, scale = 0.2f0),
                        filled(ffn, hidden; seed = 47, scale = 0.2f0), filled(hidden; seed = 48, scale = 0.2f0))
        # `local`: a closure assigning a name of the testset's scope would rebind that variable
        function chain(act, LN, W1, b1, W2, b2, dY)
            local h, a, y, dh, dx, dg, dbt
            h = Float64.(W1)' * LN .+ Float64.(b1)
            a = mod_act(act, h)
            y = Float64.(W2)' * a .+ Float64.(b2)
            dh = mod_act_backward(act, h, Float64.(W2) * dY)
            dx, dg, dbt = mod_norm_backward(:layernorm, Float64.(W1) * dh, x, gamma)
            return (h = h, a = a, y = y, dx = dx, dg = dg, dbt = dbt, dw1 = LN * dh', db1 = vec(sum(dh; dims = 2)),
                    dw2 = a * dY', db2 = vec(sum(dY; dims = 2)))
        end
        LN = mod_norm(:layernorm, x, gamma, beta)[1]
        for act in (:gelu, :relu, :srelu, :swiglu, :geglu)
            m = LayerNormMLP(ctx, hidden, ffn; activation = act)
            rows = m.fc1_rows
            @test rows == (gated_act(act) ? 2ffn : ffn)
            W1, b1, W2, b2 = params(rows)
            y = zeros(Float32, hidden, tokens)
            res = forward_compute!(y, m, x, gamma, beta, W1, b1, W2, b2)
            c = chain(act, LN, W1, b1, W2, b2, Float64.(dy))
            r = LibTE.residual_tensors(res)
            # fp32 throughout: GEMMs of 64 and 96 terms and the activation (tanh, exp within a
            # few ulps) within 1e-5 of the scale; the backward through the norm within 1e-4
            @test !r.fp8 && size(r.fc1_out) == (rows, tokens)
            @test close_to(r.fc1_out, c.h, 1e-5)
            @test close_to(r.act_out_t, c.a, 1e-5)
            @test close_to(y, c.y, 1e-5)
            bwd = forward_save(res, m)
            g = (dx = zeros(Float32, hidden, tokens), dg = zeros(Float32, hidden), dbt = zeros(Float32, hidden),
                 dw1 = zeros(Float32, hidden, rows), db1 = zeros(Float32, rows), dw2 = zeros(Float32, ffn, hidden),
                 db2 = zeros(Float32, hidden))
            backward!(bwd, dy; dx = g.dx, dln_weight = g.dg, dln_bias = g.dbt, dfc1_weight = g.dw1,
                      dfc1_bias = g.db1, dfc2_weight = g.dw2, dfc2_bias = g.db2)
            for k in keys(g)
                @test close_to(getfield(g, k), getfield(c, k), 1e-4)
            end
            dw2 = zeros(Float32, ffn, hidden)
            backward!(bwd, dy; dfc2_weight = dw2)
            @test dw2 == g.dw2
            close(bwd); close(m)
        end

        # FP8, delayed scaling: each GEMM on the operands libte quantized.
        m = LayerNormMLP(ctx, hidden, ffn; activation = :swiglu)
        W1, b1, W2, b2 = params(2ffn)
        y = zeros(Float32, hidden, tokens)
        res = autocast(() -> forward_compute!(y, m, x, gamma, beta, W1, b1, W2, b2), ctx; recipe = Recipe(:delayed))
        r = LibTE.residual_tensors(res)
        @test r.fp8 && size(r.act_out_t) == (tokens, ffn) && size(r.fc2_weight_t) == (hidden, ffn)
        lnq, w1q, aq, w2q = deq(ctx, r.ln_out_t)', deq(ctx, r.fc1_weight_t)', deq(ctx, r.act_out_t)',
                            deq(ctx, r.fc2_weight_t)'
        @test close_to(r.fc1_out, w1q' * lnq .+ Float64.(b1), 1e-5)
        A = mod_act(:swiglu, Float64.(r.fc1_out))   # of libte's own fc1 output, rounded to E4M3
        @test all(abs.(aq .- A) .<= abs.(A) ./ 16 .+ 1 / 1024 .+ 1e-6)
        @test close_to(y, w2q' * aq .+ Float64.(b2), 1e-5)
        bwd = forward_save(res, m)
        dy8 = e5m2_exact(hidden, tokens; seed = 49)
        dw2, db2, dx = zeros(Float32, ffn, hidden), zeros(Float32, hidden), zeros(Float32, hidden, tokens)
        backward!(bwd, dy8; dfc2_weight = dw2, dfc2_bias = db2, dx = dx)
        # fc2's wgrad reads dy and the activation's FP8 output only: exact up to fp32 sums
        @test close_to(dw2, aq * Float64.(dy8)', 1e-5)
        @test close_to(db2, vec(sum(Float64.(dy8); dims = 2)), 1e-6)
        # deeper, the activation's gradient is requantized to E5M2 (2 mantissa bits, about
        # 0.072 RMS): dx within 0.15 of the chain on the quantized forward operands
        c = chain(:swiglu, lnq, w1q, b1, w2q, b2, Float64.(dy8))
        @test relerr(dx, c.dx) < 0.15
        close(bwd)

        # Scaling states per GEMM and the state round trip.
        recipe = Recipe(:delayed; amax_history_len = 4)
        for step in 1:2
            bw = autocast(() -> forward!(y, m, x, gamma, beta, W1, b1, W2 .* step, b2), ctx; recipe = recipe)
            backward!(bw, dy; dx = dx, once = true)
        end
        info1, h1 = scaling_state(m, :fc1, TE_ROLE_WEIGHT; history = true)
        @test length(h1) == 4 && info1.scale ≈ 448 / maximum(abs, W1)
        @test scaling_state(m, LibTE.TE_MLP_FC2, TE_ROLE_WEIGHT)[1].scale ≈ 448 / maximum(abs, 2 .* W2)
        bytes = save_state(m)
        m2 = LayerNormMLP(ctx, hidden, ffn; activation = :swiglu)
        load_state!(m2, bytes)
        @test save_state(m2) == bytes
        for gemm in (:fc1, :fc2), role in (TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT)
            @test scaling_state(m, gemm, role; history = true) == scaling_state(m2, gemm, role; history = true)
        end
        e = thrown(() -> load_state!(LayerNormMLP(ctx, hidden, ffn + 16), bytes))
        @test e isa LibTEError && occursin("te_layernorm_mlp_state_load", e.message)

        # Errors.
        g1 = params(ffn)   # fc1 with ffn rows: a gated block needs 2ffn
        e = thrown(() -> forward(m, x, gamma, beta, g1...))
        @test e isa LibTEError && occursin("te_layernorm_mlp_forward: argument 'args->fc1_weight'", e.message)
        _, bw = forward(m, x, gamma, beta, W1, b1, W2, b2)
        e = thrown(() -> backward!(bw, dy; dfc2_weight = zeros(Float32, hidden, ffn)))
        @test e isa LibTEError && occursin("'grads->dfc2_weight'", e.message)
        @test_throws ArgumentError scaling_state(m, :fc3, TE_ROLE_INPUT)
        @test_throws ArgumentError LayerNormMLP(ctx, hidden, ffn; activation = :tanh)
        close(ctx)
    end

    @testset "GroupedLinear vs a Float64 reference" begin
        ctx = Context()
        E, nin, nout = 4, 64, 48
        Ws = [filled(nin, nout; seed = 50 + i, scale = 0.2f0) for i in 1:E]
        bs = [filled(nout; seed = 60 + i) for i in 1:E]
        # per expert: y_i = W_i' x_i + b_i over consecutive column groups
        function grouped_ref(x, splits, Wd, dY)
            local Y, DX, DW, DB, c, cols, X  # not the testset's variables of the same names
            Y, DX = zeros(nout, size(x, 2)), zeros(nin, size(x, 2))
            DW, DB = [zeros(nin, nout) for _ in 1:E], [zeros(nout) for _ in 1:E]
            c = 0
            for i in 1:E
                cols = c+1:c+splits[i]
                X = Float64.(x[:, cols])
                Y[:, cols] = Wd[i]' * X .+ Float64.(bs[i])
                DX[:, cols] = Wd[i] * dY[:, cols]
                DW[i] = X * dY[:, cols]'
                DB[i] = vec(sum(dY[:, cols]; dims = 2))
                c += splits[i]
            end
            return Y, DX, DW, DB
        end
        splits = [10, 0, 37, 17]   # uneven, an empty expert, not multiples of 16
        x = filled(nin, sum(splits); seed = 70, scale = 2.0f0)
        dy = filled(nout, sum(splits); seed = 71)
        m = GroupedLinear(ctx, E, nin, nout)
        y = zeros(Float32, nout, sum(splits))
        res = forward_compute!(y, m, x, splits, Ws, bs)
        @test !LibTE.residual_tensors(res).fp8
        Y, DX, DW, DB = grouped_ref(x, splits, [Float64.(w) for w in Ws], Float64.(dy))
        @test close_to(y, Y, 1e-5)   # fp32 sums of 64 terms
        bwd = forward_save(res, m)
        dx = zeros(Float32, nin, sum(splits))
        dw, db = [fill(7.0f0, nin, nout) for _ in 1:E], [fill(7.0f0, nout) for _ in 1:E]
        backward!(bwd, dy; dx = dx, dw = dw, db = db)
        @test close_to(dx, DX, 1e-5)
        for i in (1, 3, 4)
            @test close_to(dw[i], DW[i], 1e-5) && close_to(db[i], DB[i], 1e-5)
        end
        @test all(iszero, dw[2]) && all(iszero, db[2])   # the empty expert: written with zeros
        dx2 = zeros(Float32, nin, sum(splits))
        backward!(bwd, dy; dx = dx2)
        @test dx2 == dx

        # FP8: experts with multiples of 16 tokens are exactly te_linear's FP8 GEMMs, so the
        # same bytes as one Linear per expert over several steps (one autocast pass per Linear:
        # a pass's backward scales update after its first FP8 module's backward, and the grouped
        # module runs all its experts before its update).
        splits = [32, 0, 16, 48]
        recipe = Recipe(:delayed; amax_history_len = 4)
        m8 = GroupedLinear(ctx, E, nin, nout)
        lins = [Linear(ctx, nin, nout) for _ in 1:E]
        xs = filled(nin, sum(splits); seed = 72, scale = 2.0f0)
        same = true
        for step in 1:3
            xstep = xs .* step
            dys = filled(nout, sum(splits); seed = 73 + step)
            yg = zeros(Float32, nout, sum(splits))
            bg = autocast(() -> forward!(yg, m8, xstep, splits, Ws, bs), ctx; recipe = recipe)
            dxg = zeros(Float32, nin, sum(splits))
            dwg = [zeros(Float32, nin, nout) for _ in 1:E]
            backward!(bg, dys; dx = dxg, dw = dwg, once = true)
            c = 0
            for i in 1:E
                splits[i] == 0 && continue
                cols = c+1:c+splits[i]
                yi = zeros(Float32, nout, splits[i])
                bi = autocast(() -> forward!(yi, lins[i], xstep[:, cols], Ws[i], bs[i]), ctx; recipe = recipe)
                dxi, dwi = zeros(Float32, nin, splits[i]), zeros(Float32, nin, nout)
                backward!(bi, dys[:, cols]; dx = dxi, dw = dwi, once = true)
                same &= yg[:, cols] == yi && dxg[:, cols] == dxi && dwg[i] == dwi
                c += splits[i]
            end
        end
        @test same
        for i in (1, 3, 4), role in (TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_ROLE_GRAD_OUTPUT)
            @test scaling_state(m8, i, role; history = true) == scaling_state(lins[i], role; history = true)
        end
        @test scaling_state(m8, 2, TE_ROLE_INPUT)[1].amax_history_len == 0   # never used

        # FP8 with uneven splits (padded inside libte), against the unquantized formulas: E4M3
        # products near 0.05 relative (Frobenius), bound 0.08; E5M2 gradients, bound 0.15.
        splits = [5, 0, 40, 19]
        xu = filled(nin, sum(splits); seed = 80, scale = 2.0f0)
        dyu = filled(nout, sum(splits); seed = 81)
        yu, bu = autocast(() -> forward(m8, xu, splits, Ws, bs), ctx; recipe = Recipe(:current))
        Y, DX, DW, DB = grouped_ref(xu, splits, [Float64.(w) for w in Ws], Float64.(dyu))
        B = hcat([repeat(Float64.(bs[i]), 1, splits[i]) for i in 1:E]...)
        @test relerr(yu .- B, Y .- B) < 0.08
        dxu, dwu = zeros(Float32, nin, sum(splits)), [zeros(Float32, nin, nout) for _ in 1:E]
        backward!(bu, dyu; dx = dxu, dw = dwu)
        @test relerr(dxu, DX) < 0.15
        @test all(relerr(dwu[i], DW[i]) < 0.15 for i in (1, 3, 4))

        # State round trip.
        bytes = save_state(m8)
        m9 = GroupedLinear(ctx, E, nin, nout)
        load_state!(m9, bytes)
        @test save_state(m9) == bytes
        @test all(scaling_state(m8, i, TE_ROLE_GRAD_OUTPUT; history = true) ==
                  scaling_state(m9, i, TE_ROLE_GRAD_OUTPUT; history = true) for i in 1:E)
        e = thrown(() -> load_state!(GroupedLinear(ctx, E + 1, nin, nout), bytes))
        @test e isa LibTEError && occursin("te_grouped_linear_state_load", e.message)

        # Errors: libte's naming the argument; lengths (libte reads num_gemms entries of every
        # array) and 1-based experts checked in Julia.
        e = thrown(() -> forward(m, x, [10, 0, 37, 18], Ws, bs))
        @test e isa LibTEError && occursin("te_grouped_linear_forward: argument 'args->m_splits'", e.message)
        bad = copy(Ws)
        bad[3] = Ws[3][1:32, :]
        e = thrown(() -> forward(m, x, [10, 0, 37, 17], bad, bs))
        @test e isa LibTEError && occursin("'args->weights[2]'", e.message)
        _, bw = forward(m, x, [10, 0, 37, 17], Ws, bs)
        e = thrown(() -> backward!(bw, dy; dw = [zeros(Float32, nin, nout), zeros(Float32, nin, nout),
                                                zeros(Float32, nout, nin), zeros(Float32, nin, nout)]))
        @test e isa LibTEError && occursin("te_grouped_linear_backward: argument 'dw[2]'", e.message)
        @test_throws ArgumentError forward(m, x, [10, 54], Ws, bs)
        @test_throws ArgumentError forward(m, x, [10, 0, 37, 17], Ws[1:3], bs)
        @test_throws ArgumentError forward(m, x, [10, 0, 37, 17], Ws)      # the module has biases
        @test_throws ArgumentError backward!(bw, dy; dw = dw[1:2])
        @test_throws ArgumentError scaling_state(m, 0, TE_ROLE_INPUT)
        @test_throws ArgumentError GroupedLinear(ctx, 2000, nin, nout)
        close(ctx)
    end

    @testset "Attention vs a Float64 reference" begin
        dot64(a, b) = sum(Float64.(a) .* Float64.(b))
        visible(mask, i, j, sq, skv) = mask === :causal ? j <= i :
                                       mask === :causal_bottom_right ? j <= i + skv - sq : true
        # q, dO: d × H × Tq; k, v: d × G × Tkv; seqs: (first query row, queries, first key row,
        # keys), 0-based rows. Returns O, dQ, dK, dV.
        function attn_ref(q, k, v, dO, seqs, mask, scale)
            # (a closure in the testset's scope: without `local` these would rebind its variables)
            local d, H, G, grp, o, dq, dk, dv, g, js, qi, doi, s, p, dp, D, j, ds
            d, H, _ = size(q)
            G = size(k, 2)
            grp = H ÷ G
            o, dq = zeros(size(q)), zeros(size(q))
            dk, dv = zeros(size(k)), zeros(size(k))
            for (q0, sq, k0, skv) in seqs, h in 1:H
                g = (h - 1) ÷ grp + 1
                for i in 0:sq-1
                    js = [j for j in 0:skv-1 if visible(mask, i, j, sq, skv)]
                    isempty(js) && continue
                    qi, doi = Float64.(q[:, h, q0+i+1]), Float64.(dO[:, h, q0+i+1])
                    s = [scale * dot64(qi, k[:, g, k0+j+1]) for j in js]
                    p = exp.(s .- maximum(s))
                    p ./= sum(p)
                    dp = [dot64(doi, v[:, g, k0+j+1]) for j in js]
                    D = sum(p .* dp)
                    for n in 1:length(js)
                        j = js[n]
                        o[:, h, q0+i+1] .+= p[n] .* v[:, g, k0+j+1]
                        ds = p[n] * (dp[n] - D)
                        dq[:, h, q0+i+1] .+= scale * ds .* k[:, g, k0+j+1]
                        dk[:, g, k0+j+1] .+= scale * ds .* qi
                        dv[:, g, k0+j+1] .+= p[n] .* doi
                    end
                end
            end
            return o, dq, dk, dv
        end
        tokens(A) = reshape(A, size(A, 1), size(A, 2), :)  # BSHD -> d × heads × (seq·batch)

        ctx = Context()
        H, G, d = 8, 2, 16
        @test LibTE.TensorView(Int32[0, 3, 5]).t.dtype == LibTE.TE_DTYPE_I32
        @test LibTE.shape(LibTE.TensorView(zeros(Int32, 4, 2))) == (2, 4)

        # BSHD, causal, GQA 8/2: batch 2, seq 12.
        B, S = 2, 12
        q, k, v = filled(d, H, S, B; seed = 1), filled(d, G, S, B; seed = 2), filled(d, G, S, B; seed = 3)
        dO = filled(d, H, S, B; seed = 4, scale = 0.5f0)
        m = Attention(ctx, H, d; num_kv_heads = G, mask = :causal)
        @test occursin("causal", sprint(show, m))
        o, bwd = forward(m, q, k, v)
        dq, dk, dv = zeros(Float32, size(q)), zeros(Float32, size(k)), zeros(Float32, size(v))
        backward!(bwd, dO; dq = dq, dk = dk, dv = dv)
        dq2, dk2, dv2 = zeros(Float32, size(q)), zeros(Float32, size(k)), zeros(Float32, size(v))
        backward!(bwd, dO; dq = dq2, dk = dk2, dv = dv2)
        @test dq == dq2 && dk == dk2 && dv == dv2   # backward twice: identical
        seqs = [(b * S, S, b * S, S) for b in 0:B-1]
        ro, rdq, rdk, rdv = attn_ref(tokens(q), tokens(k), tokens(v), tokens(dO), seqs, :causal, 1 / sqrt(d))
        @test relerr(tokens(o), ro) < 1e-5
        @test relerr(tokens(dq), rdq) < 1e-5
        @test relerr(tokens(dk), rdk) < 1e-5
        @test relerr(tokens(dv), rdv) < 1e-5
        backward!(bwd, dO; dv = dv2, once = true)
        @test dv2 == dv
        e = thrown(() -> backward!(bwd, dO; dv = dv2))
        @test e isa LibTEError && e.status == TE_ERROR_INVALID_STATE
        @test startswith(e.message, "te_attention_backward")
        close(bwd)

        # THD, lengths 1, 17, 33 (queries and keys), GQA 8/2, causal and bottom-right.
        lens = [1, 17, 33]
        T = sum(lens)
        cu = Int32[0, 1, 18, 51]
        qt, kt, vt = filled(d, H, T; seed = 5), filled(d, G, T; seed = 6), filled(d, G, T; seed = 7)
        dOt = filled(d, H, T; seed = 8, scale = 0.5f0)
        seqs = [(Int(cu[b]), lens[b], Int(cu[b]), lens[b]) for b in 1:3]
        for mask in (:causal, :none)
            mt = Attention(ctx, H, d; num_kv_heads = G, mask = mask)
            ot = zeros(Float32, size(qt))
            bt = forward!(ot, mt, qt, kt, vt; cu_seqlens_q = cu, cu_seqlens_kv = cu, max_seqlen_q = 33,
                          max_seqlen_kv = 33)
            g = (zeros(Float32, size(qt)), zeros(Float32, size(kt)), zeros(Float32, size(vt)))
            backward!(bt, dOt; dq = g[1], dk = g[2], dv = g[3])
            r = attn_ref(qt, kt, vt, dOt, seqs, mask, 1 / sqrt(d))
            @test relerr(ot, r[1]) < 1e-5
            @test all(relerr(g[i], r[i+1]) < 1e-5 for i in 1:3)
            close(bt)
            close(mt)
        end

        # Split forward: residuals (LSE heads × tokens), forward_save.
        res = forward_compute!(similar(q), m, q, k, v)
        rt = LibTE.residual_tensors(res)
        @test !rt.fp8 && size(rt.lse) == (H, S * B) && rt.q == q && rt.o == o
        lse_ref = log(sum(exp(dot64(q[:, 1, 3, 1], k[:, 1, j, 1]) / sqrt(d)) for j in 1:3))
        @test abs(rt.lse[1, 3] - lse_ref) < 1e-5
        b2 = forward_save(res, m)
        @test !isopen(res)
        dq3 = zeros(Float32, size(q))
        backward!(b2, dO; dq = dq3)
        @test dq3 == dq
        close(b2)

        # Residuals in caller memory, THD.
        mt = Attention(ctx, H, d; num_kv_heads = G, mask = :causal)
        kw = (cu_seqlens_q = cu, cu_seqlens_kv = cu, max_seqlen_q = 33, max_seqlen_kv = 33)
        n = residuals_size(mt, qt, kt, vt; kw...)
        @test n >= 4 * H * T
        mem = zeros(UInt8, n)
        o1, o2 = zeros(Float32, size(qt)), zeros(Float32, size(qt))
        forward_compute_into!(o1, mt, qt, kt, vt, mem; kw...)
        bt = forward!(o2, mt, qt, kt, vt; kw...)
        @test o1 == o2
        g1 = (zeros(Float32, size(qt)), zeros(Float32, size(kt)), zeros(Float32, size(vt)))
        g2 = (zeros(Float32, size(qt)), zeros(Float32, size(kt)), zeros(Float32, size(vt)))
        backward!(bt, dOt; dq = g1[1], dk = g1[2], dv = g1[3])
        backward_from!(mt, qt, kt, vt, o1, mem, dOt; dq = g2[1], dk = g2[2], dv = g2[3], kw...)
        @test g1 == g2
        backward_from!(mt, qt, kt, vt, o1, mem, dOt; dq = g2[1], dk = g2[2], dv = g2[3], kw...)
        @test g1 == g2
        e = thrown(() -> forward_compute_into!(o1, mt, qt, kt, vt, mem[1:n-16]; kw...))
        @test e isa LibTEError && startswith(e.message, "te_attention_forward_compute_into")
        @test_throws ArgumentError forward!(o1, mt, qt, kt, vt; cu_seqlens_q = cu)
        close(bt)

        # State round trip, scaling states.
        st = save_state(m)
        m2 = Attention(ctx, H, d; num_kv_heads = G, mask = :causal)
        load_state!(m2, st)
        @test save_state(m2) == st
        info, hist = scaling_state(m, LibTE.TE_ATTN_Q; history = true)
        @test info.scale == 1.0f0

        # FP8 (current scaling): E4M3 residuals, close to the reference.
        m8 = Attention(ctx, H, d; num_kv_heads = G, mask = :causal, fp8 = true)
        @test occursin("fp8", sprint(show, m8))
        o8, dq8 = zeros(Float32, size(q)), zeros(Float32, size(q))
        b8 = autocast(ctx; recipe = Recipe(:current)) do
            res8 = forward_compute!(o8, m8, q, k, v)
            rt8 = LibTE.residual_tensors(res8)
            @test rt8.fp8 && rt8.q isa LibTE.Float8Array
            forward_save(res8, m8)
        end
        backward!(b8, dO; dq = dq8)
        r8 = attn_ref(tokens(q), tokens(k), tokens(v), tokens(dO), [(b * S, S, b * S, S) for b in 0:B-1],
                      :causal, 1 / sqrt(d))
        @test relerr(tokens(o8), r8[1]) < 0.15
        @test relerr(tokens(dq8), r8[2]) < 0.15
        close(b8)

        # Bad input: LibTEError naming the function.
        e = thrown(() -> Attention(ctx, 4, 12))
        @test e isa LibTEError && e.status == TE_ERROR_INVALID_ARGUMENT
        @test startswith(e.message, "te_attention_create")
        e = thrown(() -> forward(m, Float16.(q), Float16.(k), Float16.(v)))
        @test e isa LibTEError && startswith(e.message, "te_attention_forward")
        e = thrown(() -> forward!(zeros(Float32, size(qt)), mt, qt, kt, vt; cu_seqlens_q = Int32[0, 1, 18, 50],
                                  cu_seqlens_kv = cu, max_seqlen_q = 33, max_seqlen_kv = 33))
        @test e isa LibTEError && startswith(e.message, "te_attention_forward")
        @test_throws ArgumentError Attention(ctx, H, d; mask = :sideways)
        close(ctx)
    end

    @testset "RoPE: forward then backward is the identity" begin
        ctx = Context()
        d, H = 32, 4
        angles(P, rot) = Float32[p * 10000.0^(-2 * (kk - 1) / rot) for kk in 1:rot÷2, p in 0:P-1]
        for (rot, il) in ((0, false), (0, true), (16, false))
            rd = rot == 0 ? d : rot
            f = angles(40, rd)
            x = filled(d, H, 12, 2; seed = 11)
            y = rope_forward(ctx, x, f; rot_dim = rot, interleaved = il)
            # Against Float64 at token (position 5, batch 2), head 3.
            half = rd ÷ 2
            for kk in 1:half
                i1, i2 = il ? (2kk - 1, 2kk) : (kk, kk + half)
                a = Float64(f[kk, 6])
                x1, x2 = Float64(x[i1, 3, 6, 2]), Float64(x[i2, 3, 6, 2])
                @test abs(y[i1, 3, 6, 2] - (x1 * cos(a) - x2 * sin(a))) < 1e-5
                @test abs(y[i2, 3, 6, 2] - (x2 * cos(a) + x1 * sin(a))) < 1e-5
            end
            rd < d && @test y[rd+1:end, :, :, :] == x[rd+1:end, :, :, :]
            back = rope_backward(ctx, y, f; rot_dim = rot, interleaved = il)
            @test maximum(abs.(back .- x)) < 1e-6
            # in place equals out of place
            z = copy(x)
            rope_forward!(z, ctx, z, f; rot_dim = rot, interleaved = il)
            @test z == y
            # THD: lengths 1, 17, 5; positions restart in every sequence
            xt = filled(d, H, 23; seed = 12)
            cu = Int32[0, 1, 18, 23]
            yt = rope_forward(ctx, xt, f; cu_seqlens = cu, rot_dim = rot, interleaved = il)
            # the first token of every sequence is at position 0 (angle 0: copied exactly)
            @test yt[:, :, [1, 2, 19]] == xt[:, :, [1, 2, 19]]
            # token 20 is at position 1 of the third sequence
            for kk in 1:half
                i1, i2 = il ? (2kk - 1, 2kk) : (kk, kk + half)
                a = Float64(f[kk, 2])
                x1, x2 = Float64(xt[i1, 2, 20]), Float64(xt[i2, 2, 20])
                @test abs(yt[i1, 2, 20] - (x1 * cos(a) - x2 * sin(a))) < 1e-5
                @test abs(yt[i2, 2, 20] - (x2 * cos(a) + x1 * sin(a))) < 1e-5
            end
            bt = rope_backward(ctx, yt, f; cu_seqlens = cu, rot_dim = rot, interleaved = il)
            @test maximum(abs.(bt .- xt)) < 1e-6
        end
        e = thrown(() -> rope_forward(ctx, filled(16, 2, 4, 1), angles(4, 16); rot_dim = 7))
        @test e isa LibTEError && e.status == TE_ERROR_INVALID_ARGUMENT && startswith(e.message, "te_rope_forward")
        e = thrown(() -> rope_backward(ctx, filled(16, 2, 8, 1), angles(4, 16)))
        @test e isa LibTEError && startswith(e.message, "te_rope_backward")
        close(ctx)
    end

    include("training.jl")
    include("checkpoint.jl")

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
