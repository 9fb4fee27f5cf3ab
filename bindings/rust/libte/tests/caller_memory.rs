//! Residuals in the caller's memory (`residuals_size` / `forward_compute_into` /
//! `backward_from`) for Linear, LayerNormLinear, LayerNormMlp and GroupedLinear: in high
//! precision and in FP8 (current scaling) they give the same y and gradients as the
//! library-owned path, bit for bit; backward_from repeats identically until a `_once` one;
//! bad memory is an `Err` naming the function.

mod common;

use common::*;
use libte::*;

const T: usize = 32;
const IN: usize = 64;
const OUT: usize = 48;

/// Runs `f` with the context as the forward should see it: inside an FP8 (current scaling)
/// scope, or plain.
fn in_scope<R>(ctx: &mut Context, fp8: bool, f: impl FnOnce(&Context) -> R) -> R {
    if fp8 {
        let recipe = Recipe::current_scaling().unwrap();
        let scope = Autocast::new(ctx, &AutocastOptions::fp8(&recipe)).unwrap();
        f(&scope)
    } else {
        f(ctx)
    }
}

fn scaled(seed: u64, n: usize, k: f32) -> Vec<f32> {
    fill(seed, n).iter().map(|v| v * k).collect()
}

// ---- Linear ------------------------------------------------------------------------------------

type LinearGrads = (Vec<f32>, Vec<f32>, Vec<f32>);

fn linear_grads() -> LinearGrads {
    (vec![0.0; T * IN], vec![0.0; OUT * IN], vec![0.0; OUT])
}

#[test]
fn linear_into_equals_owned() {
    let (x, w, b, dy) = (
        scaled(1, T * IN, 1.0),
        scaled(2, OUT * IN, 0.2),
        scaled(3, OUT, 1.0),
        scaled(4, T * OUT, 0.1),
    );
    for fp8 in [false, true] {
        let mut ctx = Context::cpu().unwrap();
        let args =
            ForwardArgs::new(view(&x, &[T, IN]), view(&w, &[OUT, IN])).bias(view(&b, &[OUT]));

        // Library-owned residuals.
        let mut owned = f32_linear(&ctx, IN, OUT);
        let mut y0 = vec![0.0f32; T * OUT];
        let mut g0 = linear_grads();
        {
            let mut bwd = in_scope(&mut ctx, fp8, |c| {
                owned
                    .forward(c, &args, &mut view_mut(&mut y0, &[T, OUT]))
                    .unwrap()
            });
            bwd.backward(
                &ctx,
                &view(&dy, &[T, OUT]),
                Some(&mut view_mut(&mut g0.0, &[T, IN])),
                Some(&mut view_mut(&mut g0.1, &[OUT, IN])),
                Some(&mut view_mut(&mut g0.2, &[OUT])),
            )
            .unwrap();
        }

        // Caller-owned residuals.
        let mut fc = f32_linear(&ctx, IN, OUT);
        let mut y1 = vec![0.0f32; T * OUT];
        let mut mem = in_scope(&mut ctx, fp8, |c| {
            let bytes = fc.residuals_size(c, &args).unwrap();
            assert_eq!(bytes == 0, !fp8, "size {} (fp8 {})", bytes, fp8);
            let mut mem = ResidualBuffer::new(bytes);
            fc.forward_compute_into(c, &args, &mut view_mut(&mut y1, &[T, OUT]), &mut mem)
                .unwrap();
            mem
        });
        assert_eq!(y0, y1, "y (fp8 {})", fp8);
        let run = |fc: &mut Linear, mem: &[u8], once: bool| -> Result<LinearGrads> {
            let mut g = linear_grads();
            let (dx, dw, db) = (
                &mut view_mut(&mut g.0, &[T, IN]),
                &mut view_mut(&mut g.1, &[OUT, IN]),
                &mut view_mut(&mut g.2, &[OUT]),
            );
            let dyv = view(&dy, &[T, OUT]);
            if once {
                fc.backward_from_once(&ctx, &args, mem, &dyv, Some(dx), Some(dw), Some(db))?;
            } else {
                fc.backward_from(&ctx, &args, mem, &dyv, Some(dx), Some(dw), Some(db))?;
            }
            Ok(g)
        };
        let g1 = run(&mut fc, &mem, false).unwrap();
        assert_eq!(g0, g1, "grads (fp8 {})", fp8);
        assert_eq!(run(&mut fc, &mem, false).unwrap(), g1, "repeatable");
        assert_eq!(run(&mut fc, &mem, true).unwrap(), g1, "once");
        if fp8 {
            // The record is gone.
            let err = run(&mut fc, &mem, false).unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
            assert!(
                err.message().starts_with("te_linear_backward_from"),
                "{}",
                err
            );
            // Memory too small, misaligned.
            let small = mem.len() - 16;
            let err = in_scope(&mut ctx, true, |c| {
                fc.forward_compute_into(
                    c,
                    &args,
                    &mut view_mut(&mut y1, &[T, OUT]),
                    &mut mem[..small],
                )
            })
            .unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
            assert!(
                err.message().starts_with("te_linear_forward_compute_into"),
                "{}",
                err
            );
            let mut big = ResidualBuffer::new(mem.len() + 16);
            let err = in_scope(&mut ctx, true, |c| {
                fc.forward_compute_into(c, &args, &mut view_mut(&mut y1, &[T, OUT]), &mut big[1..])
            })
            .unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
        }
    }
}

