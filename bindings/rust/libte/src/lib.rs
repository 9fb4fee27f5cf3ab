//! Safe Rust bindings to **libte**, an FP8 training runtime in the style of NVIDIA
//! TransformerEngine behind a stable C ABI (`te/te.h`); the raw bindings are `libte-sys`.
//!
//! * [`Context`]: one device, one stream, one autocast stack. `Send`, not `Sync`.
//! * [`Recipe`]: an immutable, reference-counted FP8 recipe (delayed, current or block
//!   scaling). `Send + Sync`; `Clone` is a cheap reference.
//! * [`Autocast`]: an FP8 autocast scope; begins in `new`, ends in `Drop`. It borrows the
//!   context mutably, so scopes nest correctly by construction.
//! * [`Group`]: a process group that scopes all-reduce amaxes over: single-rank, or NCCL ranks
//!   joined with an [`NcclId`]. `Send + Sync`.
//! * [`Linear`]: an FP8 linear layer's state; `forward_compute` / `forward_save` / `forward`
//!   give a [`BackwardCtx`] to run `backward` with.
//! * The transformer modules, with `Linear`'s contract: [`LayerNormLinear`] (norm + linear),
//!   [`LayerNormMlp`] (norm, fc1, activation, fc2) and [`GroupedLinear`] (one linear per expert
//!   over consecutive row groups).
//! * [`Attention`]: scaled dot-product attention (BSHD or THD with `i32` sequence offsets,
//!   [`AttnMask`]s, GQA/MQA, optional FP8), with the modules' contract.
//! * Every module can also keep its residuals in the caller's memory: `residuals_size`,
//!   `forward_compute_into`, `backward_from` (a [`ResidualBuffer`] is suitable host memory).
//! * [`Context::norm_forward`] / [`Context::norm_backward`]: LayerNorm and RMSNorm
//!   ([`NormOptions`]), with FP8 outputs and their transpose.
//! * [`Context::rope_forward`] / [`Context::rope_backward`]: rotary position embedding
//!   ([`RopeOptions`]).
//! * The training step's glue, as methods of [`Context`]: [`Context::add`],
//!   [`Context::split_columns`] / [`Context::concat_columns`], the token embedding
//!   ([`Context::embedding_forward`] / [`Context::embedding_backward`]), the fused
//!   cross-entropy ([`Context::cross_entropy`], [`CrossEntropyOptions`]) and the fused AdamW
//!   step ([`AdamW`], [`Context::adamw_step`], [`AdamWParam`]s whose [`ParamOwner`] has its FP8
//!   weight cache refreshed).
//! * [`Checkpoint`]: named tensors and byte strings in one checksummed file or buffer.
//! * [`TensorView`] / [`TensorViewMut`]: `te_tensor` views of slices of `f32`, [`F16`],
//!   [`Bf16`] or `i32` (or FP8 codes with their scale_inv).
//! * Every fallible call returns [`Result`]; an [`Error`] carries the [`Status`] and the
//!   message libte gave (`te_last_error()`, copied right after the failing call).
//!
//! ```no_run
//! use libte::*;
//!
//! let mut ctx = Context::cpu()?;
//! let recipe = Recipe::new(&RecipeOptions {
//!     amax_history_len: 16,
//!     ..RecipeOptions::new(RecipeKind::DelayedScaling)
//! })?;
//! let mut fc = Linear::new(&ctx, &LinearOptions {
//!     activation_dtype: DType::F32,
//!     ..LinearOptions::new(64, 32)
//! })?;
//! let (x, w, b) = (vec![0.5f32; 32 * 64], vec![0.01f32; 32 * 64], vec![0.0f32; 32]);
//! let mut y = vec![0.0f32; 32 * 32];
//! let args = ForwardArgs::new(
//!     TensorView::from_slice(&x, &[32, 64])?,
//!     TensorView::from_slice(&w, &[32, 64])?,
//! )
//! .bias(TensorView::from_slice(&b, &[32])?);
//! let mut bwd = {
//!     let fp8 = Autocast::new(&mut ctx, &AutocastOptions::fp8(&recipe))?;
//!     fc.forward(&fp8, &args, &mut TensorViewMut::from_slice(&mut y, &[32, 32])?)?
//! }; // the scope ends: forward scales are updated
//! let dy = vec![1.0f32 / 1024.0; 32 * 32];
//! let (mut dx, mut dw, mut db) = (vec![0.0f32; 32 * 64], vec![0.0f32; 32 * 64], vec![0.0f32; 32]);
//! bwd.backward(
//!     &ctx,
//!     &TensorView::from_slice(&dy, &[32, 32])?,
//!     Some(&mut TensorViewMut::from_slice(&mut dx, &[32, 64])?),
//!     Some(&mut TensorViewMut::from_slice(&mut dw, &[32, 64])?),
//!     Some(&mut TensorViewMut::from_slice(&mut db, &[32])?),
//! )?;
//! # Ok::<(), libte::Error>(())
//! ```

