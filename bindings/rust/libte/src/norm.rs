//! LayerNorm and RMSNorm over the last dimension (`te_norm_forward` / `te_norm_backward`).

use std::ptr;

use libte_sys as sys;

use crate::context::{Context, Device, QuantizeScale};
use crate::error::{check, Error, Result, Status};
use crate::tensor::{opt_mut, TensorView, TensorViewMut};

/// Which normalisation (`te_norm_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * gamma + beta`.
    LayerNorm,
    /// `x / sqrt(mean(x^2) + eps) * gamma` (no beta, no mean).
    RmsNorm,
}

impl NormKind {
    pub(crate) fn to_raw(self) -> sys::te_norm_kind {
        match self {
            NormKind::LayerNorm => sys::te_norm_kind::TE_NORM_LAYERNORM,
            NormKind::RmsNorm => sys::te_norm_kind::TE_NORM_RMSNORM,
        }
    }

    pub(crate) fn from_raw(raw: sys::te_norm_kind) -> Option<NormKind> {
        match raw {
            sys::te_norm_kind::TE_NORM_LAYERNORM => Some(NormKind::LayerNorm),
            sys::te_norm_kind::TE_NORM_RMSNORM => Some(NormKind::RmsNorm),
            _ => None,
        }
    }
}

/// The norm's options (`te_norm_options`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormOptions {
    /// Default [`NormKind::LayerNorm`].
    pub kind: NormKind,
    /// Added to the variance; finite and > 0. Default 1e-5.
    pub eps: f32,
    /// The scale applied is `1 + gamma`, so gamma = 0 is the identity (TE's option). Default
    /// false.
    pub zero_centered_gamma: bool,
}

impl NormOptions {
    /// The defaults (`te_norm_options_init`) for `kind`.
    pub fn new(kind: NormKind) -> NormOptions {
        NormOptions {
            kind,
            eps: 1e-5,
            zero_centered_gamma: false,
        }
    }

    fn to_raw(self) -> Result<sys::te_norm_options> {
        let mut raw = sys::te_norm_options::default();
        check(unsafe { sys::te_norm_options_init(&mut raw) })?;
        raw.kind = self.kind.to_raw();
        raw.eps = self.eps;
        raw.zero_centered_gamma = self.zero_centered_gamma as i32;
        Ok(raw)
    }
}

impl Default for NormOptions {
    fn default() -> NormOptions {
        NormOptions::new(NormKind::LayerNorm)
    }
}

/// What a forward writes (the views are handed over for the call); every field may be
/// `None`, but at least one of `output` and `output_t` must be given.
#[derive(Debug, Default)]
pub struct NormOutputs<'a> {
    /// y `[..., hidden]` (x's shape, or `[rows, hidden]`): F32/F16/BF16, or FP8 codes with
    /// per-tensor scaling.
    pub output: Option<TensorViewMut<'a>>,
    /// FP8 `[hidden, rows]`: y transposed (the operand an FP8 wgrad GEMM needs).
    pub output_t: Option<TensorViewMut<'a>>,
    /// F32 `[rows]`: the means (LayerNorm only).
    pub mu: Option<TensorViewMut<'a>>,
    /// F32 `[rows]`: `1 / sqrt(var + eps)`.
    pub rsigma: Option<TensorViewMut<'a>>,
    /// max |y| over the normalised values, max-accumulated into this host float (whatever the
    /// outputs' dtypes). Needs a CPU context.
    pub amax: Option<&'a mut f32>,
}

/// The gradients a backward writes; each `None` is skipped. `dbeta` is LayerNorm's only.
#[derive(Debug, Default)]
pub struct NormGrads<'a> {
    /// dx, x's shape and dtype.
    pub dx: Option<TensorViewMut<'a>>,
    /// dgamma `[hidden]`, gamma's dtype (written, not accumulated).
    pub dgamma: Option<TensorViewMut<'a>>,
    /// dbeta `[hidden]`, gamma's dtype (written, not accumulated).
    pub dbeta: Option<TensorViewMut<'a>>,
}

