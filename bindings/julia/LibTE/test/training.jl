# Included by runtests.jl (inside its "LibTE" testset; `filled`, `thrown` and `relerr` come from
# there): the training-step ops and AdamW against Float64 references written here.

# The LibTEError f() throws, checked to be INVALID_ARGUMENT naming `func`.
function invalid_arg(f, func)
    e = thrown(f)
    return e isa LibTEError && e.status == TE_ERROR_INVALID_ARGUMENT && startswith(e.message, func)
end

@testset "add, split_columns, concat_columns" begin
    ctx = Context()
    a = filled(40, 6; seed = 1)
    b = filled(40, 6; seed = 2, scale = 1.0f-3)
    y = add(ctx, a, b)
    # one fp32 rounding of the exact sum (Float64 holds the sum of two Float32s exactly)
    @test y == Float32.(Float64.(a) .+ Float64.(b))
    acc = copy(a)
    add!(acc, ctx, acc, b)                       # in place
    @test acc == y
    ah, bh = Float16.(a), Float16.(b)
    @test add(ctx, ah, bh) == Float16.(Float32.(ah) .+ Float32.(bh))
    yb = fill(7.0f0, 40, 6)
    @test invalid_arg(() -> add!(yb, ctx, a, filled(40, 5)), "te_add")
    @test all(yb .== 7.0f0)

    # libte columns are the Julia first dimension: x is (3 + 8 + 1 + 4) × 5 × 2
    sizes = [3, 8, 1, 4]
    x = filled(sum(sizes), 5, 2; seed = 3)
    parts = split_columns(ctx, x, sizes)
    offs = cumsum([0; sizes])
    @test length(parts) == 4
    @test all(parts[i] == x[offs[i]+1:offs[i+1], :, :] for i in 1:4)
    @test concat_columns(ctx, parts) == x
    @test concat_columns(ctx, [reshape(p, size(p, 1), 10) for p in parts]) == reshape(x, 16, 10)
    # sizes that do not add up: nothing written
    outs = [fill(5.0f0, 3, 5, 2), fill(5.0f0, 12, 5, 2)]
    @test invalid_arg(() -> split_columns!(outs, ctx, x), "te_split_columns")
    @test all(all(o .== 5.0f0) for o in outs)
    @test invalid_arg(() -> split_columns!(Any[], ctx, x), "te_split_columns")
    @test invalid_arg(() -> concat_columns!(zeros(Float32, 16, 10), ctx, [parts[1], filled(13, 9)]), "te_concat_columns")
end

@testset "embedding forward/backward" begin
    ctx = Context()
    dim, vocab = 6, 11
    table = filled(dim, vocab; seed = 7)
    ids = Int32[3 7; 0 3; 10 1; 3 0]            # 4 × 2 Julia = libte [2, 4], 0-based, repeats
    y = embedding_forward(ctx, table, ids)
    @test size(y) == (dim, 4, 2)
    @test all(y[:, i, j] == table[:, ids[i, j] + 1] for i in 1:4, j in 1:2)

    dy = filled(dim, 8; seed = 8)
    want = zeros(Float64, dim, vocab)
    for (t, id) in enumerate(vec(ids))
        want[:, id + 1] .+= dy[:, t]
    end
    dtable = fill(9.0f0, dim, vocab)              # zeroed first without accumulate
    embedding_backward!(dtable, ctx, ids, dy)
    @test relerr(dtable, want) < 1e-6
    @test all(dtable[:, [3, 5, 6, 7, 9, 10]] .== 0)
    base = filled(dim, vocab; seed = 9)
    acc = copy(base)
    embedding_backward!(acc, ctx, vec(ids), dy; accumulate = true)
    @test relerr(acc, want .+ base) < 1e-6

    for bad in (Int32(11), Int32(-1))
        yy = fill(3.0f0, dim, 3)
        @test invalid_arg(() -> embedding_forward!(yy, ctx, table, Int32[0, bad, 2]), "te_embedding_forward")
        @test all(yy .== 3.0f0)
        dt = fill(3.0f0, dim, vocab)
        @test invalid_arg(() -> embedding_backward!(dt, ctx, Int32[0, bad, 2], filled(dim, 3)), "te_embedding_backward")
        @test all(dt .== 3.0f0)
    end
