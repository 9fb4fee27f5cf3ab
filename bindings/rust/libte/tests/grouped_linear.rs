//! GroupedLinear against f64 references (one product per expert over its rows), bitwise against
//! one `Linear` per expert in FP8, within a justified tolerance for uneven splits, repeatable
//! backward, state round trips, errors (what Rust checks and what libte checks).

mod common;

use common::reference::*;
use common::*;
use libte::*;

const E: usize = 4;
const IN: usize = 64;
const OUT: usize = 48;

struct Data {
    splits: Vec<usize>,
    rows: usize,
    x: Vec<f32>,
    w: Vec<Vec<f32>>,
    b: Vec<Vec<f32>>,
}

fn data(seed: u64, splits: &[usize]) -> Data {
    let rows = splits.iter().sum();
    Data {
        splits: splits.to_vec(),
        rows,
        x: fill(seed, rows * IN).iter().map(|v| v * 2.0).collect(),
        w: (0..E)
            .map(|i| {
                fill(seed + 1 + i as u64, OUT * IN)
                    .iter()
                    .map(|v| v * 0.2)
                    .collect()
            })
            .collect(),
        b: (0..E).map(|i| fill(seed + 10 + i as u64, OUT)).collect(),
    }
}

impl Data {
    fn weights(&self) -> Vec<TensorView<'_>> {
        self.w.iter().map(|w| view(w, &[OUT, IN])).collect()
    }

    fn biases(&self) -> Vec<TensorView<'_>> {
        self.b.iter().map(|b| view(b, &[OUT])).collect()
    }

    /// The first row of each expert, and one past the last.
    fn bounds(&self) -> Vec<usize> {
        let mut out = vec![0];
        for s in &self.splits {
            out.push(out.last().unwrap() + s);
        }
        out
    }

    /// y, dx, dW_i, db_i in f64, expert by expert, from (possibly quantized) x and W_i.
    fn reference(
        &self,
        x: &[f64],
        w: &[Vec<f64>],
        dy: &[f32],
    ) -> (Vec<f64>, Vec<f64>, Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let bounds = self.bounds();
        let (mut y, mut dx) = (vec![0.0; self.rows * OUT], vec![0.0; self.rows * IN]);
        let (mut dw, mut db) = (vec![], vec![]);
        for i in 0..E {
            let (r0, r1) = (bounds[i], bounds[i + 1]);
            let n = r1 - r0;
            let xi = &x[r0 * IN..r1 * IN];
            let dyi = f64s(&dy[r0 * OUT..r1 * OUT]);
            let mut yi = matmul_nt(xi, &w[i], n, OUT, IN);
            add_bias(&mut yi, &self.b[i]);
            y[r0 * OUT..r1 * OUT].copy_from_slice(&yi);
            dx[r0 * IN..r1 * IN].copy_from_slice(&matmul_nn(&dyi, &w[i], n, IN, OUT));
            dw.push(matmul_tn(&dyi, xi, OUT, IN, n));
            db.push(column_sums(&dyi, OUT));
        }
        (y, dx, dw, db)
    }
}

fn module(ctx: &Context, bias: bool) -> GroupedLinear {
    GroupedLinear::new(
        ctx,
        &GroupedLinearOptions {
            bias,
            activation_dtype: DType::F32,
            ..GroupedLinearOptions::new(E, IN, OUT)
        },
    )
    .unwrap()
}

/// dx, dW_i, db_i.
#[derive(PartialEq, Debug)]
struct Grads(Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>);

fn backward(
    ctx: &Context,
    bwd: &mut GroupedLinearBackwardCtx<'_>,
    dy: &[f32],
    rows: usize,
    once: bool,
) -> Result<Grads> {
    let mut g = Grads(
        vec![0.0; rows * IN],
        vec![vec![7.0; OUT * IN]; E], // not zero: an empty expert's dW must be written
        vec![vec![7.0; OUT]; E],
    );
    let grads = GroupedLinearGrads {
        dx: Some(view_mut(&mut g.0, &[rows, IN])),
        dw: Some(g.1.iter_mut().map(|w| view_mut(w, &[OUT, IN])).collect()),
        db: Some(g.2.iter_mut().map(|b| view_mut(b, &[OUT])).collect()),
    };
    let dy = view(dy, &[rows, OUT]);
    if once {
        bwd.backward_once(ctx, &dy, grads)?;
    } else {
        bwd.backward(ctx, &dy, grads)?;
    }
    Ok(g)
}

