//! `Attention`: scaled dot-product attention (TE's DotProductAttention: BSHD or THD layouts,
//! masks, GQA/MQA, optional FP8), with `Linear`'s split forward, repeatable backward and
//! caller-memory residuals.

use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr;

use libte_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result};
use crate::linear::ScalingStateInfo;
use crate::module::{
    backward_args, read_scaling_state, required_view, residual_memory, residual_memory_mut,
    save_state, Owned, OwnedResiduals,
};
use crate::tensor::{opt_mut, DType, TensorView, TensorViewMut};

/// Which keys a query sees (`te_attn_mask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttnMask {
    /// Every key (`TE_ATTN_MASK_NONE`).
    None,
    /// Key j is visible to query i iff `j <= i` (top-left aligned, TE's "causal").
    Causal,
    /// Key j is visible to query i iff `j <= i + seq_kv - seq_q` (TE's
    /// "causal_bottom_right").
    CausalBottomRight,
}

impl AttnMask {
    pub(crate) fn to_raw(self) -> sys::te_attn_mask {
        match self {
            AttnMask::None => sys::te_attn_mask::TE_ATTN_MASK_NONE,
            AttnMask::Causal => sys::te_attn_mask::TE_ATTN_MASK_CAUSAL,
            AttnMask::CausalBottomRight => sys::te_attn_mask::TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT,
        }
    }

    pub(crate) fn from_raw(raw: sys::te_attn_mask) -> Option<AttnMask> {
        Some(match raw {
            sys::te_attn_mask::TE_ATTN_MASK_NONE => AttnMask::None,
            sys::te_attn_mask::TE_ATTN_MASK_CAUSAL => AttnMask::Causal,
            sys::te_attn_mask::TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT => AttnMask::CausalBottomRight,
            _ => return None,
        })
    }
}

/// An attention's options (`te_attention_options`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOptions {
    /// Query heads; required, > 0.
    pub num_heads: usize,
    /// Key/value heads (GQA/MQA); 0 (the default) means `num_heads`; must divide `num_heads`.
    pub num_kv_heads: usize,
    /// Features per head; required, a multiple of 8 in 8..=256.
    pub head_dim: usize,
    /// The factor of `Q K^T`; 0 (the default) means `1 / sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Default [`AttnMask::None`].
    pub mask: AttnMask,
    /// F32, F16 or BF16 (default BF16): q, k, v, o and their gradients.
    pub activation_dtype: DType,
    /// FP8 attention inside FP8 autocast scopes (TE's `fp8_dpa`). Default false.
    pub fp8: bool,
}

impl AttentionOptions {
    /// libte's defaults (`te_attention_options_init`) for `num_heads` heads of `head_dim`.
    pub fn new(num_heads: usize, head_dim: usize) -> AttentionOptions {
        let mut raw = sys::te_attention_options::default();
        let _ = unsafe { sys::te_attention_options_init(&mut raw) };
        AttentionOptions {
            num_heads,
            num_kv_heads: raw.num_kv_heads.max(0) as usize,
            head_dim,
            softmax_scale: raw.softmax_scale,
            mask: AttnMask::from_raw(raw.mask).unwrap_or(AttnMask::None),
            activation_dtype: DType::from_raw(raw.activation_dtype).unwrap_or(DType::BF16),
            fp8: raw.fp8 != 0,
        }
    }

    fn to_raw(self) -> Result<sys::te_attention_options> {
        let count = |n: usize, name: &str| {
            i32::try_from(n).map_err(|_| {
                Error::invalid_argument(format!(
                    "Attention::new: argument 'opts.{}': expected at most i32::MAX, got {}",
                    name, n
                ))
            })
        };
        let mut raw = sys::te_attention_options::default();
        check(unsafe { sys::te_attention_options_init(&mut raw) })?;
        raw.num_heads = count(self.num_heads, "num_heads")?;
        raw.num_kv_heads = count(self.num_kv_heads, "num_kv_heads")?;
        raw.head_dim = count(self.head_dim, "head_dim")?;
        raw.softmax_scale = self.softmax_scale;
        raw.mask = self.mask.to_raw();
        raw.activation_dtype = self.activation_dtype.to_raw();
        raw.fp8 = self.fp8 as i32;
        Ok(raw)
    }
}