// ---- LayerNormLinear ---------------------------------------------------------------------------

#[test]
fn layernorm_linear_into_equals_owned() {
    let (x, gamma, beta, w, b, dy) = (
        scaled(11, T * IN, 2.0),
        fill(12, IN)
            .iter()
            .map(|v| 1.0 + v * 0.5)
            .collect::<Vec<f32>>(),
        scaled(13, IN, 0.5),
        scaled(14, OUT * IN, 0.2),
        scaled(15, OUT, 1.0),
        scaled(16, T * OUT, 0.1),
    );
    let opts = LayerNormLinearOptions {
        activation_dtype: DType::F32,
        ..LayerNormLinearOptions::new(IN, OUT)
    };
    type G = [Vec<f32>; 5];
    let fresh = || -> G {
        [
            vec![0.0; T * IN],
            vec![0.0; IN],
            vec![0.0; IN],
            vec![0.0; OUT * IN],
            vec![0.0; OUT],
        ]
    };
    fn grads(g: &mut G) -> LayerNormLinearGrads<'_> {
        let [dx, dg, dbeta, dw, db] = g;
        LayerNormLinearGrads {
            dx: Some(view_mut(dx, &[T, IN])),
            dln_weight: Some(view_mut(dg, &[IN])),
            dln_bias: Some(view_mut(dbeta, &[IN])),
            dw: Some(view_mut(dw, &[OUT, IN])),
            db: Some(view_mut(db, &[OUT])),
        }
    }
    for fp8 in [false, true] {
        let mut ctx = Context::cpu().unwrap();
        let args = LayerNormLinearArgs::new(
            view(&x, &[T, IN]),
            view(&gamma, &[IN]),
            view(&w, &[OUT, IN]),
        )
        .ln_bias(view(&beta, &[IN]))
        .bias(view(&b, &[OUT]));
        let dyv = view(&dy, &[T, OUT]);

        let mut owned = LayerNormLinear::new(&ctx, &opts).unwrap();
        let mut y0 = vec![0.0f32; T * OUT];
        let mut g0 = fresh();
        {
            let mut bwd = in_scope(&mut ctx, fp8, |c| {
                owned
                    .forward(c, &args, &mut view_mut(&mut y0, &[T, OUT]), None)
                    .unwrap()
            });
            bwd.backward(&ctx, &dyv, grads(&mut g0)).unwrap();
        }

        let mut m = LayerNormLinear::new(&ctx, &opts).unwrap();
        let mut y1 = vec![0.0f32; T * OUT];
        let mut ln_out = vec![0.0f32; T * IN];
        let mem = in_scope(&mut ctx, fp8, |c| {
            let bytes = m.residuals_size(c, &args).unwrap();
            assert!(bytes > 0);
            let mut mem = ResidualBuffer::new(bytes);
            m.forward_compute_into(
                c,
                &args,
                &mut view_mut(&mut y1, &[T, OUT]),
                Some(&mut view_mut(&mut ln_out, &[T, IN])),
                &mut mem,
            )
            .unwrap();
            mem
        });
        assert_eq!(y0, y1, "y (fp8 {})", fp8);
        assert!(ln_out.iter().any(|&v| v != 0.0), "ln_out written");
        let mut g1 = fresh();
        m.backward_from(&ctx, &args, &mem, &dyv, grads(&mut g1))
            .unwrap();
        assert_eq!(g0, g1, "grads (fp8 {})", fp8);
        let mut g2 = fresh();
        m.backward_from_once(&ctx, &args, &mem, &dyv, grads(&mut g2))
            .unwrap();
        assert_eq!(g1, g2, "repeatable");
        let err = m
            .backward_from(&ctx, &args, &mem, &dyv, grads(&mut g2))
            .unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
        assert!(
            err.message()
                .starts_with("te_layernorm_linear_backward_from"),
            "{}",
            err
        );
    }
}

