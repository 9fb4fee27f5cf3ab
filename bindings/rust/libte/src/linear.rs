//! `Linear`: an FP8 linear layer's state; `Residuals` and `BackwardCtx`: what backward needs.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use libte_sys as sys;

use crate::context::{Context, Shared};
use crate::error::{check, Error, Result, Status};
use crate::module::{backward_args, residual_memory, residual_memory_mut};
use crate::tensor::{opt_mut, DType, TensorView, TensorViewMut};

/// A linear layer's options (`te_linear_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearOptions {
    /// Required, > 0.
    pub in_features: usize,
    /// Required, > 0.
    pub out_features: usize,
    /// The forward takes a bias `[out_features]`. Default true.
    pub bias: bool,
    /// F32, F16 or BF16 (default BF16): x, W, b, y, dy, dx.
    pub activation_dtype: DType,
    /// Backward adds dW into the caller's F32 main_grad passed as `dw`. Default false.
    pub fuse_wgrad_accumulation: bool,
}

impl LinearOptions {
    /// libte's defaults (`te_linear_options_init`) for a layer `in_features -> out_features`.
    pub fn new(in_features: usize, out_features: usize) -> LinearOptions {
        let mut raw = sys::te_linear_options::default();
        let (bias, dtype) =
            if unsafe { sys::te_linear_options_init(&mut raw) } == sys::te_status::TE_SUCCESS {
                (
                    raw.bias != 0,
                    DType::from_raw(raw.activation_dtype).unwrap_or(DType::BF16),
                )
            } else {
                (true, DType::BF16) // cannot happen: the documented defaults
            };
        LinearOptions {
            in_features,
            out_features,
            bias,
            activation_dtype: dtype,
            fuse_wgrad_accumulation: raw.fuse_wgrad_accumulation != 0,
        }
    }

    fn to_raw(self) -> Result<sys::te_linear_options> {
        let features = |n: usize, name: &str| {
            i64::try_from(n).map_err(|_| {
                Error::invalid_argument(format!(
                    "Linear::new: argument 'opts.{}': expected at most i64::MAX, got {}",
                    name, n
                ))
            })
        };
        let mut raw = sys::te_linear_options::default();
        let _ = unsafe { sys::te_linear_options_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_linear_options>();
        raw.in_features = features(self.in_features, "in_features")?;
        raw.out_features = features(self.out_features, "out_features")?;
        raw.bias = self.bias as i32;
        raw.activation_dtype = self.activation_dtype.to_raw();
        raw.fuse_wgrad_accumulation = self.fuse_wgrad_accumulation as i32;
        Ok(raw)
    }
}

/// Which scaling state of a layer (`te_tensor_role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TensorRole {
    /// Forward: x.
    Input,
    /// Forward: W.
    Weight,
    /// Backward: dy.
    GradOutput,
}

impl TensorRole {
    pub(crate) fn to_raw(self) -> sys::te_tensor_role {
        match self {
            TensorRole::Input => sys::te_tensor_role::TE_ROLE_INPUT,
            TensorRole::Weight => sys::te_tensor_role::TE_ROLE_WEIGHT,
            TensorRole::GradOutput => sys::te_tensor_role::TE_ROLE_GRAD_OUTPUT,
        }
    }
}

/// A copy of one scaling state (`te_scaling_state_info` and its amax history).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScalingStateInfo {
    /// The scale quantization multiplies by.
    pub scale: f32,
    /// 1 / scale.
    pub scale_inv: f32,
    /// The amax history, current amax first; empty until the state is first used in FP8.
    pub amax_history: Vec<f32>,
    /// The FP8 dtype of the last use (E4M3 before the first).
    pub fp8_dtype: Option<DType>,
}