/// Which scaling state of FP8 attention (`te_attention_tensor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttentionTensor {
    /// Forward: Q.
    Q,
    /// Forward: K.
    K,
    /// Forward: V.
    V,
    /// Forward: the softmax output P.
    S,
    /// Backward: dO.
    DO,
    /// Backward: dS = P * (dP - D).
    DP,
}

impl AttentionTensor {
    pub(crate) fn to_raw(self) -> sys::te_attention_tensor {
        match self {
            AttentionTensor::Q => sys::te_attention_tensor::TE_ATTN_Q,
            AttentionTensor::K => sys::te_attention_tensor::TE_ATTN_K,
            AttentionTensor::V => sys::te_attention_tensor::TE_ATTN_V,
            AttentionTensor::S => sys::te_attention_tensor::TE_ATTN_S,
            AttentionTensor::DO => sys::te_attention_tensor::TE_ATTN_DO,
            AttentionTensor::DP => sys::te_attention_tensor::TE_ATTN_DP,
        }
    }
}

/// The inputs of a forward (`te_attention_forward_args`), borrowed for `'a`: in high precision
/// libte references q, k, v (and the offsets) until the backward context is destroyed, so the
/// residuals and backward context keep that borrow.
///
/// BSHD (fixed lengths): q `[batch, seq_q, heads, head_dim]`, k and v
/// `[batch, seq_kv, kv_heads, head_dim]`. THD (variable lengths, [`thd`](AttentionArgs::thd)):
/// q `[tokens_q, heads, head_dim]`, k and v `[tokens_kv, kv_heads, head_dim]` and the I32
/// offsets `[batch + 1]` (TE's `cu_seqlens`; views of `&[i32]`).
#[derive(Debug, Clone, Copy)]
pub struct AttentionArgs<'a> {
    /// Q.
    pub q: TensorView<'a>,
    /// K.
    pub k: TensorView<'a>,
    /// V.
    pub v: TensorView<'a>,
    /// THD: the queries' sequence offsets, I32 `[batch + 1]`; `None` for BSHD.
    pub cu_seqlens_q: Option<TensorView<'a>>,
    /// THD: the keys' sequence offsets, I32 `[batch + 1]`; `None` for BSHD.
    pub cu_seqlens_kv: Option<TensorView<'a>>,
    /// THD: at least every query sequence's length (> 0); ignored for BSHD.
    pub max_seqlen_q: usize,
    /// THD: at least every key sequence's length (> 0); ignored for BSHD.
    pub max_seqlen_kv: usize,
}

impl<'a> AttentionArgs<'a> {
    /// q, k and v in the BSHD layout.
    pub fn new(q: TensorView<'a>, k: TensorView<'a>, v: TensorView<'a>) -> AttentionArgs<'a> {
        AttentionArgs {
            q,
            k,
            v,
            cu_seqlens_q: None,
            cu_seqlens_kv: None,
            max_seqlen_q: 0,
            max_seqlen_kv: 0,
        }
    }

    /// The THD layout: the sequence offsets of the queries and of the keys, and bounds of
    /// their lengths.
    pub fn thd(
        mut self,
        cu_seqlens_q: TensorView<'a>,
        cu_seqlens_kv: TensorView<'a>,
        max_seqlen_q: usize,
        max_seqlen_kv: usize,
    ) -> AttentionArgs<'a> {
        self.cu_seqlens_q = Some(cu_seqlens_q);
        self.cu_seqlens_kv = Some(cu_seqlens_kv);
        self.max_seqlen_q = max_seqlen_q;
        self.max_seqlen_kv = max_seqlen_kv;
        self
    }

