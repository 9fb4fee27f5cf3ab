//! Attention on the CPU against a naive f64 reference written here (softmax attention and its
//! gradients, masks, GQA, BSHD and THD), repeatable backward, caller-memory residuals, state
//! round trips, FP8 (loosely), and errors naming the C function.

mod common;

use common::reference::rel_err;
use common::*;
use libte::*;

/// Sequences as row ranges of token-major `[tokens, heads, d]` tensors: BSHD is THD with
/// every sequence of the same length.
#[derive(Clone)]
struct Layout {
    /// Per sequence: (first query row, queries, first key row, keys).
    seqs: Vec<(usize, usize, usize, usize)>,
    tokens_q: usize,
    tokens_kv: usize,
}

impl Layout {
    fn bshd(batch: usize, sq: usize, skv: usize) -> Layout {
        Layout {
            seqs: (0..batch).map(|b| (b * sq, sq, b * skv, skv)).collect(),
            tokens_q: batch * sq,
            tokens_kv: batch * skv,
        }
    }

    fn thd(lens_q: &[usize], lens_kv: &[usize]) -> Layout {
        let (mut oq, mut okv) = (0, 0);
        let mut seqs = Vec::new();
        for (&lq, &lkv) in lens_q.iter().zip(lens_kv) {
            seqs.push((oq, lq, okv, lkv));
            oq += lq;
            okv += lkv;
        }
        Layout {
            seqs,
            tokens_q: oq,
            tokens_kv: okv,
        }
    }

    fn cu_q(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.seqs.iter().map(|s| s.0 as i32).collect();
        v.push(self.tokens_q as i32);
        v
    }

    fn cu_kv(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.seqs.iter().map(|s| s.2 as i32).collect();
        v.push(self.tokens_kv as i32);
        v
    }
}

struct Dims {
    heads: usize,
    kv_heads: usize,
    d: usize,
}

fn visible(mask: AttnMask, i: usize, j: usize, sq: usize, skv: usize) -> bool {
    match mask {
        AttnMask::Causal => j <= i,
        AttnMask::CausalBottomRight => j as i64 <= i as i64 + skv as i64 - sq as i64,
        _ => true,
    }
}

