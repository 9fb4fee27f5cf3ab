//! The training-step ops a model written against libte needs between its modules, as methods
//! of [`Context`]: `te_add`, `te_split_columns` / `te_concat_columns`, the token embedding
//! (`te_embedding_forward` / `_backward`), the fused softmax cross-entropy (`te_cross_entropy`)
//! and the fused multi-tensor AdamW step (`te_adamw_step`), whose parameters may name the
//! module ([`Linear`], [`LayerNormLinear`], [`LayerNormMlp`]) whose FP8 weight cache the step
//! refreshes.

use std::ptr;

use libte_sys as sys;

use crate::context::{Context, Device};
use crate::error::{check, Error, Result};
use crate::layernorm_linear::LayerNormLinear;
use crate::layernorm_mlp::{LayerNormMlp, MlpGemm};
use crate::linear::Linear;
use crate::tensor::{DType, TensorView, TensorViewMut};

/// The most parts `te_split_columns` / `te_concat_columns` take (te.h: 1 <= n <= 64).
pub const MAX_COLUMN_PARTS: usize = 64;

// ---------------------------------------------------------------------------------------------
// Cross-entropy options
// ---------------------------------------------------------------------------------------------

/// The cross-entropy's options (`te_cross_entropy_options`), built from libte's defaults:
/// `CrossEntropyOptions::new().ignore_index(-1).grad_scale(0.5)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyOptions {
    /// Tokens whose target is this are left out of the mean (zero dlogits rows). Default -100.
    pub ignore_index: i32,
    /// dlogits is multiplied by this (default 1: the gradient of the mean loss; e.g. 1 / the
    /// number of micro-batches, or a loss scale).
    pub grad_scale: f32,
}

impl Default for CrossEntropyOptions {
    /// libte's defaults (`te_cross_entropy_options_init`).
    fn default() -> CrossEntropyOptions {
        let mut raw = sys::te_cross_entropy_options::default();
        if unsafe { sys::te_cross_entropy_options_init(&mut raw) } != sys::te_status::TE_SUCCESS {
            // Cannot happen (a non-NULL options pointer); te.h's documented defaults.
            raw.ignore_index = -100;
            raw.grad_scale = 1.0;
        }
        CrossEntropyOptions {
            ignore_index: raw.ignore_index,
            grad_scale: raw.grad_scale,
        }
    }
}

impl CrossEntropyOptions {
    /// libte's defaults.
    pub fn new() -> CrossEntropyOptions {
        CrossEntropyOptions::default()
    }

    /// Sets `ignore_index`.
    pub fn ignore_index(mut self, ignore_index: i32) -> CrossEntropyOptions {
        self.ignore_index = ignore_index;
        self
    }

    /// Sets `grad_scale`.
    pub fn grad_scale(mut self, grad_scale: f32) -> CrossEntropyOptions {
        self.grad_scale = grad_scale;
        self
    }

    fn to_raw(self) -> Result<sys::te_cross_entropy_options> {
        let mut raw = sys::te_cross_entropy_options::default();
        check(unsafe { sys::te_cross_entropy_options_init(&mut raw) })?;
        raw.struct_size = std::mem::size_of::<sys::te_cross_entropy_options>();
        raw.ignore_index = self.ignore_index;
        raw.grad_scale = self.grad_scale;
        Ok(raw)
    }
}

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------

/// AdamW's hyper-parameters (`te_adamw_options` without the step number and the gradient-norm
/// output, which [`Context::adamw_step`] / [`AdamW::step`] take).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWOptions {
    /// Learning rate, >= 0. Default 1e-3.
    pub lr: f32,
    /// First-moment decay, in [0, 1). Default 0.9.
    pub beta1: f32,
    /// Second-moment decay, in [0, 1). Default 0.999.
    pub beta2: f32,
    /// Added to the denominator, > 0. Default 1e-8.
    pub eps: f32,
    /// Decoupled weight decay (`p -= lr * weight_decay * p` for the parameters that decay),
    /// >= 0. Default 0.01.
    pub weight_decay: f32,
    /// When positive, every gradient is scaled by `min(1, max_grad_norm / (norm + 1e-6))`, norm
    /// being the global L2 norm of all the step's gradients, and a non-finite norm skips the whole
    /// update. Default 0: no clipping.
    pub max_grad_norm: f32,
}

