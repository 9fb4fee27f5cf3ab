//! RoPE against an f64 reference written here (GPT-NeoX and GPT-J pairs, partial rotation,
//! BSHD and THD positions), forward then backward is the identity within rounding, in place
//! equals out of place, errors name the function.

mod common;

use common::*;
use libte::*;

/// Angles `freqs[p][k] = p * base^(-2k / rot_dim)`, F32 `[positions, rot_dim / 2]`.
fn freqs(positions: usize, rot_dim: usize) -> Vec<f32> {
    let half = rot_dim / 2;
    let mut f = vec![0.0f32; positions * half];
    for p in 0..positions {
        for k in 0..half {
            f[p * half + k] = (p as f64 * 10000f64.powf(-2.0 * k as f64 / rot_dim as f64)) as f32;
        }
    }
    f
}

/// y for x `[tokens, heads, d]` whose token t sits at position `pos[t]`.
fn reference(
    x: &[f32],
    pos: &[usize],
    heads: usize,
    d: usize,
    rot: usize,
    interleaved: bool,
    f: &[f32],
    inverse: bool,
) -> Vec<f64> {
    let half = rot / 2;
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let base = (t * heads + h) * d;
            for k in 0..half {
                let (i1, i2) = if interleaved {
                    (2 * k, 2 * k + 1)
                } else {
                    (k, k + half)
                };
                let a = f[p * half + k] as f64;
                let (c, s) = (a.cos(), if inverse { -a.sin() } else { a.sin() });
                let (x1, x2) = (x[base + i1] as f64, x[base + i2] as f64);
                y[base + i1] = x1 * c - x2 * s;
                y[base + i2] = x2 * c + x1 * s;
            }
        }
    }
    y
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn bshd_and_thd_match_f64_and_invert() {
    let (heads, d) = (4usize, 32usize);
    for &(rot, interleaved) in &[(0usize, false), (0, true), (16, false), (8, true)] {
        let rot_dim = if rot == 0 { d } else { rot };
        let opts = RopeOptions {
            rot_dim: rot,
            interleaved,
        };
        let f = freqs(40, rot_dim);
        let fv = view(&f, &[40, rot_dim / 2]);
        // BSHD: batch 2, seq 12: positions 0..12 in each sequence.
        let (b, s) = (2usize, 12usize);
        let x = fill(1, b * s * heads * d);
        let pos: Vec<usize> = (0..b * s).map(|t| t % s).collect();
        let shape = [b, s, heads, d];
        // THD: lengths 1, 17, 5.
        let lens = [1usize, 17, 5];
        let cu = [0i32, 1, 18, 23];
        let xt = fill(2, 23 * heads * d);
        let pos_t: Vec<usize> = lens.iter().flat_map(|&l| 0..l).collect();
        let cases: [(&[f32], &[usize], Vec<usize>, bool); 2] = [
            (&x, &pos, shape.to_vec(), false),
            (&xt, &pos_t, vec![23, heads, d], true),
        ];
        for (x, pos, shape, thd) in cases {
            let ctx = Context::cpu().unwrap();
            let cuv = TensorView::from_slice(&cu, &[4]).unwrap();
            let cu_opt = if thd { Some(&cuv) } else { None };
            let mut y = vec![0.0f32; x.len()];
            ctx.rope_forward(
                &opts,
                &view(x, &shape),
                &fv,
                cu_opt,
                &mut view_mut(&mut y, &shape),
            )
            .unwrap();
            let want = reference(x, pos, heads, d, rot_dim, interleaved, &f, false);
            let e = max_abs_diff(&y, &want);
            assert!(
                e < 1e-5,
                "forward rot {} il {} thd {}: {}",
                rot_dim,
                interleaved,
                thd,
                e
            );
            // The features past rot_dim are copied exactly.
            if rot_dim < d {
                for t in 0..x.len() / d {
                    assert_eq!(
                        &y[t * d + rot_dim..(t + 1) * d],
                        &x[t * d + rot_dim..(t + 1) * d]
                    );
                }
            }
            // Backward is the inverse rotation: forward then backward gives x back.
            let mut back = vec![0.0f32; x.len()];
            ctx.rope_backward(
                &opts,
                &view(&y, &shape),
                &fv,
                cu_opt,
                &mut view_mut(&mut back, &shape),
            )
            .unwrap();
            let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let e = max_abs_diff(&back, &xs);
            assert!(
                e < 1e-6,
                "round trip rot {} il {} thd {}: {}",
                rot_dim,
                interleaved,
                thd,
                e
            );
            // And backward is the f64 inverse rotation of its input.
            let want_b = reference(&y, pos, heads, d, rot_dim, interleaved, &f, true);
            assert!(max_abs_diff(&back, &want_b) < 1e-5);
            // In place equals out of place, bit for bit.
            let mut inplace = x.to_vec();
            ctx.rope_forward_inplace(&opts, &mut view_mut(&mut inplace, &shape), &fv, cu_opt)
                .unwrap();
            assert_eq!(inplace, y);
            ctx.rope_backward_inplace(&opts, &mut view_mut(&mut inplace, &shape), &fv, cu_opt)
                .unwrap();
            assert_eq!(inplace, back);
        }
    }
}