#![warn(missing_docs)]

mod attention;
mod autocast;
mod checkpoint;
mod context;
mod error;
mod group;
mod grouped_linear;
mod half;
mod layernorm_linear;
mod layernorm_mlp;
mod linear;
mod module;
mod norm;
mod recipe;
mod rope;
mod tensor;
mod training;

pub use libte_sys as sys;

pub use crate::attention::{
    Attention, AttentionArgs, AttentionBackwardCtx, AttentionGrads, AttentionOptions,
    AttentionResiduals, AttentionTensor, AttnMask,
};
pub use crate::autocast::{Autocast, AutocastOptions, AutocastState};
pub use crate::checkpoint::{Checkpoint, RecordInfo};
pub use crate::context::{Activation, Context, ContextStats, Device, QuantizeScale};
pub use crate::error::{Error, Result, Status};
pub use crate::group::{nccl_unique_id, Group, NcclId, NCCL_ID_BYTES};
pub use crate::grouped_linear::{
    GroupedLinear, GroupedLinearArgs, GroupedLinearBackwardCtx, GroupedLinearGrads,
    GroupedLinearOptions, GroupedLinearResiduals, GROUPED_LINEAR_MAX_GEMMS,
};
pub use crate::half::{Bf16, F16};
pub use crate::layernorm_linear::{
    LayerNormLinear, LayerNormLinearArgs, LayerNormLinearBackwardCtx, LayerNormLinearGrads,
    LayerNormLinearOptions, LayerNormLinearResiduals,
};
pub use crate::layernorm_mlp::{
    LayerNormMlp, LayerNormMlpArgs, LayerNormMlpBackwardCtx, LayerNormMlpGrads,
    LayerNormMlpOptions, LayerNormMlpResiduals, MlpGemm,
};
pub use crate::linear::{
    BackwardCtx, ForwardArgs, Linear, LinearOptions, Residuals, ScalingStateInfo, TensorRole,
};
pub use crate::module::ResidualBuffer;
pub use crate::norm::{NormGrads, NormKind, NormOptions, NormOutputs};
pub use crate::recipe::{AmaxAlgo, Format, Recipe, RecipeKind, RecipeOptions};
pub use crate::rope::RopeOptions;
pub use crate::tensor::{DType, Element, ScalingMode, TensorView, TensorViewMut, MAX_DIMS};
pub use crate::training::{
    AdamW, AdamWOptions, AdamWParam, CrossEntropyOptions, ParamOwner, MAX_COLUMN_PARTS,
};

/// The loaded library's version, encoded as `MAJOR * 10000 + MINOR * 100 + PATCH`.
pub fn version() -> u32 {
    unsafe { sys::te_version() }
}

/// The loaded library's version, "MAJOR.MINOR.PATCH".
pub fn version_string() -> &'static str {
    // Static storage (te.h).
    unsafe { std::ffi::CStr::from_ptr(sys::te_version_string()) }
        .to_str()
        .unwrap_or("")
}

