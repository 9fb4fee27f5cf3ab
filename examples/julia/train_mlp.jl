# train_mlp.jl: train a small MLP in FP8 with LibTE.jl, and check it against FP32.
# The Julia twin of examples/c/train_mlp.c (same model, data, seeds, optimiser and verdict).
#
#   model   Linear(64 -> 256) -> GELU -> Linear(256 -> 16), MSE loss
#   task    regress the outputs of a fixed random "teacher" MLP on Gaussian inputs
#   optim   SGD with momentum on Float32 master weights kept here
#
# The model is trained twice from the same initial weights on the same batches: once with every
# forward inside an FP8 autocast scope (delayed scaling, HYBRID: E4M3 forward, E5M2 gradients),
# once with the scope disabled, so the only difference between the two loss curves is FP8.
#
# Usage:   LIBTE_PATH=build/release/libte.so.0 \
#            julia --project=bindings/julia/LibTE examples/julia/train_mlp.jl [loss.csv]
# Exit:    0  FP8 converged: final loss far below the initial loss and within 10% of FP32's
#          1  it did not
#          2  a libte call (or the CSV file) failed
#
# Layout: Julia arrays are column-major, libte tensors row-major, and LibTE describes a Julia
# array with its dimensions reversed. So a batch is a Julia IN × BATCH matrix (one column per
# sample; libte sees [BATCH, IN]), and a weight is IN × OUT (libte's [OUT, IN]): in Julia terms
# the layer computes y = W' * x .+ b. The bytes are exactly those of the C demo's row-major
# arrays, so the two programs see the same numbers.
#
# scripts/test_julia.sh runs it on Julia 1.5.3 and checks that its loss curve equals the C demo's.

using LibTE
using LibTE: TE_RECIPE_DELAYED_SCALING, TE_FORMAT_HYBRID, TE_ACTIVATION_GELU, TE_DEVICE_CPU

# FP8 GEMMs need every dimension, the token count included, to be a multiple of 16.
const IN, HIDDEN, OUT, BATCH = 64, 256, 16, 128
const STEPS, LOG_EVERY = 600, 50
const FINAL_WINDOW = 20  # "final loss" = mean over the last this-many steps: one batch is noisy
const LEARNING_RATE = 0.5f0
const MOMENTUM = 0.9f0
const CONVERGED_FRACTION = 0.1  # converged = final loss at most this fraction of the initial...
const FP8_TOLERANCE = 0.10      # ...and within this relative distance of FP32's
const TEACHER_SEED, INIT_SEED, DATA_SEED = UInt64(1), UInt64(2), UInt64(3)

# ---- the C demo's fixed-seed RNG (splitmix64 + Box-Muller), so both programs see the same data

mutable struct Rng
    state::UInt64
end

function splitmix64(r::Rng)
    r.state += 0x9E3779B97F4A7C15  # UInt64 arithmetic wraps, as in C
    z = r.state
    z = (z ⊻ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ⊻ (z >> 27)) * 0x94D049BB133111EB
    return z ⊻ (z >> 31)
end

# Uniform in (0, 1]: never 0, so log() below is finite.
uniform01(r::Rng) = (Float64(splitmix64(r) >> 11) + 1.0) * 0x1.0p-53

# Box-Muller; the second variate is dropped to keep the state a single integer.
function normal(r::Rng, stddev::Float32)
    u1 = uniform01(r)
    u2 = uniform01(r)
    return Float32(Float64(stddev) * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2))
end

# Fills A in memory order, as the C demo fills its row-major arrays.
function fill_normal!(r::Rng, A::Array{Float32}, stddev::Float32)
    for i in eachindex(A)
        A[i] = normal(r, stddev)
    end
    return A
end

# ---- parameters -------------------------------------------------------------------------------

struct Params
    w1::Matrix{Float32}  # IN × HIDDEN   (libte's [HIDDEN, IN])
    b1::Vector{Float32}  # HIDDEN
    w2::Matrix{Float32}  # HIDDEN × OUT  (libte's [OUT, HIDDEN])
    b2::Vector{Float32}  # OUT
end

Params() = Params(zeros(Float32, IN, HIDDEN), zeros(Float32, HIDDEN), zeros(Float32, HIDDEN, OUT), zeros(Float32, OUT))
arrays(p::Params) = (p.w1, p.b1, p.w2, p.b2)
Base.copy(p::Params) = Params(copy(p.w1), copy(p.b1), copy(p.w2), copy(p.b2))

# Variance 1/fan_in keeps activations near unit scale through both layers.
function init_params(seed::UInt64)
    r = Rng(seed)
    p = Params()
    fill_normal!(r, p.w1, 1.0f0 / sqrt(Float32(IN)))
    fill_normal!(r, p.w2, 1.0f0 / sqrt(Float32(HIDDEN)))
    return p
end

