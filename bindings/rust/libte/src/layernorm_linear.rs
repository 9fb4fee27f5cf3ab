//! `LayerNormLinear`: `y = norm(x) W^T + b` (TE's LayerNormLinear, e.g. a QKV projection), with
//! `Linear`'s split forward and repeatable backward.

use std::fmt;
use std::os::raw::c_void;
use std::ptr;

use libte_sys as sys;

use crate::context::Context;
use crate::error::{check, Result};
use crate::linear::{ScalingStateInfo, TensorRole};
use crate::module::{
    backward_args, features, read_scaling_state, required_view, residual_memory,
    residual_memory_mut, residual_view, save_state, Owned, OwnedResiduals,
};
use crate::norm::{NormKind, NormOptions};
use crate::tensor::{opt_mut, DType, TensorView, TensorViewMut};

/// A LayerNormLinear's options (`te_layernorm_linear_options`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormLinearOptions {
    /// Required, > 0.
    pub in_features: usize,
    /// Required, > 0.
    pub out_features: usize,
    /// The forward takes a bias `[out_features]`. Default true.
    pub bias: bool,
    /// F32, F16 or BF16 (default BF16): x, gamma, beta, W, b, y and the gradients.
    pub activation_dtype: DType,
    /// Backward adds dW into the caller's F32 main_grad passed as `dw`. Default false.
    pub fuse_wgrad_accumulation: bool,
    /// The norm: LayerNorm (default) or RMSNorm, eps (default 1e-5), zero-centred gamma.
    pub norm: NormOptions,
}

impl LayerNormLinearOptions {
    /// libte's defaults (`te_layernorm_linear_options_init`) for `in_features -> out_features`.
    pub fn new(in_features: usize, out_features: usize) -> LayerNormLinearOptions {
        let mut raw = sys::te_layernorm_linear_options::default();
        let _ = unsafe { sys::te_layernorm_linear_options_init(&mut raw) };
        LayerNormLinearOptions {
            in_features,
            out_features,
            bias: raw.bias != 0,
            activation_dtype: DType::from_raw(raw.activation_dtype).unwrap_or(DType::BF16),
            fuse_wgrad_accumulation: raw.fuse_wgrad_accumulation != 0,
            norm: NormOptions {
                kind: NormKind::from_raw(raw.normalization).unwrap_or(NormKind::LayerNorm),
                eps: raw.eps,
                zero_centered_gamma: raw.zero_centered_gamma != 0,
            },
        }
    }

    fn to_raw(self) -> Result<sys::te_layernorm_linear_options> {
        const F: &str = "LayerNormLinear::new";
        let mut raw = sys::te_layernorm_linear_options::default();
        check(unsafe { sys::te_layernorm_linear_options_init(&mut raw) })?;
        raw.in_features = features(self.in_features, F, "in_features")?;
        raw.out_features = features(self.out_features, F, "out_features")?;
        raw.bias = self.bias as i32;
        raw.activation_dtype = self.activation_dtype.to_raw();
        raw.fuse_wgrad_accumulation = self.fuse_wgrad_accumulation as i32;
        raw.normalization = self.norm.kind.to_raw();
        raw.eps = self.norm.eps;
        raw.zero_centered_gamma = self.norm.zero_centered_gamma as i32;
        Ok(raw)
    }
}

/// The inputs of a forward (`te_layernorm_linear_forward_args`), borrowed for `'a`: libte
/// references x and gamma (always) and W (in high precision) until the backward context is
/// destroyed, so the residuals and backward context keep that borrow.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormLinearArgs<'a> {
    /// x `[..., in_features]`.
    pub input: TensorView<'a>,
    /// gamma `[in_features]`.
    pub ln_weight: TensorView<'a>,
    /// beta `[in_features]`: LayerNorm only (`None` for RMSNorm).
    pub ln_bias: Option<TensorView<'a>>,
    /// W `[out_features, in_features]`.
    pub weight: TensorView<'a>,
    /// b `[out_features]`; `None` iff the layer has no bias.
    pub bias: Option<TensorView<'a>>,
    /// W is the one of the last FP8 forward: reuse the cached FP8 weight. Default false.
    pub weight_unchanged: bool,
}

