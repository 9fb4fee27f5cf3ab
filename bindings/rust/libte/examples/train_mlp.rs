//! train_mlp: train a small MLP in FP8 with libte, and check it against FP32.
//! The Rust twin of `examples/c/train_mlp.c`: same model, data, seeds and pass criterion.
//!
//!   model   Linear(64 -> 256) -> GELU -> Linear(256 -> 16), MSE loss
//!   task    regress the outputs of a fixed random "teacher" MLP on Gaussian inputs
//!   optim   SGD with momentum on fp32 master weights kept here
//!
//! The model is trained twice from the same initial weights on the same batches: once with
//! every forward inside an FP8 autocast scope (delayed scaling, HYBRID: E4M3 forward, E5M2
//! gradients), once with the scope disabled, so the only difference is FP8.
//!
//! Usage:  cargo run --release --example train_mlp [-- loss.csv]
//! Exit:   0  FP8 converged (final loss far below the initial one) and is within 10% of FP32
//!         1  it did not
//!         2  a libte call (or writing the CSV) failed

use std::process::ExitCode;

use libte::{
    Activation, Autocast, AutocastOptions, Context, DType, ForwardArgs, Linear, LinearOptions,
    Recipe, RecipeKind, RecipeOptions, TensorView, TensorViewMut,
};

// FP8 GEMMs need every dimension, the token count included, to be a multiple of 16.
const IN: usize = 64;
const HIDDEN: usize = 256;
const OUT: usize = 16;
const BATCH: usize = 128;

const STEPS: usize = 600;
const LOG_EVERY: usize = 50;
const FINAL_WINDOW: usize = 20; // "final loss" = mean over the last this-many steps

const LEARNING_RATE: f32 = 0.5;
const MOMENTUM: f32 = 0.9;
const CONVERGED_FRACTION: f64 = 0.1; // final loss at most this fraction of the initial loss...
const FP8_TOLERANCE: f64 = 0.10; // ...and FP8's within this relative distance of FP32's

const TEACHER_SEED: u64 = 1;
const INIT_SEED: u64 = 2;
const DATA_SEED: u64 = 3;

// ---- a small fixed-seed RNG, the C demo's, so every run sees the same data ----------------

struct Rng(u64);

impl Rng {
    fn splitmix64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so ln() is finite.
    fn uniform01(&mut self) -> f64 {
        ((self.splitmix64() >> 11) as f64 + 1.0) * (1.0 / (1u64 << 53) as f64)
    }

    /// Box-Muller; the second variate is dropped.
    fn normal(&mut self, stddev: f32) -> f32 {
        let u1 = self.uniform01();
        let u2 = self.uniform01();
        (stddev as f64 * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    fn fill_normal(&mut self, x: &mut [f32], stddev: f32) {
        for v in x {
            *v = self.normal(stddev);
        }
    }
}

// ---- parameters: one flat fp32 vector, so the SGD step is one loop --------------------------

const W1: usize = HIDDEN * IN; // [HIDDEN, IN]: libte's weight layout is [out, in]
const B1: usize = HIDDEN;
const W2: usize = OUT * HIDDEN;
const B2: usize = OUT;
const N_PARAMS: usize = W1 + B1 + W2 + B2;

fn split(p: &[f32]) -> (&[f32], &[f32], &[f32], &[f32]) {
    let (w1, rest) = p.split_at(W1);
    let (b1, rest) = rest.split_at(B1);
    let (w2, b2) = rest.split_at(W2);
    (w1, b1, w2, b2)
}

fn split_mut(p: &mut [f32]) -> (&mut [f32], &mut [f32], &mut [f32], &mut [f32]) {
    let (w1, rest) = p.split_at_mut(W1);
    let (b1, rest) = rest.split_at_mut(B1);
    let (w2, b2) = rest.split_at_mut(W2);
    (w1, b1, w2, b2)
}

/// Variance 1/fan_in keeps activations near unit scale through both layers; biases start at 0.
fn init_params(seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let mut p = vec![0.0f32; N_PARAMS];
    let (w1, _, w2, _) = split_mut(&mut p);
    r.fill_normal(w1, 1.0 / (IN as f32).sqrt());
    r.fill_normal(w2, 1.0 / (HIDDEN as f32).sqrt());
    p
}

// ---- the task --------------------------------------------------------------------------------

/// Same tanh approximation as `Activation::Gelu`.
fn gelu(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (K * (x + 0.044715 * x * x * x)).tanh())
}

/// A fixed random MLP evaluated in plain fp32, never through libte, so the targets do not
/// depend on the precision the student trains in. Weights input-major ([in][out]).
struct Teacher {
    w1: Vec<f32>, // [IN][HIDDEN]
    w2: Vec<f32>, // [HIDDEN][OUT]
}

impl Teacher {
    fn new(seed: u64) -> Teacher {
        let mut r = Rng(seed);
        let mut w1 = vec![0.0; IN * HIDDEN];
        let mut w2 = vec![0.0; HIDDEN * OUT];
        r.fill_normal(&mut w1, 1.0 / (IN as f32).sqrt());
        r.fill_normal(&mut w2, 1.0 / (HIDDEN as f32).sqrt());
        Teacher { w1, w2 }
    }