/// The inputs of a forward (`te_linear_forward_args`). The views are borrowed for `'a`, which
/// the residuals and backward context keep: a forward that ran in high precision references
/// the caller's x and W for its backward instead of copying them.
#[derive(Debug, Clone, Copy)]
pub struct ForwardArgs<'a> {
    /// x `[..., in_features]`.
    pub input: TensorView<'a>,
    /// W `[out_features, in_features]`.
    pub weight: TensorView<'a>,
    /// b `[out_features]`; `None` iff the layer has no bias.
    pub bias: Option<TensorView<'a>>,
    /// W is the same as in the last FP8 forward, so the cached FP8 weight may be reused (TE's
    /// `is_first_microbatch=False`). Default false.
    pub weight_unchanged: bool,
}

impl<'a> ForwardArgs<'a> {
    /// x and W, no bias.
    pub fn new(input: TensorView<'a>, weight: TensorView<'a>) -> ForwardArgs<'a> {
        ForwardArgs {
            input,
            weight,
            bias: None,
            weight_unchanged: false,
        }
    }

    /// With a bias.
    pub fn bias(mut self, bias: TensorView<'a>) -> ForwardArgs<'a> {
        self.bias = Some(bias);
        self
    }

    /// Sets `weight_unchanged`.
    pub fn weight_unchanged(mut self, unchanged: bool) -> ForwardArgs<'a> {
        self.weight_unchanged = unchanged;
        self
    }

    /// The C struct; it points into `self`, so it is valid while `self` is borrowed.
    fn c_args(&self) -> sys::te_linear_forward_args {
        let mut raw = sys::te_linear_forward_args::default();
        let _ = unsafe { sys::te_linear_forward_args_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_linear_forward_args>();
        raw.input = self.input.as_raw();
        raw.weight = self.weight.as_raw();
        raw.bias = self.bias.as_ref().map_or(ptr::null(), |b| b.as_raw());
        raw.weight_unchanged = self.weight_unchanged as i32;
        raw
    }
}

/// An FP8 linear layer's state (`te_linear`): scaling states for x, W and dy, and the FP8
/// weight cache. The parameters stay the caller's and are passed to each call.
///
/// Every call takes the context it was created with (another is an `InvalidArgument`). The
/// layer keeps that context's `te_context` alive, so it may be dropped before or after the
/// `Context`. `Send`, not `Sync`.
pub struct Linear {
    raw: NonNull<sys::te_linear>,
    shared: Arc<Shared>,
    opts: LinearOptions,
    _not_sync: PhantomData<Cell<()>>,
}

unsafe impl Send for Linear {}

