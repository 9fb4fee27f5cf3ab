//! LayerNormLinear against f64 references: in high precision against the formulas, in FP8
//! against the formulas on the operands libte quantized (read back from the residuals) and,
//! loosely, against the unquantized formulas; repeatable backward, state round trips, errors.

mod common;

use common::reference::*;
use common::*;
use libte::*;

const T: usize = 32;
const IN: usize = 64;
const OUT: usize = 48;

struct Data {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
}

fn data(seed: u64) -> Data {
    Data {
        x: fill(seed, T * IN).iter().map(|v| v * 2.5 + 0.5).collect(),
        gamma: fill(seed + 1, IN).iter().map(|v| 1.0 + v * 0.5).collect(),
        beta: fill(seed + 2, IN).iter().map(|v| v * 0.5).collect(),
        w: fill(seed + 3, OUT * IN).iter().map(|v| v * 0.2).collect(),
        b: fill(seed + 4, OUT),
    }
}

impl Data {
    fn args(&self, kind: NormKind) -> LayerNormLinearArgs<'_> {
        let args = LayerNormLinearArgs::new(
            view(&self.x, &[T, IN]),
            view(&self.gamma, &[IN]),
            view(&self.w, &[OUT, IN]),
        )
        .bias(view(&self.b, &[OUT]));
        match kind {
            NormKind::LayerNorm => args.ln_bias(view(&self.beta, &[IN])),
            _ => args,
        }
    }

    fn beta(&self, kind: NormKind) -> Option<&[f32]> {
        (kind == NormKind::LayerNorm).then(|| &self.beta[..])
    }
}

fn module(ctx: &Context, kind: NormKind, zcg: bool) -> LayerNormLinear {
    LayerNormLinear::new(
        ctx,
        &LayerNormLinearOptions {
            activation_dtype: DType::F32,
            norm: NormOptions {
                zero_centered_gamma: zcg,
                ..NormOptions::new(kind)
            },
            ..LayerNormLinearOptions::new(IN, OUT)
        },
    )
    .unwrap()
}