    fn forward(&self, x: &[f32], target: &mut [f32]) {
        for (xn, yn) in x.chunks_exact(IN).zip(target.chunks_exact_mut(OUT)) {
            let mut hidden = [0.0f32; HIDDEN];
            for (i, &xi) in xn.iter().enumerate() {
                for (h, &w) in hidden
                    .iter_mut()
                    .zip(&self.w1[i * HIDDEN..(i + 1) * HIDDEN])
                {
                    *h += xi * w;
                }
            }
            yn.iter_mut().for_each(|v| *v = 0.0);
            for (j, &h) in hidden.iter().enumerate() {
                let a = gelu(h);
                for (y, &w) in yn.iter_mut().zip(&self.w2[j * OUT..(j + 1) * OUT]) {
                    *y += a * w;
                }
            }
        }
    }
}

/// Mean squared error, and its gradient with respect to y.
fn mse_loss(y: &[f32], target: &[f32], dy: &mut [f32]) -> f64 {
    let n = y.len();
    let mut sum = 0.0f64;
    for ((&yi, &ti), d) in y.iter().zip(target).zip(dy.iter_mut()) {
        let diff = yi - ti;
        sum += diff as f64 * diff as f64;
        *d = 2.0 * diff / n as f32;
    }
    sum / n as f64
}

// ---- training --------------------------------------------------------------------------------

fn linear(ctx: &Context, input: usize, output: usize) -> libte::Result<Linear> {
    // The default activation dtype is BF16; F32 in both runs keeps FP8 the only difference.
    Linear::new(
        ctx,
        &LinearOptions {
            activation_dtype: DType::F32,
            ..LinearOptions::new(input, output)
        },
    )
}

/// Trains from `init` for STEPS steps; returns each step's loss (before its update). With
/// `use_fp8` false the very same code runs with the autocast scope disabled.
fn train(
    ctx: &mut Context,
    recipe: &Recipe,
    use_fp8: bool,
    init: &[f32],
    teacher: &Teacher,
) -> libte::Result<Vec<f64>> {
    // Fresh layers per run: a layer carries its FP8 scaling history.
    let mut fc1 = linear(ctx, IN, HIDDEN)?;
    let mut fc2 = linear(ctx, HIDDEN, OUT)?;

    let mut master = init.to_vec();
    let mut grad = vec![0.0f32; N_PARAMS];
    let mut velocity = vec![0.0f32; N_PARAMS];

    let mut x = vec![0.0f32; BATCH * IN];
    let mut target = vec![0.0f32; BATCH * OUT];
    let mut h = vec![0.0f32; BATCH * HIDDEN]; // fc1 output, GELU input
    let mut a = vec![0.0f32; BATCH * HIDDEN]; // GELU output, fc2 input
    let mut y = vec![0.0f32; BATCH * OUT];
    let mut dy = vec![0.0f32; BATCH * OUT];
    let mut da = vec![0.0f32; BATCH * HIDDEN];
    let mut dh = vec![0.0f32; BATCH * HIDDEN];

    let scope = AutocastOptions {
        enabled: use_fp8,
        ..AutocastOptions::fp8(recipe)
    };

    let mut data = Rng(DATA_SEED); // both runs replay the same batches
    let mut losses = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        data.fill_normal(&mut x, 1.0);
        teacher.forward(&x, &mut target);

        let (w1, b1, w2, b2) = split(&master);
        // weight_unchanged stays false: SGD changes the weights every step.
        let args1 = ForwardArgs::new(
            TensorView::from_slice(&x, &[BATCH, IN])?,
            TensorView::from_slice(w1, &[HIDDEN, IN])?,
        )
        .bias(TensorView::from_slice(b1, &[HIDDEN])?);

        // Forward inside the scope: when it ends, libte updates the forward scales (inputs and
        // weights) from this step's amaxes, for the next step to use.
        let (mut bwd1, mut bwd2) = {
            let fp8 = Autocast::new(ctx, &scope)?;
            let bwd1 = fc1.forward(
                &fp8,
                &args1,
                &mut TensorViewMut::from_slice(&mut h, &[BATCH, HIDDEN])?,
            )?;
            fp8.activation_forward(
                Activation::Gelu,
                &TensorView::from_slice(&h, &[BATCH, HIDDEN])?,
                &mut TensorViewMut::from_slice(&mut a, &[BATCH, HIDDEN])?,
            )?;
            let args2 = ForwardArgs::new(
                TensorView::from_slice(&a, &[BATCH, HIDDEN])?,
                TensorView::from_slice(w2, &[OUT, HIDDEN])?,
            )
            .bias(TensorView::from_slice(b2, &[OUT])?);
            let bwd2 = fc2.forward(
                &fp8,
                &args2,
                &mut TensorViewMut::from_slice(&mut y, &[BATCH, OUT])?,
            )?;
            fp8.end()?;
            (bwd1, bwd2)
        };

        losses.push(mse_loss(&y, &target, &mut dy));

        // Backward after the scope, as in TE; the saved contexts remember it was FP8. fc1 needs
        // no dx (x is data). fc1 is the pass's first FP8 module, so its backward is what makes
        // libte update the gradient scales. Each backward runs once: free its FP8 copies.
        {
            let (dw1, db1, dw2, db2) = split_mut(&mut grad);
            bwd2.backward_once(
                ctx,
                &TensorView::from_slice(&dy, &[BATCH, OUT])?,
                Some(&mut TensorViewMut::from_slice(&mut da, &[BATCH, HIDDEN])?),
                Some(&mut TensorViewMut::from_slice(dw2, &[OUT, HIDDEN])?),
                Some(&mut TensorViewMut::from_slice(db2, &[OUT])?),
            )?;
            ctx.activation_backward(
                Activation::Gelu,
                &TensorView::from_slice(&h, &[BATCH, HIDDEN])?,
                &TensorView::from_slice(&da, &[BATCH, HIDDEN])?,
                &mut TensorViewMut::from_slice(&mut dh, &[BATCH, HIDDEN])?,
            )?;
            bwd1.backward_once(
                ctx,
                &TensorView::from_slice(&dh, &[BATCH, HIDDEN])?,
                None,
                Some(&mut TensorViewMut::from_slice(dw1, &[HIDDEN, IN])?),
                Some(&mut TensorViewMut::from_slice(db1, &[HIDDEN])?),
            )?;
        }
        // The backward contexts borrow x and the weights: drop them before the update.
        drop(bwd2);
        drop(bwd1);

        // The master weights stay fp32; FP8 is only ever a per-step copy inside libte.
        for ((m, v), &g) in master.iter_mut().zip(velocity.iter_mut()).zip(&grad) {
            *v = MOMENTUM * *v + g;
            *m -= LEARNING_RATE * *v;
        }
    }
    Ok(losses)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn write_csv(path: &str, fp8: &[f64], fp32: &[f64]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(f, "step,loss_fp8,loss_fp32")?;
    for (i, (a, b)) in fp8.iter().zip(fp32).enumerate() {
        writeln!(f, "{},{:.9},{:.9}", i, a, b)?;
    }
    f.flush()
}

fn run() -> libte::Result<bool> {
    // The buffers are host memory, so the demo needs a CPU context (the default would be
    // CUDA when a GPU is usable).
    let mut ctx = Context::cpu()?;

    // Delayed scaling with a 16-step amax window instead of TE's 1024 (longer than this run):
    // the scales follow the gradients down as training shrinks them. See the C demo.
    let recipe = Recipe::new(&RecipeOptions {
        format: libte::Format::Hybrid,
        amax_history_len: 16,
        ..RecipeOptions::new(RecipeKind::DelayedScaling)
    })?;

    let teacher = Teacher::new(TEACHER_SEED);
    let init = init_params(INIT_SEED);

    println!(
        "libte {} (Rust binding), CPU context",
        libte::version_string()
    );
    println!(
        "MLP {} -> {} -> GELU -> {}, batch {}, {} steps, SGD lr {} momentum {}",
        IN, HIDDEN, OUT, BATCH, STEPS, LEARNING_RATE, MOMENTUM
    );
    println!("fp8 recipe: {}", recipe);

    let loss_fp8 = train(&mut ctx, &recipe, true, &init, &teacher)?;
    let loss_fp32 = train(&mut ctx, &recipe, false, &init, &teacher)?;

    for step in 0..STEPS {
        if step % LOG_EVERY == 0 || step == STEPS - 1 {
            println!(
                "step {:4}  fp8 {:.5}  fp32 {:.5}",
                step, loss_fp8[step], loss_fp32[step]
            );
        }
    }

    // Same weights, same batch: FP8's step-0 loss differs only by FP8 itself.
    let initial = loss_fp32[0];
    let final_fp8 = mean(&loss_fp8[STEPS - FINAL_WINDOW..]);
    let final_fp32 = mean(&loss_fp32[STEPS - FINAL_WINDOW..]);
    let ratio = final_fp8 / final_fp32;
    // Written as "x <= limit" so that a NaN loss fails every test.
    let converged = final_fp8 <= CONVERGED_FRACTION * initial;
    let within = (ratio - 1.0).abs() <= FP8_TOLERANCE;
    if !converged {
        println!(
            "fp8 did not converge: final loss {:.5} is not below {} x the initial {:.5}",
            final_fp8, CONVERGED_FRACTION, initial
        );
    }
    println!(
        "final loss: fp8 {:.5} fp32 {:.5} (fp8/fp32 = {:.3}, within {:.0}%: {}; initial {:.5})",
        final_fp8,
        final_fp32,
        ratio,
        100.0 * FP8_TOLERANCE,
        if within { "yes" } else { "no" },
        initial
    );

    if let Some(path) = std::env::args().nth(1) {
        if let Err(e) = write_csv(&path, &loss_fp8, &loss_fp32) {
            eprintln!("could not write {}: {}", path, e);
            return Err(libte::Error::new(
                libte::Status::InvalidArgument,
                format!("writing {}", path),
            ));
        }
        println!("wrote {}", path);
    }
    Ok(converged && within)
}

const USAGE: &str = "Usage: cargo run --example train_mlp --release [-- loss.csv]

Trains a small MLP in FP8 (libte's delayed scaling) and in FP32 from the same start, prints both
losses, and writes the curves to loss.csv when given (columns step,loss_fp8,loss_fp32).
Exit status: 0 when FP8 converged within 10% of FP32, 1 when not, 2 on an error.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{}", USAGE);
        return ExitCode::SUCCESS;
    }
    if args.len() > 1 || args.first().map_or(false, |a| a.starts_with('-')) {
        eprintln!("train_mlp: unexpected arguments: {}\n\n{}", args.join(" "), USAGE);
        return ExitCode::from(2);
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("train_mlp: {}", e);
            ExitCode::from(2)
        }
    }
}
