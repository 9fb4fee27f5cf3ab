//! `LayerNormMlp`: `y = fc2(act(fc1(norm(x))))` (TE's LayerNormMLP, the feed-forward block),
//! with `Linear`'s split forward and repeatable backward.

use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use libte_sys as sys;

use crate::context::{Activation, Context};
use crate::error::{check, Result};
use crate::linear::{ScalingStateInfo, TensorRole};
use crate::module::{
    backward_args, features, read_scaling_state, required_view, residual_memory,
    residual_memory_mut, residual_view, save_state, Owned, OwnedResiduals,
};
use crate::norm::{NormKind, NormOptions};
use crate::tensor::{opt_mut, DType, TensorView, TensorViewMut};

/// A LayerNormMLP's options (`te_layernorm_mlp_options`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormMlpOptions {
    /// Required, > 0.
    pub hidden_size: usize,
    /// Required, > 0.
    pub ffn_hidden_size: usize,
    /// fc1 and fc2 have biases. Default true.
    pub bias: bool,
    /// Default GELU. The gated SwiGLU and GeGLU take fc1 outputs of `2 * ffn_hidden_size`.
    pub activation: Activation,
    /// F32, F16 or BF16 (default BF16).
    pub activation_dtype: DType,
    /// Backward adds the wgrads into the caller's F32 main_grads. Default false.
    pub fuse_wgrad_accumulation: bool,
    /// The norm: LayerNorm (default) or RMSNorm, eps (default 1e-5), zero-centred gamma.
    pub norm: NormOptions,
}

impl LayerNormMlpOptions {
    /// libte's defaults (`te_layernorm_mlp_options_init`) for a block of `hidden_size` with
    /// `ffn_hidden_size` hidden units.
    pub fn new(hidden_size: usize, ffn_hidden_size: usize) -> LayerNormMlpOptions {
        let mut raw = sys::te_layernorm_mlp_options::default();
        let _ = unsafe { sys::te_layernorm_mlp_options_init(&mut raw) };
        LayerNormMlpOptions {
            hidden_size,
            ffn_hidden_size,
            bias: raw.bias != 0,
            activation: Activation::from_raw(raw.activation).unwrap_or(Activation::Gelu),
            activation_dtype: DType::from_raw(raw.activation_dtype).unwrap_or(DType::BF16),
            fuse_wgrad_accumulation: raw.fuse_wgrad_accumulation != 0,
            norm: NormOptions {
                kind: NormKind::from_raw(raw.normalization).unwrap_or(NormKind::LayerNorm),
                eps: raw.eps,
                zero_centered_gamma: raw.zero_centered_gamma != 0,
            },
        }
    }

    /// fc1's output features: `ffn_hidden_size`, twice that for a gated activation.
    pub fn fc1_out_features(&self) -> usize {
        self.ffn_hidden_size * if self.activation.is_gated() { 2 } else { 1 }
    }

    fn to_raw(self) -> Result<sys::te_layernorm_mlp_options> {
        const F: &str = "LayerNormMlp::new";
        let mut raw = sys::te_layernorm_mlp_options::default();
        check(unsafe { sys::te_layernorm_mlp_options_init(&mut raw) })?;
        raw.hidden_size = features(self.hidden_size, F, "hidden_size")?;
        raw.ffn_hidden_size = features(self.ffn_hidden_size, F, "ffn_hidden_size")?;
        raw.bias = self.bias as i32;
        raw.activation = self.activation.to_raw();
        raw.activation_dtype = self.activation_dtype.to_raw();
        raw.fuse_wgrad_accumulation = self.fuse_wgrad_accumulation as i32;
        raw.normalization = self.norm.kind.to_raw();
        raw.eps = self.norm.eps;
        raw.zero_centered_gamma = self.norm.zero_centered_gamma as i32;
        Ok(raw)
    }
}

/// Which GEMM of a LayerNormMLP (`te_mlp_gemm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MlpGemm {
    /// norm(x) -> the activation's input.
    Fc1,
    /// The activation's output -> y.
    Fc2,
}

impl MlpGemm {
    pub(crate) fn to_raw(self) -> sys::te_mlp_gemm {
        match self {
            MlpGemm::Fc1 => sys::te_mlp_gemm::TE_MLP_FC1,
            MlpGemm::Fc2 => sys::te_mlp_gemm::TE_MLP_FC2,
        }
    }
}

