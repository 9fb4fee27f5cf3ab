//! The training-step ops against f64 references written here: add, split/concat columns, the
//! embedding's gather and scatter-add, the fused cross-entropy, AdamW (with clipping, decay
//! flags, a model-weight copy and an owner whose FP8 weight cache is refreshed); bad input is
//! an `Err` naming the C function, with the outputs untouched.

mod common;

use common::*;
use libte::*;

fn ids_view<'a>(ids: &'a [i32], shape: &[usize]) -> TensorView<'a> {
    TensorView::from_slice(ids, shape).expect("TensorView::from_slice(i32)")
}

fn assert_invalid(err: &Error, func: &str) {
    assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
    assert!(
        err.message().starts_with(func),
        "expected a message naming {}: {}",
        func,
        err
    );
}

// ---------------------------------------------------------------------------------------------
// add, split, concat
// ---------------------------------------------------------------------------------------------

#[test]
fn add_is_the_correctly_rounded_sum() {
    let ctx = Context::cpu().unwrap();
    let a = fill(1, 6 * 40);
    let b: Vec<f32> = fill(2, 6 * 40).iter().map(|v| v * 1e-3).collect();
    let mut y = vec![0.0f32; 6 * 40];
    ctx.add(
        &view(&a, &[6, 40]),
        &view(&b, &[6, 40]),
        &mut view_mut(&mut y, &[6, 40]),
    )
    .unwrap();
    // One fp32 rounding of the exact sum (f64 holds the sum of two f32 exactly).
    let want: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &z)| (x as f64 + z as f64) as f32)
        .collect();
    assert_eq!(y, want);

    // In place: a += b.
    let mut acc = a.clone();
    ctx.add_inplace(&mut view_mut(&mut acc, &[6, 40]), &view(&b, &[6, 40]))
        .unwrap();
    assert_eq!(acc, want);

    // BF16: fp32 arithmetic, rounded once to BF16.
    let ah: Vec<Bf16> = a.iter().map(|&v| Bf16::from_f32(v)).collect();
    let bh: Vec<Bf16> = b.iter().map(|&v| Bf16::from_f32(v)).collect();
    let mut yh = vec![Bf16::from_f32(0.0); a.len()];
    ctx.add(
        &TensorView::from_slice(&ah, &[240]).unwrap(),
        &TensorView::from_slice(&bh, &[240]).unwrap(),
        &mut TensorViewMut::from_slice(&mut yh, &[240]).unwrap(),
    )
    .unwrap();
    for i in 0..240 {
        let exact = ah[i].to_f32() as f64 + bh[i].to_f32() as f64;
        assert_eq!(yh[i], Bf16::from_f32(exact as f32), "bf16 sum {}", i);
    }
}

#[test]
fn add_refuses_mismatched_shapes_and_dtypes() {
    let ctx = Context::cpu().unwrap();
    let a = fill(1, 24);
    let b = fill(2, 20);
    let mut y = vec![7.0f32; 24];
    let err = ctx
        .add(
            &view(&a, &[24]),
            &view(&b, &[20]),
            &mut view_mut(&mut y, &[24]),
        )
        .unwrap_err();
    assert_invalid(&err, "te_add");
    assert!(y.iter().all(|&v| v == 7.0), "y untouched");
    let ids = vec![0i32; 24];
    let err = ctx
        .add(
            &view(&a, &[24]),
            &ids_view(&ids, &[24]),
            &mut view_mut(&mut y, &[24]),
        )
        .unwrap_err();
    assert_invalid(&err, "te_add");
}

