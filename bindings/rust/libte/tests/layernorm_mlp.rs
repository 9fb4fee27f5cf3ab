//! LayerNormMlp against f64 references: every activation in high precision against the chain
//! of formulas, FP8 against the formulas on the operands libte quantized, repeatable backward,
//! scaling states per GEMM, state round trips, errors.

mod common;

use common::reference::*;
use common::*;
use libte::*;

const T: usize = 32;
const H: usize = 64;
const FFN: usize = 96;

struct Data {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
    rows1: usize,
}

fn data(seed: u64, act: Activation) -> Data {
    let rows1 = if act.is_gated() { 2 * FFN } else { FFN };
    let scaled = |s: u64, n: usize, k: f32| fill(s, n).iter().map(|v| v * k).collect();
    Data {
        x: fill(seed, T * H).iter().map(|v| v * 2.5 + 0.5).collect(),
        gamma: fill(seed + 1, H).iter().map(|v| 1.0 + v * 0.5).collect(),
        beta: scaled(seed + 2, H, 0.5),
        w1: scaled(seed + 3, rows1 * H, 0.2),
        b1: scaled(seed + 4, rows1, 0.2),
        w2: scaled(seed + 5, H * FFN, 0.2),
        b2: scaled(seed + 6, H, 0.2),
        rows1,
    }
}

impl Data {
    fn args(&self) -> LayerNormMlpArgs<'_> {
        LayerNormMlpArgs::new(
            view(&self.x, &[T, H]),
            view(&self.gamma, &[H]),
            view(&self.w1, &[self.rows1, H]),
            view(&self.w2, &[H, FFN]),
        )
        .ln_bias(view(&self.beta, &[H]))
        .biases(view(&self.b1, &[self.rows1]), view(&self.b2, &[H]))
    }
}

fn module(ctx: &Context, act: Activation) -> LayerNormMlp {
    LayerNormMlp::new(
        ctx,
        &LayerNormMlpOptions {
            activation: act,
            activation_dtype: DType::F32,
            ..LayerNormMlpOptions::new(H, FFN)
        },
    )
    .unwrap()
}

/// Every gradient, in LayerNormMlpGrads' order.
#[derive(PartialEq, Debug)]
struct Grads([Vec<f32>; 7]);

fn backward(
    ctx: &Context,
    bwd: &mut LayerNormMlpBackwardCtx<'_>,
    dy: &[f32],
    rows1: usize,
    once: bool,
) -> Result<Grads> {
    let mut g = Grads([
        vec![0.0; T * H],
        vec![0.0; H],
        vec![0.0; H],
        vec![0.0; rows1 * H],
        vec![0.0; rows1],
        vec![0.0; H * FFN],
        vec![0.0; H],
    ]);
    let [dx, dg, dbeta, dw1, db1, dw2, db2] = &mut g.0;
    let grads = LayerNormMlpGrads {
        dx: Some(view_mut(dx, &[T, H])),
        dln_weight: Some(view_mut(dg, &[H])),
        dln_bias: Some(view_mut(dbeta, &[H])),
        dfc1_weight: Some(view_mut(dw1, &[rows1, H])),
        dfc1_bias: Some(view_mut(db1, &[rows1])),
        dfc2_weight: Some(view_mut(dw2, &[H, FFN])),
        dfc2_bias: Some(view_mut(db2, &[H])),
    };
    let dy = view(dy, &[T, H]);
    if once {
        bwd.backward_once(ctx, &dy, grads)?;
    } else {
        bwd.backward(ctx, &dy, grads)?;
    }
    Ok(g)
}

/// The f64 chain from (possibly quantized) operands: fc1 output, activation output, y, and
/// every gradient for dy.
struct Chain {
    h: Vec<f64>,
    a: Vec<f64>,
    y: Vec<f64>,
    grads: [Vec<f64>; 7],
}