/// f64 reference: O, dQ, dK, dV.
#[allow(clippy::too_many_arguments)]
fn reference(
    lay: &Layout,
    dims: &Dims,
    mask: AttnMask,
    scale: f64,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
) -> [Vec<f64>; 4] {
    let (h_n, g_n, d) = (dims.heads, dims.kv_heads, dims.d);
    let group = h_n / g_n;
    let qi = |t: usize, h: usize, e: usize| q[(t * h_n + h) * d + e] as f64;
    let ki = |t: usize, g: usize, e: usize| k[(t * g_n + g) * d + e] as f64;
    let vi = |t: usize, g: usize, e: usize| v[(t * g_n + g) * d + e] as f64;
    let doi = |t: usize, h: usize, e: usize| d_o[(t * h_n + h) * d + e] as f64;
    let mut o = vec![0.0; lay.tokens_q * h_n * d];
    let mut dq = vec![0.0; lay.tokens_q * h_n * d];
    let mut dk = vec![0.0; lay.tokens_kv * g_n * d];
    let mut dv = vec![0.0; lay.tokens_kv * g_n * d];
    for &(q0, sq, k0, skv) in &lay.seqs {
        for h in 0..h_n {
            let g = h / group;
            for i in 0..sq {
                let js: Vec<usize> = (0..skv).filter(|&j| visible(mask, i, j, sq, skv)).collect();
                if js.is_empty() {
                    continue; // O = 0, no gradient
                }
                let s: Vec<f64> = js
                    .iter()
                    .map(|&j| {
                        scale
                            * (0..d)
                                .map(|e| qi(q0 + i, h, e) * ki(k0 + j, g, e))
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let row = ((q0 + i) * h_n + h) * d;
                for (n, &j) in js.iter().enumerate() {
                    for e in 0..d {
                        o[row + e] += p[n] * vi(k0 + j, g, e);
                    }
                }
                // Backward.
                let dp: Vec<f64> = js
                    .iter()
                    .map(|&j| (0..d).map(|e| doi(q0 + i, h, e) * vi(k0 + j, g, e)).sum())
                    .collect();
                let dd: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (n, &j) in js.iter().enumerate() {
                    let ds = p[n] * (dp[n] - dd);
                    let krow = ((k0 + j) * g_n + g) * d;
                    for e in 0..d {
                        dq[row + e] += scale * ds * ki(k0 + j, g, e);
                        dk[krow + e] += scale * ds * qi(q0 + i, h, e);
                        dv[krow + e] += p[n] * doi(q0 + i, h, e);
                    }
                }
            }
        }
    }
    [o, dq, dk, dv]
}

struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    cu_q: Vec<i32>,
    cu_kv: Vec<i32>,
}

fn data(seed: u64, lay: &Layout, dims: &Dims) -> Data {
    let nq = lay.tokens_q * dims.heads * dims.d;
    let nkv = lay.tokens_kv * dims.kv_heads * dims.d;
    Data {
        q: fill(seed, nq),
        k: fill(seed + 1, nkv),
        v: fill(seed + 2, nkv),
        d_o: fill(seed + 3, nq).iter().map(|x| x * 0.5).collect(),
        cu_q: lay.cu_q(),
        cu_kv: lay.cu_kv(),
    }
}

/// The tensor shapes of q and k: BSHD `[b, s, h, d]` or THD `[t, h, d]`.
fn shapes(lay: &Layout, dims: &Dims, thd: bool) -> (Vec<usize>, Vec<usize>) {
    if thd {
        (
            vec![lay.tokens_q, dims.heads, dims.d],
            vec![lay.tokens_kv, dims.kv_heads, dims.d],
        )
    } else {
        let b = lay.seqs.len();
        let (sq, skv) = (lay.seqs[0].1, lay.seqs[0].3);
        (
            vec![b, sq, dims.heads, dims.d],
            vec![b, skv, dims.kv_heads, dims.d],
        )
    }
}

impl Data {
    fn args(&self, lay: &Layout, dims: &Dims, thd: bool) -> AttentionArgs<'_> {
        let (sq, skv) = shapes(lay, dims, thd);
        let args = AttentionArgs::new(view(&self.q, &sq), view(&self.k, &skv), view(&self.v, &skv));
        if thd {
            let b = lay.seqs.len();
            let max_q = lay.seqs.iter().map(|s| s.1).max().unwrap();
            let max_kv = lay.seqs.iter().map(|s| s.3).max().unwrap();
            args.thd(
                TensorView::from_slice(&self.cu_q, &[b + 1]).unwrap(),
                TensorView::from_slice(&self.cu_kv, &[b + 1]).unwrap(),
                max_q,
                max_kv,
            )
        } else {
            args
        }
    }
}

fn f32_attention(ctx: &Context, dims: &Dims, mask: AttnMask) -> Attention {
    Attention::new(
        ctx,
        &AttentionOptions {
            num_kv_heads: dims.kv_heads,
            mask,
            activation_dtype: DType::F32,
            ..AttentionOptions::new(dims.heads, dims.d)
        },
    )
    .unwrap()
}

type Grads = [Vec<f32>; 3];

fn zero_grads(lay: &Layout, dims: &Dims) -> Grads {
    [
        vec![0.0; lay.tokens_q * dims.heads * dims.d],
        vec![0.0; lay.tokens_kv * dims.kv_heads * dims.d],
        vec![0.0; lay.tokens_kv * dims.kv_heads * dims.d],
    ]
}