impl Default for AdamWOptions {
    /// libte's defaults (`te_adamw_options_init`).
    fn default() -> AdamWOptions {
        let mut raw = sys::te_adamw_options::default();
        if unsafe { sys::te_adamw_options_init(&mut raw) } != sys::te_status::TE_SUCCESS {
            // Not built yet, or cannot happen: te.h's documented defaults.
            raw.lr = 1e-3;
            raw.beta1 = 0.9;
            raw.beta2 = 0.999;
            raw.eps = 1e-8;
            raw.weight_decay = 0.01;
            raw.max_grad_norm = 0.0;
        }
        AdamWOptions {
            lr: raw.lr,
            beta1: raw.beta1,
            beta2: raw.beta2,
            eps: raw.eps,
            weight_decay: raw.weight_decay,
            max_grad_norm: raw.max_grad_norm,
        }
    }
}

impl AdamWOptions {
    /// libte's defaults.
    pub fn new() -> AdamWOptions {
        AdamWOptions::default()
    }

    /// Sets `lr`.
    pub fn lr(mut self, lr: f32) -> AdamWOptions {
        self.lr = lr;
        self
    }

    /// Sets `beta1` and `beta2`.
    pub fn betas(mut self, beta1: f32, beta2: f32) -> AdamWOptions {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self
    }

    /// Sets `eps`.
    pub fn eps(mut self, eps: f32) -> AdamWOptions {
        self.eps = eps;
        self
    }

    /// Sets `weight_decay`.
    pub fn weight_decay(mut self, weight_decay: f32) -> AdamWOptions {
        self.weight_decay = weight_decay;
        self
    }

    /// Sets `max_grad_norm` (0: no clipping).
    pub fn max_grad_norm(mut self, max_grad_norm: f32) -> AdamWOptions {
        self.max_grad_norm = max_grad_norm;
        self
    }

    fn to_raw(self, func: &str, step: u64, grad_norm: *mut f32) -> Result<sys::te_adamw_options> {
        let step = i64::try_from(step).map_err(|_| {
            Error::invalid_argument(format!(
                "{}: argument 'step': expected at most i64::MAX, got {}",
                func, step
            ))
        })?;
        let mut raw = sys::te_adamw_options::default();
        check(unsafe { sys::te_adamw_options_init(&mut raw) })?;
        raw.struct_size = std::mem::size_of::<sys::te_adamw_options>();
        raw.lr = self.lr;
        raw.beta1 = self.beta1;
        raw.beta2 = self.beta2;
        raw.eps = self.eps;
        raw.weight_decay = self.weight_decay;
        raw.max_grad_norm = self.max_grad_norm;
        raw.step = step;
        raw.grad_norm = grad_norm;
        Ok(raw)
    }
}

/// The module a parameter is the weight of (`te_module_kind` and its handle): after the update
/// `te_adamw_step` re-quantizes that module's FP8 weight cache from the new weight, so its next
/// forward may pass `weight_unchanged = true` and cast nothing.
///
/// The module is borrowed shared for the step: libte writes only its weight cache, which no
/// Rust value exposes, and the modules are not `Sync`, so no other thread can use it meanwhile.
/// A module borrowed mutably (a backward context alive) cannot be an owner.
#[derive(Debug, Clone, Copy)]
pub enum ParamOwner<'a> {
    /// The weight of a [`Linear`].
    Linear(&'a Linear),
    /// The weight of a [`LayerNormLinear`].
    LayerNormLinear(&'a LayerNormLinear),
    /// fc1's or fc2's weight of a [`LayerNormMlp`].
    LayerNormMlp(&'a LayerNormMlp, MlpGemm),
}

impl ParamOwner<'_> {
    fn raw(self) -> (sys::te_module_kind, *const std::os::raw::c_void, i32) {
        match self {
            ParamOwner::Linear(m) => (
                sys::te_module_kind::TE_MODULE_LINEAR,
                m.as_ptr() as *const _,
                0,
            ),
            ParamOwner::LayerNormLinear(m) => (
                sys::te_module_kind::TE_MODULE_LAYERNORM_LINEAR,
                m.as_ptr() as *const _,
                0,
            ),
            ParamOwner::LayerNormMlp(m, gemm) => (
                sys::te_module_kind::TE_MODULE_LAYERNORM_MLP,
                m.as_ptr() as *const _,
                gemm.to_raw().0 as i32,
            ),
        }
    }
}

/// One parameter of an AdamW step (`te_adamw_param`): every tensor on the context's device,
/// all with the same number of elements.
#[derive(Debug)]
pub struct AdamWParam<'a> {
    /// F32 master weights, updated in place.
    pub param: TensorViewMut<'a>,
    /// F32, F16 or BF16.
    pub grad: TensorView<'a>,
    /// F32 first moment, updated in place.
    pub exp_avg: TensorViewMut<'a>,
    /// F32 second moment, updated in place.
    pub exp_avg_sq: TensorViewMut<'a>,
    /// Optional F32/F16/BF16 copy of the new param written in the same pass (the weight the
    /// modules are given).
    pub model_weight: Option<TensorViewMut<'a>>,
    /// Apply the options' weight decay (default true; false for norms, biases, ...).
    pub weight_decay: bool,
    /// The module whose FP8 weight cache the step refreshes, if any.
    pub owner: Option<ParamOwner<'a>>,
}