/// The inputs of a forward (`te_layernorm_mlp_forward_args`), borrowed for `'a`: libte
/// references x and gamma (always) and the weights (in high precision) until the backward
/// context is destroyed, so the residuals and backward context keep that borrow.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormMlpArgs<'a> {
    /// x `[..., hidden]`.
    pub input: TensorView<'a>,
    /// gamma `[hidden]`.
    pub ln_weight: TensorView<'a>,
    /// beta `[hidden]`: LayerNorm only.
    pub ln_bias: Option<TensorView<'a>>,
    /// `[ffn (x2 gated, gate rows first), hidden]`.
    pub fc1_weight: TensorView<'a>,
    /// `[ffn (x2 gated)]`; `None` iff the block has no bias.
    pub fc1_bias: Option<TensorView<'a>>,
    /// `[hidden, ffn]`.
    pub fc2_weight: TensorView<'a>,
    /// `[hidden]`; `None` iff the block has no bias.
    pub fc2_bias: Option<TensorView<'a>>,
    /// Both weights are the ones of the last FP8 forward: reuse the cached FP8 weights.
    pub weight_unchanged: bool,
}

impl<'a> LayerNormMlpArgs<'a> {
    /// x, gamma and the two weights; no beta, no biases.
    pub fn new(
        input: TensorView<'a>,
        ln_weight: TensorView<'a>,
        fc1_weight: TensorView<'a>,
        fc2_weight: TensorView<'a>,
    ) -> LayerNormMlpArgs<'a> {
        LayerNormMlpArgs {
            input,
            ln_weight,
            ln_bias: None,
            fc1_weight,
            fc1_bias: None,
            fc2_weight,
            fc2_bias: None,
            weight_unchanged: false,
        }
    }

    /// With the norm's beta (LayerNorm).
    pub fn ln_bias(mut self, ln_bias: TensorView<'a>) -> LayerNormMlpArgs<'a> {
        self.ln_bias = Some(ln_bias);
        self
    }

    /// With fc1's and fc2's biases.
    pub fn biases(
        mut self,
        fc1_bias: TensorView<'a>,
        fc2_bias: TensorView<'a>,
    ) -> LayerNormMlpArgs<'a> {
        self.fc1_bias = Some(fc1_bias);
        self.fc2_bias = Some(fc2_bias);
        self
    }

    /// Sets `weight_unchanged`.
    pub fn weight_unchanged(mut self, unchanged: bool) -> LayerNormMlpArgs<'a> {
        self.weight_unchanged = unchanged;
        self
    }

    fn c_args(&self, ln_out: Option<&mut TensorViewMut<'_>>) -> sys::te_layernorm_mlp_forward_args {
        let opt =
            |t: &Option<TensorView<'_>>| t.as_ref().map_or(ptr::null(), |t| t.as_raw() as *const _);
        let mut raw = sys::te_layernorm_mlp_forward_args::default();
        let _ = unsafe { sys::te_layernorm_mlp_forward_args_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_layernorm_mlp_forward_args>();
        raw.input = self.input.as_raw();
        raw.ln_weight = self.ln_weight.as_raw();
        raw.ln_bias = opt(&self.ln_bias);
        raw.fc1_weight = self.fc1_weight.as_raw();
        raw.fc1_bias = opt(&self.fc1_bias);
        raw.fc2_weight = self.fc2_weight.as_raw();
        raw.fc2_bias = opt(&self.fc2_bias);
        raw.weight_unchanged = self.weight_unchanged as i32;
        raw.ln_out = opt_mut(ln_out);
        raw
    }
}

/// The gradients a backward writes (`te_layernorm_mlp_grads`); each `None` is skipped.
#[derive(Debug, Default)]
pub struct LayerNormMlpGrads<'a> {
    /// dx `[..., hidden]`.
    pub dx: Option<TensorViewMut<'a>>,
    /// dgamma `[hidden]`.
    pub dln_weight: Option<TensorViewMut<'a>>,
    /// dbeta `[hidden]`: LayerNorm only.
    pub dln_bias: Option<TensorViewMut<'a>>,
    /// fc1 W's shape; F32 and added into with fused wgrad accumulation.
    pub dfc1_weight: Option<TensorViewMut<'a>>,
    /// `[ffn (x2 gated)]`: blocks with bias only.
    pub dfc1_bias: Option<TensorViewMut<'a>>,
    /// `[hidden, ffn]`; F32 and added into with fused wgrad accumulation.
    pub dfc2_weight: Option<TensorViewMut<'a>>,
    /// `[hidden]`: blocks with bias only.
    pub dfc2_bias: Option<TensorViewMut<'a>>,
}