    /// The C struct; it points into `self`.
    fn c_args(&self, func: &str) -> Result<sys::te_attention_forward_args> {
        let len = |n: usize, name: &str| {
            i64::try_from(n).map_err(|_| {
                Error::invalid_argument(format!(
                    "{}: argument 'args.{}': expected at most i64::MAX, got {}",
                    func, name, n
                ))
            })
        };
        let mut raw = sys::te_attention_forward_args::default();
        let _ = unsafe { sys::te_attention_forward_args_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_attention_forward_args>();
        raw.q = self.q.as_raw();
        raw.k = self.k.as_raw();
        raw.v = self.v.as_raw();
        raw.cu_seqlens_q = self
            .cu_seqlens_q
            .as_ref()
            .map_or(ptr::null(), |t| t.as_raw());
        raw.cu_seqlens_kv = self
            .cu_seqlens_kv
            .as_ref()
            .map_or(ptr::null(), |t| t.as_raw());
        raw.max_seqlen_q = len(self.max_seqlen_q, "max_seqlen_q")?;
        raw.max_seqlen_kv = len(self.max_seqlen_kv, "max_seqlen_kv")?;
        Ok(raw)
    }
}

/// The gradients a backward writes (`te_attention_grads`), each like its input (written, not
/// accumulated; dk and dv sum the query heads of each GQA group); each `None` is skipped.
#[derive(Debug, Default)]
pub struct AttentionGrads<'a> {
    /// dQ, like q.
    pub dq: Option<TensorViewMut<'a>>,
    /// dK, like k.
    pub dk: Option<TensorViewMut<'a>>,
    /// dV, like v.
    pub dv: Option<TensorViewMut<'a>>,
}

impl<'a> AttentionGrads<'a> {
    /// All three.
    pub fn new(
        dq: TensorViewMut<'a>,
        dk: TensorViewMut<'a>,
        dv: TensorViewMut<'a>,
    ) -> AttentionGrads<'a> {
        AttentionGrads {
            dq: Some(dq),
            dk: Some(dk),
            dv: Some(dv),
        }
    }

    /// Calls `f` with the C struct, which points into `self`.
    fn with_raw<T>(self, f: impl FnOnce(&sys::te_attention_grads) -> T) -> T {
        let AttentionGrads {
            mut dq,
            mut dk,
            mut dv,
        } = self;
        let mut raw = sys::te_attention_grads::default();
        let _ = unsafe { sys::te_attention_grads_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_attention_grads>();
        raw.dq = opt_mut(dq.as_mut());
        raw.dk = opt_mut(dk.as_mut());
        raw.dv = opt_mut(dv.as_mut());
        f(&raw)
    }
}

unsafe fn destroy_module(p: *mut c_void) {
    sys::te_attention_destroy(p.cast())
}

unsafe fn destroy_backward(p: *mut c_void) {
    sys::te_attention_backward_ctx_destroy(p.cast())
}

unsafe fn release_residuals(internal: *mut c_void) {
    // Release reads only `internal`.
    let mut r = sys::te_attention_residuals {
        struct_size: std::mem::size_of::<sys::te_attention_residuals>(),
        ..Default::default()
    };
    r.internal = internal;
    sys::te_attention_residuals_release(&mut r)
}

/// Scaled dot-product attention (`te_attention`): `O = softmax(scale * Q K^T + mask) V` per
/// sequence and query head, and, with `fp8`, the scaling states of Q, K, V, P, dO and dS.
/// Has no parameters; every call takes the context it was created with. `Send`, not `Sync`.
///
/// The forward's output `o` is referenced by the residuals (libte reads it in backward), so
/// [`forward_compute`](Attention::forward_compute) and [`forward`](Attention::forward) take
/// its view by value and keep its borrow for `'a`; read it meanwhile through
/// [`AttentionBackwardCtx::output`] (or [`AttentionResiduals::o`]).
pub struct Attention {
    handle: Owned<sys::te_attention>,
    opts: AttentionOptions,
}

