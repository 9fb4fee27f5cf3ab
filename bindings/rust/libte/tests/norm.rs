//! Context::norm_forward / norm_backward against f64 references, FP8 outputs against libte's own
//! cast of the F32 output, and the errors; the GeGLU and SReLU activations.

#![allow(clippy::needless_range_loop)] // indices mirror the formulas

mod common;

use common::{fill, view, view_mut};
use libte::*;

const ROWS: usize = 6;
const HIDDEN: usize = 40;

struct Data {
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    dy: Vec<f32>,
}

fn data() -> Data {
    Data {
        x: fill(1, ROWS * HIDDEN).iter().map(|v| 2.0 * v).collect(),
        gamma: fill(2, HIDDEN).iter().map(|v| 1.0 + 0.5 * v).collect(),
        beta: fill(3, HIDDEN).iter().map(|v| 0.5 * v).collect(),
        dy: fill(4, ROWS * HIDDEN),
    }
}

/// (y, mu, rsigma, x_hat) in f64; g = gamma (+ 1 when zero-centred).
fn reference(
    kind: NormKind,
    d: &Data,
    eps: f64,
    zcg: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut mus, mut rss, mut xh) = (vec![], vec![], vec![], vec![]);
    for r in 0..ROWS {
        let row: Vec<f64> = d.x[r * HIDDEN..(r + 1) * HIDDEN]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let n = HIDDEN as f64;
        let (mu, second) = if kind == NormKind::LayerNorm {
            let mu = row.iter().sum::<f64>() / n;
            (mu, row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>())
        } else {
            (0.0, row.iter().map(|v| v * v).sum::<f64>())
        };
        let rs = 1.0 / (second / n + eps).sqrt();
        mus.push(mu);
        rss.push(rs);
        for j in 0..HIDDEN {
            let g = d.gamma[j] as f64 + if zcg { 1.0 } else { 0.0 };
            let h = (row[j] - mu) * rs;
            xh.push(h);
            let b = if kind == NormKind::LayerNorm {
                d.beta[j] as f64
            } else {
                0.0
            };
            y.push(h * g + b);
        }
    }
    (y, mus, rss, xh)
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{}", what);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{}[{}]: got {}, want {}",
            what,
            i,
            g,
            w
        );
    }
}

struct Forward {
    y: Vec<f32>,
    mu: Vec<f32>,
    rsigma: Vec<f32>,
}

fn forward(ctx: &Context, opts: &NormOptions, d: &Data) -> Forward {
    let (mut y, mut mu, mut rsigma) = (vec![0.0; ROWS * HIDDEN], vec![0.0; ROWS], vec![0.0; ROWS]);
    let layer = opts.kind == NormKind::LayerNorm;
    let beta = view(&d.beta, &[HIDDEN]);
    ctx.norm_forward(
        opts,
        &view(&d.x, &[ROWS, HIDDEN]),
        &view(&d.gamma, &[HIDDEN]),
        if layer { Some(&beta) } else { None },
        NormOutputs {
            output: Some(view_mut(&mut y, &[ROWS, HIDDEN])),
            mu: if layer {
                Some(view_mut(&mut mu, &[ROWS]))
            } else {
                None
            },
            rsigma: Some(view_mut(&mut rsigma, &[ROWS])),
            ..Default::default()
        },
        QuantizeScale::default(),
    )
    .expect("norm_forward");
    Forward { y, mu, rsigma }
}

#[test]
fn options_defaults_match_the_header() {
    let mut raw = sys::te_norm_options::default();
    assert_eq!(
        unsafe { sys::te_norm_options_init(&mut raw) },
        sys::te_status::TE_SUCCESS
    );
    let o = NormOptions::default();
    assert_eq!(raw.kind, sys::te_norm_kind::TE_NORM_LAYERNORM);
    assert_eq!(o.kind, NormKind::LayerNorm);
    assert_eq!(raw.eps, o.eps);
    assert_eq!(raw.zero_centered_gamma, 0);
    assert!(!o.zero_centered_gamma);
}

#[test]
fn forward_matches_f64_reference() {
    let ctx = Context::cpu().unwrap();
    let d = data();
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        for zcg in [false, true] {
            let opts = NormOptions {
                zero_centered_gamma: zcg,
                ..NormOptions::new(kind)
            };
            let f = forward(&ctx, &opts, &d);
            let (y, mu, rs, _) = reference(kind, &d, opts.eps as f64, zcg);
            // fp32 with short fixed-order sums against f64: a few ulps.
            assert_close(&f.y, &y, 1e-5, "y");
            assert_close(&f.rsigma, &rs, 1e-5, "rsigma");
            if kind == NormKind::LayerNorm {
                assert_close(&f.mu, &mu, 1e-6, "mu");
            }
        }
    }
}