impl<'a> LayerNormLinearArgs<'a> {
    /// x, gamma and W; no beta, no bias.
    pub fn new(
        input: TensorView<'a>,
        ln_weight: TensorView<'a>,
        weight: TensorView<'a>,
    ) -> LayerNormLinearArgs<'a> {
        LayerNormLinearArgs {
            input,
            ln_weight,
            ln_bias: None,
            weight,
            bias: None,
            weight_unchanged: false,
        }
    }

    /// With the norm's beta (LayerNorm).
    pub fn ln_bias(mut self, ln_bias: TensorView<'a>) -> LayerNormLinearArgs<'a> {
        self.ln_bias = Some(ln_bias);
        self
    }

    /// With a bias.
    pub fn bias(mut self, bias: TensorView<'a>) -> LayerNormLinearArgs<'a> {
        self.bias = Some(bias);
        self
    }

    /// Sets `weight_unchanged`.
    pub fn weight_unchanged(mut self, unchanged: bool) -> LayerNormLinearArgs<'a> {
        self.weight_unchanged = unchanged;
        self
    }

    /// The C struct; it points into `self` and `ln_out`.
    fn c_args(
        &self,
        ln_out: Option<&mut TensorViewMut<'_>>,
    ) -> sys::te_layernorm_linear_forward_args {
        let mut raw = sys::te_layernorm_linear_forward_args::default();
        let _ = unsafe { sys::te_layernorm_linear_forward_args_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_layernorm_linear_forward_args>();
        raw.input = self.input.as_raw();
        raw.ln_weight = self.ln_weight.as_raw();
        raw.ln_bias = self.ln_bias.as_ref().map_or(ptr::null(), |t| t.as_raw());
        raw.weight = self.weight.as_raw();
        raw.bias = self.bias.as_ref().map_or(ptr::null(), |t| t.as_raw());
        raw.weight_unchanged = self.weight_unchanged as i32;
        raw.ln_out = opt_mut(ln_out);
        raw
    }
}

/// The gradients a backward writes (`te_layernorm_linear_grads`); each `None` is skipped.
#[derive(Debug, Default)]
pub struct LayerNormLinearGrads<'a> {
    /// dx `[..., in]` (through the norm), the activation dtype.
    pub dx: Option<TensorViewMut<'a>>,
    /// dgamma `[in]`.
    pub dln_weight: Option<TensorViewMut<'a>>,
    /// dbeta `[in]`: LayerNorm only.
    pub dln_bias: Option<TensorViewMut<'a>>,
    /// dW `[out, in]`; F32 and added into with fused wgrad accumulation.
    pub dw: Option<TensorViewMut<'a>>,
    /// db `[out]`: layers with bias only.
    pub db: Option<TensorViewMut<'a>>,
}

impl LayerNormLinearGrads<'_> {
    /// Calls `f` with the C struct, which points into `self`.
    fn with_raw<R>(self, f: impl FnOnce(&sys::te_layernorm_linear_grads) -> R) -> R {
        let LayerNormLinearGrads {
            mut dx,
            mut dln_weight,
            mut dln_bias,
            mut dw,
            mut db,
        } = self;
        let mut raw = sys::te_layernorm_linear_grads::default();
        let _ = unsafe { sys::te_layernorm_linear_grads_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_layernorm_linear_grads>();
        raw.dx = opt_mut(dx.as_mut());
        raw.dln_weight = opt_mut(dln_weight.as_mut());
        raw.dln_bias = opt_mut(dln_bias.as_mut());
        raw.dw = opt_mut(dw.as_mut());
        raw.db = opt_mut(db.as_mut());
        f(&raw)
    }
}

unsafe fn destroy_module(p: *mut c_void) {
    sys::te_layernorm_linear_destroy(p.cast())
}