/// dx, dgamma, dbeta, dW, db.
#[derive(PartialEq, Debug)]
struct Grads(Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn backward(
    ctx: &Context,
    bwd: &mut LayerNormLinearBackwardCtx<'_>,
    dy: &[f32],
    kind: NormKind,
    once: bool,
) -> Result<Grads> {
    let mut g = Grads(
        vec![0.0; T * IN],
        vec![0.0; IN],
        vec![0.0; IN],
        vec![0.0; OUT * IN],
        vec![0.0; OUT],
    );
    let grads = LayerNormLinearGrads {
        dx: Some(view_mut(&mut g.0, &[T, IN])),
        dln_weight: Some(view_mut(&mut g.1, &[IN])),
        dln_bias: (kind == NormKind::LayerNorm).then(|| view_mut(&mut g.2, &[IN])),
        dw: Some(view_mut(&mut g.3, &[OUT, IN])),
        db: Some(view_mut(&mut g.4, &[OUT])),
    };
    let dy = view(dy, &[T, OUT]);
    if once {
        bwd.backward_once(ctx, &dy, grads)?;
    } else {
        bwd.backward(ctx, &dy, grads)?;
    }
    Ok(g)
}

#[test]
fn options_defaults_match_the_header() {
    let o = LayerNormLinearOptions::new(8, 16);
    assert!(o.bias && !o.fuse_wgrad_accumulation);
    assert_eq!(o.activation_dtype, DType::BF16);
    assert_eq!(o.norm, NormOptions::new(NormKind::LayerNorm));
}

#[test]
fn high_precision_matches_f64() {
    for (kind, zcg) in [
        (NormKind::LayerNorm, false),
        (NormKind::LayerNorm, true),
        (NormKind::RmsNorm, false),
        (NormKind::RmsNorm, true),
    ] {
        let ctx = Context::cpu().unwrap();
        let d = data(10);
        let mut m = module(&ctx, kind, zcg);
        let (mut y, mut ln_out) = (vec![0.0f32; T * OUT], vec![0.0f32; T * IN]);
        let args = d.args(kind);
        let res = m
            .forward_compute(
                &ctx,
                &args,
                &mut view_mut(&mut y, &[T, OUT]),
                Some(&mut view_mut(&mut ln_out, &[T, IN])),
            )
            .unwrap();
        assert!(!res.fp8());
        let n = norm(kind, &d.x, &d.gamma, d.beta(kind), IN, 1e-5, zcg);
        let mut y_ref = matmul_nt(&n.y, &f64s(&d.w), T, OUT, IN);
        add_bias(&mut y_ref, &d.b);
        // fp32 statistics and a 64-term fp32 dot product: a few fp32 ulps of the scale.
        assert_close("ln_out", &ln_out, &n.y, 1e-6);
        assert_close("y", &y, &y_ref, 1e-5);
        // High precision: the residuals are norm(x) (libte's) and the caller's W itself.
        assert_eq!(
            res.ln_out_t().unwrap().as_slice::<f32>().unwrap(),
            &ln_out[..]
        );
        assert_eq!(
            res.weight_t().unwrap().as_slice::<f32>().unwrap().as_ptr(),
            d.w.as_ptr()
        );
        let rs = res.rsigma().unwrap();
        assert_close("rsigma", rs.as_slice::<f32>().unwrap(), &n.rsigma, 1e-6);
        assert_eq!(res.mu().unwrap().is_some(), kind == NormKind::LayerNorm);

        let dy = fill(20, T * OUT);
        let mut bwd = m.forward_save(&ctx, res).unwrap();
        let g = backward(&ctx, &mut bwd, &dy, kind, false).unwrap();
        let dln = matmul_nn(&f64s(&dy), &f64s(&d.w), T, IN, OUT);
        let (dx, dg, db_) = norm_backward(kind, &dln, &d.x, &d.gamma, IN, 1e-5, zcg);
        // The norm's backward cancels terms: 1e-4 of the scale.
        assert_close("dx", &g.0, &dx, 1e-4);
        assert_close("dgamma", &g.1, &dg, 1e-4);
        if kind == NormKind::LayerNorm {
            assert_close("dbeta", &g.2, &db_, 1e-4);
        }
        assert_close("dw", &g.3, &matmul_tn(&f64s(&dy), &n.y, OUT, IN, T), 1e-5);
        assert_close("db", &g.4, &column_sums(&f64s(&dy), OUT), 1e-5);
        // Retain-graph: the same bits again.
        assert_eq!(backward(&ctx, &mut bwd, &dy, kind, false).unwrap(), g);
    }
}

#[test]
fn fp8_delayed_matches_f64_on_quantized_operands() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::delayed_scaling().unwrap();
    let d = data(30);
    let mut m = module(&ctx, NormKind::LayerNorm, false);
    let mut y = vec![0.0f32; T * OUT];
    let args = d.args(NormKind::LayerNorm);
    let res = {
        let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        m.forward_compute(&scope, &args, &mut view_mut(&mut y, &[T, OUT]), None)
            .unwrap()
    };
    assert!(res.fp8());
    let (lt, wt) = (res.ln_out_t().unwrap(), res.weight_t().unwrap());
    assert_eq!(
        (lt.dtype(), lt.shape()),
        (DType::E4M3, &[IN as i64, T as i64][..])
    );
    assert_eq!(
        (wt.dtype(), wt.shape()),
        (DType::E4M3, &[IN as i64, OUT as i64][..])
    );
    let ln_q = transpose(&dequantized(&ctx, &lt), IN, T);
    let w_q = transpose(&dequantized(&ctx, &wt), IN, OUT);
    // A fresh delayed-scaling state has scale 1: the norm's FP8 output is the f64 norm rounded
    // to E4M3, within half an ulp (2^-4 relative) plus half the smallest subnormal (2^-10).
    let n = norm(
        NormKind::LayerNorm,
        &d.x,
        &d.gamma,
        Some(&d.beta),
        IN,
        1e-5,
        false,
    );
    for (q, r) in ln_q.iter().zip(&n.y) {
        assert!(
            (q - r).abs() <= r.abs() / 16.0 + 1.0 / 1024.0,
            "{} vs {}",
            q,
            r
        );
    }
    // The GEMM on the quantized operands: exact products, fp32 accumulation.
    let mut y_ref = matmul_nt(&ln_q, &w_q, T, OUT, IN);
    add_bias(&mut y_ref, &d.b);
    assert_close("y", &y, &y_ref, 1e-5);

    // dy exactly representable in E5M2 (scale 1): its quantization is exact too.
    let dy = e5m2_exact(31, T * OUT);
    let mut bwd = m.forward_save(&ctx, res).unwrap();
    let g = backward(&ctx, &mut bwd, &dy, NormKind::LayerNorm, false).unwrap();
    let dln = matmul_nn(&f64s(&dy), &w_q, T, IN, OUT);
    let (dx, dg, db_) = norm_backward(NormKind::LayerNorm, &dln, &d.x, &d.gamma, IN, 1e-5, false);
    assert_close("dx", &g.0, &dx, 1e-4);
    assert_close("dgamma", &g.1, &dg, 1e-4);
    assert_close("dbeta", &g.2, &db_, 1e-4);
    assert_close("dw", &g.3, &matmul_tn(&f64s(&dy), &ln_q, OUT, IN, T), 1e-5);
    assert_close("db", &g.4, &column_sums(&f64s(&dy), OUT), 1e-6);
    let again = backward(&ctx, &mut bwd, &dy, NormKind::LayerNorm, true).unwrap();
    assert_eq!(again, g);
    let err = backward(&ctx, &mut bwd, &dy, NormKind::LayerNorm, false).unwrap_err();
    assert_eq!(err.status(), Status::InvalidState);
    assert!(
        err.message().contains("te_layernorm_linear_backward"),
        "{}",
        err
    );
}