#[test]
fn high_precision_matches_f64() {
    let ctx = Context::cpu().unwrap();
    let d = data(1, &[10, 0, 37, 17]); // uneven, an empty expert, not multiples of 16
    let mut m = module(&ctx, true);
    let mut y = vec![0.0f32; d.rows * OUT];
    let (weights, biases) = (d.weights(), d.biases());
    let args =
        GroupedLinearArgs::new(view(&d.x, &[d.rows, IN]), &d.splits, &weights).biases(&biases);
    let res = m
        .forward_compute(&ctx, &args, &mut view_mut(&mut y, &[d.rows, OUT]))
        .unwrap();
    assert!(!res.fp8());
    let dy = fill(2, d.rows * OUT);
    let w: Vec<Vec<f64>> = d.w.iter().map(|w| f64s(w)).collect();
    let (y_ref, dx, dw, db) = d.reference(&f64s(&d.x), &w, &dy);
    assert_close("y", &y, &y_ref, 1e-5); // fp32 sums of 64 terms
    let mut bwd = m.forward_save(&ctx, res).unwrap();
    let g = backward(&ctx, &mut bwd, &dy, d.rows, false).unwrap();
    assert_close("dx", &g.0, &dx, 1e-5);
    for i in 0..E {
        if d.splits[i] == 0 {
            assert!(g.1[i].iter().all(|&v| v == 0.0) && g.2[i].iter().all(|&v| v == 0.0));
        } else {
            assert_close(&format!("dw[{}]", i), &g.1[i], &dw[i], 1e-5);
            assert_close(&format!("db[{}]", i), &g.2[i], &db[i], 1e-5);
        }
    }
    assert_eq!(backward(&ctx, &mut bwd, &dy, d.rows, false).unwrap(), g);
}

/// Experts with multiples of 16 tokens are exactly te_linear's FP8 GEMMs: the same bytes as
/// one Linear per expert over several steps (the empty expert sits them out). One autocast
/// pass per Linear: a pass's backward scales are updated after its first FP8 module's
/// backward, and the grouped module runs all its experts before its update.
#[test]
fn fp8_equals_one_linear_per_expert() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::new(&RecipeOptions {
        amax_history_len: 4,
        ..Default::default()
    })
    .unwrap();
    let d = data(3, &[32, 0, 16, 48]);
    let bounds = d.bounds();
    let mut m = module(&ctx, true);
    let mut linears: Vec<Linear> = (0..E).map(|_| f32_linear(&ctx, IN, OUT)).collect();
    let (weights, biases) = (d.weights(), d.biases());
    for step in 0..3 {
        let x: Vec<f32> = d.x.iter().map(|v| v * (step + 1) as f32).collect();
        let dy = fill(4 + step, d.rows * OUT);
        let mut y = vec![0.0f32; d.rows * OUT];
        let args =
            GroupedLinearArgs::new(view(&x, &[d.rows, IN]), &d.splits, &weights).biases(&biases);
        let mut bwd = {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            m.forward(&scope, &args, &mut view_mut(&mut y, &[d.rows, OUT]))
                .unwrap()
        };
        let g = backward(&ctx, &mut bwd, &dy, d.rows, true).unwrap();
        for (i, lin) in linears.iter_mut().enumerate() {
            let (r0, r1) = (bounds[i], bounds[i + 1]);
            if r0 == r1 {
                assert!(g.1[i].iter().all(|&v| v == 0.0));
                continue;
            }
            let n = r1 - r0;
            let mut yi = vec![0.0f32; n * OUT];
            let args =
                ForwardArgs::new(view(&x[r0 * IN..r1 * IN], &[n, IN]), weights[i]).bias(biases[i]);
            let mut lb = {
                let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
                lin.forward(&scope, &args, &mut view_mut(&mut yi, &[n, OUT]))
                    .unwrap()
            };
            assert_eq!(
                &y[r0 * OUT..r1 * OUT],
                &yi[..],
                "step {} expert {} y",
                step,
                i
            );
            let (mut dx, mut dw, mut db) = (
                vec![0.0f32; n * IN],
                vec![0.0f32; OUT * IN],
                vec![0.0f32; OUT],
            );
            lb.backward_once(
                &ctx,
                &view(&dy[r0 * OUT..r1 * OUT], &[n, OUT]),
                Some(&mut view_mut(&mut dx, &[n, IN])),
                Some(&mut view_mut(&mut dw, &[OUT, IN])),
                Some(&mut view_mut(&mut db, &[OUT])),
            )
            .unwrap();
            assert_eq!(
                &g.0[r0 * IN..r1 * IN],
                &dx[..],
                "step {} expert {} dx",
                step,
                i
            );
            assert_eq!(g.1[i], dw, "step {} expert {} dw", step, i);
            assert_eq!(g.2[i], db, "step {} expert {} db", step, i);
        }
    }
    for i in [0, 2, 3] {
        for role in [
            TensorRole::Input,
            TensorRole::Weight,
            TensorRole::GradOutput,
        ] {
            assert_eq!(
                m.scaling_state(&ctx, i, role).unwrap(),
                linears[i].scaling_state(&ctx, role).unwrap()
            );
        }
    }
    assert!(m
        .scaling_state(&ctx, 1, TensorRole::Input)
        .unwrap()
        .amax_history
        .is_empty());
}