unsafe fn destroy_backward(p: *mut c_void) {
    sys::te_layernorm_linear_backward_ctx_destroy(p.cast())
}

unsafe fn release_residuals(internal: *mut c_void) {
    // Release reads only `internal`.
    let mut r = sys::te_layernorm_linear_residuals {
        struct_size: std::mem::size_of::<sys::te_layernorm_linear_residuals>(),
        ..Default::default()
    };
    r.internal = internal;
    sys::te_layernorm_linear_residuals_release(&mut r)
}

/// A LayerNorm (or RMSNorm) followed by a linear layer (`te_layernorm_linear`): the GEMM's
/// three scaling states and its FP8 weight cache. Under FP8 with delayed scaling the norm
/// writes the GEMM's FP8 input directly. Parameters stay the caller's and are passed to each
/// call; every call takes the context it was created with. `Send`, not `Sync`.
pub struct LayerNormLinear {
    handle: Owned<sys::te_layernorm_linear>,
    opts: LayerNormLinearOptions,
}

impl LayerNormLinear {
    /// A module on `ctx`'s device.
    pub fn new(ctx: &Context, opts: &LayerNormLinearOptions) -> Result<LayerNormLinear> {
        let raw_opts = opts.to_raw()?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_layernorm_linear_create(&mut raw, ctx.as_ptr(), &raw_opts) })?;
        Ok(LayerNormLinear {
            handle: Owned::new(raw, ctx, "te_layernorm_linear_create", destroy_module)?,
            opts: *opts,
        })
    }

    /// The options it was created with.
    pub fn options(&self) -> &LayerNormLinearOptions {
        &self.opts
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_layernorm_linear {
        self.handle.as_ptr()
    }

    /// Pure compute: `y = norm(x) W^T (+ b)`, in FP8 inside an enabled autocast scope, and
    /// what backward needs. `ln_out`, when given, receives norm(x) `[..., in]` in the
    /// activation dtype (TE's `return_layernorm_output`). Errors: as `Linear`, and
    /// `InvalidArgument` for gamma/beta not `[in_features]`, a beta given to RMSNorm or missing
    /// for LayerNorm, `ln_out` not like x.
    pub fn forward_compute<'a>(
        &mut self,
        ctx: &Context,
        args: &LayerNormLinearArgs<'a>,
        y: &mut TensorViewMut<'_>,
        ln_out: Option<&mut TensorViewMut<'_>>,
    ) -> Result<LayerNormLinearResiduals<'a>> {
        let raw_args = args.c_args(ln_out);
        let mut res = sys::te_layernorm_linear_residuals {
            struct_size: std::mem::size_of::<sys::te_layernorm_linear_residuals>(),
            ..Default::default()
        };
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_layernorm_linear_forward_compute(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut res,
            )
        }))?;
        Ok(LayerNormLinearResiduals {
            owned: OwnedResiduals::new(res, ctx, |r| r.internal, release_residuals),
            _inputs: std::marker::PhantomData,
        })
    }

    /// The context-saving step: packs the residuals into a backward context (on failure they
    /// are released).
    pub fn forward_save<'a>(
        &mut self,
        ctx: &Context,
        mut residuals: LayerNormLinearResiduals<'a>,
    ) -> Result<LayerNormLinearBackwardCtx<'a>> {
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::te_layernorm_linear_forward_save(
                ctx.as_ptr(),
                self.as_ptr(),
                &mut residuals.owned.raw,
                &mut out,
            )
        })?;
        LayerNormLinearBackwardCtx::own(out, ctx)
    }

    /// `forward_compute` followed by `forward_save`.
    pub fn forward<'a>(
        &mut self,
        ctx: &Context,
        args: &LayerNormLinearArgs<'a>,
        y: &mut TensorViewMut<'_>,
        ln_out: Option<&mut TensorViewMut<'_>>,
    ) -> Result<LayerNormLinearBackwardCtx<'a>> {
        let raw_args = args.c_args(ln_out);
        let mut out = ptr::null_mut();
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_layernorm_linear_forward(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut out,
            )
        }))?;
        LayerNormLinearBackwardCtx::own(out, ctx)
    }

    /// The bytes of residual memory a [`forward_compute_into`](LayerNormLinear::forward_compute_into)
    /// with these arguments needs under the innermost autocast scope as it is now (never 0:
    /// the norm's statistics and the GEMM inputs). Reads only the shapes.
    pub fn residuals_size(&self, ctx: &Context, args: &LayerNormLinearArgs<'_>) -> Result<usize> {
        let raw_args = args.c_args(None);
        let mut bytes = 0usize;
        check(unsafe {
            sys::te_layernorm_linear_residuals_size(
                ctx.as_ptr(),
                self.as_ptr(),
                &raw_args,
                &mut bytes,
            )
        })?;
        Ok(bytes)
    }

    /// `forward_compute` keeping the residuals in the caller's host memory (16-byte aligned,
    /// at least [`residuals_size`](LayerNormLinear::residuals_size) bytes, e.g. a
    /// [`ResidualBuffer`](crate::ResidualBuffer)) instead of library-owned storage; nothing
    /// stays borrowed. Each pending forward needs memory of its own (the module keeps a record
    /// per address). Host memory needs a CPU context (device memory goes through `libte::sys`).
    pub fn forward_compute_into(
        &mut self,
        ctx: &Context,
        args: &LayerNormLinearArgs<'_>,
        y: &mut TensorViewMut<'_>,
        ln_out: Option<&mut TensorViewMut<'_>>,
        residuals: &mut [u8],
    ) -> Result<()> {
        let (res_ptr, bytes) =
            residual_memory_mut(ctx, "LayerNormLinear::forward_compute_into", residuals)?;
        let raw_args = args.c_args(ln_out);
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_layernorm_linear_forward_compute_into(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                res_ptr,
                bytes,
            )
        }))
    }

    /// The backward of a [`forward_compute_into`](LayerNormLinear::forward_compute_into): the forward's
    /// arguments again (`inputs`, which may have moved), the residual memory it filled and dy;
    /// gradients as the backward context's. Repeatable with identical results.
    pub fn backward_from(
        &mut self,
        ctx: &Context,
        inputs: &LayerNormLinearArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: LayerNormLinearGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, grads, 0)
    }

    /// `backward_from` with `TE_BACKWARD_ONCE`: drops the forward's record (a later
    /// `backward_from` of that memory is an `InvalidArgument`).
    pub fn backward_from_once(
        &mut self,
        ctx: &Context,
        inputs: &LayerNormLinearArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: LayerNormLinearGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, grads, sys::TE_BACKWARD_ONCE)
    }

    fn backward_from_flags(
        &mut self,
        ctx: &Context,
        inputs: &LayerNormLinearArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: LayerNormLinearGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        let (res_ptr, bytes) = residual_memory(ctx, "LayerNormLinear::backward_from", residuals)?;
        let raw_inputs = inputs.c_args(None);
        let args = backward_args(flags);
        grads.with_raw(|raw| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_layernorm_linear_backward_from(
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

    /// A copy of one of the GEMM's scaling states (`Input` is the norm's FP8 output), with its
    /// whole amax history.
    pub fn scaling_state(&self, ctx: &Context, role: TensorRole) -> Result<ScalingStateInfo> {
        read_scaling_state(|info, history, cap| unsafe {
            sys::te_layernorm_linear_get_scaling_state(
                ctx.as_ptr(),
                self.as_ptr(),
                role.to_raw(),
                info,
                history,
                cap,
            )
        })
    }

    /// The FP8 state (histories, scales) in a versioned byte format;
    /// [`state_load`](LayerNormLinear::state_load) restores it bit-exactly.
    pub fn state_save(&self, ctx: &Context) -> Result<Vec<u8>> {
        save_state(|buf, capacity, size| unsafe {
            sys::te_layernorm_linear_state_save(ctx.as_ptr(), self.as_ptr(), buf, capacity, size)
        })
    }

    /// Restores what `state_save` wrote. Errors: `InvalidArgument` for a truncated buffer,
    /// another format version or another shape; `InvalidState` while a scope or a pending
    /// backward holds the states.
    pub fn state_load(&mut self, ctx: &Context, state: &[u8]) -> Result<()> {
        check(unsafe {
            sys::te_layernorm_linear_state_load(
                ctx.as_ptr(),
                self.as_ptr(),
                state.as_ptr().cast(),
                state.len(),
            )
        })
    }
}

impl fmt::Debug for LayerNormLinear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormLinear")
            .field("options", &self.opts)
            .finish()
    }
}