impl LayerNormMlpGrads<'_> {
    /// Calls `f` with the C struct, which points into `self`.
    fn with_raw<R>(self, f: impl FnOnce(&sys::te_layernorm_mlp_grads) -> R) -> R {
        let LayerNormMlpGrads {
            mut dx,
            mut dln_weight,
            mut dln_bias,
            mut dfc1_weight,
            mut dfc1_bias,
            mut dfc2_weight,
            mut dfc2_bias,
        } = self;
        let mut raw = sys::te_layernorm_mlp_grads::default();
        let _ = unsafe { sys::te_layernorm_mlp_grads_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_layernorm_mlp_grads>();
        raw.dx = opt_mut(dx.as_mut());
        raw.dln_weight = opt_mut(dln_weight.as_mut());
        raw.dln_bias = opt_mut(dln_bias.as_mut());
        raw.dfc1_weight = opt_mut(dfc1_weight.as_mut());
        raw.dfc1_bias = opt_mut(dfc1_bias.as_mut());
        raw.dfc2_weight = opt_mut(dfc2_weight.as_mut());
        raw.dfc2_bias = opt_mut(dfc2_bias.as_mut());
        f(&raw)
    }
}

unsafe fn destroy_module(p: *mut c_void) {
    sys::te_layernorm_mlp_destroy(p.cast())
}

unsafe fn destroy_backward(p: *mut c_void) {
    sys::te_layernorm_mlp_backward_ctx_destroy(p.cast())
}

unsafe fn release_residuals(internal: *mut c_void) {
    let mut r = sys::te_layernorm_mlp_residuals {
        struct_size: std::mem::size_of::<sys::te_layernorm_mlp_residuals>(),
        ..Default::default()
    };
    r.internal = internal;
    sys::te_layernorm_mlp_residuals_release(&mut r)
}

/// A norm, fc1, an activation and fc2 (`te_layernorm_mlp`): each GEMM's three scaling states
/// and FP8 weight cache. Under FP8 the norm writes fc1's FP8 input and the activation fc2's.
/// Parameters stay the caller's; every call takes the context it was created with. `Send`,
/// not `Sync`.
pub struct LayerNormMlp {
    handle: Owned<sys::te_layernorm_mlp>,
    opts: LayerNormMlpOptions,
}