end

# Mean loss and dlogits (vocab × n) in Float64.
function ce_reference(logits, targets, ignore, scale)
    vocab, n = size(logits)
    count = sum(targets .!= ignore)
    loss = 0.0
    d = zeros(Float64, vocab, n)
    for t in 1:n
        targets[t] == ignore && continue
        row = Float64.(logits[:, t])
        m = maximum(row)
        lse = m + log(sum(exp.(row .- m)))
        loss += lse - row[targets[t] + 1]
        p = exp.(row .- lse)
        p[targets[t] + 1] -= 1
        d[:, t] = scale .* p ./ count
    end
    return (count == 0 ? 0.0 : loss / count), d
end

@testset "cross_entropy vs a Float64 reference" begin
    ctx = Context()
    vocab, n = 33, 7
    logits = filled(vocab, n; seed = 10, scale = 30.0f0) .+ 50.0f0   # the row max is subtracted
    targets = Int32[4, -100, 0, 32, 17, -100, 9]
    wl, wd = ce_reference(logits, targets, -100, 0.25)
    d = fill(1.0f0, vocab, n)
    loss = cross_entropy!(zeros(Float32, 1), ctx, logits, targets; dlogits = d, grad_scale = 0.25)
    @test abs(loss[1] - wl) <= 1e-5 * abs(wl)
    @test relerr(d, wd) < 1e-5
    @test all(d[:, 2] .== 0)
    @test cross_entropy(ctx, logits, targets) == loss[1]            # loss only
    inplace = copy(logits)
    @test cross_entropy(ctx, inplace, targets; dlogits = inplace, grad_scale = 0.25) == loss[1]
    @test inplace == d
    t2 = Int32[-1, 2, -1, 5, 6, 7, -1]
    wl2, wd2 = ce_reference(logits, t2, -1, 1.0)
    @test abs(cross_entropy(ctx, logits, t2; dlogits = d, ignore_index = -1) - wl2) <= 1e-5 * abs(wl2)
    @test relerr(d, wd2) < 1e-5
    @test cross_entropy(ctx, logits, fill(Int32(-100), n); dlogits = d) == 0
    @test all(d .== 0)

    l = fill(5.0f0, 1)
    dd = fill(5.0f0, vocab, n)
    @test invalid_arg(() -> cross_entropy!(l, ctx, logits, Int32[1, 33, 2, 3, 4, 5, 6]; dlogits = dd), "te_cross_entropy")
    @test l[1] == 5.0f0 && all(dd .== 5.0f0)
    @test invalid_arg(() -> cross_entropy!(l, ctx, logits, Int32[1, 2]), "te_cross_entropy")
end