/// What a LayerNormLinear backward needs, from
/// [`LayerNormLinear::forward_compute`] (`te_layernorm_linear_residuals`); borrows the forward's
/// inputs for `'a`. Hand them to [`LayerNormLinear::forward_save`]; dropping releases them.
pub struct LayerNormLinearResiduals<'a> {
    owned: OwnedResiduals<sys::te_layernorm_linear_residuals>,
    _inputs: std::marker::PhantomData<&'a [u8]>,
}

impl LayerNormLinearResiduals<'_> {
    const F: &'static str = "LayerNormLinearResiduals";

    /// Whether the forward ran in FP8.
    pub fn fp8(&self) -> bool {
        self.owned.raw.fp8 != 0
    }

    /// FP8: norm(x)^T `[in, tokens]` with its scale_inv; high precision: norm(x)
    /// `[tokens, in]`.
    pub fn ln_out_t(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.ln_out_t, Self::F)
    }

    /// FP8: W^T `[in, out]` with its scale_inv; high precision: the caller's W.
    pub fn weight_t(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.weight_t, Self::F)
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

impl fmt::Debug for LayerNormLinearResiduals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormLinearResiduals")
            .field("fp8", &self.fp8())
            .finish_non_exhaustive()
    }
}

/// A saved LayerNormLinear forward (`te_layernorm_linear_backward_ctx`): run
/// [`backward`](LayerNormLinearBackwardCtx::backward) as often as needed, or
/// [`backward_once`](LayerNormLinearBackwardCtx::backward_once). Borrows the forward's inputs
/// for `'a`. `Drop` destroys it.
pub struct LayerNormLinearBackwardCtx<'a> {
    handle: Owned<sys::te_layernorm_linear_backward_ctx>,
    _inputs: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> LayerNormLinearBackwardCtx<'a> {
    fn own(
        raw: *mut sys::te_layernorm_linear_backward_ctx,
        ctx: &Context,
    ) -> Result<LayerNormLinearBackwardCtx<'a>> {
        Ok(LayerNormLinearBackwardCtx {
            handle: Owned::new(raw, ctx, "te_layernorm_linear_forward", destroy_backward)?,
            _inputs: std::marker::PhantomData,
        })
    }

    /// From dy `[tokens, out]`: dx through the norm, dgamma, dbeta, dW (added into with fused
    /// wgrad accumulation) and db, each skipped when `None`. Repeatable with identical
    /// results.
    pub fn backward(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: LayerNormLinearGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, dy, grads, 0)
    }

    /// `backward` with `TE_BACKWARD_ONCE`: the residuals are freed when it returns, and a later
    /// call is an `InvalidState`. On failure nothing is freed.
    pub fn backward_once(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: LayerNormLinearGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, dy, grads, sys::TE_BACKWARD_ONCE)
    }

    fn run(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: LayerNormLinearGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        let args = backward_args(flags);
        let bwd = self.as_ptr();
        grads.with_raw(|raw| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_layernorm_linear_backward(raw_ctx, bwd, dy.as_raw(), raw, &args)
            }))
        })
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_layernorm_linear_backward_ctx {
        self.handle.as_ptr()
    }
}

impl fmt::Debug for LayerNormLinearBackwardCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormLinearBackwardCtx")
            .finish_non_exhaustive()
    }
}