impl<'a> AdamWParam<'a> {
    /// A parameter with its gradient and moments; decays, no model weight, no owner.
    pub fn new(
        param: TensorViewMut<'a>,
        grad: TensorView<'a>,
        exp_avg: TensorViewMut<'a>,
        exp_avg_sq: TensorViewMut<'a>,
    ) -> AdamWParam<'a> {
        AdamWParam {
            param,
            grad,
            exp_avg,
            exp_avg_sq,
            model_weight: None,
            weight_decay: true,
            owner: None,
        }
    }

    /// Writes the new param, rounded to `model_weight`'s dtype, into it.
    pub fn model_weight(mut self, model_weight: TensorViewMut<'a>) -> AdamWParam<'a> {
        self.model_weight = Some(model_weight);
        self
    }

    /// Sets whether the options' weight decay applies.
    pub fn weight_decay(mut self, decay: bool) -> AdamWParam<'a> {
        self.weight_decay = decay;
        self
    }

    /// Names the module whose weight this is.
    pub fn owner(mut self, owner: ParamOwner<'a>) -> AdamWParam<'a> {
        self.owner = Some(owner);
        self
    }

    /// The C struct; its tensor pointers point into `self`, valid while `self` is borrowed.
    fn c_param(&mut self) -> sys::te_adamw_param {
        let mut raw = sys::te_adamw_param::default();
        // Cannot fail on a non-NULL pointer; every field is set below anyway.
        let _ = unsafe { sys::te_adamw_param_init(&mut raw) };
        raw.struct_size = std::mem::size_of::<sys::te_adamw_param>();
        raw.param = self.param.as_raw_mut();
        raw.grad = self.grad.as_raw();
        raw.exp_avg = self.exp_avg.as_raw_mut();
        raw.exp_avg_sq = self.exp_avg_sq.as_raw_mut();
        raw.model_weight = match self.model_weight.as_mut() {
            Some(w) => w.as_raw_mut(),
            None => ptr::null_mut(),
        };
        raw.weight_decay = self.weight_decay as i32;
        let (kind, owner, gemm) = match self.owner {
            Some(o) => o.raw(),
            None => (sys::te_module_kind::TE_MODULE_NONE, ptr::null(), 0),
        };
        raw.owner_kind = kind;
        raw.owner = owner;
        raw.owner_gemm = gemm;
        raw
    }
}

/// An AdamW optimizer: its options and the number of the next step (1-based, for the bias
/// corrections), which advances only when a step succeeds. The parameters and moments stay the
/// caller's and are passed to each [`step`](AdamW::step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// The hyper-parameters; may be changed between steps (a learning-rate schedule).
    pub options: AdamWOptions,
    next_step: u64,
}

impl AdamW {
    /// An optimizer whose first step is step 1.
    pub fn new(options: AdamWOptions) -> AdamW {
        AdamW {
            options,
            next_step: 1,
        }
    }

    /// The number the next [`step`](AdamW::step) will use (1 before the first).
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Sets the next step's number (>= 1), e.g. when resuming from a checkpoint.
    pub fn set_next_step(&mut self, step: u64) {
        self.next_step = step;
    }