impl Linear {
    /// A layer on `ctx`'s device.
    pub fn new(ctx: &Context, opts: &LinearOptions) -> Result<Linear> {
        let raw_opts = opts.to_raw()?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_linear_create(&mut raw, ctx.as_ptr(), &raw_opts) })?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::Internal, "te_linear_create returned NULL"))?;
        Ok(Linear {
            raw,
            shared: Arc::clone(ctx.shared()),
            opts: *opts,
            _not_sync: PhantomData,
        })
    }

    /// The options it was created with.
    pub fn options(&self) -> &LinearOptions {
        &self.opts
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_linear {
        self.raw.as_ptr()
    }

    /// Pure compute: quantizes x and W with the innermost autocast scope's recipe, runs
    /// `y = x W^T (+ b)`, records the amaxes, and returns what backward needs. Outside an
    /// enabled scope it computes in high precision. Errors: `InvalidArgument` (dtype, shape,
    /// context mismatch), `Unsupported` (FP8 with tokens, in or out not a multiple of 16).
    pub fn forward_compute<'a>(
        &mut self,
        ctx: &Context,
        args: &ForwardArgs<'a>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<Residuals<'a>> {
        let raw_args = args.c_args();
        let mut res = sys::te_linear_residuals {
            struct_size: std::mem::size_of::<sys::te_linear_residuals>(),
            ..Default::default()
        };
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_linear_forward_compute(
                raw_ctx,
                self.raw.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut res,
            )
        }))?;
        Ok(Residuals {
            raw: res,
            shared: Arc::clone(ctx.shared()),
            _inputs: PhantomData,
            _not_sync: PhantomData,
        })
    }

    /// The context-saving step: packs residuals into a backward context. On failure the
    /// residuals are released.
    pub fn forward_save<'a>(
        &mut self,
        ctx: &Context,
        mut residuals: Residuals<'a>,
    ) -> Result<BackwardCtx<'a>> {
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::te_linear_forward_save(
                ctx.as_ptr(),
                self.raw.as_ptr(),
                &mut residuals.raw,
                &mut out,
            )
        })?;
        BackwardCtx::own(out, ctx)
    }

    /// `forward_compute` followed by `forward_save`.
    pub fn forward<'a>(
        &mut self,
        ctx: &Context,
        args: &ForwardArgs<'a>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<BackwardCtx<'a>> {
        let raw_args = args.c_args();
        let mut out = ptr::null_mut();
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_linear_forward(
                raw_ctx,
                self.raw.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut out,
            )
        }))?;
        BackwardCtx::own(out, ctx)
    }

    /// The bytes of residual memory a [`forward_compute_into`](Linear::forward_compute_into)
    /// with these arguments leaves under the innermost autocast scope as it is now: FP8 x^T
    /// and its scale_inv, or 0 when the forward will run in high precision (the backward then
    /// reads x and W again). Reads only the shapes.
    pub fn residuals_size(&self, ctx: &Context, args: &ForwardArgs<'_>) -> Result<usize> {
        let raw_args = args.c_args();
        let mut bytes = 0usize;
        check(unsafe {
            sys::te_linear_residuals_size(ctx.as_ptr(), self.raw.as_ptr(), &raw_args, &mut bytes)
        })?;
        Ok(bytes)
    }

    /// `forward_compute` keeping the residuals in the caller's host memory (16-byte aligned,
    /// at least [`residuals_size`](Linear::residuals_size) bytes, e.g. a
    /// [`ResidualBuffer`](crate::ResidualBuffer); empty when that is 0) instead of
    /// library-owned storage; nothing stays borrowed. The layer keeps a small record per
    /// memory address (the last `TE_RESIDUAL_RECORDS`), so each pending forward needs memory
    /// of its own. Host memory needs a CPU context (device memory goes through `libte::sys`).
    pub fn forward_compute_into(
        &mut self,
        ctx: &Context,
        args: &ForwardArgs<'_>,
        y: &mut TensorViewMut<'_>,
        residuals: &mut [u8],
    ) -> Result<()> {
        let (res_ptr, bytes) = residual_memory_mut(ctx, "Linear::forward_compute_into", residuals)?;
        let raw_args = args.c_args();
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_linear_forward_compute_into(
                raw_ctx,
                self.raw.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                res_ptr,
                bytes,
            )
        }))
    }

    /// The backward of a [`forward_compute_into`](Linear::forward_compute_into): the forward's
    /// arguments again (`inputs`, which may have moved; the bias is not read), the residual
    /// memory it filled, dy; outputs as [`BackwardCtx::backward`]. Repeatable with identical
    /// results.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_from(
        &mut self,
        ctx: &Context,
        inputs: &ForwardArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        dx: Option<&mut TensorViewMut<'_>>,
        dw: Option<&mut TensorViewMut<'_>>,
        db: Option<&mut TensorViewMut<'_>>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, dx, dw, db, 0)
    }

    /// `backward_from` with `TE_BACKWARD_ONCE`: drops the forward's record (a later
    /// `backward_from` of that memory is an `InvalidArgument`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_from_once(
        &mut self,
        ctx: &Context,
        inputs: &ForwardArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        dx: Option<&mut TensorViewMut<'_>>,
        dw: Option<&mut TensorViewMut<'_>>,
        db: Option<&mut TensorViewMut<'_>>,
    ) -> Result<()> {
        self.backward_from_flags(
            ctx,
            inputs,
            residuals,
            dy,
            dx,
            dw,
            db,
            sys::TE_BACKWARD_ONCE,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_from_flags(
        &mut self,
        ctx: &Context,
        inputs: &ForwardArgs<'_>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        dx: Option<&mut TensorViewMut<'_>>,
        dw: Option<&mut TensorViewMut<'_>>,
        db: Option<&mut TensorViewMut<'_>>,
        flags: u32,
    ) -> Result<()> {
        let (res_ptr, bytes) = residual_memory(ctx, "Linear::backward_from", residuals)?;
        let raw_inputs = inputs.c_args();
        let args = backward_args(flags);
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_linear_backward_from(
                raw_ctx,
                self.raw.as_ptr(),
                &raw_inputs,
                res_ptr,
                bytes,
                dy.as_raw(),
                opt_mut(dx),
                opt_mut(dw),
                opt_mut(db),
                &args,
            )
        }))
    }

    /// A copy of one scaling state, with its whole amax history.
    pub fn scaling_state(&self, ctx: &Context, role: TensorRole) -> Result<ScalingStateInfo> {
        // Called twice: with no buffer for the history's length, then to fill it.
        let get = |info: &mut sys::te_scaling_state_info, history: *mut f32, cap: usize| {
            check(unsafe {
                sys::te_linear_get_scaling_state(
                    ctx.as_ptr(),
                    self.raw.as_ptr(),
                    role.to_raw(),
                    info,
                    history,
                    cap,
                )
            })
        };
        let mut info = sys::te_scaling_state_info {
            struct_size: std::mem::size_of::<sys::te_scaling_state_info>(),
            ..Default::default()
        };
        get(&mut info, ptr::null_mut(), 0)?;
        let mut history = vec![0.0f32; info.amax_history_len.max(0) as usize];
        if !history.is_empty() {
            get(&mut info, history.as_mut_ptr(), history.len())?;
            history.truncate(info.amax_history_len.max(0) as usize);
        }
        Ok(ScalingStateInfo {
            scale: info.scale,
            scale_inv: info.scale_inv,
            amax_history: history,
            fp8_dtype: DType::from_raw(info.fp8_dtype),
        })
    }

    /// Serialises the layer's FP8 state (histories, scales) into a versioned byte format;
    /// [`state_load`](Linear::state_load) restores it bit-exactly.
    pub fn state_save(&self, ctx: &Context) -> Result<Vec<u8>> {
        // Called twice: with no buffer for the size, then to fill it.
        let save = |buf: *mut u8, capacity: usize, size: &mut usize| {
            check(unsafe {
                sys::te_linear_state_save(
                    ctx.as_ptr(),
                    self.raw.as_ptr(),
                    buf.cast(),
                    capacity,
                    size,
                )
            })
        };
        let mut size = 0usize;
        save(ptr::null_mut(), 0, &mut size)?;
        let mut buf = vec![0u8; size];
        save(buf.as_mut_ptr(), buf.len(), &mut size)?;
        buf.truncate(size);
        Ok(buf)
    }

    /// Restores what `state_save` wrote. Errors: `InvalidArgument` for a truncated buffer,
    /// another format version, or a layer of another shape.
    pub fn state_load(&mut self, ctx: &Context, state: &[u8]) -> Result<()> {
        check(unsafe {
            sys::te_linear_state_load(
                ctx.as_ptr(),
                self.raw.as_ptr(),
                state.as_ptr().cast(),
                state.len(),
            )
        })
    }
}