# ---- the task ---------------------------------------------------------------------------------

# Same tanh approximation as TE_ACTIVATION_GELU.
function gelu(x::Float32)
    k = 0.7978845608028654f0  # sqrt(2/pi)
    return 0.5f0 * x * (1.0f0 + tanh(k * (x + 0.044715f0 * x * x * x)))
end

# The teacher: a fixed random MLP of the same shape, evaluated here in plain Float32, never
# through libte. Its weights have the C demo's bytes: C's w1[IN][HIDDEN] is Julia's HIDDEN × IN.
struct Teacher
    w1::Matrix{Float32}  # HIDDEN × IN
    w2::Matrix{Float32}  # OUT × HIDDEN
end

function init_teacher(seed::UInt64)
    r = Rng(seed)
    w1 = fill_normal!(r, zeros(Float32, HIDDEN, IN), 1.0f0 / sqrt(Float32(IN)))
    w2 = fill_normal!(r, zeros(Float32, OUT, HIDDEN), 1.0f0 / sqrt(Float32(HIDDEN)))
    return Teacher(w1, w2)
end

function teacher_forward!(target::Matrix{Float32}, t::Teacher, x::Matrix{Float32})
    hidden = zeros(Float32, HIDDEN)
    for n in 1:BATCH
        fill!(hidden, 0.0f0)
        for i in 1:IN, j in 1:HIDDEN
            hidden[j] += x[i, n] * t.w1[j, i]
        end
        for o in 1:OUT
            target[o, n] = 0.0f0
        end
        for j in 1:HIDDEN
            a = gelu(hidden[j])
            for o in 1:OUT
                target[o, n] += a * t.w2[o, j]
            end
        end
    end
    return target
end

# A fresh batch every step, so the loss measures generalisation, not memorisation.
function next_batch!(x, target, data::Rng, teacher::Teacher)
    fill_normal!(data, x, 1.0f0)
    teacher_forward!(target, teacher, x)
end

# Mean squared error, and its gradient with respect to y.
function mse_loss!(dy, y, target)
    n = length(y)
    s = 0.0
    for i in eachindex(y)
        diff = y[i] - target[i]
        s += Float64(diff) * diff
        dy[i] = 2.0f0 * diff / Float32(n)
    end
    return s / n
end

# ---- training -------------------------------------------------------------------------------

# Trains from `init` for STEPS steps; returns each step's loss (before its update). With
# use_fp8 = false the very same code runs with the autocast scope disabled.
function train(ctx::Context, recipe::Recipe, use_fp8::Bool, init::Params, teacher::Teacher)
    # Fresh layers per run: a Linear carries its FP8 scaling history.
    # F32 activations in both runs keep FP8 the only difference between them.
    fc1 = Linear(ctx, IN, HIDDEN; activation_dtype = Float32)
    fc2 = Linear(ctx, HIDDEN, OUT; activation_dtype = Float32)

    w = copy(init)                                 # Float32 master weights
    g = Params()                                   # their gradients
    velocity = Params()
    x, target = zeros(Float32, IN, BATCH), zeros(Float32, OUT, BATCH)
    h, a = zeros(Float32, HIDDEN, BATCH), zeros(Float32, HIDDEN, BATCH)  # fc1 output, GELU output
    y, dy = zeros(Float32, OUT, BATCH), zeros(Float32, OUT, BATCH)
    da, dh = zeros(Float32, HIDDEN, BATCH), zeros(Float32, HIDDEN, BATCH)
    losses = zeros(Float64, STEPS)

    data = Rng(DATA_SEED)  # both runs replay the same batches
    for step in 1:STEPS
        next_batch!(x, target, data, teacher)

        # Forward inside the scope: when it ends, libte updates the forward scales (inputs and
        # weights) from this step's amaxes, for the next step to use. weight_unchanged stays
        # false: SGD changes the weights every step, so the cached FP8 weights are re-quantized.
        bwd1, bwd2 = autocast(ctx; enabled = use_fp8, recipe = recipe) do
            b1 = forward!(h, fc1, x, w.w1, w.b1)
            activation!(a, ctx, TE_ACTIVATION_GELU, h)
            b2 = forward!(y, fc2, a, w.w2, w.b2)
            (b1, b2)
        end

        losses[step] = mse_loss!(dy, y, target)

        # Backward runs after the scope, as in TE; the saved contexts remember it was FP8. fc1
        # needs no dx: x is data. fc1 is the pass's first FP8 module, so its backward is what
        # makes libte update the gradient scales. once = true: each backward runs once, so its
        # FP8 copies are freed right away.
        backward!(bwd2, dy; dx = da, dw = g.w2, db = g.b2, once = true)
        activation_backward!(dh, ctx, TE_ACTIVATION_GELU, h, da)
        backward!(bwd1, dh; dw = g.w1, db = g.b1, once = true)
        close(bwd2)
        close(bwd1)

        # The master weights stay Float32; FP8 is only ever a per-step copy inside libte.
        for (p, gp, v) in zip(arrays(w), arrays(g), arrays(velocity))
            @. v = MOMENTUM * v + gp
            @. p -= LEARNING_RATE * v
        end
    end
    close(fc2)
    close(fc1)
    return losses