    /// One update of every parameter ([`Context::adamw_step`] with this optimizer's options and
    /// step number); on success the step number advances. Returns nothing; pass `grad_norm` to
    /// [`Context::adamw_step`] directly to receive the gradient norm.
    pub fn step(&mut self, ctx: &Context, params: &mut [AdamWParam<'_>]) -> Result<()> {
        ctx.adamw_step(&self.options, self.next_step, params, None)?;
        self.next_step += 1;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The ops
// ---------------------------------------------------------------------------------------------

fn too_many(func: &str, what: &str, n: usize) -> Error {
    Error::invalid_argument(format!(
        "{}: argument '{}': expected 1..={} tensors, got {}",
        func, what, MAX_COLUMN_PARTS, n
    ))
}

impl Context {
    /// `y = a + b` elementwise (fp32 arithmetic, rounded once to y's dtype); a, b and y of one
    /// dtype (F32/F16/BF16) and one shape. Errors: `InvalidArgument` (dtypes, shapes).
    pub fn add(
        &self,
        a: &TensorView<'_>,
        b: &TensorView<'_>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        check(unsafe { sys::te_add(self.as_ptr(), a.as_raw(), b.as_raw(), y.as_raw_mut()) })
    }

    /// `a += b` in place (te_add with y = a), e.g. a residual connection.
    pub fn add_inplace(&self, a: &mut TensorViewMut<'_>, b: &TensorView<'_>) -> Result<()> {
        let p = a.as_raw_mut();
        check(unsafe { sys::te_add(self.as_ptr(), p, b.as_raw(), p) })
    }

    /// Splits x `[..., c_0 + ... + c_{n-1}]` by columns into `outputs[i]` `[..., c_i]` (x's
    /// rows; any shape of `rows * c_i` elements whose last dimension is `c_i`). One dtype
    /// throughout (any, FP8 included: bytes are moved, scale_inv is not touched); 1..=64
    /// outputs, not overlapping x (the borrows rule that out). Exact copies.
    pub fn split_columns(
        &self,
        x: &TensorView<'_>,
        outputs: &mut [TensorViewMut<'_>],
    ) -> Result<()> {
        const F: &str = "Context::split_columns";
        if outputs.is_empty() || outputs.len() > MAX_COLUMN_PARTS {
            return Err(too_many(F, "outputs", outputs.len()));
        }
        let ptrs: Vec<*mut sys::te_tensor> = outputs.iter_mut().map(|t| t.as_raw_mut()).collect();
        check(unsafe {
            sys::te_split_columns(self.as_ptr(), x.as_raw(), ptrs.as_ptr(), ptrs.len())
        })
    }

    /// The inverse of [`split_columns`](Context::split_columns): y `[..., sum c_i]` from
    /// `inputs[i]` `[..., c_i]`.
    pub fn concat_columns(
        &self,
        inputs: &[TensorView<'_>],
        y: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        const F: &str = "Context::concat_columns";
        if inputs.is_empty() || inputs.len() > MAX_COLUMN_PARTS {
            return Err(too_many(F, "inputs", inputs.len()));
        }
        let ptrs: Vec<*const sys::te_tensor> =
            inputs.iter().map(|t| t.as_raw() as *const _).collect();
        check(unsafe {
            sys::te_concat_columns(self.as_ptr(), ptrs.as_ptr(), ptrs.len(), y.as_raw_mut())
        })
    }

    /// Token embedding, a gather: `y[t, :] = table[ids[t], :]`. table: F32/F16/BF16
    /// `[vocab, dim]`; ids: I32, any shape (n tokens); y: the table's dtype, n * dim elements,
    /// last dimension dim. An id outside `[0, vocab)`: `InvalidArgument` naming the position on
    /// the CPU, nothing written (CUDA writes that row as zeros).
    pub fn embedding_forward(
        &self,
        table: &TensorView<'_>,
        ids: &TensorView<'_>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        check(unsafe {
            sys::te_embedding_forward(self.as_ptr(), table.as_raw(), ids.as_raw(), y.as_raw_mut())
        })
    }

    /// The embedding's gradient, a scatter-add: `dtable[ids[t], :] += dy[t, :]`. dtable: F32
    /// `[vocab, dim]`, zeroed first unless `accumulate`; dy: F32/F16/BF16, n * dim elements.
    /// Deterministic (each row sums its tokens in increasing t, in fp32). Ids out of range: as
    /// the forward.
    pub fn embedding_backward(
        &self,
        ids: &TensorView<'_>,
        dy: &TensorView<'_>,
        dtable: &mut TensorViewMut<'_>,
        accumulate: bool,
    ) -> Result<()> {
        check(unsafe {
            sys::te_embedding_backward(
                self.as_ptr(),
                ids.as_raw(),
                dy.as_raw(),
                dtable.as_raw_mut(),
                accumulate as i32,
            )
        })
    }

    /// Softmax cross-entropy fused over the vocabulary, the mean over the tokens whose target is
    /// not `ignore_index`: `loss = mean_t (logsumexp(logits[t]) - logits[t, target[t]])`, and in
    /// the same pass, when `dlogits` is given, `grad_scale * (softmax(logits[t]) -
    /// onehot(target[t])) / count` (zero rows for ignored tokens). logits: F32/F16/BF16
    /// `[..., vocab]`; targets: I32, one per row; loss: F32, one element; dlogits: logits'
    /// dtype and shape. No counted token: loss 0, zero dlogits. A target outside `[0, vocab)`
    /// other than ignore_index: `InvalidArgument` naming the token (CPU).
    pub fn cross_entropy(
        &self,
        opts: &CrossEntropyOptions,
        logits: &TensorView<'_>,
        targets: &TensorView<'_>,
        loss: &mut TensorViewMut<'_>,
        dlogits: Option<&mut TensorViewMut<'_>>,
    ) -> Result<()> {
        let raw = opts.to_raw()?;
        let d = match dlogits {
            Some(d) => d.as_raw_mut(),
            None => ptr::null_mut(),
        };
        check(unsafe {
            sys::te_cross_entropy(
                self.as_ptr(),
                &raw,
                logits.as_raw(),
                targets.as_raw(),
                loss.as_raw_mut(),
                d,
            )
        })
    }

    /// [`cross_entropy`](Context::cross_entropy) writing dlogits over the logits (in place).
    pub fn cross_entropy_inplace(
        &self,
        opts: &CrossEntropyOptions,
        logits: &mut TensorViewMut<'_>,
        targets: &TensorView<'_>,
        loss: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        let raw = opts.to_raw()?;
        let p = logits.as_raw_mut();
        check(unsafe {
            sys::te_cross_entropy(
                self.as_ptr(),
                &raw,
                p,
                targets.as_raw(),
                loss.as_raw_mut(),
                p,
            )
        })
    }

    /// One fused AdamW update (PyTorch's `torch.optim.AdamW` formulas, fp32) of every
    /// parameter, `step` being this update's 1-based number. `grad_norm`, when given, is one F32
    /// element on the context's device that receives the global gradient norm (computed even
    /// without clipping). Parameters with an owner have that module's FP8 weight cache
    /// refreshed. Errors: `InvalidArgument` (shapes, dtypes, devices, a tensor given twice,
    /// options out of range, an owner whose weight shape differs); on failure nothing changes.
    pub fn adamw_step(
        &self,
        opts: &AdamWOptions,
        step: u64,
        params: &mut [AdamWParam<'_>],
        grad_norm: Option<&mut TensorViewMut<'_>>,
    ) -> Result<()> {
        const F: &str = "Context::adamw_step";
        let norm_ptr = match grad_norm {
            None => ptr::null_mut(),
            Some(t) => {
                // libte takes a bare float pointer: what its descriptor would say is checked here.
                let on_device = match self.device() {
                    Device::Cpu => t.as_view().is_host(),
                    _ => !t.as_view().is_host(),
                };
                if t.dtype() != DType::F32 || t.numel() != 1 || !on_device {
                    return Err(Error::invalid_argument(format!(
                        "{}: argument 'grad_norm': expected one F32 element on the context's \
                         device, got {:?} {:?} on {}",
                        F,
                        t.dtype(),
                        t.shape(),
                        if t.as_view().is_host() {
                            "the host"
                        } else {
                            "a device"
                        }
                    )));
                }
                t.as_raw().data as *mut f32
            }
        };
        let raw_opts = opts.to_raw(F, step, norm_ptr)?;
        let raw: Vec<sys::te_adamw_param> = params.iter_mut().map(|p| p.c_param()).collect();
        check(
            self.reducing(|ctx| unsafe {
                sys::te_adamw_step(ctx, &raw_opts, raw.as_ptr(), raw.len())
            }),
        )
    }
}