fn chain(act: Activation, d: &Data, ln: &[f64], w1: &[f64], w2: &[f64], dy: &[f32]) -> Chain {
    let mut h = matmul_nt(ln, w1, T, d.rows1, H);
    add_bias(&mut h, &d.b1);
    let a = activation(act, &h, d.rows1);
    let mut y = matmul_nt(&a, w2, T, H, FFN);
    add_bias(&mut y, &d.b2);
    let dy = f64s(dy);
    let da = matmul_nn(&dy, w2, T, FFN, H);
    let dh = activation_backward(act, &h, &da, d.rows1);
    let dln = matmul_nn(&dh, w1, T, H, d.rows1);
    let (dx, dg, dbeta) = norm_backward(NormKind::LayerNorm, &dln, &d.x, &d.gamma, H, 1e-5, false);
    let grads = [
        dx,
        dg,
        dbeta,
        matmul_tn(&dh, ln, d.rows1, H, T),
        column_sums(&dh, d.rows1),
        matmul_tn(&dy, &a, H, FFN, T),
        column_sums(&dy, H),
    ];
    Chain { h, a, y, grads }
}

const NAMES: [&str; 7] = [
    "dx",
    "dln_weight",
    "dln_bias",
    "dfc1_weight",
    "dfc1_bias",
    "dfc2_weight",
    "dfc2_bias",
];

#[test]
fn options_defaults_match_the_header() {
    let o = LayerNormMlpOptions::new(64, 256);
    assert!(o.bias && !o.fuse_wgrad_accumulation);
    assert_eq!(o.activation, Activation::Gelu);
    assert_eq!(o.activation_dtype, DType::BF16);
    assert_eq!(o.fc1_out_features(), 256);
    let gated = LayerNormMlpOptions {
        activation: Activation::Swiglu,
        ..o
    };
    assert_eq!(gated.fc1_out_features(), 512);
}

#[test]
fn high_precision_matches_f64_for_every_activation() {
    for act in [
        Activation::Gelu,
        Activation::Relu,
        Activation::Srelu,
        Activation::Swiglu,
        Activation::Geglu,
    ] {
        let ctx = Context::cpu().unwrap();
        let d = data(100, act);
        let mut m = module(&ctx, act);
        let (mut y, mut ln_out) = (vec![0.0f32; T * H], vec![0.0f32; T * H]);
        let args = d.args();
        let res = m
            .forward_compute(
                &ctx,
                &args,
                &mut view_mut(&mut y, &[T, H]),
                Some(&mut view_mut(&mut ln_out, &[T, H])),
            )
            .unwrap();
        assert!(!res.fp8());
        let n = norm(
            NormKind::LayerNorm,
            &d.x,
            &d.gamma,
            Some(&d.beta),
            H,
            1e-5,
            false,
        );
        let dy = fill(101, T * H);
        let c = chain(act, &d, &n.y, &f64s(&d.w1), &f64s(&d.w2), &dy);
        // fp32 throughout: the norm, GEMMs of 64 and 96 terms and the activation (tanh, exp
        // within a few ulps) within 1e-5 of each tensor's scale; the backward through the norm
        // (cancelling terms) within 1e-4.
        assert_close("ln_out", &ln_out, &n.y, 1e-6);
        let fc1_out = res.fc1_out().unwrap();
        assert_close(
            &format!("{:?} fc1_out", act),
            fc1_out.as_slice::<f32>().unwrap(),
            &c.h,
            1e-5,
        );
        let act_out = res.act_out_t().unwrap();
        assert_close(
            &format!("{:?} act_out", act),
            act_out.as_slice::<f32>().unwrap(),
            &c.a,
            1e-5,
        );
        assert_close(&format!("{:?} y", act), &y, &c.y, 1e-5);
        let mut bwd = m.forward_save(&ctx, res).unwrap();
        let g = backward(&ctx, &mut bwd, &dy, d.rows1, false).unwrap();
        for (i, name) in NAMES.iter().enumerate() {
            assert_close(&format!("{:?} {}", act, name), &g.0[i], &c.grads[i], 1e-4);
        }
        assert_eq!(backward(&ctx, &mut bwd, &dy, d.rows1, false).unwrap(), g);
    }
}