/// The version of the header these bindings were generated from.
pub const HEADER_VERSION: u32 = sys::TE_VERSION_NUMBER;

/// What the type system rules out, as `compile_fail` doctests.
///
/// A context is not `Sync` (one thread at a time):
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<libte::Context>();
/// ```
/// Nor are layers and backward contexts:
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<libte::Linear>();
/// ```
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<libte::BackwardCtx<'static>>();
/// ```
/// While a scope is open, the context cannot open a sibling scope (only `nested` can):
/// ```compile_fail
/// # use libte::*;
/// let mut ctx = Context::cpu().unwrap();
/// let outer = Autocast::new(&mut ctx, &AutocastOptions::default()).unwrap();
/// let sibling = Autocast::new(&mut ctx, &AutocastOptions::default()).unwrap();
/// drop(outer); // would end the outer scope before the inner one
/// drop(sibling);
/// ```
/// An outer scope cannot end while an inner one is open:
/// ```compile_fail
/// # use libte::*;
/// let mut ctx = Context::cpu().unwrap();
/// let mut outer = Autocast::new(&mut ctx, &AutocastOptions::default()).unwrap();
/// let inner = outer.nested(&AutocastOptions::default()).unwrap();
/// outer.end().unwrap();
/// drop(inner);
/// ```
/// A scope borrows its process group, which cannot be dropped while the scope is open:
/// ```compile_fail
/// # use libte::*;
/// let mut ctx = Context::cpu().unwrap();
/// let group = Group::single().unwrap();
/// let scope = Autocast::new(&mut ctx, &AutocastOptions::default().group(&group)).unwrap();
/// drop(group);
/// drop(scope);
/// ```
/// A backward context borrows the forward's inputs (a high-precision forward references x and
/// W instead of copying them), so they cannot be freed or changed before it is dropped:
/// ```compile_fail
/// # use libte::*;
/// let ctx = Context::cpu().unwrap();
/// let mut fc = Linear::new(&ctx, &LinearOptions { activation_dtype: DType::F32, bias: false,
///     ..LinearOptions::new(16, 16) }).unwrap();
/// let mut x = vec![0.0f32; 256];
/// let w = vec![0.0f32; 256];
/// let mut y = vec![0.0f32; 256];
/// let args = ForwardArgs::new(TensorView::from_slice(&x, &[16, 16]).unwrap(),
///     TensorView::from_slice(&w, &[16, 16]).unwrap());
/// let bwd = fc.forward(&ctx, &args, &mut TensorViewMut::from_slice(&mut y, &[16, 16]).unwrap());
/// x[0] = 1.0;
/// drop(bwd);
/// ```
/// The transformer modules borrow likewise: libte references x and gamma (always) and the
/// weights (in high precision) until the backward context is destroyed (te.h), so changing x
/// while a LayerNormLinear's backward context lives does not compile:
/// ```compile_fail
/// # use libte::*;
/// let ctx = Context::cpu().unwrap();
/// let mut m = LayerNormLinear::new(&ctx, &LayerNormLinearOptions { activation_dtype: DType::F32,
///     bias: false, ..LayerNormLinearOptions::new(16, 16) }).unwrap();
/// let mut x = vec![0.0f32; 256];
/// let (g, b, w) = (vec![1.0f32; 16], vec![0.0f32; 16], vec![0.0f32; 256]);
/// let mut y = vec![0.0f32; 256];
/// let args = LayerNormLinearArgs::new(TensorView::from_slice(&x, &[16, 16]).unwrap(),
///     TensorView::from_slice(&g, &[16]).unwrap(), TensorView::from_slice(&w, &[16, 16]).unwrap())
///     .ln_bias(TensorView::from_slice(&b, &[16]).unwrap());
/// let bwd = m.forward(&ctx, &args, &mut TensorViewMut::from_slice(&mut y, &[16, 16]).unwrap(), None);
/// x[0] = 1.0;
/// drop(bwd);
/// ```
/// nor does freeing gamma while a LayerNormMLP's residuals live:
/// ```compile_fail
/// # use libte::*;
/// let ctx = Context::cpu().unwrap();
/// let mut m = LayerNormMlp::new(&ctx, &LayerNormMlpOptions { activation_dtype: DType::F32,
///     bias: false, norm: NormOptions::new(NormKind::RmsNorm),
///     ..LayerNormMlpOptions::new(16, 16) }).unwrap();
/// let x = vec![0.0f32; 256];
/// let g = vec![1.0f32; 16];
/// let (w1, w2) = (vec![0.0f32; 256], vec![0.0f32; 256]);
/// let mut y = vec![0.0f32; 256];
/// let args = LayerNormMlpArgs::new(TensorView::from_slice(&x, &[16, 16]).unwrap(),
///     TensorView::from_slice(&g, &[16]).unwrap(), TensorView::from_slice(&w1, &[16, 16]).unwrap(),
///     TensorView::from_slice(&w2, &[16, 16]).unwrap());
/// let res = m.forward_compute(&ctx, &args, &mut TensorViewMut::from_slice(&mut y, &[16, 16]).unwrap(), None);
/// drop(g);
/// drop(res);
/// ```
/// nor changing an expert's weight while a GroupedLinear's backward context lives (the slice
/// of views and m_splits are borrowed for the call only):
/// ```compile_fail
/// # use libte::*;
/// let ctx = Context::cpu().unwrap();
/// let mut m = GroupedLinear::new(&ctx, &GroupedLinearOptions { activation_dtype: DType::F32,
///     bias: false, ..GroupedLinearOptions::new(2, 16, 16) }).unwrap();
/// let x = vec![0.0f32; 256];
/// let (mut w0, w1) = (vec![0.0f32; 256], vec![0.0f32; 256]);
/// let mut y = vec![0.0f32; 256];
/// let bwd = {
///     let weights = [TensorView::from_slice(&w0, &[16, 16]).unwrap(),
///                    TensorView::from_slice(&w1, &[16, 16]).unwrap()];
///     let splits = [10, 6];
///     let args = GroupedLinearArgs::new(TensorView::from_slice(&x, &[16, 16]).unwrap(), &splits,
///                                       &weights);
///     m.forward(&ctx, &args, &mut TensorViewMut::from_slice(&mut y, &[16, 16]).unwrap())
/// };
/// w0[0] = 1.0;
/// drop(bwd);
/// ```
/// An attention's backward reads the forward's output O, so its backward context borrows O's
/// memory (the view is taken by value): writing O before the context is dropped does not
/// compile:
/// ```compile_fail
/// # use libte::*;
/// let ctx = Context::cpu().unwrap();
/// let mut m = Attention::new(&ctx, &AttentionOptions { activation_dtype: DType::F32,
///     ..AttentionOptions::new(2, 8) }).unwrap();
/// let (q, k, v) = (vec![0.0f32; 32], vec![0.0f32; 32], vec![0.0f32; 32]);
/// let mut o = vec![0.0f32; 32];
/// let args = AttentionArgs::new(TensorView::from_slice(&q, &[1, 2, 2, 8]).unwrap(),
///     TensorView::from_slice(&k, &[1, 2, 2, 8]).unwrap(),
///     TensorView::from_slice(&v, &[1, 2, 2, 8]).unwrap());
/// let bwd = m.forward(&ctx, &args, TensorViewMut::from_slice(&mut o, &[1, 2, 2, 8]).unwrap());
/// o[0] = 1.0;
/// drop(bwd);
/// ```
/// The modules and their backward contexts are not `Sync` either:
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<libte::LayerNormMlp>();
/// ```
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<libte::GroupedLinearBackwardCtx<'static>>();
/// ```
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<libte::AttentionBackwardCtx<'static>>();
/// ```
#[doc(hidden)]
pub mod compile_checks {}

/// The README's Rust example, compiled and run as a doctest so that it stays correct.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
