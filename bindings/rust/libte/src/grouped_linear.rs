//! `GroupedLinear`: `num_gemms` experts sharing in/out features (TE's GroupedLinear, mixture
//! of experts). A call splits x's rows into consecutive groups of `m_splits[i]` tokens; group
//! i goes through expert i: `y_i = x_i W_i^T + b_i`.

use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use libte_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result};
use crate::linear::{ScalingStateInfo, TensorRole};
use crate::module::{
    backward_args, features, read_scaling_state, residual_memory, residual_memory_mut, save_state,
    Owned, OwnedResiduals,
};
use crate::tensor::{opt_mut, DType, TensorView, TensorViewMut};

/// `TE_GROUPED_LINEAR_MAX_GEMMS`: the most experts a GroupedLinear has.
pub const GROUPED_LINEAR_MAX_GEMMS: usize = sys::TE_GROUPED_LINEAR_MAX_GEMMS as usize;

/// A GroupedLinear's options (`te_grouped_linear_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedLinearOptions {
    /// The number of experts, 1..=[`GROUPED_LINEAR_MAX_GEMMS`].
    pub num_gemms: usize,
    /// Required, > 0.
    pub in_features: usize,
    /// Required, > 0.
    pub out_features: usize,
    /// Each expert has a bias `[out_features]`. Default true.
    pub bias: bool,
    /// F32, F16 or BF16 (default BF16).
    pub activation_dtype: DType,
    /// Backward adds each dW into the caller's F32 main_grads. Default false.
    pub fuse_wgrad_accumulation: bool,
}

impl GroupedLinearOptions {
    /// libte's defaults (`te_grouped_linear_options_init`) for `num_gemms` experts
    /// `in_features -> out_features`.
    pub fn new(num_gemms: usize, in_features: usize, out_features: usize) -> GroupedLinearOptions {
        let mut raw = sys::te_grouped_linear_options::default();
        let _ = unsafe { sys::te_grouped_linear_options_init(&mut raw) };
        GroupedLinearOptions {
            num_gemms,
            in_features,
            out_features,
            bias: raw.bias != 0,
            activation_dtype: DType::from_raw(raw.activation_dtype).unwrap_or(DType::BF16),
            fuse_wgrad_accumulation: raw.fuse_wgrad_accumulation != 0,
        }
    }

    fn to_raw(self) -> Result<sys::te_grouped_linear_options> {
        const F: &str = "GroupedLinear::new";
        let mut raw = sys::te_grouped_linear_options::default();
        check(unsafe { sys::te_grouped_linear_options_init(&mut raw) })?;
        raw.num_gemms = i32::try_from(self.num_gemms).map_err(|_| {
            Error::invalid_argument(format!(
                "{}: argument 'opts.num_gemms': expected 1..={}, got {}",
                F, GROUPED_LINEAR_MAX_GEMMS, self.num_gemms
            ))
        })?;
        raw.in_features = features(self.in_features, F, "in_features")?;
        raw.out_features = features(self.out_features, F, "out_features")?;
        raw.bias = self.bias as i32;
        raw.activation_dtype = self.activation_dtype.to_raw();
        raw.fuse_wgrad_accumulation = self.fuse_wgrad_accumulation as i32;
        Ok(raw)
    }
}

/// The inputs of a forward (`te_grouped_linear_forward_args`). The tensors are borrowed for
/// `'a`, which the residuals and backward context keep (libte references x, and the weights in
/// high precision, until the backward context is destroyed); the slices holding them, and
/// `m_splits`, only for the call (`'s`).
#[derive(Debug, Clone, Copy)]
pub struct GroupedLinearArgs<'s, 'a> {
    /// x `[..., in]` with `sum(m_splits)` rows.
    pub input: TensorView<'a>,
    /// `num_gemms` token counts (may be 0; need not be multiples of 16: under FP8 each group
    /// is padded inside the library).
    pub m_splits: &'s [usize],
    /// `num_gemms` weights `W_i [out, in]`.
    pub weights: &'s [TensorView<'a>],
    /// `num_gemms` biases `b_i [out]`; `None` iff the layer has no bias.
    pub biases: Option<&'s [TensorView<'a>]>,
    /// Every expert's weight is the one of the last FP8 forward: reuse the FP8 caches.
    pub weight_unchanged: bool,
}