#[test]
fn fp8_delayed_matches_f64_on_quantized_operands() {
    for act in [Activation::Gelu, Activation::Swiglu] {
        let mut ctx = Context::cpu().unwrap();
        let recipe = Recipe::delayed_scaling().unwrap();
        let d = data(200, act);
        let mut m = module(&ctx, act);
        let mut y = vec![0.0f32; T * H];
        let args = d.args();
        let res = {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            m.forward_compute(&scope, &args, &mut view_mut(&mut y, &[T, H]), None)
                .unwrap()
        };
        assert!(res.fp8());
        let ln_q = transpose(&dequantized(&ctx, &res.ln_out_t().unwrap()), H, T);
        let w1_q = transpose(&dequantized(&ctx, &res.fc1_weight_t().unwrap()), H, d.rows1);
        let act_t = res.act_out_t().unwrap();
        assert_eq!(act_t.shape(), &[FFN as i64, T as i64]);
        let a_q = transpose(&dequantized(&ctx, &act_t), FFN, T);
        let w2_q = transpose(&dequantized(&ctx, &res.fc2_weight_t().unwrap()), FFN, H);
        let h = f64s(res.fc1_out().unwrap().as_slice::<f32>().unwrap());
        // Each GEMM on the operands it used: exact products, fp32 accumulation.
        let mut h_ref = matmul_nt(&ln_q, &w1_q, T, d.rows1, H);
        add_bias(&mut h_ref, &d.b1);
        assert_close(
            "fc1_out",
            &h.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &h_ref,
            1e-5,
        );
        // The activation of libte's own fc1 output, rounded to E4M3 with scale 1 (a fresh
        // delayed-scaling state): half an ulp (2^-4 relative) plus half the least subnormal.
        let a_ref = activation(act, &h, d.rows1);
        for (q, r) in a_q.iter().zip(&a_ref) {
            assert!(
                (q - r).abs() <= r.abs() / 16.0 + 1.0 / 1024.0 + 1e-6,
                "{} vs {}",
                q,
                r
            );
        }
        let mut y_ref = matmul_nt(&a_q, &w2_q, T, H, FFN);
        add_bias(&mut y_ref, &d.b2);
        assert_close("y", &y, &y_ref, 1e-5);

        let dy = e5m2_exact(201, T * H); // quantized exactly with scale 1
        let mut bwd = m.forward_save(&ctx, res).unwrap();
        let g = backward(&ctx, &mut bwd, &dy, d.rows1, false).unwrap();
        // fc2's wgrad and dbias read only dy and the activation's FP8 output: exact up to
        // fp32 sums.
        assert_close(
            "dfc2_weight",
            &g.0[5],
            &matmul_tn(&f64s(&dy), &a_q, H, FFN, T),
            1e-5,
        );
        assert_close("dfc2_bias", &g.0[6], &column_sums(&f64s(&dy), H), 1e-6);
        // Deeper the activation's gradient is requantized to E5M2 (2 mantissa bits: 2^-3
        // relative at most, about 0.072 RMS): the rest within 0.15 (Frobenius) of the chain
        // on the quantized forward operands.
        let c = chain(act, &d, &ln_q, &w1_q, &w2_q, &dy);
        for i in 0..5 {
            assert!(
                rel_err(&g.0[i], &c.grads[i]) < 0.15,
                "{:?} {}",
                act,
                NAMES[i]
            );
        }
        assert_eq!(backward(&ctx, &mut bwd, &dy, d.rows1, true).unwrap(), g);
        let e = backward(&ctx, &mut bwd, &dy, d.rows1, false).unwrap_err();
        assert_eq!(e.status(), Status::InvalidState);
    }
}