@testset "AdamW vs a Float64 reference" begin
    ctx = Context()
    opt = AdamW(lr = 0.01, beta1 = 0.8, beta2 = 0.95, eps = 1e-6, weight_decay = 0.1, max_grad_norm = 0.5)
    @test AdamW().lr == 1.0f-3 && AdamW().beta2 == 0.999f0 && AdamW().weight_decay == 0.01f0
    p1, p2 = filled(8, 6; seed = 20), filled(7; seed = 21)
    g1, g2 = zeros(Float32, 8, 6), zeros(Float32, 7)
    mw = zeros(Float16, 8, 6)
    a1 = add_param!(opt, p1, g1; model_weight = mw)
    a2 = add_param!(opt, p2, g2; weight_decay = false)
    ref = [(p = Float64.(p1), m = zeros(8, 6), v = zeros(8, 6), decay = true),
           (p = Float64.(p2), m = zeros(7), v = zeros(7), decay = false)]
    for step in 1:4
        g1 .= filled(8, 6; seed = 100step)
        g2 .= filled(7; seed = 100step + 1)
        gs = (g1, g2)
        nrm = sqrt(sum(sum(Float64.(g) .^ 2) for g in gs))
        clip = min(1.0, 0.5 / (nrm + 1e-6))
        b1, b2, lr, wd, ep = 0.8, 0.95, 0.01, 0.1, 1e-6
        for (r, g) in zip(ref, gs)
            gg = Float64.(g) .* clip
            r.decay && (r.p .-= lr * wd .* r.p)
            r.m .= b1 .* r.m .+ (1 - b1) .* gg
            r.v .= b2 .* r.v .+ (1 - b2) .* gg .^ 2
            r.p .-= lr .* (r.m ./ (1 - b1^step)) ./ (sqrt.(r.v ./ (1 - b2^step)) .+ ep)
        end
        @test opt.next_step == step
        got = step!(opt, ctx)
        @test abs(got - nrm) <= 1e-5 * nrm
        @test relerr(p1, ref[1].p) < 2e-6 && relerr(p2, ref[2].p) < 2e-6
        @test relerr(a1.exp_avg, ref[1].m) < 2e-6 && relerr(a2.exp_avg_sq, ref[2].v) < 2e-6
        @test mw == Float16.(p1)
    end
    @test opt.next_step == 5

    # Bad options: an error naming te_adamw_step, nothing changed, the step number kept.
    before = (copy(p1), copy(a1.exp_avg), copy(a1.exp_avg_sq))
    for (field, value) in ((:lr, -1.0f0), (:beta1, 1.0f0), (:eps, 0.0f0), (:weight_decay, -0.1f0))
        bad = deepcopy(opt)
        setfield!(bad, field, value)
        @test invalid_arg(() -> step!(bad, ctx), "te_adamw_step")
        @test bad.next_step == 5
    end
    @test invalid_arg(() -> step!(opt, ctx; step = 0), "te_adamw_step")
    short = AdamW()
    add_param!(short, p1, filled(47))
    @test invalid_arg(() -> step!(short, ctx), "te_adamw_step")
    @test (p1, a1.exp_avg, a1.exp_avg_sq) == before
    @test opt.next_step == 5
    @test_throws ArgumentError add_param!(AdamW(), p1, g1; owner = "not a module")
    @test_throws ArgumentError step!(AdamW(), ctx)
end

@testset "AdamW refreshes an owner's FP8 weight cache" begin
    # After an FP8 forward, a step naming the layer as owner re-quantizes its FP8 weight: a
    # forward with weight_unchanged = true then equals one that casts the new weight. Without
    # the owner the cache is stale and they differ (so the test can fail).
    r = Recipe(:delayed)
    T, IN, OUT = 16, 32, 32
    for with_owner in (true, false)
        ctx = Context()
        lin = Linear(ctx, IN, OUT; bias = false)
        x = filled(IN, T; seed = 1)
        W = filled(IN, OUT; seed = 2, scale = 0.1f0)
        y = zeros(Float32, OUT, T)
        autocast(ctx; recipe = r) do
            forward!(y, lin, x, W)
        end
        opt = AdamW(lr = 0.05)
        g = filled(IN, OUT; seed = 3)
        with_owner ? add_param!(opt, W, g; owner = lin) : add_param!(opt, W, g)
        step!(opt, ctx)
        y_cached, y_cast = zeros(Float32, OUT, T), zeros(Float32, OUT, T)
        autocast(ctx; recipe = r) do
            forward!(y_cached, lin, x, W; weight_unchanged = true)
            forward!(y_cast, lin, x, W)
        end
        @test (y_cached == y_cast) == with_owner
    end
    # An owner whose weight has another shape, or a LayerNormMLP's wrong gemm, is refused.
    ctx = Context()
    mlp = LayerNormMLP(ctx, 16, 32; bias = false)       # fc1: libte [32, 16] = Julia 16 × 32
    lin = Linear(ctx, 16, 8; bias = false)
    W1 = filled(16, 32)
    for (owner, gemm) in ((mlp, :fc2), (lin, nothing))
        opt = AdamW()
        add_param!(opt, W1, filled(16, 32; seed = 4); owner = owner, gemm = gemm)
        @test invalid_arg(() -> step!(opt, ctx), "te_adamw_step")
    end
    @test W1 == filled(16, 32)
    opt = AdamW()
    add_param!(opt, W1, filled(16, 32; seed = 4); owner = mlp, gemm = :fc1)
    step!(opt, ctx)
    @test W1 != filled(16, 32)
    @test_throws ArgumentError add_param!(opt, W1, W1; owner = mlp)   # an MLP needs its gemm
end