/// Against the unquantized formulas. E4M3 keeps 3 mantissa bits: a relative rounding error of
/// at most 2^-4, about 2^-4/sqrt(3) = 0.036 RMS per operand; a product of two independently
/// rounded operands summed over 64 terms: near sqrt(2) * 0.036 = 0.05 relative (Frobenius),
/// bound 0.08. The backward adds dy in E5M2 (2 mantissa bits, 0.072 RMS): near
/// sqrt(0.072^2 + 0.036^2) = 0.08, bound 0.15.
#[test]
fn fp8_current_scaling_close_to_f64() {
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let mut ctx = Context::cpu().unwrap();
        let recipe = Recipe::current_scaling().unwrap();
        let d = data(40);
        let mut m = module(&ctx, kind, false);
        let mut y = vec![0.0f32; T * OUT];
        let args = d.args(kind);
        let mut bwd = {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            m.forward(&scope, &args, &mut view_mut(&mut y, &[T, OUT]), None)
                .unwrap()
        };
        let n = norm(kind, &d.x, &d.gamma, d.beta(kind), IN, 1e-5, false);
        let y_ref = matmul_nt(&n.y, &f64s(&d.w), T, OUT, IN);
        let y_nobias: Vec<f32> = y
            .iter()
            .enumerate()
            .map(|(i, v)| v - d.b[i % OUT])
            .collect();
        assert!(rel_err(&y_nobias, &y_ref) < 0.08);
        let dy: Vec<f32> = fill(41, T * OUT);
        let g = backward(&ctx, &mut bwd, &dy, kind, true).unwrap();
        let dln = matmul_nn(&f64s(&dy), &f64s(&d.w), T, IN, OUT);
        let (dx, dg, _) = norm_backward(kind, &dln, &d.x, &d.gamma, IN, 1e-5, false);
        assert!(rel_err(&g.0, &dx) < 0.15);
        assert!(rel_err(&g.1, &dg) < 0.15);
        assert!(rel_err(&g.3, &matmul_tn(&f64s(&dy), &n.y, OUT, IN, T)) < 0.15);
        assert_close("db", &g.4, &column_sums(&f64s(&dy), OUT), 1e-6);
    }
}

#[test]
fn state_round_trip_is_bit_exact() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::new(&RecipeOptions {
        amax_history_len: 8,
        ..Default::default()
    })
    .unwrap();
    let d = data(50);
    let mut a = module(&ctx, NormKind::LayerNorm, false);
    let mut y = vec![0.0f32; T * OUT];
    let dy = fill(51, T * OUT);
    for _ in 0..3 {
        let args = d.args(NormKind::LayerNorm);
        let mut bwd = {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            a.forward(&scope, &args, &mut view_mut(&mut y, &[T, OUT]), None)
                .unwrap()
        };
        backward(&ctx, &mut bwd, &dy, NormKind::LayerNorm, true).unwrap();
    }
    let state = a.state_save(&ctx).unwrap();
    let mut fresh = module(&ctx, NormKind::LayerNorm, false);
    assert_ne!(fresh.state_save(&ctx).unwrap(), state);
    fresh.state_load(&ctx, &state).unwrap();
    assert_eq!(fresh.state_save(&ctx).unwrap(), state);
    for role in [
        TensorRole::Input,
        TensorRole::Weight,
        TensorRole::GradOutput,
    ] {
        let (sa, sf) = (
            a.scaling_state(&ctx, role).unwrap(),
            fresh.scaling_state(&ctx, role).unwrap(),
        );
        assert_eq!(sa, sf);
        assert_eq!(sa.amax_history.len(), 8);
    }
    assert_eq!(
        a.scaling_state(&ctx, TensorRole::GradOutput)
            .unwrap()
            .fp8_dtype,
        Some(DType::E5M2)
    );
    let err = module(&ctx, NormKind::RmsNorm, false)
        .state_load(&ctx, &state[..state.len() - 1])
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("te_layernorm_linear_state_load"));
}