impl<'s, 'a> GroupedLinearArgs<'s, 'a> {
    /// x, the splits and the weights; no biases.
    pub fn new(
        input: TensorView<'a>,
        m_splits: &'s [usize],
        weights: &'s [TensorView<'a>],
    ) -> GroupedLinearArgs<'s, 'a> {
        GroupedLinearArgs {
            input,
            m_splits,
            weights,
            biases: None,
            weight_unchanged: false,
        }
    }

    /// With the experts' biases.
    pub fn biases(mut self, biases: &'s [TensorView<'a>]) -> GroupedLinearArgs<'s, 'a> {
        self.biases = Some(biases);
        self
    }

    /// Sets `weight_unchanged`.
    pub fn weight_unchanged(mut self, unchanged: bool) -> GroupedLinearArgs<'s, 'a> {
        self.weight_unchanged = unchanged;
        self
    }
}

/// The arrays a forward points to: libte reads `num_gemms` entries of each, so their lengths
/// are checked here (a short array would be read past its end).
struct CallArrays {
    splits: Vec<i64>,
    weights: Vec<*const sys::te_tensor>,
    biases: Option<Vec<*const sys::te_tensor>>,
}

fn check_len(func: &str, name: &str, got: usize, n: usize) -> Result<()> {
    if got == n {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "{}: argument '{}': expected num_gemms ({}) entries, got {}",
            func, name, n, got
        )))
    }
}

impl CallArrays {
    fn new(func: &str, args: &GroupedLinearArgs<'_, '_>, n: usize) -> Result<CallArrays> {
        check_len(func, "args.m_splits", args.m_splits.len(), n)?;
        check_len(func, "args.weights", args.weights.len(), n)?;
        if let Some(b) = args.biases {
            check_len(func, "args.biases", b.len(), n)?;
        }
        let splits = args
            .m_splits
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                i64::try_from(c).map_err(|_| {
                    Error::invalid_argument(format!(
                        "{}: argument 'args.m_splits[{}]': expected at most i64::MAX, got {}",
                        func, i, c
                    ))
                })
            })
            .collect::<Result<Vec<i64>>>()?;
        let ptrs =
            |views: &[TensorView<'_>]| views.iter().map(|v| v.as_raw() as *const _).collect();
        Ok(CallArrays {
            splits,
            weights: ptrs(args.weights),
            biases: args.biases.map(ptrs),
        })
    }

    /// The C struct; it points into `self` and the args' views.
    fn c_args(&self, args: &GroupedLinearArgs<'_, '_>) -> sys::te_grouped_linear_forward_args {
        let mut raw = sys::te_grouped_linear_forward_args::default();
        let _ = unsafe { sys::te_grouped_linear_forward_args_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_grouped_linear_forward_args>();
        raw.input = args.input.as_raw();
        raw.m_splits = self.splits.as_ptr();
        raw.weights = self.weights.as_ptr();
        raw.biases = self.biases.as_ref().map_or(ptr::null(), |b| b.as_ptr());
        raw.weight_unchanged = args.weight_unchanged as i32;
        raw
    }
}

/// The gradients a backward writes; `None` skips dx, or a whole list.
#[derive(Debug, Default)]
pub struct GroupedLinearGrads<'a> {
    /// dx `[..., in]`.
    pub dx: Option<TensorViewMut<'a>>,
    /// `num_gemms` dW_i `[out, in]` (F32 main_grads added into with fused wgrad accumulation);
    /// an expert that got no tokens gets 0 (nothing added).
    pub dw: Option<Vec<TensorViewMut<'a>>>,
    /// `num_gemms` db_i `[out]`: layers with bias only.
    pub db: Option<Vec<TensorViewMut<'a>>>,
}

/// Calls `f` with the C arrays of a backward's gradients (dx, then `num_gemms` dW_i and db_i
/// pointers, or NULL), which point into `grads`; the lists' lengths are checked first.
fn with_grad_pointers<R>(
    func: &str,
    grads: GroupedLinearGrads<'_>,
    n: usize,
    f: impl FnOnce(
        *mut sys::te_tensor,
        *const *mut sys::te_tensor,
        *const *mut sys::te_tensor,
    ) -> Result<R>,
) -> Result<R> {
    let GroupedLinearGrads {
        mut dx,
        mut dw,
        mut db,
    } = grads;
    // Pointers into the views, which stay here (alive) until `f` returns.
    let pointers = |list: Option<&mut Vec<TensorViewMut<'_>>>, name: &str| {
        list.map(|views| {
            check_len(func, name, views.len(), n)?;
            Ok(views.iter_mut().map(|v| v.as_raw_mut()).collect::<Vec<_>>())
        })
        .transpose()
    };
    let dw = pointers(dw.as_mut(), "grads.dw")?;
    let db = pointers(db.as_mut(), "grads.db")?;
    f(
        opt_mut(dx.as_mut()),
        dw.as_ref().map_or(ptr::null(), |p| p.as_ptr()),
        db.as_ref().map_or(ptr::null(), |p| p.as_ptr()),
    )
}