#[test]
fn fp8_outputs_are_the_cast_of_the_f32_output() {
    let ctx = Context::cpu().unwrap();
    let d = data();
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let opts = NormOptions::new(kind);
        let v = forward(&ctx, &opts, &d).y;
        let vmax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let beta = view(&d.beta, &[HIDDEN]);
        let beta = if kind == NormKind::LayerNorm {
            Some(&beta)
        } else {
            None
        };
        for (scale, expected_scale) in [
            (QuantizeScale::Given(24.0), 24.0f32),
            (QuantizeScale::default(), 448.0f32 / vmax),
        ] {
            let (mut codes, mut codes_t) = (vec![0u8; ROWS * HIDDEN], vec![0u8; ROWS * HIDDEN]);
            let (mut si, mut si_t) = ([0.0f32], [0.0f32]);
            let mut amax = 0.0f32;
            ctx.norm_forward(
                &opts,
                &view(&d.x, &[ROWS, HIDDEN]),
                &view(&d.gamma, &[HIDDEN]),
                beta,
                NormOutputs {
                    output: Some(
                        TensorViewMut::from_fp8(
                            &mut codes,
                            DType::E4M3,
                            &[ROWS, HIDDEN],
                            &mut si,
                            ScalingMode::PerTensor,
                        )
                        .unwrap(),
                    ),
                    output_t: Some(
                        TensorViewMut::from_fp8(
                            &mut codes_t,
                            DType::E4M3,
                            &[HIDDEN, ROWS],
                            &mut si_t,
                            ScalingMode::PerTensor,
                        )
                        .unwrap(),
                    ),
                    amax: Some(&mut amax),
                    ..Default::default()
                },
                scale,
            )
            .expect("norm_forward (FP8)");
            // libte's own cast of v with that scale: the same codes.
            let (mut want, mut want_si) = (vec![0u8; ROWS * HIDDEN], [0.0f32]);
            ctx.quantize(
                &view(&v, &[ROWS, HIDDEN]),
                &mut TensorViewMut::from_fp8(
                    &mut want,
                    DType::E4M3,
                    &[ROWS, HIDDEN],
                    &mut want_si,
                    ScalingMode::PerTensor,
                )
                .unwrap(),
                QuantizeScale::Given(expected_scale),
            )
            .unwrap();
            assert_eq!(codes, want, "{:?}: codes", kind);
            assert_eq!(si[0].to_bits(), (1.0 / expected_scale).to_bits());
            assert_eq!(si_t[0].to_bits(), si[0].to_bits());
            for r in 0..ROWS {
                for c in 0..HIDDEN {
                    assert_eq!(codes_t[c * ROWS + r], codes[r * HIDDEN + c]);
                }
            }
            assert_eq!(amax, vmax);
        }
    }
}

#[test]
fn backward_matches_f64_reference_and_repeats_exactly() {
    let ctx = Context::cpu().unwrap();
    let d = data();
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let opts = NormOptions::new(kind);
        let f = forward(&ctx, &opts, &d);
        let layer = kind == NormKind::LayerNorm;
        let run = || {
            let (mut dx, mut dg, mut db) = (
                vec![0.0f32; ROWS * HIDDEN],
                vec![0.0f32; HIDDEN],
                vec![0.0f32; HIDDEN],
            );
            let mu = view(&f.mu, &[ROWS]);
            ctx.norm_backward(
                &opts,
                &view(&d.dy, &[ROWS, HIDDEN]),
                &view(&d.x, &[ROWS, HIDDEN]),
                &view(&d.gamma, &[HIDDEN]),
                if layer { Some(&mu) } else { None },
                &view(&f.rsigma, &[ROWS]),
                NormGrads {
                    dx: Some(view_mut(&mut dx, &[ROWS, HIDDEN])),
                    dgamma: Some(view_mut(&mut dg, &[HIDDEN])),
                    dbeta: if layer {
                        Some(view_mut(&mut db, &[HIDDEN]))
                    } else {
                        None
                    },
                },
            )
            .expect("norm_backward");
            (dx, dg, db)
        };
        let (dx, dg, db) = run();
        assert_eq!(
            (dx.clone(), dg.clone(), db.clone()),
            run(),
            "backward twice"
        );
        let (_, _, rs, xh) = reference(kind, &d, opts.eps as f64, false);
        let (mut rdx, mut rdg, mut rdb) = (vec![], vec![0.0f64; HIDDEN], vec![0.0f64; HIDDEN]);
        for r in 0..ROWS {
            let (mut c1, mut c2) = (0.0, 0.0);
            for j in 0..HIDDEN {
                let dyg = d.dy[r * HIDDEN + j] as f64 * d.gamma[j] as f64;
                c1 += dyg * xh[r * HIDDEN + j];
                c2 += dyg;
            }
            c1 /= HIDDEN as f64;
            c2 = if layer { c2 / HIDDEN as f64 } else { 0.0 };
            for j in 0..HIDDEN {
                let dy = d.dy[r * HIDDEN + j] as f64;
                let dyg = dy * d.gamma[j] as f64;
                rdx.push(rs[r] * (dyg - xh[r * HIDDEN + j] * c1 - c2));
                rdg[j] += dy * xh[r * HIDDEN + j];
                rdb[j] += dy;
            }
        }
        assert_close(&dx, &rdx, 1e-5, "dx");
        assert_close(&dg, &rdg, 1e-5, "dgamma");
        if layer {
            assert_close(&db, &rdb, 1e-5, "dbeta");
        }
    }
}