impl Attention {
    /// An attention on `ctx`'s device. Errors: `InvalidArgument` naming the field out of range.
    pub fn new(ctx: &Context, opts: &AttentionOptions) -> Result<Attention> {
        let raw_opts = opts.to_raw()?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_attention_create(&mut raw, ctx.as_ptr(), &raw_opts) })?;
        Ok(Attention {
            handle: Owned::new(raw, ctx, "te_attention_create", destroy_module)?,
            opts: *opts,
        })
    }

    /// The options it was created with.
    pub fn options(&self) -> &AttentionOptions {
        &self.opts
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_attention {
        self.handle.as_ptr()
    }

    /// Pure compute: writes O (like q) and returns what backward needs; in FP8 inside an
    /// enabled autocast scope when the attention was created with `fp8`. Errors:
    /// `InvalidArgument` (a tensor of the wrong dtype, device or shape, naming it; head counts
    /// or head_dim not the layer's; bad offsets), `Unsupported` (FP8 under a block-scaling
    /// recipe; a shape the device cannot do).
    pub fn forward_compute<'a>(
        &mut self,
        ctx: &Context,
        args: &AttentionArgs<'a>,
        mut o: TensorViewMut<'a>,
    ) -> Result<AttentionResiduals<'a>> {
        let raw_args = args.c_args("Attention::forward_compute")?;
        let mut res = sys::te_attention_residuals {
            struct_size: std::mem::size_of::<sys::te_attention_residuals>(),
            ..Default::default()
        };
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_attention_forward_compute(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                o.as_raw_mut(),
                &mut res,
            )
        }))?;
        Ok(AttentionResiduals {
            owned: OwnedResiduals::new(res, ctx, |r| r.internal, release_residuals),
            _inputs: PhantomData,
        })
    }

    /// The context-saving step: packs the residuals into a backward context (on failure they
    /// are released).
    pub fn forward_save<'a>(
        &mut self,
        ctx: &Context,
        mut residuals: AttentionResiduals<'a>,
    ) -> Result<AttentionBackwardCtx<'a>> {
        let o = residuals.owned.raw.o;
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::te_attention_forward_save(
                ctx.as_ptr(),
                self.as_ptr(),
                &mut residuals.owned.raw,
                &mut out,
            )
        })?;
        AttentionBackwardCtx::own(out, ctx, o)
    }

    /// `forward_compute` followed by `forward_save`.
    pub fn forward<'a>(
        &mut self,
        ctx: &Context,
        args: &AttentionArgs<'a>,
        mut o: TensorViewMut<'a>,
    ) -> Result<AttentionBackwardCtx<'a>> {
        let raw_args = args.c_args("Attention::forward")?;
        let mut out = ptr::null_mut();
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_attention_forward(raw_ctx, self.as_ptr(), &raw_args, o.as_raw_mut(), &mut out)
        }))?;
        AttentionBackwardCtx::own(out, ctx, *o.as_raw())
    }

    /// The bytes of residual memory a [`forward_compute_into`](Attention::forward_compute_into)
    /// with these arguments needs under the innermost autocast scope as it is now (never 0:
    /// the LSE, and under FP8 the E4M3 Q, K, V). Reads only shapes.
    pub fn residuals_size(&self, ctx: &Context, args: &AttentionArgs<'_>) -> Result<usize> {
        let raw_args = args.c_args("Attention::residuals_size")?;
        let mut bytes = 0usize;
        check(unsafe {
            sys::te_attention_residuals_size(ctx.as_ptr(), self.as_ptr(), &raw_args, &mut bytes)
        })?;
        Ok(bytes)
    }

    /// `forward_compute` keeping the residuals in the caller's host memory (16-byte aligned,
    /// at least [`residuals_size`](Attention::residuals_size) bytes: a
    /// [`ResidualBuffer`](crate::ResidualBuffer) is), for
    /// [`backward_from`](Attention::backward_from). Nothing stays borrowed: backward_from
    /// takes the inputs and O again. Host memory needs a CPU context (device memory of a CUDA
    /// context goes through `libte::sys` directly).
    pub fn forward_compute_into(
        &mut self,
        ctx: &Context,
        args: &AttentionArgs<'_>,
        o: &mut TensorViewMut<'_>,
        residuals: &mut [u8],
    ) -> Result<()> {
        const F: &str = "Attention::forward_compute_into";
        let (res_ptr, bytes) = residual_memory_mut(ctx, F, residuals)?;
        let raw_args = args.c_args(F)?;
        check(ctx.reducing(|raw_ctx| unsafe {
            sys::te_attention_forward_compute_into(
                raw_ctx,
                self.as_ptr(),
                &raw_args,
                o.as_raw_mut(),
                res_ptr,
                bytes,
            )
        }))
    }

    /// The backward of a [`forward_compute_into`](Attention::forward_compute_into): given
    /// the forward's inputs again (they may have moved), its output O, the residual memory it
    /// filled and dO, writes the gradients. Repeatable with identical results.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_from(
        &mut self,
        ctx: &Context,
        inputs: &AttentionArgs<'_>,
        o: &TensorView<'_>,
        residuals: &[u8],
        d_o: &TensorView<'_>,
        grads: AttentionGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, o, residuals, d_o, grads, 0)
    }

    /// `backward_from` with `TE_BACKWARD_ONCE`: drops the forward's record (a later
    /// `backward_from` of that memory is an `InvalidArgument`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_from_once(
        &mut self,
        ctx: &Context,
        inputs: &AttentionArgs<'_>,
        o: &TensorView<'_>,
        residuals: &[u8],
        d_o: &TensorView<'_>,
        grads: AttentionGrads<'_>,
    ) -> Result<()> {
        self.backward_from_flags(ctx, inputs, o, residuals, d_o, grads, sys::TE_BACKWARD_ONCE)
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_from_flags(
        &mut self,
        ctx: &Context,
        inputs: &AttentionArgs<'_>,
        o: &TensorView<'_>,
        residuals: &[u8],
        d_o: &TensorView<'_>,
        grads: AttentionGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        const F: &str = "Attention::backward_from";
        let (res_ptr, bytes) = residual_memory(ctx, F, residuals)?;
        let raw_inputs = inputs.c_args(F)?;
        let args = backward_args(flags);
        grads.with_raw(|raw_grads| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_attention_backward_from(
                    raw_ctx,
                    self.as_ptr(),
                    &raw_inputs,
                    o.as_raw(),
                    res_ptr,
                    bytes,
                    d_o.as_raw(),
                    raw_grads,
                    &args,
                )
            }))
        })
    }

    /// A copy of one FP8 scaling state, with its whole amax history.
    pub fn scaling_state(&self, ctx: &Context, which: AttentionTensor) -> Result<ScalingStateInfo> {
        read_scaling_state(|info, history, cap| unsafe {
            sys::te_attention_get_scaling_state(
                ctx.as_ptr(),
                self.as_ptr(),
                which.to_raw(),
                info,
                history,
                cap,
            )
        })
    }

    /// The FP8 state (histories, scales) in a versioned byte format;
    /// [`state_load`](Attention::state_load) restores it bit-exactly.
    pub fn state_save(&self, ctx: &Context) -> Result<Vec<u8>> {
        save_state(|buf, capacity, size| unsafe {
            sys::te_attention_state_save(ctx.as_ptr(), self.as_ptr(), buf, capacity, size)
        })
    }

    /// Restores what `state_save` wrote. Errors: `InvalidArgument` for a truncated buffer,
    /// another format version or another shape; `InvalidState` while a scope or a pending
    /// backward holds the states.
    pub fn state_load(&mut self, ctx: &Context, state: &[u8]) -> Result<()> {
        check(unsafe {
            sys::te_attention_state_load(
                ctx.as_ptr(),
                self.as_ptr(),
                state.as_ptr().cast(),
                state.len(),
            )
        })
    }
}