impl Context {
    /// The norm of `x [..., hidden]` over its last dimension, statistics in fp32 (bit-identical
    /// on every backend). `gamma [hidden]` and `beta [hidden]` (LayerNorm only) have x's dtype.
    ///
    /// FP8 outputs are cast with `scale`: [`QuantizeScale::Given`] (delayed scaling; one pass)
    /// or [`QuantizeScale::FromAmax`] (current scaling from y's own amax). A given scale and
    /// `outputs.amax` are host memory, so they need a CPU context.
    pub fn norm_forward(
        &self,
        opts: &NormOptions,
        x: &TensorView<'_>,
        gamma: &TensorView<'_>,
        beta: Option<&TensorView<'_>>,
        outputs: NormOutputs<'_>,
        scale: QuantizeScale,
    ) -> Result<()> {
        let raw_opts = opts.to_raw()?;
        let NormOutputs {
            mut output,
            mut output_t,
            mut mu,
            mut rsigma,
            amax,
        } = outputs;
        let mut q = sys::te_quantize_options::default();
        check(unsafe { sys::te_quantize_options_init(&mut q) })?;
        let given;
        match scale {
            QuantizeScale::Given(s) => {
                self.require_host_scalars("Context::norm_forward", "a given scale")?;
                given = s;
                q.scale = &given;
            }
            QuantizeScale::FromAmax {
                amax_epsilon,
                power_of_2_scales,
            } => {
                q.amax_epsilon = amax_epsilon;
                q.power_of_2_scales = power_of_2_scales as i32;
            }
        }
        if let Some(a) = amax {
            self.require_host_scalars("Context::norm_forward", "outputs.amax")?;
            q.amax = a;
        }
        let mut args = sys::te_norm_forward_args::default();
        check(unsafe { sys::te_norm_forward_args_init(&mut args) })?;
        args.input = x.as_raw();
        args.weight = gamma.as_raw();
        args.bias = beta.map_or(ptr::null(), |b| b.as_raw());
        args.output = opt_mut(output.as_mut());
        args.output_t = opt_mut(output_t.as_mut());
        args.mu = opt_mut(mu.as_mut());
        args.rsigma = opt_mut(rsigma.as_mut());
        args.quantize = &q;
        check(unsafe { sys::te_norm_forward(self.as_ptr(), &raw_opts, &args) })
    }

    /// The norm's backward from `dy` (x's shape and dtype), the forward's `x`, `gamma` and
    /// statistics (`mu`: LayerNorm only, `None` for RMSNorm; `rsigma`). Deterministic.
    #[allow(clippy::too_many_arguments)] // the C call's inputs, each a tensor
    pub fn norm_backward(
        &self,
        opts: &NormOptions,
        dy: &TensorView<'_>,
        x: &TensorView<'_>,
        gamma: &TensorView<'_>,
        mu: Option<&TensorView<'_>>,
        rsigma: &TensorView<'_>,
        grads: NormGrads<'_>,
    ) -> Result<()> {
        let raw_opts = opts.to_raw()?;
        let NormGrads {
            mut dx,
            mut dgamma,
            mut dbeta,
        } = grads;
        check(unsafe {
            sys::te_norm_backward(
                self.as_ptr(),
                &raw_opts,
                dy.as_raw(),
                x.as_raw(),
                gamma.as_raw(),
                mu.map_or(ptr::null(), |m| m.as_raw()),
                rsigma.as_raw(),
                opt_mut(dx.as_mut()),
                opt_mut(dgamma.as_mut()),
                opt_mut(dbeta.as_mut()),
            )
        })
    }

    fn require_host_scalars(&self, func: &str, what: &str) -> Result<()> {
        if self.device() == Device::Cpu {
            Ok(())
        } else {
            Err(Error::new(
                Status::Unsupported,
                format!(
                    "{}: {} is host memory here, so it needs a CPU context; this one is on {:?}",
                    func,
                    what,
                    self.device()
                ),
            ))
        }
    }
}