fn grads<'g>(g: &'g mut Grads, lay: &Layout, dims: &Dims, thd: bool) -> AttentionGrads<'g> {
    let (sq, skv) = shapes(lay, dims, thd);
    let [dq, dk, dv] = g;
    AttentionGrads::new(view_mut(dq, &sq), view_mut(dk, &skv), view_mut(dv, &skv))
}

/// Forward and backward (twice, checked identical) on a CPU context in F32; checks O and
/// the gradients against the reference to `tol` (relative Frobenius error).
fn check_against_reference(lay: &Layout, dims: &Dims, mask: AttnMask, thd: bool, tol: f64) {
    let ctx = Context::cpu().unwrap();
    let d = data(7, lay, dims);
    let mut m = f32_attention(&ctx, dims, mask);
    let (sq, _) = shapes(lay, dims, thd);
    let mut o = vec![0.0f32; d.q.len()];
    let args = d.args(lay, dims, thd);
    let (g1, g2) = {
        let mut bwd = m.forward(&ctx, &args, view_mut(&mut o, &sq)).unwrap();
        assert_eq!(
            bwd.output().shape(),
            &sq.iter().map(|&x| x as i64).collect::<Vec<_>>()[..]
        );
        let d_o = view(&d.d_o, &sq);
        let mut g1 = zero_grads(lay, dims);
        bwd.backward(&ctx, &d_o, grads(&mut g1, lay, dims, thd))
            .unwrap();
        let mut g2 = zero_grads(lay, dims);
        bwd.backward(&ctx, &d_o, grads(&mut g2, lay, dims, thd))
            .unwrap();
        (g1, g2)
    };
    assert_eq!(g1, g2, "backward twice: identical");
    let scale = 1.0 / (dims.d as f64).sqrt();
    let [ro, rdq, rdk, rdv] = reference(lay, dims, mask, scale, &d.q, &d.k, &d.v, &d.d_o);
    let what = format!(
        "{:?} thd={} heads {}/{}",
        mask, thd, dims.heads, dims.kv_heads
    );
    for (name, got, want) in [
        ("O", &o, &ro),
        ("dQ", &g1[0], &rdq),
        ("dK", &g1[1], &rdk),
        ("dV", &g1[2], &rdv),
    ] {
        let e = rel_err(got, want);
        assert!(e <= tol, "{} {}: relative error {}", what, name, e);
    }
}

const GQA: Dims = Dims {
    heads: 8,
    kv_heads: 2,
    d: 16,
};

#[test]
fn options_defaults_match_the_header() {
    let o = AttentionOptions::new(8, 64);
    assert_eq!((o.num_heads, o.num_kv_heads, o.head_dim), (8, 0, 64));
    assert_eq!(o.softmax_scale, 0.0);
    assert_eq!(o.mask, AttnMask::None);
    assert_eq!(o.activation_dtype, DType::BF16);
    assert!(!o.fp8);
}

#[test]
fn causal_gqa_bshd_matches_f64() {
    check_against_reference(
        &Layout::bshd(2, 24, 24),
        &GQA,
        AttnMask::Causal,
        false,
        1e-5,
    );
}

#[test]
fn no_mask_and_bottom_right_bshd_match_f64() {
    let mha = Dims {
        heads: 4,
        kv_heads: 4,
        d: 8,
    };
    check_against_reference(&Layout::bshd(2, 9, 9), &mha, AttnMask::None, false, 1e-5);
    // seq_q < seq_kv: bottom-right lets query i see keys up to i + 7.
    check_against_reference(
        &Layout::bshd(2, 5, 12),
        &GQA,
        AttnMask::CausalBottomRight,
        false,
        1e-5,
    );
    // seq_q > seq_kv: the first queries see no key (O = 0, no gradient).
    check_against_reference(
        &Layout::bshd(1, 12, 5),
        &GQA,
        AttnMask::CausalBottomRight,
        false,
        1e-5,
    );
    // MQA.
    let mqa = Dims {
        heads: 4,
        kv_heads: 1,
        d: 24,
    };
    check_against_reference(
        &Layout::bshd(1, 10, 10),
        &mqa,
        AttnMask::Causal,
        false,
        1e-5,
    );
}