#[test]
fn scaling_states_and_state_round_trip() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::new(&RecipeOptions {
        amax_history_len: 4,
        ..Default::default()
    })
    .unwrap();
    let d = data(300, Activation::Swiglu);
    let mut a = module(&ctx, Activation::Swiglu);
    let mut y = vec![0.0f32; T * H];
    let dy = fill(301, T * H);
    for _ in 0..2 {
        let args = d.args();
        let mut bwd = {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            a.forward(&scope, &args, &mut view_mut(&mut y, &[T, H]), None)
                .unwrap()
        };
        backward(&ctx, &mut bwd, &dy, d.rows1, true).unwrap();
    }
    let amax = |w: &[f32]| w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (gemm, w) in [(MlpGemm::Fc1, &d.w1), (MlpGemm::Fc2, &d.w2)] {
        let s = a.scaling_state(&ctx, gemm, TensorRole::Weight).unwrap();
        assert_eq!(s.amax_history.len(), 4);
        assert!(
            (s.scale - 448.0 / amax(w)).abs() <= 1e-6 * s.scale,
            "{:?}",
            gemm
        );
    }
    let state = a.state_save(&ctx).unwrap();
    let mut fresh = module(&ctx, Activation::Swiglu);
    fresh.state_load(&ctx, &state).unwrap();
    assert_eq!(fresh.state_save(&ctx).unwrap(), state);
    for gemm in [MlpGemm::Fc1, MlpGemm::Fc2] {
        for role in [
            TensorRole::Input,
            TensorRole::Weight,
            TensorRole::GradOutput,
        ] {
            assert_eq!(
                a.scaling_state(&ctx, gemm, role).unwrap(),
                fresh.scaling_state(&ctx, gemm, role).unwrap()
            );
        }
    }
    // Training resumes identically.
    let (mut ya, mut yf) = (vec![0.0f32; T * H], vec![0.0f32; T * H]);
    let args = d.args();
    {
        let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        a.forward(&scope, &args, &mut view_mut(&mut ya, &[T, H]), None)
            .unwrap();
        fresh
            .forward(&scope, &args, &mut view_mut(&mut yf, &[T, H]), None)
            .unwrap();
    }
    assert_eq!(ya, yf);
    let e = LayerNormMlp::new(
        &ctx,
        &LayerNormMlpOptions {
            activation: Activation::Swiglu,
            activation_dtype: DType::F32,
            ..LayerNormMlpOptions::new(H, FFN + 16)
        },
    )
    .unwrap()
    .state_load(&ctx, &state)
    .unwrap_err();
    assert!(e.message().contains("te_layernorm_mlp_state_load"), "{}", e);
}

#[test]
fn errors_name_the_argument() {
    let ctx = Context::cpu().unwrap();
    let d = data(400, Activation::Gelu);
    let mut gated = module(&ctx, Activation::Swiglu);
    let mut y = vec![0.0f32; T * H];
    // fc1 needs 2 * ffn rows when gated.
    let args = d.args();
    let e = gated
        .forward(&ctx, &args, &mut view_mut(&mut y, &[T, H]), None)
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("te_layernorm_mlp_forward"), "{}", e);
    assert!(e.message().contains("args->fc1_weight"), "{}", e);
    // A missing bias.
    let mut m = module(&ctx, Activation::Gelu);
    let args = LayerNormMlpArgs {
        fc2_bias: None,
        ..d.args()
    };
    let e = m
        .forward(&ctx, &args, &mut view_mut(&mut y, &[T, H]), None)
        .unwrap_err();
    assert!(e.message().contains("args->fc2_bias"), "{}", e);
    // A gradient of the wrong shape.
    let args = d.args();
    let mut bwd = m
        .forward(&ctx, &args, &mut view_mut(&mut y, &[T, H]), None)
        .unwrap();
    let dy = vec![0.5f32; T * H];
    let mut dw2 = vec![0.0f32; H * FFN];
    let e = bwd
        .backward(
            &ctx,
            &view(&dy, &[T, H]),
            LayerNormMlpGrads {
                dfc2_weight: Some(view_mut(&mut dw2, &[FFN, H])),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.message().contains("grads->dfc2_weight"), "{}", e);
    let e = LayerNormMlp::new(&ctx, &LayerNormMlpOptions::new(0, FFN)).unwrap_err();
    assert!(e.message().contains("hidden_size"), "{}", e);
}