// ---- LayerNormMlp ------------------------------------------------------------------------------

#[test]
fn layernorm_mlp_into_equals_owned() {
    const H: usize = 64;
    const FFN: usize = 96;
    let (x, gamma, beta, w1, b1, w2, b2, dy) = (
        scaled(21, T * H, 2.0),
        fill(22, H)
            .iter()
            .map(|v| 1.0 + v * 0.5)
            .collect::<Vec<f32>>(),
        scaled(23, H, 0.5),
        scaled(24, FFN * H, 0.2),
        scaled(25, FFN, 0.2),
        scaled(26, H * FFN, 0.2),
        scaled(27, H, 0.2),
        scaled(28, T * H, 0.1),
    );
    let opts = LayerNormMlpOptions {
        activation: Activation::Gelu,
        activation_dtype: DType::F32,
        ..LayerNormMlpOptions::new(H, FFN)
    };
    type G = [Vec<f32>; 7];
    let fresh = || -> G {
        [
            vec![0.0; T * H],
            vec![0.0; H],
            vec![0.0; H],
            vec![0.0; FFN * H],
            vec![0.0; FFN],
            vec![0.0; H * FFN],
            vec![0.0; H],
        ]
    };
    fn grads(g: &mut G) -> LayerNormMlpGrads<'_> {
        let [dx, dg, dbeta, dw1, db1, dw2, db2] = g;
        LayerNormMlpGrads {
            dx: Some(view_mut(dx, &[32, 64])),
            dln_weight: Some(view_mut(dg, &[64])),
            dln_bias: Some(view_mut(dbeta, &[64])),
            dfc1_weight: Some(view_mut(dw1, &[96, 64])),
            dfc1_bias: Some(view_mut(db1, &[96])),
            dfc2_weight: Some(view_mut(dw2, &[64, 96])),
            dfc2_bias: Some(view_mut(db2, &[64])),
        }
    }
    for fp8 in [false, true] {
        let mut ctx = Context::cpu().unwrap();
        let args = LayerNormMlpArgs::new(
            view(&x, &[T, H]),
            view(&gamma, &[H]),
            view(&w1, &[FFN, H]),
            view(&w2, &[H, FFN]),
        )
        .ln_bias(view(&beta, &[H]))
        .biases(view(&b1, &[FFN]), view(&b2, &[H]));
        let dyv = view(&dy, &[T, H]);

        let mut owned = LayerNormMlp::new(&ctx, &opts).unwrap();
        let mut y0 = vec![0.0f32; T * H];
        let mut g0 = fresh();
        {
            let mut bwd = in_scope(&mut ctx, fp8, |c| {
                owned
                    .forward(c, &args, &mut view_mut(&mut y0, &[T, H]), None)
                    .unwrap()
            });
            bwd.backward(&ctx, &dyv, grads(&mut g0)).unwrap();
        }

        let mut m = LayerNormMlp::new(&ctx, &opts).unwrap();
        let mut y1 = vec![0.0f32; T * H];
        let mem = in_scope(&mut ctx, fp8, |c| {
            let mut mem = ResidualBuffer::new(m.residuals_size(c, &args).unwrap());
            m.forward_compute_into(c, &args, &mut view_mut(&mut y1, &[T, H]), None, &mut mem)
                .unwrap();
            mem
        });
        assert_eq!(y0, y1, "y (fp8 {})", fp8);
        let mut g1 = fresh();
        m.backward_from(&ctx, &args, &mem, &dyv, grads(&mut g1))
            .unwrap();
        assert_eq!(g0, g1, "grads (fp8 {})", fp8);
        let mut g2 = fresh();
        m.backward_from(&ctx, &args, &mem, &dyv, grads(&mut g2))
            .unwrap();
        assert_eq!(g1, g2, "repeatable");
    }
}

// ---- GroupedLinear -----------------------------------------------------------------------------