impl Drop for Linear {
    fn drop(&mut self) {
        self.shared.dispose_linear(self.raw.as_ptr());
    }
}

impl fmt::Debug for Linear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Linear")
            .field("options", &self.opts)
            .finish()
    }
}

/// What backward needs, from [`Linear::forward_compute`] (`te_linear_residuals`): FP8 x^T and
/// W^T with their scale_inv, owned by libte, or (high precision) the caller's x and W, borrowed
/// for `'a`. Hand them to [`Linear::forward_save`]; dropping them releases them.
pub struct Residuals<'a> {
    raw: sys::te_linear_residuals,
    shared: Arc<Shared>,
    _inputs: PhantomData<&'a [u8]>,
    _not_sync: PhantomData<Cell<()>>,
}

unsafe impl Send for Residuals<'_> {}

impl Residuals<'_> {
    /// Whether the forward ran in FP8.
    pub fn fp8(&self) -> bool {
        self.raw.fp8 != 0
    }

    /// FP8: x^T `[in, tokens]` with its scale_inv; high precision: x.
    pub fn input_t(&self) -> Result<TensorView<'_>> {
        // libte owns it until the residuals are saved or released; `&self` outlives neither.
        unsafe { TensorView::from_foreign(self.raw.input_t) }
    }

    /// FP8: W^T `[in, out]` with its scale_inv; high precision: W.
    pub fn weight_t(&self) -> Result<TensorView<'_>> {
        unsafe { TensorView::from_foreign(self.raw.weight_t) }
    }
}