/// Experts padded to 16 rows inside the library, against the unquantized formulas: E4M3
/// operands (3 mantissa bits, 0.036 RMS relative each) give products near 0.05 relative
/// (Frobenius), bound 0.08; the backward adds dy in E5M2 (0.072 RMS), bound 0.15.
#[test]
fn fp8_uneven_splits_close_to_f64() {
    let mut ctx = Context::cpu().unwrap();
    let recipe = Recipe::current_scaling().unwrap();
    let d = data(5, &[5, 0, 40, 19]);
    let mut m = module(&ctx, true);
    let mut y = vec![0.0f32; d.rows * OUT];
    let (weights, biases) = (d.weights(), d.biases());
    let args =
        GroupedLinearArgs::new(view(&d.x, &[d.rows, IN]), &d.splits, &weights).biases(&biases);
    let res = {
        let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        m.forward_compute(&scope, &args, &mut view_mut(&mut y, &[d.rows, OUT]))
            .unwrap()
    };
    assert!(res.fp8());
    let mut bwd = m.forward_save(&ctx, res).unwrap();
    let dy = fill(6, d.rows * OUT);
    let w: Vec<Vec<f64>> = d.w.iter().map(|w| f64s(w)).collect();
    let (y_ref, dx, dw, db) = d.reference(&f64s(&d.x), &w, &dy);
    // Without the biases, which are added in fp32 after the GEMM.
    let bounds = d.bounds();
    let unbias = |v: &mut Vec<f64>| {
        for i in 0..E {
            for r in bounds[i]..bounds[i + 1] {
                for o in 0..OUT {
                    v[r * OUT + o] -= d.b[i][o] as f64;
                }
            }
        }
    };
    let mut y64 = f64s(&y);
    let mut y_ref = y_ref;
    unbias(&mut y64);
    unbias(&mut y_ref);
    let y32: Vec<f32> = y64.iter().map(|&v| v as f32).collect();
    assert!(rel_err(&y32, &y_ref) < 0.08);
    let g = backward(&ctx, &mut bwd, &dy, d.rows, false).unwrap();
    assert!(rel_err(&g.0, &dx) < 0.15);
    for i in [0, 2, 3] {
        assert!(rel_err(&g.1[i], &dw[i]) < 0.15, "dw[{}]", i);
        assert_close(&format!("db[{}]", i), &g.2[i], &db[i], 1e-5); // fp32 sums of dy
    }
}