impl fmt::Debug for Attention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attention")
            .field("options", &self.opts)
            .finish()
    }
}

/// What an attention backward needs, from [`Attention::forward_compute`]
/// (`te_attention_residuals`); borrows the forward's inputs and output for `'a`. Hand them to
/// [`Attention::forward_save`]; dropping releases them.
pub struct AttentionResiduals<'a> {
    owned: OwnedResiduals<sys::te_attention_residuals>,
    _inputs: PhantomData<&'a [u8]>,
}

impl AttentionResiduals<'_> {
    const F: &'static str = "AttentionResiduals";

    /// Whether the forward ran in FP8.
    pub fn fp8(&self) -> bool {
        self.owned.raw.fp8 != 0
    }

    /// FP8: the E4M3 Q with its scale_inv; high precision: the caller's q.
    pub fn q(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.q, Self::F)
    }

    /// FP8: the E4M3 K with its scale_inv; high precision: the caller's k.
    pub fn k(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.k, Self::F)
    }

    /// FP8: the E4M3 V with its scale_inv; high precision: the caller's v.
    pub fn v(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.v, Self::F)
    }

    /// The forward's output O (the caller's).
    pub fn o(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.o, Self::F)
    }

    /// The rows' log-sum-exp, F32 `[tokens_q, heads]`.
    pub fn lse(&self) -> Result<TensorView<'_>> {
        required_view(&self.owned.raw.lse, Self::F)
    }
}