unsafe fn destroy_module(p: *mut c_void) {
    sys::te_grouped_linear_destroy(p.cast())
}

unsafe fn destroy_backward(p: *mut c_void) {
    sys::te_grouped_linear_backward_ctx_destroy(p.cast())
}

unsafe fn release_residuals(internal: *mut c_void) {
    let mut r = sys::te_grouped_linear_residuals {
        struct_size: std::mem::size_of::<sys::te_grouped_linear_residuals>(),
        ..Default::default()
    };
    r.internal = internal;
    sys::te_grouped_linear_residuals_release(&mut r)
}

/// `num_gemms` FP8 linear experts (`te_grouped_linear`): three scaling states and an FP8
/// weight cache per expert, all joining the scope's bucket together (one amax reduction and
/// one scale update per pass). Parameters stay the caller's; every call takes the context it
/// was created with. `Send`, not `Sync`.
pub struct GroupedLinear {
    handle: Owned<sys::te_grouped_linear>,
    opts: GroupedLinearOptions,
}

impl GroupedLinear {
    /// A layer on `ctx`'s device.
    pub fn new(ctx: &Context, opts: &GroupedLinearOptions) -> Result<GroupedLinear> {
        let raw_opts = opts.to_raw()?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_grouped_linear_create(&mut raw, ctx.as_ptr(), &raw_opts) })?;
        Ok(GroupedLinear {
            handle: Owned::new(raw, ctx, "te_grouped_linear_create", destroy_module)?,
            opts: *opts,
        })
    }

    /// The options it was created with.
    pub fn options(&self) -> &GroupedLinearOptions {
        &self.opts
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_grouped_linear {
        self.handle.as_ptr()
    }

    /// Pure compute: `y_i = x_i W_i^T (+ b_i)` for each expert's rows, in FP8 inside an enabled
    /// autocast scope, and what backward needs. y `[..., out]` has x's rows. Errors:
    /// `InvalidArgument` (arrays not of `num_gemms` entries, counts not summing to x's rows, a
    /// weight or bias of the wrong shape/dtype), `Unsupported` (FP8 with in or out not a
    /// multiple of 16).
    pub fn forward_compute<'a>(
        &mut self,
        ctx: &Context,
        args: &GroupedLinearArgs<'_, 'a>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<GroupedLinearResiduals<'a>> {
        let arrays = CallArrays::new("GroupedLinear::forward_compute", args, self.opts.num_gemms)?;
        let raw_args = arrays.c_args(args);
        let mut res = sys::te_grouped_linear_residuals {
            struct_size: std::mem::size_of::<sys::te_grouped_linear_residuals>(),
            ..Default::default()
        };
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_grouped_linear_forward_compute(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut res,
            )
        }))?;
        Ok(GroupedLinearResiduals {
            owned: OwnedResiduals::new(res, ctx, |r| r.internal, release_residuals),
            _inputs: PhantomData,
        })
    }

    /// The context-saving step: packs the residuals into a backward context (on failure they
    /// are released).
    pub fn forward_save<'a>(
        &mut self,
        ctx: &Context,
        mut residuals: GroupedLinearResiduals<'a>,
    ) -> Result<GroupedLinearBackwardCtx<'a>> {
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::te_grouped_linear_forward_save(
                ctx.as_ptr(),
                self.as_ptr(),
                &mut residuals.owned.raw,
                &mut out,
            )
        })?;
        GroupedLinearBackwardCtx::own(out, ctx, self.opts.num_gemms)
    }

    /// `forward_compute` followed by `forward_save`.
    pub fn forward<'a>(
        &mut self,
        ctx: &Context,
        args: &GroupedLinearArgs<'_, 'a>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<GroupedLinearBackwardCtx<'a>> {
        let arrays = CallArrays::new("GroupedLinear::forward", args, self.opts.num_gemms)?;
        let raw_args = arrays.c_args(args);
        let mut out = ptr::null_mut();
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_grouped_linear_forward(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                &mut out,
            )
        }))?;
        GroupedLinearBackwardCtx::own(out, ctx, self.opts.num_gemms)
    }

    /// The bytes of residual memory a
    /// [`forward_compute_into`](GroupedLinear::forward_compute_into) with these arguments
    /// leaves under the innermost autocast scope as it is now: under FP8 every expert's x^T
    /// with its scale_inv; 0 in high precision (the backward then reads the inputs again).
    /// Reads the shapes and `m_splits`.
    pub fn residuals_size(&self, ctx: &Context, args: &GroupedLinearArgs<'_, '_>) -> Result<usize> {
        let arrays = CallArrays::new("GroupedLinear::residuals_size", args, self.opts.num_gemms)?;
        let raw_args = arrays.c_args(args);
        let mut bytes = 0usize;
        check(unsafe {
            sys::te_grouped_linear_residuals_size(
                ctx.as_ptr(),
                self.as_ptr(),
                &raw_args,
                &mut bytes,
            )
        })?;
        Ok(bytes)
    }

    /// `forward_compute` keeping the residuals in the caller's host memory (16-byte aligned,
    /// at least [`residuals_size`](GroupedLinear::residuals_size) bytes, e.g. a
    /// [`ResidualBuffer`](crate::ResidualBuffer); empty when that is 0); nothing stays
    /// borrowed. Each pending forward needs memory of its own. Host memory needs a CPU context
    /// (device memory goes through `libte::sys`).
    pub fn forward_compute_into(
        &mut self,
        ctx: &Context,
        args: &GroupedLinearArgs<'_, '_>,
        y: &mut TensorViewMut<'_>,
        residuals: &mut [u8],
    ) -> Result<()> {
        const F: &str = "GroupedLinear::forward_compute_into";
        let (res_ptr, bytes) = residual_memory_mut(ctx, F, residuals)?;
        let arrays = CallArrays::new(F, args, self.opts.num_gemms)?;
        let raw_args = arrays.c_args(args);
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_grouped_linear_forward_compute_into(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                y.as_raw_mut(),
                res_ptr,
                bytes,
            )
        }))
    }

    /// The backward of a [`forward_compute_into`](GroupedLinear::forward_compute_into):
    /// `inputs` are the forward's arguments again (they may have moved; required in high
    /// precision, optional under FP8, where given ones must match the forward's), the residual
    /// memory it filled and dy; gradients as the backward context's. Repeatable with identical
    /// results.
    pub fn backward_from(
        &mut self,
        ctx: &Context,
        inputs: Option<&GroupedLinearArgs<'_, '_>>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: GroupedLinearGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, grads, 0)
    }

    /// `backward_from` with `TE_BACKWARD_ONCE`: drops the forward's record.
    pub fn backward_from_once(
        &mut self,
        ctx: &Context,
        inputs: Option<&GroupedLinearArgs<'_, '_>>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: GroupedLinearGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, residuals, dy, grads, sys::TE_BACKWARD_ONCE)
    }

    fn backward_from_flags(
        &mut self,
        ctx: &Context,
        inputs: Option<&GroupedLinearArgs<'_, '_>>,
        residuals: &[u8],
        dy: &TensorView<'_>,
        grads: GroupedLinearGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        const F: &str = "GroupedLinear::backward_from";
        let n = self.opts.num_gemms;
        let (res_ptr, bytes) = residual_memory(ctx, F, residuals)?;
        let arrays = inputs.map(|a| CallArrays::new(F, a, n)).transpose()?;
        let raw_inputs = match (&arrays, inputs) {
            (Some(arrays), Some(a)) => Some(arrays.c_args(a)),
            _ => None,
        };
        let args = backward_args(flags);
        let m = self.as_ptr();
        with_grad_pointers(F, grads, n, |dx, dw, db| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_grouped_linear_backward_from(
                    raw_ctx,
                    m,
                    raw_inputs.as_ref().map_or(ptr::null(), |r| r),
                    res_ptr,
                    bytes,
                    dy.as_raw(),
                    dx,
                    dw,
                    db,
                    &args,
                )
            }))
        })
    }

    /// A copy of expert `expert`'s scaling state for `role`, with its whole amax history.
    pub fn scaling_state(
        &self,
        ctx: &Context,
        expert: usize,
        role: TensorRole,
    ) -> Result<ScalingStateInfo> {
        let expert = i32::try_from(expert).map_err(|_| {
            Error::invalid_argument(format!(
                "GroupedLinear::scaling_state: argument 'expert': expected 0..{}, got {}",
                self.opts.num_gemms, expert
            ))
        })?;
        read_scaling_state(|info, history, cap| unsafe {
            sys::te_grouped_linear_get_scaling_state(
                ctx.as_ptr(),
                self.as_ptr(),
                expert,
                role.to_raw(),
                info,
                history,
                cap,
            )
        })
    }

    /// Every expert's FP8 state in a versioned byte format;
    /// [`state_load`](GroupedLinear::state_load) restores it bit-exactly.
    pub fn state_save(&self, ctx: &Context) -> Result<Vec<u8>> {
        save_state(|buf, capacity, size| unsafe {
            sys::te_grouped_linear_state_save(ctx.as_ptr(), self.as_ptr(), buf, capacity, size)
        })
    }

    /// Restores what `state_save` wrote (a layer of the same shape and expert count).
    pub fn state_load(&mut self, ctx: &Context, state: &[u8]) -> Result<()> {
        check(unsafe {
            sys::te_grouped_linear_state_load(
                ctx.as_ptr(),
                self.as_ptr(),
                state.as_ptr().cast(),
                state.len(),
            )
        })
    }
}