#[test]
fn split_then_concat_round_trips_exactly() {
    let ctx = Context::cpu().unwrap();
    let (b, s, sizes) = (2usize, 5usize, [3usize, 8, 1, 4]);
    let total: usize = sizes.iter().sum();
    let x = fill(3, b * s * total);
    let mut parts: Vec<Vec<f32>> = sizes.iter().map(|&c| vec![0.0; b * s * c]).collect();
    {
        let mut outs: Vec<TensorViewMut<'_>> = parts
            .iter_mut()
            .zip(&sizes)
            .map(|(p, &c)| view_mut(p, &[b, s, c]))
            .collect();
        ctx.split_columns(&view(&x, &[b, s, total]), &mut outs)
            .unwrap();
    }
    // Part i holds columns [off_i, off_i + c_i) of every row.
    let mut off = 0;
    for (p, &c) in parts.iter().zip(&sizes) {
        for r in 0..b * s {
            assert_eq!(
                &p[r * c..(r + 1) * c],
                &x[r * total + off..r * total + off + c]
            );
        }
        off += c;
    }
    let mut y = vec![0.0f32; x.len()];
    let ins: Vec<TensorView<'_>> = parts
        .iter()
        .zip(&sizes)
        .map(|(p, &c)| view(p, &[b * s, c]))
        .collect();
    ctx.concat_columns(&ins, &mut view_mut(&mut y, &[b * s, total]))
        .unwrap();
    assert_eq!(y, x);
}

#[test]
fn split_and_concat_refuse_bad_input() {
    let ctx = Context::cpu().unwrap();
    let x = fill(4, 4 * 10);
    let (mut p0, mut p1) = (vec![5.0f32; 4 * 3], vec![5.0f32; 4 * 6]);
    {
        // 3 + 6 columns != 10.
        let mut outs = [view_mut(&mut p0, &[4, 3]), view_mut(&mut p1, &[4, 6])];
        let err = ctx
            .split_columns(&view(&x, &[4, 10]), &mut outs)
            .unwrap_err();
        assert_invalid(&err, "te_split_columns");
    }
    assert!(p0.iter().chain(&p1).all(|&v| v == 5.0), "outputs untouched");
    // No parts: refused before libte.
    let err = ctx.split_columns(&view(&x, &[4, 10]), &mut []).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message().starts_with("Context::split_columns"),
        "{}",
        err
    );
    let mut y = vec![0.0f32; 4 * 10];
    let err = ctx
        .concat_columns(&[], &mut view_mut(&mut y, &[4, 10]))
        .unwrap_err();
    assert!(
        err.message().starts_with("Context::concat_columns"),
        "{}",
        err
    );
    // Rows differ.
    let (a, b) = (fill(5, 4 * 4), fill(6, 3 * 6));
    let err = ctx
        .concat_columns(
            &[view(&a, &[4, 4]), view(&b, &[3, 6])],
            &mut view_mut(&mut y, &[4, 10]),
        )
        .unwrap_err();
    assert_invalid(&err, "te_concat_columns");
}

// ---------------------------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------------------------

#[test]
fn embedding_gathers_and_scatter_adds() {
    let ctx = Context::cpu().unwrap();
    let (vocab, dim) = (11usize, 6usize);
    let table = fill(7, vocab * dim);
    let ids: Vec<i32> = vec![3, 0, 10, 3, 7, 3, 1, 0]; // repeats: the backward sums them
    let (b, s) = (2usize, 4usize);
    let mut y = vec![0.0f32; b * s * dim];
    ctx.embedding_forward(
        &view(&table, &[vocab, dim]),
        &ids_view(&ids, &[b, s]),
        &mut view_mut(&mut y, &[b, s, dim]),
    )
    .unwrap();
    for (t, &id) in ids.iter().enumerate() {
        let id = id as usize;
        assert_eq!(
            &y[t * dim..(t + 1) * dim],
            &table[id * dim..(id + 1) * dim],
            "row {}",
            t
        );
    }

    let dy = fill(8, b * s * dim);
    let mut want = vec![0.0f64; vocab * dim];
    for (t, &id) in ids.iter().enumerate() {
        for j in 0..dim {
            want[id as usize * dim + j] += dy[t * dim + j] as f64;
        }
    }
    let mut dtable = vec![9.0f32; vocab * dim]; // zeroed first without accumulate
    ctx.embedding_backward(
        &ids_view(&ids, &[b * s]),
        &view(&dy, &[b * s, dim]),
        &mut view_mut(&mut dtable, &[vocab, dim]),
        false,
    )
    .unwrap();
    assert_close("dtable", &dtable, &want, 1e-6);
    for r in [2usize, 4, 5, 6, 8, 9] {
        assert!(
            dtable[r * dim..(r + 1) * dim].iter().all(|&v| v == 0.0),
            "row {} not zeroed",
            r
        );
    }

    // accumulate: adds onto what is there (a tied LM head's dW).
    let base = fill(9, vocab * dim);
    let mut acc = base.clone();
    ctx.embedding_backward(
        &ids_view(&ids, &[b * s]),
        &view(&dy, &[b * s, dim]),
        &mut view_mut(&mut acc, &[vocab, dim]),
        true,
    )
    .unwrap();
    let want_acc: Vec<f64> = want
        .iter()
        .zip(&base)
        .map(|(&w, &b)| w + b as f64)
        .collect();
    assert_close("dtable accumulated", &acc, &want_acc, 1e-6);
}