impl fmt::Debug for AttentionResiduals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttentionResiduals")
            .field("fp8", &self.fp8())
            .finish_non_exhaustive()
    }
}

/// A saved attention forward (`te_attention_backward_ctx`): run
/// [`backward`](AttentionBackwardCtx::backward) as often as needed, or
/// [`backward_once`](AttentionBackwardCtx::backward_once). Borrows the forward's inputs and
/// output for `'a`. `Drop` destroys it.
pub struct AttentionBackwardCtx<'a> {
    handle: Owned<sys::te_attention_backward_ctx>,
    o: sys::te_tensor,
    _inputs: PhantomData<&'a [u8]>,
}

// The O descriptor points to the caller's memory, borrowed for 'a and only read through
// `&self`; the handle is Send (as the other modules' backward contexts).
unsafe impl Send for AttentionBackwardCtx<'_> {}

impl<'a> AttentionBackwardCtx<'a> {
    fn own(
        raw: *mut sys::te_attention_backward_ctx,
        ctx: &Context,
        o: sys::te_tensor,
    ) -> Result<AttentionBackwardCtx<'a>> {
        Ok(AttentionBackwardCtx {
            handle: Owned::new(raw, ctx, "te_attention_forward", destroy_backward)?,
            o,
            _inputs: PhantomData,
        })
    }

    /// The forward's output O (the view it was given, borrowed by this context).
    pub fn output(&self) -> TensorView<'_> {
        // The caller's view, checked when it was made; its memory is borrowed for 'a.
        unsafe { TensorView::from_raw(self.o) }
    }

    /// From dO (like q): dQ, dK, dV, each skipped when `None`. Repeatable with identical
    /// results.
    pub fn backward(
        &mut self,
        ctx: &Context,
        d_o: &TensorView<'_>,
        grads: AttentionGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, d_o, grads, 0)
    }

    /// `backward` with `TE_BACKWARD_ONCE`: the residuals are freed when it returns, and a later
    /// call is an `InvalidState`. On failure nothing is freed.
    pub fn backward_once(
        &mut self,
        ctx: &Context,
        d_o: &TensorView<'_>,
        grads: AttentionGrads<'_>,
    ) -> Result<()> {
        self.run(ctx, d_o, grads, sys::TE_BACKWARD_ONCE)
    }

    fn run(
        &mut self,
        ctx: &Context,
        d_o: &TensorView<'_>,
        grads: AttentionGrads<'_>,
        flags: u32,
    ) -> Result<()> {
        let args = backward_args(flags);
        let bwd = self.as_ptr();
        grads.with_raw(|raw| {
            check(ctx.reducing(|raw_ctx| unsafe {
                sys::te_attention_backward(raw_ctx, bwd, d_o.as_raw(), raw, &args)
            }))
        })
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_attention_backward_ctx {
        self.handle.as_ptr()
    }
}

impl fmt::Debug for AttentionBackwardCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttentionBackwardCtx")
            .finish_non_exhaustive()
    }
}