#[test]
fn errors_name_the_argument() {
    let mut ctx = Context::cpu().unwrap();
    let d = data(60);
    let mut m = module(&ctx, NormKind::LayerNorm, false);
    let mut y = vec![0.0f32; T * OUT];
    let expect = |r: Result<LayerNormLinearBackwardCtx<'_>>, status: Status, arg: &str| {
        let e = r.err().expect("an error");
        assert_eq!(e.status(), status, "{}", e);
        assert!(e.message().contains(arg), "{}", e);
    };
    // x with the wrong number of features.
    let args = LayerNormLinearArgs {
        input: view(&d.x[..T * 32], &[T, 32]),
        ..d.args(NormKind::LayerNorm)
    };
    expect(
        m.forward(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None),
        Status::InvalidArgument,
        "args->input",
    );
    // gamma of the wrong length, beta missing for LayerNorm, beta given to RMSNorm.
    let args = LayerNormLinearArgs {
        ln_weight: view(&d.gamma[..32], &[32]),
        ..d.args(NormKind::LayerNorm)
    };
    expect(
        m.forward(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None),
        Status::InvalidArgument,
        "args->ln_weight",
    );
    let args = d.args(NormKind::RmsNorm);
    expect(
        m.forward(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None),
        Status::InvalidArgument,
        "args->ln_bias",
    );
    let mut rms = module(&ctx, NormKind::RmsNorm, false);
    let args = d.args(NormKind::LayerNorm);
    expect(
        rms.forward(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None),
        Status::InvalidArgument,
        "args->ln_bias",
    );
    // ln_out not like x.
    let mut ln_out = vec![0.0f32; T * OUT];
    expect(
        m.forward(
            &ctx,
            &args,
            &mut view_mut(&mut y, &[T, OUT]),
            Some(&mut view_mut(&mut ln_out, &[T, OUT])),
        ),
        Status::InvalidArgument,
        "args->ln_out",
    );
    // A gradient of the wrong shape.
    let mut bwd = m
        .forward(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None)
        .unwrap();
    let dy = vec![0.5f32; T * OUT];
    let mut dg = vec![0.0f32; OUT];
    let e = bwd
        .backward(
            &ctx,
            &view(&dy, &[T, OUT]),
            LayerNormLinearGrads {
                dln_weight: Some(view_mut(&mut dg, &[OUT])),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.message().contains("grads->dln_weight"), "{}", e);
    // FP8 needs tokens in multiples of 16.
    let args = LayerNormLinearArgs {
        input: view(&d.x[..10 * IN], &[10, IN]),
        ..d.args(NormKind::LayerNorm)
    };
    let scope = ctx.autocast(&AutocastOptions::default()).unwrap();
    expect(
        m.forward(
            &scope,
            &args,
            &mut view_mut(&mut y[..10 * OUT], &[10, OUT]),
            None,
        ),
        Status::Unsupported,
        "16",
    );
    drop(scope);
    // Options libte refuses.
    let e = LayerNormLinear::new(
        &ctx,
        &LayerNormLinearOptions {
            norm: NormOptions {
                eps: -1.0,
                ..NormOptions::default()
            },
            ..LayerNormLinearOptions::new(IN, OUT)
        },
    )
    .unwrap_err();
    assert!(e.message().contains("te_layernorm_linear_create"), "{}", e);
    assert!(e.message().contains("eps"), "{}", e);
}

#[test]
fn handles_outlive_their_module_and_context() {
    let ctx = Context::cpu().unwrap();
    let d = data(70);
    let mut m = module(&ctx, NormKind::LayerNorm, false);
    let mut y = vec![0.0f32; T * OUT];
    let args = d.args(NormKind::LayerNorm);
    let mut bwd = m
        .forward(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None)
        .unwrap();
    let res = m
        .forward_compute(&ctx, &args, &mut view_mut(&mut y, &[T, OUT]), None)
        .unwrap();
    drop(m); // the backward context and the residuals keep what they need
    let g = backward(
        &ctx,
        &mut bwd,
        &vec![0.25f32; T * OUT],
        NormKind::LayerNorm,
        false,
    )
    .unwrap();
    assert!(g.0.iter().all(|v| v.is_finite()));
    // Dropped on another thread: destroyed by the context on its own thread later.
    std::thread::scope(|s| {
        s.spawn(move || drop(res));
    });
    drop(ctx);
    drop(bwd); // the last handle destroys the te_context
}
