# LibTE.jl tests: `julia --project=bindings/julia/LibTE -e 'using Pkg; Pkg.test()'` with libte on
# the loader's path or LIBTE_PATH=/path/to/libte.so.0.
#
# NOTE: no Julia runtime could be installed on the project's machines, so this file has not been
# run there. What does run there is test/check_abi.py (through scripts/test_julia.sh): the
# generated wrappers against the C compiler and the built library.
using Test
using LinearAlgebra
using LibTE
using LibTE: te_autocast_state, TE_SUCCESS, TE_ERROR_INVALID_ARGUMENT, TE_ERROR_INVALID_STATE,
             TE_ERROR_UNSUPPORTED, TE_RECIPE_DELAYED_SCALING, TE_RECIPE_CURRENT_SCALING,
             TE_RECIPE_BLOCK_SCALING, TE_FORMAT_HYBRID, TE_FORMAT_E4M3, TE_DTYPE_F32, TE_DTYPE_E4M3,
             TE_ROLE_INPUT, TE_ROLE_WEIGHT, TE_DEVICE_CPU, TE_VERSION_NUMBER, TE_API_FUNCTIONS

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

relerr(a, b) = norm(Float64.(a) .- Float64.(b)) / max(norm(Float64.(b)), eps())

@testset "LibTE" begin
    @testset "library and generated wrappers" begin
        @test LibTE.version() == VersionNumber(TE_VERSION_NUMBER ÷ 10000, (TE_VERSION_NUMBER ÷ 100) % 100,
                                               TE_VERSION_NUMBER % 100)
        @test LibTE.te_version() == TE_VERSION_NUMBER
        @test LibTE.status_string(TE_ERROR_INVALID_ARGUMENT) == "TE_ERROR_INVALID_ARGUMENT"
        @test length(TE_API_FUNCTIONS) == 57
        @test all(f -> isdefined(LibTE, f), TE_API_FUNCTIONS)
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