impl Drop for Residuals<'_> {
    fn drop(&mut self) {
        if !self.raw.internal.is_null() {
            self.shared.dispose_residuals(self.raw.internal);
        }
    }
}

impl fmt::Debug for Residuals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Residuals")
            .field("fp8", &self.fp8())
            .field("input_t", &self.input_t().ok())
            .field("weight_t", &self.weight_t().ok())
            .finish()
    }
}

/// A saved forward (`te_linear_backward_ctx`): run [`backward`](BackwardCtx::backward) as often
/// as needed (retain-graph semantics), or [`backward_once`](BackwardCtx::backward_once) to
/// free the residuals right away. Borrows the forward's inputs for `'a`. `Drop` destroys it.
pub struct BackwardCtx<'a> {
    raw: NonNull<sys::te_linear_backward_ctx>,
    shared: Arc<Shared>,
    _inputs: PhantomData<&'a [u8]>,
    _not_sync: PhantomData<Cell<()>>,
}

unsafe impl Send for BackwardCtx<'_> {}

impl<'a> BackwardCtx<'a> {
    fn own(raw: *mut sys::te_linear_backward_ctx, ctx: &Context) -> Result<BackwardCtx<'a>> {
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::new(Status::Internal, "libte returned a NULL backward context")
        })?;
        Ok(BackwardCtx {
            raw,
            shared: Arc::clone(ctx.shared()),
            _inputs: PhantomData,
            _not_sync: PhantomData,
        })
    }

    /// Quantizes dy (E5M2 under HYBRID) and computes `dx = dy W`, `dW = dy^T x` (added into
    /// `dw` with fused wgrad accumulation) and `db = sum over tokens of dy`. Any output may be
    /// `None` to skip it (`db` must be `None` without bias). Repeatable with identical results.
    pub fn backward(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        dx: Option<&mut TensorViewMut<'_>>,
        dw: Option<&mut TensorViewMut<'_>>,
        db: Option<&mut TensorViewMut<'_>>,
    ) -> Result<()> {
        self.run(ctx, dy, dx, dw, db, 0)
    }

    /// `backward` with `TE_BACKWARD_ONCE`: the residuals are freed when it returns, and a later
    /// call is an `InvalidState`. On failure nothing is freed, so it can be retried.
    pub fn backward_once(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        dx: Option<&mut TensorViewMut<'_>>,
        dw: Option<&mut TensorViewMut<'_>>,
        db: Option<&mut TensorViewMut<'_>>,
    ) -> Result<()> {
        self.run(ctx, dy, dx, dw, db, sys::TE_BACKWARD_ONCE)
    }

    fn run(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        dx: Option<&mut TensorViewMut<'_>>,
        dw: Option<&mut TensorViewMut<'_>>,
        db: Option<&mut TensorViewMut<'_>>,
        flags: u32,
    ) -> Result<()> {
        let mut args = sys::te_linear_backward_args::default();
        let _ = unsafe { sys::te_linear_backward_args_init(&mut args) };
        args.struct_size = std::mem::size_of::<sys::te_linear_backward_args>();
        args.flags = flags;
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_linear_backward(
                raw_ctx,
                self.raw.as_ptr(),
                dy.as_raw(),
                opt_mut(dx),
                opt_mut(dw),
                opt_mut(db),
                &args,
            )
        }))
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_linear_backward_ctx {
        self.raw.as_ptr()
    }
}

impl Drop for BackwardCtx<'_> {
    fn drop(&mut self) {
        self.shared.dispose_backward(self.raw.as_ptr());
    }
}

impl fmt::Debug for BackwardCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackwardCtx").finish_non_exhaustive()
    }
}