impl LayerNormMlp {
    /// A block on `ctx`'s device.
    pub fn new(ctx: &Context, opts: &LayerNormMlpOptions) -> Result<LayerNormMlp> {
        let raw_opts = opts.to_raw()?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_layernorm_mlp_create(&mut raw, ctx.as_ptr(), &raw_opts) })?;
        Ok(LayerNormMlp {
            handle: Owned::new(raw, ctx, "te_layernorm_mlp_create", destroy_module)?,
            opts: *opts,
        })
    }

    /// The options it was created with.
    pub fn options(&self) -> &LayerNormMlpOptions {
        &self.opts
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_layernorm_mlp {
        self.handle.as_ptr()
    }

    /// Pure compute: `y = fc2(act(fc1(norm(x))))`, in FP8 inside an enabled autocast scope,
    /// and what backward needs. `ln_out`, when given, receives norm(x) `[..., hidden]`.
    /// Errors: as `LayerNormLinear`; `Unsupported` under FP8 when tokens, hidden or ffn (x2
    /// gated) is not a multiple of 16.
    pub fn forward_compute<'a>(
        &mut self,
        ctx: &Context,
        args: &LayerNormMlpArgs<'a>,
        y: &mut TensorViewMut<'_>,
        ln_out: Option<&mut TensorViewMut<'_>>,
    ) -> Result<LayerNormMlpResiduals<'a>> {
        let raw_args = args.c_args(ln_out);
        let mut res = sys::te_layernorm_mlp_residuals {
            struct_size: std::mem::size_of::<sys::te_layernorm_mlp_residuals>(),
            ..Default::default()
        };
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_layernorm_mlp_forward_compute(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut res,
            )
        }))?;
        Ok(LayerNormMlpResiduals {
            owned: OwnedResiduals::new(res, ctx, |r| r.internal, release_residuals),
            _inputs: PhantomData,
        })
    }

    /// The context-saving step: packs the residuals into a backward context (on failure they
    /// are released).
    pub fn forward_save<'a>(
        &mut self,
        ctx: &Context,
        mut residuals: LayerNormMlpResiduals<'a>,
    ) -> Result<LayerNormMlpBackwardCtx<'a>> {
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::te_layernorm_mlp_forward_save(
                ctx.as_ptr(),
                self.as_ptr(),
                &mut residuals.owned.raw,
                &mut out,
            )
        })?;
        LayerNormMlpBackwardCtx::own(out, ctx)
    }

    /// `forward_compute` followed by `forward_save`.
    pub fn forward<'a>(
        &mut self,
        ctx: &Context,
        args: &LayerNormMlpArgs<'a>,
        y: &mut TensorViewMut<'_>,
        ln_out: Option<&mut TensorViewMut<'_>>,
    ) -> Result<LayerNormMlpBackwardCtx<'a>> {
        let raw_args = args.c_args(ln_out);
        let mut out = ptr::null_mut();
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_layernorm_mlp_forward(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut out,
            )
        }))?;
        LayerNormMlpBackwardCtx::own(out, ctx)
    }

    /// The bytes of residual memory a [`forward_compute_into`](LayerNormMlp::forward_compute_into)
    /// with these arguments needs under the innermost autocast scope as it is now (never 0:
    /// the norm's statistics and the GEMM inputs). Reads only the shapes.
    pub fn residuals_size(&self, ctx: &Context, args: &LayerNormMlpArgs<'_>) -> Result<usize> {
        let raw_args = args.c_args(None);
        let mut bytes = 0usize;
        check(unsafe {
            sys::te_layernorm_mlp_residuals_size(ctx.as_ptr(), self.as_ptr(), &raw_args, &mut bytes)
        })?;
        Ok(bytes)
    }

    /// `forward_compute` keeping the residuals in the caller's host memory (16-byte aligned,
    /// at least [`residuals_size`](LayerNormMlp::residuals_size) bytes, e.g. a
    /// [`ResidualBuffer`](crate::ResidualBuffer)) instead of library-owned storage; nothing
    /// stays borrowed. Each pending forward needs memory of its own (the module keeps a record
    /// per address). Host memory needs a CPU context (device memory goes through `libte::sys`).
    pub fn forward_compute_into(
        &mut self,
        ctx: &Context,
        args: &LayerNormMlpArgs<'_>,
        y: &mut TensorViewMut<'_>,
        ln_out: Option<&mut TensorViewMut<'_>>,
        residuals: &mut [u8],
    ) -> Result<()> {
        let (res_ptr, bytes) =
            residual_memory_mut(ctx, "LayerNormMlp::forward_compute_into", residuals)?;
        let raw_args = args.c_args(ln_out);
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_layernorm_mlp_forward_compute_into(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                res_ptr,
                bytes,
            )
        }))
    }

    /// The backward of a [`forward_compute_into`](LayerNormMlp::forward_compute_into): the forward's
    /// arguments again (`inputs`, which may have moved), the residual memory it filled and dy;
    /// gradients as the backward context's. Repeatable with identical results.
    pub fn backward_from(
        &mut self,
        ctx: &Context,
        inputs: &LayerNormMlpArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: LayerNormMlpGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, grads, 0)
    }

    /// `backward_from` with `TE_BACKWARD_ONCE`: drops the forward's record (a later
    /// `backward_from` of that memory is an `InvalidArgument`).
    pub fn backward_from_once(
        &mut self,
        ctx: &Context,
        inputs: &LayerNormMlpArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: LayerNormMlpGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, grads, sys::TE_BACKWARD_ONCE)
    }

    fn backward_from_flags(
        &mut self,
        ctx: &Context,
        inputs: &LayerNormMlpArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: LayerNormMlpGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        let (res_ptr, bytes) = residual_memory(ctx, "LayerNormMlp::backward_from", residuals)?;
        let raw_inputs = inputs.c_args(None);
        let args = backward_args(flags);
        grads.with_raw(|raw| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_layernorm_mlp_backward_from(
                    raw_ctx,
                    self.as_ptr(),
                    &raw_inputs,
                    res_ptr,
                    bytes,
                    dy.as_raw(),
                    raw,
                    &args,
                )
            }))
        })
    }

    /// A copy of one scaling state of GEMM `gemm`, with its whole amax history.
    pub fn scaling_state(
        &self,
        ctx: &Context,
        gemm: MlpGemm,
        role: TensorRole,
    ) -> Result<ScalingStateInfo> {
        read_scaling_state(|info, history, cap| unsafe {
            sys::te_layernorm_mlp_get_scaling_state(
                ctx.as_ptr(),
                self.as_ptr(),
                gemm.to_raw(),
                role.to_raw(),
                info,
                history,
                cap,
            )
        })
    }

    /// The FP8 state of both GEMMs in a versioned byte format;
    /// [`state_load`](LayerNormMlp::state_load) restores it bit-exactly.
    pub fn state_save(&self, ctx: &Context) -> Result<Vec<u8>> {
        save_state(|buf, capacity, size| unsafe {
            sys::te_layernorm_mlp_state_save(ctx.as_ptr(), self.as_ptr(), buf, capacity, size)
        })
    }

    /// Restores what `state_save` wrote (a block of the same shape).
    pub fn state_load(&mut self, ctx: &Context, state: &[u8]) -> Result<()> {
        check(unsafe {
            sys::te_layernorm_mlp_state_load(
                ctx.as_ptr(),
                self.as_ptr(),
                state.as_ptr().cast(),
                state.len(),
            )
        })
    }
}