#[test]
fn bad_arguments_are_errors_naming_them() {
    let ctx = Context::cpu().unwrap();
    let d = data();
    let mut y = vec![7.0f32; ROWS * HIDDEN];
    let beta = view(&d.beta, &[HIDDEN]);
    let call = |opts: NormOptions, beta: Option<&TensorView<'_>>, y: &mut Vec<f32>| {
        ctx.norm_forward(
            &opts,
            &view(&d.x, &[ROWS, HIDDEN]),
            &view(&d.gamma, &[HIDDEN]),
            beta,
            NormOutputs {
                output: Some(view_mut(y, &[ROWS, HIDDEN])),
                ..Default::default()
            },
            QuantizeScale::default(),
        )
    };
    let err = call(NormOptions::new(NormKind::RmsNorm), Some(&beta), &mut y).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message()
            .starts_with("te_norm_forward: argument 'args->bias'"),
        "{}",
        err
    );
    let err = call(NormOptions::new(NormKind::LayerNorm), None, &mut y).unwrap_err();
    assert!(err.message().contains("'args->bias'"), "{}", err);
    for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let err = call(
            NormOptions {
                eps,
                ..NormOptions::default()
            },
            Some(&beta),
            &mut y,
        )
        .unwrap_err();
        assert!(err.message().contains("'opts->eps'"), "{}", err);
    }
    assert!(y.iter().all(|&v| v == 7.0), "outputs untouched on failure");
    // No output at all.
    let err = ctx
        .norm_forward(
            &NormOptions::default(),
            &view(&d.x, &[ROWS, HIDDEN]),
            &view(&d.gamma, &[HIDDEN]),
            Some(&beta),
            NormOutputs::default(),
            QuantizeScale::default(),
        )
        .unwrap_err();
    assert!(err.message().contains("'args->output'"), "{}", err);
    // RMSNorm backward with mu.
    let mu = vec![0.0f32; ROWS];
    let rs = vec![1.0f32; ROWS];
    let mut dx = vec![0.0f32; ROWS * HIDDEN];
    let err = ctx
        .norm_backward(
            &NormOptions::new(NormKind::RmsNorm),
            &view(&d.dy, &[ROWS, HIDDEN]),
            &view(&d.x, &[ROWS, HIDDEN]),
            &view(&d.gamma, &[HIDDEN]),
            Some(&view(&mu, &[ROWS])),
            &view(&rs, &[ROWS]),
            NormGrads {
                dx: Some(view_mut(&mut dx, &[ROWS, HIDDEN])),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        err.message().starts_with("te_norm_backward: argument 'mu'"),
        "{}",
        err
    );
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh())
}

/// GeGLU and SReLU are in te.h; a library that does not implement them yet rejects the value
/// naming 'act' (reported, not failed: the binding passes the right code either way).
fn implemented(r: &Result<()>) -> bool {
    match r {
        Err(e)
            if e.status() == Status::InvalidArgument && e.message().contains("argument 'act'") =>
        {
            eprintln!(
                "skipped: libte does not implement this activation yet: {}",
                e
            );
            false
        }
        _ => true,
    }
}

#[test]
fn geglu_and_srelu() {
    let ctx = Context::cpu().unwrap();
    let x = fill(9, 4 * 16);
    assert!(Activation::Geglu.is_gated() && !Activation::Srelu.is_gated());
    let mut y = vec![0.0f32; 4 * 8];
    let r = ctx.activation_forward(
        Activation::Geglu,
        &view(&x, &[4, 16]),
        &mut view_mut(&mut y, &[4, 8]),
    );
    if implemented(&r) {
        r.unwrap();
        for row in 0..4 {
            for j in 0..8 {
                let (a, b) = (x[row * 16 + j] as f64, x[row * 16 + 8 + j] as f64);
                let want = gelu(a) * b;
                assert!((y[row * 8 + j] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()));
            }
        }
    }
    let mut s = vec![0.0f32; 4 * 16];
    let r = ctx.activation_forward(
        Activation::Srelu,
        &view(&x, &[4, 16]),
        &mut view_mut(&mut s, &[4, 16]),
    );
    if implemented(&r) {
        r.unwrap();
        for (i, &v) in x.iter().enumerate() {
            let want = (v.max(0.0) as f64).powi(2);
            assert!((s[i] as f64 - want).abs() <= 1e-6 * (1.0 + want));
        }
        let dy = vec![1.0f32; 4 * 16];
        let mut dx = vec![0.0f32; 4 * 16];
        ctx.activation_backward(
            Activation::Srelu,
            &view(&x, &[4, 16]),
            &view(&dy, &[4, 16]),
            &mut view_mut(&mut dx, &[4, 16]),
        )
        .unwrap();
        for (i, &v) in x.iter().enumerate() {
            assert!((dx[i] - 2.0 * v.max(0.0)).abs() <= 1e-6);
        }
    }
}