impl fmt::Debug for GroupedLinear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupedLinear")
            .field("options", &self.opts)
            .finish()
    }
}

/// What a GroupedLinear backward needs, from [`GroupedLinear::forward_compute`] (opaque: only
/// whether it ran in FP8); borrows the forward's inputs for `'a`.
pub struct GroupedLinearResiduals<'a> {
    owned: OwnedResiduals<sys::te_grouped_linear_residuals>,
    _inputs: PhantomData<&'a [u8]>,
}

impl GroupedLinearResiduals<'_> {
    /// Whether the forward ran in FP8.
    pub fn fp8(&self) -> bool {
        self.owned.raw.fp8 != 0
    }
}

impl fmt::Debug for GroupedLinearResiduals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupedLinearResiduals")
            .field("fp8", &self.fp8())
            .finish()
    }
}

/// A saved GroupedLinear forward (`te_grouped_linear_backward_ctx`); borrows the forward's
/// inputs for `'a`. `Drop` destroys it.
pub struct GroupedLinearBackwardCtx<'a> {
    handle: Owned<sys::te_grouped_linear_backward_ctx>,
    num_gemms: usize,
    _inputs: PhantomData<&'a [u8]>,
}

impl<'a> GroupedLinearBackwardCtx<'a> {
    fn own(
        raw: *mut sys::te_grouped_linear_backward_ctx,
        ctx: &Context,
        num_gemms: usize,
    ) -> Result<GroupedLinearBackwardCtx<'a>> {
        Ok(GroupedLinearBackwardCtx {
            handle: Owned::new(raw, ctx, "te_grouped_linear_forward", destroy_backward)?,
            num_gemms,
            _inputs: PhantomData,
        })
    }

    /// From dy `[tokens, out]`: dx, and dW_i / db_i for every expert (each list of
    /// `num_gemms` views, or `None` to skip it). Repeatable with identical results.
    pub fn backward(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: GroupedLinearGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, dy, grads, 0)
    }

    /// `backward` with `TE_BACKWARD_ONCE`: the residuals are freed when it returns.
    pub fn backward_once(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: GroupedLinearGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, dy, grads, sys::TE_BACKWARD_ONCE)
    }

    fn run(
        &mut self,
        ctx: &Context,
        dy: &TensorView<'_>,
        grads: GroupedLinearGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        let args = backward_args(flags);
        let bwd = self.as_ptr();
        with_grad_pointers(
            "GroupedLinearBackwardCtx::backward",
            grads,
            self.num_gemms,
            |dx, dw, db| {
                check(ctx.reducing(|raw_ctx| unsafe {
                    sys::te_grouped_linear_backward(raw_ctx, bwd, dy.as_raw(), dx, dw, db, &args)
                }))
            },
        )
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_grouped_linear_backward_ctx {
        self.handle.as_ptr()
    }
}

impl fmt::Debug for GroupedLinearBackwardCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupedLinearBackwardCtx")
            .field("num_gemms", &self.num_gemms)
            .finish_non_exhaustive()
    }
}