#[test]
fn thd_gqa_lengths_1_17_33_match_f64() {
    let lay = Layout::thd(&[1, 17, 33], &[1, 17, 33]);
    check_against_reference(&lay, &GQA, AttnMask::Causal, true, 1e-5);
    check_against_reference(&lay, &GQA, AttnMask::None, true, 1e-5);
    // Queries and keys of different lengths per sequence, bottom-right aligned.
    let lay = Layout::thd(&[1, 17, 33], &[3, 17, 40]);
    check_against_reference(&lay, &GQA, AttnMask::CausalBottomRight, true, 1e-5);
}

#[test]
fn thd_equals_bshd_for_equal_lengths() {
    let ctx = Context::cpu().unwrap();
    let lay = Layout::bshd(3, 16, 16);
    let d = data(3, &lay, &GQA);
    let mut out = [vec![0.0f32; d.q.len()], vec![0.0f32; d.q.len()]];
    let mut gs = [zero_grads(&lay, &GQA), zero_grads(&lay, &GQA)];
    for (n, thd) in [false, true].iter().enumerate() {
        let mut m = f32_attention(&ctx, &GQA, AttnMask::Causal);
        let (sq, _) = shapes(&lay, &GQA, *thd);
        let mut bwd = m
            .forward(&ctx, &d.args(&lay, &GQA, *thd), view_mut(&mut out[n], &sq))
            .unwrap();
        bwd.backward_once(
            &ctx,
            &view(&d.d_o, &sq),
            grads(&mut gs[n], &lay, &GQA, *thd),
        )
        .unwrap();
    }
    assert_eq!(out[0], out[1]);
    assert_eq!(gs[0], gs[1]);
}