#[test]
fn embedding_refuses_ids_out_of_range() {
    let ctx = Context::cpu().unwrap();
    let (vocab, dim) = (5usize, 4usize);
    let table = fill(1, vocab * dim);
    for bad in [5i32, -1] {
        let ids = vec![0, 1, bad, 2];
        let mut y = vec![3.0f32; 4 * dim];
        let err = ctx
            .embedding_forward(
                &view(&table, &[vocab, dim]),
                &ids_view(&ids, &[4]),
                &mut view_mut(&mut y, &[4, dim]),
            )
            .unwrap_err();
        assert_invalid(&err, "te_embedding_forward");
        assert!(y.iter().all(|&v| v == 3.0), "nothing written");
        let dy = fill(2, 4 * dim);
        let mut dt = vec![3.0f32; vocab * dim];
        let err = ctx
            .embedding_backward(
                &ids_view(&ids, &[4]),
                &view(&dy, &[4, dim]),
                &mut view_mut(&mut dt, &[vocab, dim]),
                false,
            )
            .unwrap_err();
        assert_invalid(&err, "te_embedding_backward");
        assert!(dt.iter().all(|&v| v == 3.0), "nothing written");
    }
    // ids of the wrong dtype.
    let fids = vec![0.0f32; 4];
    let mut y = vec![0.0f32; 4 * dim];
    let err = ctx
        .embedding_forward(
            &view(&table, &[vocab, dim]),
            &view(&fids, &[4]),
            &mut view_mut(&mut y, &[4, dim]),
        )
        .unwrap_err();
    assert_invalid(&err, "te_embedding_forward");
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy
// ---------------------------------------------------------------------------------------------

/// Mean loss and dlogits in f64.
fn ce_reference(
    logits: &[f32],
    targets: &[i32],
    vocab: usize,
    ignore: i32,
    scale: f64,
) -> (f64, Vec<f64>) {
    let n = targets.len();
    let count = targets.iter().filter(|&&t| t != ignore).count();
    let mut loss = 0.0;
    let mut d = vec![0.0; n * vocab];
    for t in 0..n {
        if targets[t] == ignore {
            continue;
        }
        let row = &logits[t * vocab..(t + 1) * vocab];
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        let lse = m + sum.ln();
        loss += lse - row[targets[t] as usize] as f64;
        for j in 0..vocab {
            let p = (row[j] as f64 - lse).exp();
            let onehot = if j == targets[t] as usize { 1.0 } else { 0.0 };
            d[t * vocab + j] = scale * (p - onehot) / count as f64;
        }
    }
    (if count == 0 { 0.0 } else { loss / count as f64 }, d)
}

#[test]
fn cross_entropy_matches_f64_with_ignored_tokens_and_grad_scale() {
    let ctx = Context::cpu().unwrap();
    let (n, vocab) = (7usize, 33usize);
    // Large logits: the row max must be subtracted.
    let logits: Vec<f32> = fill(10, n * vocab)
        .iter()
        .map(|v| v * 30.0 + 50.0)
        .collect();
    let targets = vec![4i32, -100, 0, 32, 17, -100, 9];
    let opts = CrossEntropyOptions::new().grad_scale(0.25);
    assert_eq!(opts.ignore_index, -100, "libte's default");
    let (want_loss, want_d) = ce_reference(&logits, &targets, vocab, -100, 0.25);
    let mut loss = vec![0.0f32];
    let mut d = vec![1.0f32; n * vocab];
    ctx.cross_entropy(
        &opts,
        &view(&logits, &[n, vocab]),
        &ids_view(&targets, &[n]),
        &mut view_mut(&mut loss, &[1]),
        Some(&mut view_mut(&mut d, &[n, vocab])),
    )
    .unwrap();
    assert_close("loss", &loss, &[want_loss], 1e-5);
    assert_close("dlogits", &d, &want_d, 1e-5);
    assert!(
        d[vocab..2 * vocab].iter().all(|&v| v == 0.0),
        "ignored row is zero"
    );

    // Loss only.
    let mut loss2 = vec![0.0f32];
    ctx.cross_entropy(
        &opts,
        &view(&logits, &[n, vocab]),
        &ids_view(&targets, &[n]),
        &mut view_mut(&mut loss2, &[1]),
        None,
    )
    .unwrap();
    assert_eq!(loss2, loss);

    // In place: dlogits over the logits, identical to out of place.
    let mut inplace = logits.clone();
    let mut loss3 = vec![0.0f32];
    ctx.cross_entropy_inplace(
        &opts,
        &mut view_mut(&mut inplace, &[n, vocab]),
        &ids_view(&targets, &[n]),
        &mut view_mut(&mut loss3, &[1]),
    )
    .unwrap();
    assert_eq!(loss3, loss);
    assert_eq!(inplace, d);

    // Another ignore_index; and every token ignored: loss 0, zero gradient.
    let t2 = vec![-1i32, 2, -1, 5, 6, 7, -1];
    let o2 = CrossEntropyOptions::new().ignore_index(-1);
    let (wl, wd) = ce_reference(&logits, &t2, vocab, -1, 1.0);
    ctx.cross_entropy(
        &o2,
        &view(&logits, &[n, vocab]),
        &ids_view(&t2, &[n]),
        &mut view_mut(&mut loss, &[1]),
        Some(&mut view_mut(&mut d, &[n, vocab])),
    )
    .unwrap();
    assert_close("loss ignore -1", &loss, &[wl], 1e-5);
    assert_close("dlogits ignore -1", &d, &wd, 1e-5);
    let none = vec![-100i32; n];
    ctx.cross_entropy(
        &CrossEntropyOptions::new(),
        &view(&logits, &[n, vocab]),
        &ids_view(&none, &[n]),
        &mut view_mut(&mut loss, &[1]),
        Some(&mut view_mut(&mut d, &[n, vocab])),
    )
    .unwrap();
    assert_eq!(loss, [0.0]);
    assert!(d.iter().all(|&v| v == 0.0));
}

#[test]
fn cross_entropy_refuses_bad_targets() {
    let ctx = Context::cpu().unwrap();
    let (n, vocab) = (3usize, 8usize);
    let logits = fill(11, n * vocab);
    let mut loss = vec![5.0f32];
    let mut d = vec![5.0f32; n * vocab];
    for bad in [8i32, -2] {
        let t = vec![1, bad, 2];
        let err = ctx
            .cross_entropy(
                &CrossEntropyOptions::new(),
                &view(&logits, &[n, vocab]),
                &ids_view(&t, &[n]),
                &mut view_mut(&mut loss, &[1]),
                Some(&mut view_mut(&mut d, &[n, vocab])),
            )
            .unwrap_err();
        assert_invalid(&err, "te_cross_entropy");
        assert_eq!(loss, [5.0], "loss untouched");
        assert!(d.iter().all(|&v| v == 5.0), "dlogits untouched");
    }
    // Too few targets.
    let t = vec![1i32, 2];
    let err = ctx
        .cross_entropy(
            &CrossEntropyOptions::new(),
            &view(&logits, &[n, vocab]),
            &ids_view(&t, &[2]),
            &mut view_mut(&mut loss, &[1]),
            None,
        )
        .unwrap_err();
    assert_invalid(&err, "te_cross_entropy");
}

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------

/// One parameter's state in f64, stepped with torch.optim.AdamW's formulas.
#[derive(Clone)]
struct RefParam {
    p: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
}

fn ref_step(
    ps: &mut [RefParam],
    grads: &[Vec<f32>],
    decays: &[bool],
    o: &AdamWOptions,
    step: u64,
) -> f64 {
    let norm = grads
        .iter()
        .flatten()
        .map(|&g| (g as f64) * (g as f64))
        .sum::<f64>()
        .sqrt();
    let clip = if o.max_grad_norm > 0.0 {
        (o.max_grad_norm as f64 / (norm + 1e-6)).min(1.0)
    } else {
        1.0
    };
    let (lr, b1, b2, eps, wd) = (
        o.lr as f64,
        o.beta1 as f64,
        o.beta2 as f64,
        o.eps as f64,
        o.weight_decay as f64,
    );
    let bc1 = 1.0 - b1.powi(step as i32);
    let bc2 = 1.0 - b2.powi(step as i32);
    for ((s, g), &decay) in ps.iter_mut().zip(grads).zip(decays) {
        for i in 0..s.p.len() {
            let g = g[i] as f64 * clip;
            if decay {
                s.p[i] -= lr * wd * s.p[i];
            }
            s.m[i] = b1 * s.m[i] + (1.0 - b1) * g;
            s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
            s.p[i] -= lr * (s.m[i] / bc1) / ((s.v[i] / bc2).sqrt() + eps);
        }
    }
    norm
}

#[test]
fn adamw_matches_f64_over_steps_with_clipping_decay_flags_and_model_weight() {
    let ctx = Context::cpu().unwrap();
    let sizes = [48usize, 7];
    let opts = AdamWOptions::new()
        .lr(0.01)
        .betas(0.8, 0.95)
        .eps(1e-6)
        .weight_decay(0.1)
        .max_grad_norm(0.5);
    let decays = [true, false];
    let mut p: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| fill(20 + i as u64, n))
        .collect();
    let mut m: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut v = m.clone();
    let mut mw = vec![Bf16::from_f32(0.0); sizes[0]];
    let mut reference: Vec<RefParam> = p
        .iter()
        .map(|x| RefParam {
            p: x.iter().map(|&a| a as f64).collect(),
            m: vec![0.0; x.len()],
            v: vec![0.0; x.len()],
        })
        .collect();
    let mut opt = AdamW::new(opts);
    for step in 1..=4u64 {
        let grads: Vec<Vec<f32>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| fill(100 * step + i as u64, n))
            .collect();
        let want_norm = ref_step(&mut reference, &grads, &decays, &opts, step);
        let mut norm = vec![0.0f32];
        {
            let (p0, p1) = p.split_at_mut(1);
            let (m0, m1) = m.split_at_mut(1);
            let (v0, v1) = v.split_at_mut(1);
            let mut params = vec![
                AdamWParam::new(
                    view_mut(&mut p0[0], &[6, 8]),
                    view(&grads[0], &[6, 8]),
                    view_mut(&mut m0[0], &[6, 8]),
                    view_mut(&mut v0[0], &[6, 8]),
                )
                .model_weight(TensorViewMut::from_slice(&mut mw, &[6, 8]).unwrap()),
                AdamWParam::new(
                    view_mut(&mut p1[0], &[7]),
                    view(&grads[1], &[7]),
                    view_mut(&mut m1[0], &[7]),
                    view_mut(&mut v1[0], &[7]),
                )
                .weight_decay(false),
            ];
            if step % 2 == 1 {
                assert_eq!(opt.next_step(), step);
                opt.step(&ctx, &mut params).unwrap();
            } else {
                opt.set_next_step(step + 1);
                ctx.adamw_step(
                    &opts,
                    step,
                    &mut params,
                    Some(&mut view_mut(&mut norm, &[1])),
                )
                .unwrap();
                assert_close("grad_norm", &norm, &[want_norm], 1e-5);
            }
        }
        for i in 0..2 {
            assert_close(
                &format!("param {} step {}", i, step),
                &p[i],
                &reference[i].p,
                2e-5,
            );
            assert_close(
                &format!("exp_avg {} step {}", i, step),
                &m[i],
                &reference[i].m,
                2e-5,
            );
            assert_close(
                &format!("exp_avg_sq {} step {}", i, step),
                &v[i],
                &reference[i].v,
                2e-5,
            );
        }
        // model_weight: the new param rounded to BF16.
        for (w, &x) in mw.iter().zip(&p[0]) {
            assert_eq!(*w, Bf16::from_f32(x));
        }
    }
    assert_eq!(opt.next_step(), 5);
}