impl fmt::Debug for LayerNormMlp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormMlp")
            .field("options", &self.opts)
            .finish()
    }
}

/// What a LayerNormMLP backward needs, from [`LayerNormMlp::forward_compute`]
/// (`te_layernorm_mlp_residuals`); borrows the forward's inputs for `'a`.
pub struct LayerNormMlpResiduals<'a> {
    owned: OwnedResiduals<sys::te_layernorm_mlp_residuals>,
    _inputs: PhantomData<&'a [u8]>,
}

impl LayerNormMlpResiduals<'_> {
    const F: &'static str = "LayerNormMlpResiduals";

    /// Whether the forward ran in FP8.
    pub fn fp8(&self) -> bool {
        self.owned.raw.fp8 != 0
    }

    /// FP8: norm(x)^T `[hidden, tokens]`; high precision: norm(x) `[tokens, hidden]`.
    pub fn ln_out_t(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.ln_out_t, Self::F)
    }

    /// FP8: fc1's W^T; high precision: the caller's fc1 weight.
    pub fn fc1_weight_t(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.fc1_weight_t, Self::F)
    }

    /// fc1's output (the activation's input) `[tokens, ffn (x2 gated)]`, activation dtype.
    pub fn fc1_out(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.fc1_out, Self::F)
    }

    /// FP8: act(fc1_out)^T `[ffn, tokens]`; high precision: act(fc1_out) `[tokens, ffn]`.
    pub fn act_out_t(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.act_out_t, Self::F)
    }

    /// FP8: fc2's W^T; high precision: the caller's fc2 weight.
    pub fn fc2_weight_t(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.fc2_weight_t, Self::F)
    }

    /// The means, F32 `[tokens]`: LayerNorm only (`None` for RMSNorm).
    pub fn mu(&self) -> Result<Option<TensorView<'_>>> {
        residual_view(&self.owned.raw.mu)
    }

    /// `1 / sqrt(var + eps)`, F32 `[tokens]`.
    pub fn rsigma(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.rsigma, Self::F)
    }
}

impl fmt::Debug for LayerNormMlpResiduals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormMlpResiduals")
            .field("fp8", &self.fp8())
            .finish_non_exhaustive()
    }
}

/// A saved LayerNormMLP forward (`te_layernorm_mlp_backward_ctx`); borrows the forward's
/// inputs for `'a`. `Drop` destroys it.
pub struct LayerNormMlpBackwardCtx<'a> {
    handle: Owned<sys::te_layernorm_mlp_backward_ctx>,
    _inputs: PhantomData<&'a [u8]>,
}

impl<'a> LayerNormMlpBackwardCtx<'a> {
    fn own(
        raw: *mut sys::te_layernorm_mlp_backward_ctx,
        ctx: &Context,
    ) -> Result<LayerNormMlpBackwardCtx<'a>> {
        Ok(LayerNormMlpBackwardCtx {
            handle: Owned::new(raw, ctx, "te_layernorm_mlp_forward", destroy_backward)?,
            _inputs: PhantomData,
        })
    }

    /// From dy `[tokens, hidden]`, the requested gradients of the block (each skipped when
    /// `None`). Repeatable with identical results.
    pub fn backward(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: LayerNormMlpGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, dy, grads, 0)
    }

    /// `backward` with `TE_BACKWARD_ONCE`: the residuals are freed when it returns.
    pub fn backward_once(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: LayerNormMlpGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, dy, grads, sys::TE_BACKWARD_ONCE)
    }

    fn run(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: LayerNormMlpGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        let args = backward_args(flags);
        let bwd = self.as_ptr();
        grads.with_raw(|raw| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_layernorm_mlp_backward(raw_ctx, bwd, dy.as_raw(), raw, &args)
            }))
        })
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_layernorm_mlp_backward_ctx {
        self.handle.as_ptr()
    }
}

impl fmt::Debug for LayerNormMlpBackwardCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormMlpBackwardCtx")
            .finish_non_exhaustive()
    }
}
