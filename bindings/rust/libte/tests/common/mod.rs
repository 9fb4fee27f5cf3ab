//! Helpers shared by the integration tests.
#![allow(dead_code)]

use libte::*;

pub mod reference;

/// A deterministic pseudo-random sequence (splitmix64), values in [-1, 1).
pub fn fill(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn f32_linear(ctx: &Context, input: usize, output: usize) -> Linear {
    Linear::new(
        ctx,
        &LinearOptions {
            activation_dtype: DType::F32,
            ..LinearOptions::new(input, output)
        },
    )
    .expect("Linear::new")
}

pub fn view<'a>(data: &'a [f32], shape: &[usize]) -> TensorView<'a> {
    TensorView::from_slice(data, shape).expect("TensorView::from_slice")
}

pub fn view_mut<'a>(data: &'a mut [f32], shape: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::from_slice(data, shape).expect("TensorViewMut::from_slice")
}

/// f32 buffers for one forward with bias, `y [tokens, out] = x [tokens, in] W^T + b`: x and W
/// filled with the given values, b and y zeros.
pub struct ForwardBuffers {
    pub x: Vec<f32>,
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub y: Vec<f32>,
    shape: [usize; 3],
}

impl ForwardBuffers {
    pub fn new([tokens, input, output]: [usize; 3], x: f32, w: f32) -> ForwardBuffers {
        ForwardBuffers {
            x: vec![x; tokens * input],
            w: vec![w; output * input],
            b: vec![0.0; output],
            y: vec![0.0; tokens * output],
            shape: [tokens, input, output],
        }
    }

    /// The forward's arguments (x, W and b) and the view of y to pass with them.
    pub fn views(&mut self) -> (ForwardArgs<'_>, TensorViewMut<'_>) {
        let [tokens, input, output] = self.shape;
        let args = ForwardArgs::new(
            view(&self.x, &[tokens, input]),
            view(&self.w, &[output, input]),
        )
        .bias(view(&self.b, &[output]));
        (args, view_mut(&mut self.y, &[tokens, output]))
    }
}

/// A residual tensor (FP8 or not) as f64 values, via te_dequantize for FP8.
pub fn dequantized(ctx: &Context, t: &TensorView<'_>) -> Vec<f64> {
    if t.dtype().is_fp8() {
        let shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
        let mut out = vec![0.0f32; t.numel()];
        ctx.dequantize(t, &mut view_mut(&mut out, &shape))
            .expect("dequantize");
        out.into_iter().map(f64::from).collect()
    } else {
        t.as_slice::<f32>()
            .expect("f32 residual")
            .iter()
            .map(|&v| v as f64)
            .collect()
    }
}

/// Asserts |got - want| <= tol * (scale + |want|) elementwise, where scale is the largest |want|.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{}: length", what);
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * (scale + w.abs()),
            "{}[{}]: got {}, want {} (err {}, scale {})",
            what,
            i,
            g,
            w,
            err,
            scale
        );
    }
}