#[test]
fn main_grads_skips_and_state_round_trip() {
    let mut ctx = Context::cpu().unwrap();
    let d = data(7, &[16, 0, 16, 16]);
    let mut m = GroupedLinear::new(
        &ctx,
        &GroupedLinearOptions {
            bias: false,
            activation_dtype: DType::F32,
            fuse_wgrad_accumulation: true,
            ..GroupedLinearOptions::new(E, IN, OUT)
        },
    )
    .unwrap();
    let weights = d.weights();
    let mut y = vec![0.0f32; d.rows * OUT];
    let args = GroupedLinearArgs::new(view(&d.x, &[d.rows, IN]), &d.splits, &weights);
    let recipe = Recipe::new(&RecipeOptions {
        amax_history_len: 4,
        ..Default::default()
    })
    .unwrap();
    let mut bwd = {
        let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
        m.forward(&scope, &args, &mut view_mut(&mut y, &[d.rows, OUT]))
            .unwrap()
    };
    let dy = fill(8, d.rows * OUT);
    let mut main = vec![vec![1.0f32; OUT * IN]; E];
    bwd.backward(
        &ctx,
        &view(&dy, &[d.rows, OUT]),
        GroupedLinearGrads {
            dw: Some(main.iter_mut().map(|w| view_mut(w, &[OUT, IN])).collect()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(main[1].iter().all(|&v| v == 1.0)); // the empty expert: nothing added
    assert!(main[0].iter().any(|&v| v != 1.0));

    let state = m.state_save(&ctx).unwrap();
    let mut fresh = GroupedLinear::new(&ctx, m.options()).unwrap();
    fresh.state_load(&ctx, &state).unwrap();
    assert_eq!(fresh.state_save(&ctx).unwrap(), state);
    for i in 0..E {
        for role in [
            TensorRole::Input,
            TensorRole::Weight,
            TensorRole::GradOutput,
        ] {
            assert_eq!(
                m.scaling_state(&ctx, i, role).unwrap(),
                fresh.scaling_state(&ctx, i, role).unwrap()
            );
        }
    }
    let other = GroupedLinear::new(
        &ctx,
        &GroupedLinearOptions {
            num_gemms: E + 1,
            ..*m.options()
        },
    )
    .unwrap()
    .state_load(&ctx, &state);
    assert!(other
        .unwrap_err()
        .message()
        .contains("te_grouped_linear_state_load"));
}

#[test]
fn errors_name_the_argument() {
    let ctx = Context::cpu().unwrap();
    let d = data(9, &[10, 0, 30, 24]);
    let mut m = module(&ctx, true);
    let mut y = vec![0.0f32; d.rows * OUT];
    let (weights, biases) = (d.weights(), d.biases());
    let x = view(&d.x, &[d.rows, IN]);
    let mut run = |args: &GroupedLinearArgs<'_, '_>| {
        m.forward(&ctx, args, &mut view_mut(&mut y, &[64, OUT]))
            .map(drop)
            .unwrap_err()
    };
    // What Rust checks: every array has num_gemms entries (libte would read past a short one).
    let e = run(&GroupedLinearArgs::new(x, &d.splits[..3], &weights).biases(&biases));
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(
        e.message().contains("args.m_splits") && e.message().contains("num_gemms (4)"),
        "{}",
        e
    );
    let e = run(&GroupedLinearArgs::new(x, &d.splits, &weights[..2]).biases(&biases));
    assert!(e.message().contains("args.weights"), "{}", e);
    let e = run(&GroupedLinearArgs::new(x, &d.splits, &weights).biases(&biases[..1]));
    assert!(e.message().contains("args.biases"), "{}", e);
    // What libte checks.
    let e = run(&GroupedLinearArgs::new(x, &[10, 0, 30, 25], &weights).biases(&biases));
    assert!(
        e.message().contains("te_grouped_linear_forward") && e.message().contains("args->m_splits"),
        "{}",
        e
    );
    let e = run(&GroupedLinearArgs::new(x, &d.splits, &weights));
    assert!(e.message().contains("args->biases"), "{}", e);
    let mut bad = weights.clone();
    bad[2] = view(&d.w[2][..OUT * 32], &[OUT, 32]);
    let e = run(&GroupedLinearArgs::new(x, &d.splits, &bad).biases(&biases));
    assert!(e.message().contains("args->weights[2]"), "{}", e);
    // Backward: a list of the wrong length (Rust), an element of the wrong shape (libte).
    let args = GroupedLinearArgs::new(x, &d.splits, &weights).biases(&biases);
    let mut bwd = m
        .forward(&ctx, &args, &mut view_mut(&mut y, &[64, OUT]))
        .unwrap();
    let dy = vec![0.5f32; 64 * OUT];
    let mut dw = vec![vec![0.0f32; OUT * IN]; E];
    let e = bwd
        .backward(
            &ctx,
            &view(&dy, &[64, OUT]),
            GroupedLinearGrads {
                dw: Some(
                    dw[..3]
                        .iter_mut()
                        .map(|w| view_mut(w, &[OUT, IN]))
                        .collect(),
                ),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(e.message().contains("grads.dw"), "{}", e);
    let e = bwd
        .backward(
            &ctx,
            &view(&dy, &[64, OUT]),
            GroupedLinearGrads {
                dw: Some(
                    dw.iter_mut()
                        .enumerate()
                        .map(|(i, w)| view_mut(w, if i == 3 { &[IN, OUT] } else { &[OUT, IN] }))
                        .collect(),
                ),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        e.message().contains("te_grouped_linear_backward") && e.message().contains("dw[3]"),
        "{}",
        e
    );
    let e = m.scaling_state(&ctx, E, TensorRole::Input).unwrap_err();
    assert!(e.message().contains("expert"), "{}", e);
    let e = GroupedLinear::new(
        &ctx,
        &GroupedLinearOptions::new(GROUPED_LINEAR_MAX_GEMMS + 1, IN, OUT),
    )
    .unwrap_err();
    assert!(
        e.message().contains("te_grouped_linear_create") && e.message().contains("num_gemms"),
        "{}",
        e
    );
}