end

mean(v) = sum(v) / length(v)

function write_csv(path, fp8, fp32)
    try
        open(path, "w") do io
            println(io, "step,loss_fp8,loss_fp32")
            for i in 1:STEPS
                println(io, i - 1, ",", fp8[i], ",", fp32[i])
            end
        end
        return true
    catch e
        e isa SystemError || rethrow()
        return false
    end
end

const USAGE = """
Usage: julia --project=bindings/julia/LibTE examples/julia/train_mlp.jl [loss.csv]

Trains a small MLP in FP8 (libte's delayed scaling) and in FP32 from the same start, prints both
losses, and writes the curves to loss.csv (default train_mlp_loss.csv; columns
step,loss_fp8,loss_fp32). libte is found through LIBTE_PATH or the loader's search path.
Exit status: 0 when FP8 converged within 10% of FP32, 1 when not, 2 on an error."""

function main(args)
    if any(a -> a in ("-h", "--help"), args)
        println(USAGE)
        return 0
    end
    if length(args) > 1 || (length(args) == 1 && startswith(args[1], "-"))
        println(stderr, "train_mlp: unexpected arguments: ", join(args, " "), "\n\n", USAGE)
        return 2
    end
    csv_path = isempty(args) ? "train_mlp_loss.csv" : args[1]

    # The buffers are host memory, so the demo needs a CPU context.
    ctx = Context(; device = :cpu)
    @assert LibTE.device(ctx).type == TE_DEVICE_CPU

    # Delayed scaling with a 16-step amax history (TE's default, 1024, is longer than this whole
    # run: the scales would never come down as training shrinks the gradients).
    recipe = Recipe(TE_RECIPE_DELAYED_SCALING; format = TE_FORMAT_HYBRID, amax_history_len = 16)

    teacher = init_teacher(TEACHER_SEED)
    init = init_params(INIT_SEED)

    println("libte ", LibTE.version(), ", CPU context (LibTE.jl)")
    println("MLP $IN -> $HIDDEN -> GELU -> $OUT, batch $BATCH, $STEPS steps, SGD lr $LEARNING_RATE momentum $MOMENTUM")
    println("fp8 recipe: ", describe(recipe))

    loss_fp8 = train(ctx, recipe, true, init, teacher)
    loss_fp32 = train(ctx, recipe, false, init, teacher)

    for step in 0:STEPS-1
        if step % LOG_EVERY == 0 || step == STEPS - 1
            println("step ", lpad(step, 4), "  fp8 ", round(loss_fp8[step+1]; digits = 5),
                    "  fp32 ", round(loss_fp32[step+1]; digits = 5))
        end
    end

    # Same weights, same batch: FP8's step-0 loss differs only by FP8 itself.
    initial = loss_fp32[1]
    final_fp8 = mean(loss_fp8[end-FINAL_WINDOW+1:end])
    final_fp32 = mean(loss_fp32[end-FINAL_WINDOW+1:end])
    ratio = final_fp8 / final_fp32
    # Written as "x <= limit" so that a NaN loss fails every test.
    converged = final_fp8 <= CONVERGED_FRACTION * initial
    within_tolerance = abs(ratio - 1.0) <= FP8_TOLERANCE
    if !converged
        println("fp8 did not converge: final loss $(round(final_fp8; digits = 5)) is not below ",
                "$CONVERGED_FRACTION x the initial $(round(initial; digits = 5))")
    end
    println("final loss: fp8 ", round(final_fp8; digits = 5), " fp32 ", round(final_fp32; digits = 5),
            " (fp8/fp32 = ", round(ratio; digits = 3), ", within ", round(Int, 100 * FP8_TOLERANCE), "%: ",
            within_tolerance ? "yes" : "no", "; initial ", round(initial; digits = 5), ")")

    csv_ok = write_csv(csv_path, loss_fp8, loss_fp32)
    csv_ok ? println("loss curves written to ", abspath(csv_path)) : println(stderr, "could not write ", csv_path)

    close(recipe)
    close(ctx)
    csv_ok || return 2
    return converged && within_tolerance ? 0 : 1
end

# Any libte failure ends the demo with exit status 2: the message names the call and argument.
if abspath(PROGRAM_FILE) == @__FILE__
    code = try
        main(ARGS)
    catch e
        e isa LibTEError || rethrow()
        println(stderr, "train_mlp: ", sprint(showerror, e))
        2
    end
    exit(code)
end