#[test]
fn bf16_round_trip_within_rounding() {
    let ctx = Context::cpu().unwrap();
    let shape = [1usize, 8, 2, 16];
    let xf = fill(5, 8 * 2 * 16);
    let x: Vec<Bf16> = xf.iter().map(|&v| Bf16::from_f32(v)).collect();
    let f = freqs(8, 16);
    let fv = view(&f, &[8, 8]);
    let mut y = vec![Bf16::from_f32(0.0); x.len()];
    let opts = RopeOptions::default();
    ctx.rope_forward(
        &opts,
        &TensorView::from_slice(&x, &shape).unwrap(),
        &fv,
        None,
        &mut TensorViewMut::from_slice(&mut y, &shape).unwrap(),
    )
    .unwrap();
    let mut back = vec![Bf16::from_f32(0.0); x.len()];
    ctx.rope_backward(
        &opts,
        &TensorView::from_slice(&y, &shape).unwrap(),
        &fv,
        None,
        &mut TensorViewMut::from_slice(&mut back, &shape).unwrap(),
    )
    .unwrap();
    for (a, b) in x.iter().zip(&back) {
        // Two BF16 roundings of values below 1: within 2^-7.
        assert!(
            (a.to_f32() - b.to_f32()).abs() <= 1.0 / 128.0,
            "{} vs {}",
            a.to_f32(),
            b.to_f32()
        );
    }
}

#[test]
fn options_defaults_and_errors() {
    let o = RopeOptions::new();
    assert_eq!(
        o,
        RopeOptions {
            rot_dim: 0,
            interleaved: false
        }
    );
    let ctx = Context::cpu().unwrap();
    let shape = [1usize, 4, 2, 16];
    let x = fill(9, 4 * 2 * 16);
    let mut y = vec![0.0f32; x.len()];
    let f = freqs(4, 16);
    // Odd rot_dim.
    let err = ctx
        .rope_forward(
            &RopeOptions {
                rot_dim: 7,
                interleaved: false,
            },
            &view(&x, &shape),
            &view(&f, &[4, 8]),
            None,
            &mut view_mut(&mut y, &shape),
        )
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_rope_forward"), "{}", err);
    // Positions beyond freqs: 4 positions of freqs, a sequence of 4 is fine, of 8 is not.
    let x8 = fill(9, 8 * 2 * 16);
    let mut y8 = vec![0.0f32; x8.len()];
    let err = ctx
        .rope_backward(
            &RopeOptions::default(),
            &view(&x8, &[1, 8, 2, 16]),
            &view(&f, &[4, 8]),
            None,
            &mut view_mut(&mut y8, &[1, 8, 2, 16]),
        )
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("te_rope_backward"), "{}", err);
    assert!(y8.iter().all(|&v| v == 0.0), "output untouched");
}