#[test]
fn adamw_refuses_bad_options_and_changes_nothing() {
    let ctx = Context::cpu().unwrap();
    let n = 16;
    let (p0, g) = (fill(1, n), fill(2, n));
    let bad = [
        AdamWOptions::new().lr(-1.0),
        AdamWOptions::new().betas(1.0, 0.999),
        AdamWOptions::new().eps(0.0),
        AdamWOptions::new().weight_decay(-0.1),
    ];
    for (k, o) in bad.iter().enumerate() {
        let (mut p, mut m, mut v) = (p0.clone(), vec![0.5f32; n], vec![0.5f32; n]);
        let mut params = vec![AdamWParam::new(
            view_mut(&mut p, &[n]),
            view(&g, &[n]),
            view_mut(&mut m, &[n]),
            view_mut(&mut v, &[n]),
        )];
        let err = ctx.adamw_step(o, 1, &mut params, None).unwrap_err();
        assert_invalid(&err, "te_adamw_step");
        drop(params);
        assert_eq!(p, p0, "case {}: param unchanged", k);
        assert!(
            m.iter().chain(&v).all(|&x| x == 0.5),
            "case {}: moments unchanged",
            k
        );
    }
    // step 0, a shape mismatch, and a grad_norm that is not one F32.
    let (mut p, mut m, mut v) = (p0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let g_short = fill(3, n - 1);
    {
        let mut params = vec![AdamWParam::new(
            view_mut(&mut p, &[n]),
            view(&g, &[n]),
            view_mut(&mut m, &[n]),
            view_mut(&mut v, &[n]),
        )];
        let err = ctx
            .adamw_step(&AdamWOptions::new(), 0, &mut params, None)
            .unwrap_err();
        assert_invalid(&err, "te_adamw_step");
        let mut two = vec![0.0f32; 2];
        let err = ctx
            .adamw_step(
                &AdamWOptions::new(),
                1,
                &mut params,
                Some(&mut view_mut(&mut two, &[2])),
            )
            .unwrap_err();
        assert!(
            err.message()
                .starts_with("Context::adamw_step: argument 'grad_norm'"),
            "{}",
            err
        );
        let mut opt = AdamW::new(AdamWOptions::new().lr(-1.0));
        assert!(opt.step(&ctx, &mut params).is_err());
        assert_eq!(opt.next_step(), 1, "a failed step does not advance");
    }
    {
        let mut params = vec![AdamWParam::new(
            view_mut(&mut p, &[n]),
            view(&g_short, &[n - 1]),
            view_mut(&mut m, &[n]),
            view_mut(&mut v, &[n]),
        )];
        let err = ctx
            .adamw_step(&AdamWOptions::new(), 1, &mut params, None)
            .unwrap_err();
        assert_invalid(&err, "te_adamw_step");
    }
    assert_eq!(p, p0);
}

/// After an FP8 forward, an AdamW step naming the layer as owner refreshes its FP8 weight
/// cache: a forward with `weight_unchanged` is then bit-identical to one that casts the new
/// weight. Without the owner the cache is stale and the results differ (the test can fail).
#[test]
fn adamw_owner_refreshes_the_fp8_weight_cache() {
    const T: usize = 16;
    const IN: usize = 32;
    const OUT: usize = 32;
    let recipe = Recipe::delayed_scaling().unwrap();
    for with_owner in [true, false] {
        let mut ctx = Context::cpu().unwrap();
        let mut fc = Linear::new(
            &ctx,
            &LinearOptions {
                activation_dtype: DType::F32,
                bias: false,
                ..LinearOptions::new(IN, OUT)
            },
        )
        .unwrap();
        let x = fill(1, T * IN);
        let mut w: Vec<f32> = fill(2, OUT * IN).iter().map(|v| v * 0.1).collect();
        let mut y = vec![0.0f32; T * OUT];
        {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            let args = ForwardArgs::new(view(&x, &[T, IN]), view(&w, &[OUT, IN]));
            fc.forward(&scope, &args, &mut view_mut(&mut y, &[T, OUT]))
                .unwrap();
        }
        let g = fill(3, OUT * IN);
        let (mut m, mut v) = (vec![0.0f32; OUT * IN], vec![0.0f32; OUT * IN]);
        {
            let mut param = AdamWParam::new(
                view_mut(&mut w, &[OUT, IN]),
                view(&g, &[OUT, IN]),
                view_mut(&mut m, &[OUT, IN]),
                view_mut(&mut v, &[OUT, IN]),
            );
            if with_owner {
                param = param.owner(ParamOwner::Linear(&fc));
            }
            AdamW::new(AdamWOptions::new().lr(0.05))
                .step(&ctx, &mut [param])
                .unwrap();
        }
        let (mut y_cached, mut y_cast) = (vec![0.0f32; T * OUT], vec![0.0f32; T * OUT]);
        {
            let scope = ctx.autocast(&AutocastOptions::fp8(&recipe)).unwrap();
            let base = ForwardArgs::new(view(&x, &[T, IN]), view(&w, &[OUT, IN]));
            fc.forward(
                &scope,
                &base.weight_unchanged(true),
                &mut view_mut(&mut y_cached, &[T, OUT]),
            )
            .unwrap();
            fc.forward(&scope, &base, &mut view_mut(&mut y_cast, &[T, OUT]))
                .unwrap();
        }
        if with_owner {
            assert_eq!(y_cached, y_cast, "refreshed cache = a fresh cast");
        } else {
            assert_ne!(y_cached, y_cast, "without the owner the cache is stale");
        }
    }
}

#[test]
fn adamw_refuses_an_owner_whose_weight_shape_differs() {
    let ctx = Context::cpu().unwrap();
    let mlp = LayerNormMlp::new(
        &ctx,
        &LayerNormMlpOptions {
            activation_dtype: DType::F32,
            bias: false,
            ..LayerNormMlpOptions::new(16, 32)
        },
    )
    .unwrap();
    let fc = Linear::new(
        &ctx,
        &LinearOptions {
            activation_dtype: DType::F32,
            bias: false,
            ..LinearOptions::new(16, 8)
        },
    )
    .unwrap();
    // fc1's weight is [32, 16] (not gated): naming it fc2 ([16, 32]) or a Linear [8, 16] is wrong.
    let n = 32 * 16;
    let (p0, g) = (fill(1, n), fill(2, n));
    for owner in [
        ParamOwner::LayerNormMlp(&mlp, MlpGemm::Fc2),
        ParamOwner::Linear(&fc),
    ] {
        let (mut p, mut m, mut v) = (p0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
        let param = AdamWParam::new(
            view_mut(&mut p, &[32, 16]),
            view(&g, &[32, 16]),
            view_mut(&mut m, &[32, 16]),
            view_mut(&mut v, &[32, 16]),
        )
        .owner(owner);
        let err = ctx
            .adamw_step(&AdamWOptions::new(), 1, &mut [param], None)
            .unwrap_err();
        assert_invalid(&err, "te_adamw_step");
        assert_eq!(p, p0, "nothing changes");
    }
    // The right gemm is accepted (no FP8 forward yet: nothing to refresh).
    let (mut p, mut m, mut v) = (p0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let param = AdamWParam::new(
        view_mut(&mut p, &[32, 16]),
        view(&g, &[32, 16]),
        view_mut(&mut m, &[32, 16]),
        view_mut(&mut v, &[32, 16]),
    )
    .owner(ParamOwner::LayerNormMlp(&mlp, MlpGemm::Fc1));
    ctx.adamw_step(&AdamWOptions::new(), 1, &mut [param], None)
        .unwrap();
    assert_ne!(p, p0);
}

/// te.h: with clipping on, a non-finite gradient norm skips the whole update (nothing changes)
/// and the call succeeds; the norm is still reported.
#[test]
fn adamw_skips_the_update_on_a_non_finite_norm() {
    let ctx = Context::cpu().unwrap();
    let n = 8;
    let p0 = fill(1, n);
    let mut g = fill(2, n);
    g[3] = f32::NAN;
    let (mut p, mut m, mut v) = (p0.clone(), vec![0.25f32; n], vec![0.25f32; n]);
    let mut norm = vec![0.0f32];
    let mut params = vec![AdamWParam::new(
        view_mut(&mut p, &[n]),
        view(&g, &[n]),
        view_mut(&mut m, &[n]),
        view_mut(&mut v, &[n]),
    )];
    ctx.adamw_step(
        &AdamWOptions::new().max_grad_norm(1.0),
        1,
        &mut params,
        Some(&mut view_mut(&mut norm, &[1])),
    )
    .unwrap();
    drop(params);
    assert!(!norm[0].is_finite(), "norm {}", norm[0]);
    assert_eq!(p, p0);
    assert!(m.iter().chain(&v).all(|&x| x == 0.25));
}