#[test]
fn split_forward_residuals_and_backward_once() {
    let ctx = Context::cpu().unwrap();
    let lay = Layout::bshd(2, 8, 8);
    let d = data(11, &lay, &GQA);
    let (sq, _) = shapes(&lay, &GQA, false);
    let mut m = f32_attention(&ctx, &GQA, AttnMask::Causal);
    let mut o = vec![0.0f32; d.q.len()];
    let args = d.args(&lay, &GQA, false);
    let res = m
        .forward_compute(&ctx, &args, view_mut(&mut o, &sq))
        .unwrap();
    assert!(!res.fp8());
    assert_eq!(res.lse().unwrap().shape(), &[16, 8]);
    assert_eq!(res.lse().unwrap().dtype(), DType::F32);
    assert_eq!(
        res.q().unwrap().as_slice::<f32>().unwrap(),
        &d.q[..],
        "high precision: the caller's q"
    );
    let o_copy: Vec<f32> = res.o().unwrap().as_slice::<f32>().unwrap().to_vec();
    // LSE against the reference: log sum_j exp(scale q.k_j) over visible keys.
    let lse = res.lse().unwrap().as_slice::<f32>().unwrap().to_vec();
    let scale = 0.25; // 1 / sqrt(16)
    for t in [0usize, 5, 15] {
        for h in [0usize, 7] {
            let i = t % 8;
            let b0 = t - i;
            let g = h / 4;
            let s: f64 = (0..=i)
                .map(|j| {
                    let dot: f64 = (0..16)
                        .map(|e| {
                            d.q[(t * 8 + h) * 16 + e] as f64
                                * d.k[((b0 + j) * 2 + g) * 16 + e] as f64
                        })
                        .sum();
                    (scale * dot).exp()
                })
                .sum();
            assert!(
                (lse[t * 8 + h] as f64 - s.ln()).abs() < 1e-5,
                "lse[{}][{}]",
                t,
                h
            );
        }
    }
    let mut bwd = m.forward_save(&ctx, res).unwrap();
    assert_eq!(bwd.output().as_slice::<f32>().unwrap(), &o_copy[..]);
    let d_o = view(&d.d_o, &sq);
    let mut g1 = zero_grads(&lay, &GQA);
    bwd.backward(&ctx, &d_o, grads(&mut g1, &lay, &GQA, false))
        .unwrap();
    let mut g2 = zero_grads(&lay, &GQA);
    bwd.backward_once(&ctx, &d_o, grads(&mut g2, &lay, &GQA, false))
        .unwrap();
    assert_eq!(g1, g2);
    let err = bwd
        .backward(&ctx, &d_o, grads(&mut g2, &lay, &GQA, false))
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidState, "{}", err);
    assert!(
        err.message().starts_with("te_attention_backward"),
        "{}",
        err
    );
    drop(bwd);
    assert_eq!(o, o_copy);

    // Skipped gradients: only dV.
    let mut bwd = m.forward(&ctx, &args, view_mut(&mut o, &sq)).unwrap();
    let mut dv = vec![0.0f32; g1[2].len()];
    bwd.backward(
        &ctx,
        &d_o,
        AttentionGrads {
            dv: Some(view_mut(&mut dv, &[2, 8, 2, 16])),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(dv, g1[2]);
}

#[test]
fn caller_memory_equals_library_owned() {
    for thd in [false, true] {
        let ctx = Context::cpu().unwrap();
        let lay = if thd {
            Layout::thd(&[1, 17, 33], &[1, 17, 33])
        } else {
            Layout::bshd(2, 16, 16)
        };
        let d = data(21, &lay, &GQA);
        let (sq, _) = shapes(&lay, &GQA, thd);
        let args = d.args(&lay, &GQA, thd);
        let d_o = view(&d.d_o, &sq);

        let mut owned = f32_attention(&ctx, &GQA, AttnMask::Causal);
        let mut o0 = vec![0.0f32; d.q.len()];
        let mut g0 = zero_grads(&lay, &GQA);
        {
            let mut bwd = owned.forward(&ctx, &args, view_mut(&mut o0, &sq)).unwrap();
            bwd.backward(&ctx, &d_o, grads(&mut g0, &lay, &GQA, thd))
                .unwrap();
        }

        let mut m = f32_attention(&ctx, &GQA, AttnMask::Causal);
        let bytes = m.residuals_size(&ctx, &args).unwrap();
        assert!(
            bytes >= lay.tokens_q * GQA.heads * 4,
            "the LSE at least: {}",
            bytes
        );
        let mut mem = ResidualBuffer::new(bytes);
        let mut o1 = vec![0.0f32; d.q.len()];
        m.forward_compute_into(&ctx, &args, &mut view_mut(&mut o1, &sq), &mut mem)
            .unwrap();
        assert_eq!(o0, o1);
        let ov = view(&o1, &sq);
        let mut g1 = zero_grads(&lay, &GQA);
        m.backward_from(
            &ctx,
            &args,
            &ov,
            &mem,
            &d_o,
            grads(&mut g1, &lay, &GQA, thd),
        )
        .unwrap();
        assert_eq!(g0, g1, "thd {}", thd);
        let mut g2 = zero_grads(&lay, &GQA);
        m.backward_from(
            &ctx,
            &args,
            &ov,
            &mem,
            &d_o,
            grads(&mut g2, &lay, &GQA, thd),
        )
        .unwrap();
        assert_eq!(g1, g2, "repeatable");

        // Too small.
        let err = m
            .forward_compute_into(
                &ctx,
                &args,
                &mut view_mut(&mut o1, &sq),
                &mut mem[..bytes - 16],
            )
            .unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
        assert!(
            err.message()
                .starts_with("te_attention_forward_compute_into"),
            "{}",
            err
        );
    }
}

#[test]
fn state_round_trip_and_scaling_states() {
    let ctx = Context::cpu().unwrap();
    let m = f32_attention(&ctx, &GQA, AttnMask::None);
    let bytes = m.state_save(&ctx).unwrap();
    assert!(!bytes.is_empty());
    let mut other = f32_attention(&ctx, &GQA, AttnMask::None);
    other.state_load(&ctx, &bytes).unwrap();
    assert_eq!(other.state_save(&ctx).unwrap(), bytes);
    let err = other
        .state_load(&ctx, &bytes[..bytes.len() / 2])
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
    assert!(
        err.message().starts_with("te_attention_state_load"),
        "{}",
        err
    );
    for which in [
        AttentionTensor::Q,
        AttentionTensor::K,
        AttentionTensor::V,
        AttentionTensor::S,
        AttentionTensor::DO,
        AttentionTensor::DP,
    ] {
        let s = m.scaling_state(&ctx, which).unwrap();
        assert_eq!(s.scale, 1.0, "{:?}", which);
    }
}

#[test]
fn fp8_attention_is_close_and_records_amaxes() {
    let mut ctx = Context::cpu().unwrap();
    let lay = Layout::bshd(2, 16, 16);
    let d = data(31, &lay, &GQA);
    let (sq, _) = shapes(&lay, &GQA, false);
    let mut m = Attention::new(
        &ctx,
        &AttentionOptions {
            num_kv_heads: 2,
            mask: AttnMask::Causal,
            activation_dtype: DType::F32,
            fp8: true,
            ..AttentionOptions::new(8, 16)
        },
    )
    .unwrap();
    let recipe = Recipe::new(&RecipeOptions {
        amax_history_len: 4,
        ..RecipeOptions::new(RecipeKind::DelayedScaling)
    })
    .unwrap();
    let args = d.args(&lay, &GQA, false);
    let mut o = vec![0.0f32; d.q.len()];
    let mut g = zero_grads(&lay, &GQA);
    {
        let mut bwd = {
            let scope = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe)).unwrap();
            m.forward(&scope, &args, view_mut(&mut o, &sq)).unwrap()
        };
        bwd.backward(&ctx, &view(&d.d_o, &sq), grads(&mut g, &lay, &GQA, false))
            .unwrap();
    }
    ctx.flush_backward().unwrap();
    let [ro, rdq, rdk, rdv] =
        reference(&lay, &GQA, AttnMask::Causal, 0.25, &d.q, &d.k, &d.v, &d.d_o);
    // E4M3 operands (and P, dS): a few percent.
    for (name, got, want) in [
        ("O", &o, &ro),
        ("dQ", &g[0], &rdq),
        ("dK", &g[1], &rdk),
        ("dV", &g[2], &rdv),
    ] {
        let e = rel_err(got, want);
        assert!(e < 0.15, "FP8 {}: relative error {}", name, e);
    }
    let q = m.scaling_state(&ctx, AttentionTensor::Q).unwrap();
    let amax_q = d.q.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    assert_eq!(q.amax_history.len(), 4);
    assert!(q.amax_history.contains(&amax_q), "{:?} lacks {}", q, amax_q);
    assert_eq!(q.fp8_dtype, Some(DType::E4M3));
    // P's amax (delayed scaling) from a second step: the first FP8 forward of a fresh attention
    // records none (its S state gets its amax slot only after the forward took the pointer;
    // core/modules/attention/forward.cpp), reported; the second one does.
    {
        let mut o2 = vec![0.0f32; d.q.len()];
        let scope = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe)).unwrap();
        m.forward(&scope, &args, view_mut(&mut o2, &sq)).unwrap();
    }
    let s = m.scaling_state(&ctx, AttentionTensor::S).unwrap();
    let amax_s = s.amax_history.iter().fold(0.0f32, |a, &v| a.max(v));
    assert!(amax_s > 0.0 && amax_s <= 1.0, "P's amax: {:?}", s);
}

