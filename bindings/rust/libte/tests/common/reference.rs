//! Float64 references for the transformer-module tests, from the formulas (row-major
//! matrices as flat vectors).

use libte::{Activation, NormKind};

/// `a [m, k] b[n, k]^T -> [m, n]`.
pub fn matmul_nt(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
        }
    }
    out
}

/// `a [m, k] b [k, n] -> [m, n]`.
pub fn matmul_nn(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

/// `a [k, m]^T b [k, n] -> [m, n]`.
pub fn matmul_tn(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[p * m + i] * b[p * n + j]).sum();
        }
    }
    out
}

/// `[rows, cols] -> [cols, rows]`.
pub fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = a[r * cols + c];
        }
    }
    out
}

/// Adds `bias [cols]` to every row.
pub fn add_bias(a: &mut [f64], bias: &[f32]) {
    let cols = bias.len();
    for (i, v) in a.iter_mut().enumerate() {
        *v += bias[i % cols] as f64;
    }
}

/// Sums the rows of `a [rows, cols]`.
pub fn column_sums(a: &[f64], cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; cols];
    for (i, v) in a.iter().enumerate() {
        out[i % cols] += v;
    }
    out
}

pub fn f64s(a: &[f32]) -> Vec<f64> {
    a.iter().map(|&v| v as f64).collect()
}

/// The norm over each row: (y, mu, rsigma); mu is zeros for RMSNorm.
pub struct Norm {
    pub y: Vec<f64>,
    pub mu: Vec<f64>,
    pub rsigma: Vec<f64>,
}

pub fn norm(
    kind: NormKind,
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    hidden: usize,
    eps: f64,
    zcg: bool,
) -> Norm {
    let rows = x.len() / hidden;
    let (mut y, mut mu, mut rsigma) = (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let m = if kind == NormKind::LayerNorm {
            row.iter().map(|&v| v as f64).sum::<f64>() / hidden as f64
        } else {
            0.0
        };
        let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / hidden as f64;
        let rs = 1.0 / (var + eps).sqrt();
        for c in 0..hidden {
            let g = gamma[c] as f64 + if zcg { 1.0 } else { 0.0 };
            let b = beta.map_or(0.0, |b| b[c] as f64);
            y[r * hidden + c] = (row[c] as f64 - m) * rs * g + b;
        }
        mu[r] = m;
        rsigma[r] = rs;
    }
    Norm { y, mu, rsigma }
}

/// (dx, dgamma, dbeta) of the norm for the gradient `dy` of its output.
pub fn norm_backward(
    kind: NormKind,
    dy: &[f64],
    x: &[f32],
    gamma: &[f32],
    hidden: usize,
    eps: f64,
    zcg: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = norm(kind, x, gamma, None, hidden, eps, zcg);
    let rows = x.len() / hidden;
    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; hidden], vec![0.0; hidden]);
    for r in 0..rows {
        let xhat: Vec<f64> = (0..hidden)
            .map(|c| (x[r * hidden + c] as f64 - n.mu[r]) * n.rsigma[r])
            .collect();
        let dyg: Vec<f64> = (0..hidden)
            .map(|c| dy[r * hidden + c] * (gamma[c] as f64 + if zcg { 1.0 } else { 0.0 }))
            .collect();
        let c1 = (0..hidden).map(|c| dyg[c] * xhat[c]).sum::<f64>() / hidden as f64;
        let c2 = if kind == NormKind::LayerNorm {
            dyg.iter().sum::<f64>() / hidden as f64
        } else {
            0.0
        };
        for c in 0..hidden {
            dx[r * hidden + c] = n.rsigma[r] * (dyg[c] - xhat[c] * c1 - c2);
            dg[c] += dy[r * hidden + c] * xhat[c];
            db[c] += dy[r * hidden + c];
        }
    }
    (dx, dg, db)
}

const K: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)

fn gelu(z: f64) -> f64 {
    0.5 * z * (1.0 + (K * (z + 0.044715 * z * z * z)).tanh())
}

fn dgelu(z: f64) -> f64 {
    let t = (K * (z + 0.044715 * z * z * z)).tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * K * (1.0 + 3.0 * 0.044715 * z * z)
}

fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

fn dsilu(z: f64) -> f64 {
    let s = 1.0 / (1.0 + (-z).exp());
    s * (1.0 + z * (1.0 - s))
}

fn plain(act: Activation) -> (fn(f64) -> f64, fn(f64) -> f64) {
    match act {
        Activation::Relu => (|z| z.max(0.0), |z| if z > 0.0 { 1.0 } else { 0.0 }),
        Activation::Srelu => (|z| z.max(0.0).powi(2), |z| 2.0 * z.max(0.0)),
        Activation::Gelu | Activation::Geglu => (gelu, dgelu),
        Activation::Swiglu => (silu, dsilu),
        _ => unreachable!("an activation the tests do not know"),
    }
}

/// `act(h)` for `h [rows, cols]` (cols = 2n for a gated activation: `[rows, n]` out).
pub fn activation(act: Activation, h: &[f64], cols: usize) -> Vec<f64> {
    let (f, _) = plain(act);
    if !act.is_gated() {
        return h.iter().map(|&z| f(z)).collect();
    }
    let n = cols / 2;
    let rows = h.len() / cols;
    let mut out = vec![0.0; rows * n];
    for r in 0..rows {
        for c in 0..n {
            out[r * n + c] = f(h[r * cols + c]) * h[r * cols + n + c];
        }
    }
    out
}

/// The gradient of `activation` at `h` for the gradient `da` of its output.
pub fn activation_backward(act: Activation, h: &[f64], da: &[f64], cols: usize) -> Vec<f64> {
    let (f, df) = plain(act);
    if !act.is_gated() {
        return h.iter().zip(da).map(|(&z, &d)| d * df(z)).collect();
    }
    let n = cols / 2;
    let rows = h.len() / cols;
    let mut out = vec![0.0; h.len()];
    for r in 0..rows {
        for c in 0..n {
            let (a, l, d) = (h[r * cols + c], h[r * cols + n + c], da[r * n + c]);
            out[r * cols + c] = d * l * df(a);
            out[r * cols + n + c] = d * f(a);
        }
    }
    out
}

/// Values exactly representable in E5M2 (and F32): with scale 1 (a fresh delayed-scaling
/// state) their FP8 quantization is exact.
pub fn e5m2_exact(seed: u64, n: usize) -> Vec<f32> {
    const VALS: [f32; 9] = [-1.5, -1.0, -0.5, -0.25, 0.0, 0.125, 0.375, 0.75, 1.25];
    super::fill(seed, n)
        .iter()
        .map(|v| VALS[(((v + 1.0) * 4.5) as usize).min(8)])
        .collect()
}

/// Relative Frobenius error of `got` against `want`.
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}