#[test]
fn grouped_linear_into_equals_owned() {
    const E: usize = 3;
    let splits = [10usize, 0, 22];
    let x = scaled(31, T * IN, 1.0);
    let ws: Vec<Vec<f32>> = (0..E)
        .map(|e| scaled(32 + e as u64, OUT * IN, 0.2))
        .collect();
    let bs: Vec<Vec<f32>> = (0..E).map(|e| scaled(40 + e as u64, OUT, 1.0)).collect();
    let dy = scaled(50, T * OUT, 0.1);
    let opts = GroupedLinearOptions {
        activation_dtype: DType::F32,
        ..GroupedLinearOptions::new(E, IN, OUT)
    };
    type G = (Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>);
    let fresh = || -> G {
        (
            vec![0.0; T * IN],
            vec![vec![7.0; OUT * IN]; E],
            vec![vec![7.0; OUT]; E],
        )
    };
    fn grads(g: &mut G) -> GroupedLinearGrads<'_> {
        GroupedLinearGrads {
            dx: Some(view_mut(&mut g.0, &[32, 64])),
            dw: Some(g.1.iter_mut().map(|w| view_mut(w, &[48, 64])).collect()),
            db: Some(g.2.iter_mut().map(|b| view_mut(b, &[48])).collect()),
        }
    }
    for fp8 in [false, true] {
        let mut ctx = Context::cpu().unwrap();
        let wv: Vec<TensorView<'_>> = ws.iter().map(|w| view(w, &[OUT, IN])).collect();
        let bv: Vec<TensorView<'_>> = bs.iter().map(|b| view(b, &[OUT])).collect();
        let args = GroupedLinearArgs::new(view(&x, &[T, IN]), &splits, &wv).biases(&bv);
        let dyv = view(&dy, &[T, OUT]);

        let mut owned = GroupedLinear::new(&ctx, &opts).unwrap();
        let mut y0 = vec![0.0f32; T * OUT];
        let mut g0 = fresh();
        {
            let mut bwd = in_scope(&mut ctx, fp8, |c| {
                owned
                    .forward(c, &args, &mut view_mut(&mut y0, &[T, OUT]))
                    .unwrap()
            });
            bwd.backward(&ctx, &dyv, grads(&mut g0)).unwrap();
        }

        let mut m = GroupedLinear::new(&ctx, &opts).unwrap();
        let mut y1 = vec![0.0f32; T * OUT];
        let mem = in_scope(&mut ctx, fp8, |c| {
            let bytes = m.residuals_size(c, &args).unwrap();
            assert_eq!(bytes == 0, !fp8, "size {} (fp8 {})", bytes, fp8);
            let mut mem = ResidualBuffer::new(bytes);
            m.forward_compute_into(c, &args, &mut view_mut(&mut y1, &[T, OUT]), &mut mem)
                .unwrap();
            mem
        });
        assert_eq!(y0, y1, "y (fp8 {})", fp8);
        let mut g1 = fresh();
        m.backward_from(&ctx, Some(&args), &mem, &dyv, grads(&mut g1))
            .unwrap();
        assert_eq!(g0, g1, "grads (fp8 {})", fp8);
        if fp8 {
            // Under FP8 the inputs may be left out.
            let mut g2 = fresh();
            m.backward_from_once(&ctx, None, &mem, &dyv, grads(&mut g2))
                .unwrap();
            assert_eq!(g1, g2, "without inputs");
        } else {
            // In high precision they are required.
            let err = m
                .backward_from(&ctx, None, &mem, &dyv, grads(&mut fresh()))
                .unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
            assert!(
                err.message().starts_with("te_grouped_linear_backward_from"),
                "{}",
                err
            );
        }
        // A dw list of the wrong length is caught before the call.
        let mut g3 = fresh();
        let mut gr = grads(&mut g3);
        gr.dw.as_mut().unwrap().pop();
        let err = m
            .backward_from(&ctx, Some(&args), &mem, &dyv, gr)
            .unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
        assert!(
            err.message().starts_with("GroupedLinear::backward_from"),
            "{}",
            err
        );
    }
}

#[test]
fn residual_buffer_is_aligned_and_sized() {
    for n in [0usize, 1, 15, 16, 17, 1000] {
        let mut b = ResidualBuffer::new(n);
        assert_eq!(b.len(), n);
        assert_eq!(b.is_empty(), n == 0);
        assert_eq!(b.as_ptr() as usize % 16, 0);
        assert!(b.iter().all(|&v| v == 0));
        b.iter_mut().for_each(|v| *v = 1);
        assert_eq!(b.iter().map(|&v| v as usize).sum::<usize>(), n);
    }
}