#[test]
fn bad_input_is_an_error_naming_the_function() {
    let ctx = Context::cpu().unwrap();
    // head_dim not a multiple of 8.
    let err = Attention::new(&ctx, &AttentionOptions::new(4, 12)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_attention_create"), "{}", err);
    assert!(err.message().contains("head_dim"), "{}", err);
    // kv heads not dividing the heads.
    let err = Attention::new(
        &ctx,
        &AttentionOptions {
            num_kv_heads: 3,
            ..AttentionOptions::new(8, 16)
        },
    )
    .unwrap_err();
    assert!(err.message().contains("num_kv_heads"), "{}", err);

    let lay = Layout::bshd(1, 4, 4);
    let d = data(41, &lay, &GQA);
    let (sq, skv) = shapes(&lay, &GQA, false);
    let mut o = vec![0.0f32; d.q.len()];
    // BF16 layer, F32 tensors.
    let mut bf = Attention::new(
        &ctx,
        &AttentionOptions {
            num_kv_heads: 2,
            ..AttentionOptions::new(8, 16)
        },
    )
    .unwrap();
    let err = bf
        .forward(&ctx, &d.args(&lay, &GQA, false), view_mut(&mut o, &sq))
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_attention_forward"), "{}", err);
    assert!(o.iter().all(|&v| v == 0.0), "o untouched");

    let mut m = f32_attention(&ctx, &GQA, AttnMask::None);
    // k with the query head count.
    let kbig = vec![0.0f32; d.q.len()];
    let args = AttentionArgs::new(view(&d.q, &sq), view(&kbig, &sq), view(&d.v, &skv));
    let err = m.forward(&ctx, &args, view_mut(&mut o, &sq)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_attention_forward"), "{}", err);

    // THD offsets that do not end at the token count.
    let lay = Layout::thd(&[2, 3], &[2, 3]);
    let d = data(43, &lay, &GQA);
    let (sq, skv) = shapes(&lay, &GQA, true);
    let bad = [0i32, 2, 4];
    let args = AttentionArgs::new(view(&d.q, &sq), view(&d.k, &skv), view(&d.v, &skv)).thd(
        TensorView::from_slice(&bad, &[3]).unwrap(),
        TensorView::from_slice(&d.cu_kv, &[3]).unwrap(),
        3,
        3,
    );
    let mut o = vec![0.0f32; d.q.len()];
    let err = m
        .forward_compute(&ctx, &args, view_mut(&mut o, &sq))
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message().starts_with("te_attention_forward_compute"),
        "{}",
        err
    );
    assert!(err.message().contains("cu_seqlens_q"), "{}", err);
    // Offsets of F32 instead of I32.
    let badf = [0.0f32, 2.0, 5.0];
    let args = AttentionArgs::new(view(&d.q, &sq), view(&d.k, &skv), view(&d.v, &skv)).thd(
        view(&badf, &[3]),
        TensorView::from_slice(&d.cu_kv, &[3]).unwrap(),
        3,
        3,
    );
    let err = m.forward(&ctx, &args, view_mut(&mut o, &sq)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_attention_forward"), "{}", err);
    // residuals_size names itself too.
    let err = m.residuals_size(&ctx, &args).unwrap_err();
    assert!(
        err.message().starts_with("te_attention_residuals_size"),
        "{}",
        err
    );
}

#[test]
fn i32_views() {
    let mut cu = vec![0i32, 5, 9];
    let v = TensorView::from_slice(&cu, &[3]).unwrap();
    assert_eq!(v.dtype(), DType::I32);
    assert_eq!(DType::I32.size(), 4);
    assert!(!DType::I32.is_fp8());
    assert_eq!(v.as_slice::<i32>().unwrap(), &[0, 5, 9]);
    assert!(v.as_slice::<f32>().is_err());
    let mut m = TensorViewMut::from_slice(&mut cu, &[3]).unwrap();
    assert_eq!(m.dtype(), DType::I32);
    assert!(!m.as_raw_mut().is_null());
    assert!(TensorView::from_slice(&cu, &[4]).is_err());
}

#[test]
fn fp8_caller_memory_equals_library_owned_under_current_scaling() {
    let lay = Layout::thd(&[1, 17, 33], &[1, 17, 33]);
    let d = data(51, &lay, &GQA);
    let (sq, _) = shapes(&lay, &GQA, true);
    let recipe = Recipe::current_scaling().unwrap();
    let opts = AttentionOptions {
        num_kv_heads: 2,
        mask: AttnMask::Causal,
        activation_dtype: DType::F32,
        fp8: true,
        ..AttentionOptions::new(8, 16)
    };
    let mut ctx = Context::cpu().unwrap();
    let args = d.args(&lay, &GQA, true);
    let d_o = view(&d.d_o, &sq);

    let mut owned = Attention::new(&ctx, &opts).unwrap();
    let mut o0 = vec![0.0f32; d.q.len()];
    let mut g0 = zero_grads(&lay, &GQA);
    {
        let mut bwd = {
            let scope = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe)).unwrap();
            let res = owned
                .forward_compute(&scope, &args, view_mut(&mut o0, &sq))
                .unwrap();
            assert!(res.fp8());
            assert_eq!(res.q().unwrap().dtype(), DType::E4M3);
            owned.forward_save(&scope, res).unwrap()
        };
        bwd.backward(&ctx, &d_o, grads(&mut g0, &lay, &GQA, true))
            .unwrap();
    }

    let mut m = Attention::new(&ctx, &opts).unwrap();
    let mut o1 = vec![0.0f32; d.q.len()];
    let mem = {
        let scope = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe)).unwrap();
        let bytes = m.residuals_size(&scope, &args).unwrap();
        // The LSE and the E4M3 Q, K, V.
        assert!(
            bytes >= lay.tokens_q * 8 * 4 + d.q.len() + 2 * d.k.len(),
            "{}",
            bytes
        );
        let mut mem = ResidualBuffer::new(bytes);
        m.forward_compute_into(&scope, &args, &mut view_mut(&mut o1, &sq), &mut mem)
            .unwrap();
        mem
    };
    assert_eq!(o0, o1);
    let ov = view(&o1, &sq);
    let mut g1 = zero_grads(&lay, &GQA);
    m.backward_from(
        &ctx,
        &args,
        &ov,
        &mem,
        &d_o,
        grads(&mut g1, &lay, &GQA, true),
    )
    .unwrap();
    assert_eq!(g0, g1);
    let mut g2 = zero_grads(&lay, &GQA);
    m.backward_from_once(
        &ctx,
        &args,
        &ov,
        &mem,
        &d_o,
        grads(&mut g2, &lay, &GQA, true),
    )
    .unwrap();
    assert_eq!(g1, g2);
    let err = m
        .backward_from(
            &ctx,
            &args,
            &ov,
            &mem,
            &d_o,
            grads(&mut g2, &lay, &GQA, true),
        )
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
    assert!(
        err.message().starts_with("te_attention_backward_from"),
        "{}",
        err
    );
    // Loosely against the f64 reference.
    let scale = 0.25;
    let [ro, rdq, rdk, rdv] = reference(
        &lay,
        &GQA,
        AttnMask::Causal,
        scale,
        &d.q,
        &d.k,
        &d.v,
        &d.d_o,
    );
    for (name, got, want) in [
        ("O", &o1, &ro),
        ("dQ", &g1[0], &rdq),
        ("dK", &g1[1], &rdk),
        ("dV", &g1[2], &rdv),
    ] {
        let e = rel_err(got, want);
        assert!(
            e < 0.15,
            "FP8 current scaling {}: relative error {}",
            name,
            e
        );
    }
}
