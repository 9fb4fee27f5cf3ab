//! `Context`: one device, one stream, one autocast stack; and the ops that need only a context.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use libte_sys as sys;

use crate::error::{check, Error, Result, Status};
use crate::group::GroupHandle;
use crate::tensor::{TensorView, TensorViewMut};

/// A device a context runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Device {
    /// The host.
    Cpu,
    /// A CUDA GPU by ordinal.
    Cuda(i32),
}

impl Device {
    fn to_raw(self) -> sys::te_device {
        match self {
            Device::Cpu => sys::te_device {
                type_: sys::te_device_type::TE_DEVICE_CPU,
                index: 0,
            },
            Device::Cuda(index) => sys::te_device {
                type_: sys::te_device_type::TE_DEVICE_CUDA,
                index,
            },
        }
    }

    fn from_raw(raw: sys::te_device) -> Option<Device> {
        match raw.type_ {
            sys::te_device_type::TE_DEVICE_CPU => Some(Device::Cpu),
            sys::te_device_type::TE_DEVICE_CUDA => Some(Device::Cuda(raw.index)),
            _ => None,
        }
    }
}

/// A handle of the context's that was dropped but not yet destroyed.
enum Dead {
    Linear(*mut sys::te_linear),
    Backward(*mut sys::te_linear_backward_ctx),
    Residuals(*mut c_void), // te_linear_residuals::internal
    /// Any other handle (the transformer modules', their backward contexts' and residuals'
    /// `internal`) with the function that destroys it.
    Handle(*mut c_void, unsafe fn(*mut c_void)),
}

impl Dead {
    /// # Safety
    /// On the thread that has the context now, or with no context owner left.
    unsafe fn destroy(self) {
        match self {
            Dead::Linear(p) => sys::te_linear_destroy(p),
            Dead::Backward(p) => sys::te_linear_backward_ctx_destroy(p),
            Dead::Residuals(internal) => {
                // Release reads only `internal`; the tensors were views of what it owns.
                let mut r = sys::te_linear_residuals {
                    struct_size: std::mem::size_of::<sys::te_linear_residuals>(),
                    ..Default::default()
                };
                r.internal = internal;
                sys::te_linear_residuals_release(&mut r)
            }
            Dead::Handle(p, destroy) => destroy(p),
        }
    }
}

struct Graveyard {
    owner_alive: bool,
    dead: Vec<Dead>,
}

/// The `te_context`, shared by the `Context` and every handle made with it.
///
/// libte requires that linears and backward contexts are destroyed before their context, on the
/// thread that has the context (destroying them touches the context's autocast buckets and
/// object pools). Every such handle holds an `Arc<Shared>`, so the `te_context` is destroyed
/// only after the last of them. A handle dropped while the `Context` lives is not destroyed on
/// the spot (it may be dropped on another thread: handles are `Send`): it goes to the graveyard,
/// which the `Context` empties on its own thread at its next call or when it is dropped. Once
/// the `Context` is gone nobody else calls into the `te_context`, and handles destroy
/// themselves, one at a time under the graveyard's lock.
///
/// It also holds every group an autocast scope on the context used, by id: libte keeps
/// pointers to them past the scope (see `GroupHandle`), so they are destroyed after the
/// `te_context` (fields drop after `Drop::drop`).
pub(crate) struct Shared {
    raw: NonNull<sys::te_context>,
    graveyard: Mutex<Graveyard>,
    pending: AtomicBool,
    groups: Mutex<Vec<Arc<GroupHandle>>>,
}

// The raw context is only used by the one thread that has the `Context` (which is !Sync), or,
// after the `Context` is dropped, under the graveyard lock; see above.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Graveyard> {
        // Nothing panics while holding it; a poisoned lock still guards consistent data.
        self.graveyard.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn raw(&self) -> *mut sys::te_context {
        self.raw.as_ptr()
    }

    pub(crate) fn dispose_linear(&self, p: *mut sys::te_linear) {
        self.dispose(Dead::Linear(p))
    }

    pub(crate) fn dispose_backward(&self, p: *mut sys::te_linear_backward_ctx) {
        self.dispose(Dead::Backward(p))
    }

    pub(crate) fn dispose_residuals(&self, internal: *mut c_void) {
        self.dispose(Dead::Residuals(internal))
    }

    /// Destroys `p` with `destroy` now or, while the `Context` lives, on its thread (as the
    /// other `dispose_*`).
    pub(crate) fn dispose_with(&self, p: *mut c_void, destroy: unsafe fn(*mut c_void)) {
        self.dispose(Dead::Handle(p, destroy))
    }

    fn dispose(&self, dead: Dead) {
        let mut yard = self.lock();
        if yard.owner_alive {
            yard.dead.push(dead);
            self.pending.store(true, Ordering::Release);
        } else {
            unsafe { dead.destroy() };
        }
    }

    /// Keeps `group` alive as long as the `te_context` (a scope on it was opened with it).
    pub(crate) fn use_group(&self, group: &Arc<GroupHandle>) {
        let mut groups = self.lock_groups();
        if let Err(at) = groups.binary_search_by_key(&group.id(), |g| g.id()) {
            groups.insert(at, Arc::clone(group));
        }
    }

    fn lock_groups(&self) -> MutexGuard<'_, Vec<Arc<GroupHandle>>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Destroys what was dropped since the last call. Only the `Context`'s thread calls this.
    #[inline]
    fn collect(&self) {
        if self.pending.load(Ordering::Acquire) {
            let mut yard = self.lock();
            self.pending.store(false, Ordering::Relaxed);
            for dead in yard.dead.drain(..) {
                unsafe { dead.destroy() };
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last reference: the Context and every handle are gone (and the graveyard empty).
        let yard = self.graveyard.get_mut().unwrap_or_else(|e| e.into_inner());
        for dead in yard.dead.drain(..) {
            unsafe { dead.destroy() };
        }
        unsafe { sys::te_context_destroy(self.raw.as_ptr()) };
    }
}

/// Counters of the work autocast did on a context since its creation (`te_context_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ContextStats {
    /// Autocast scopes that ended successfully.
    pub scopes_closed: u64,
    /// Fused scale-update launches (one per bucket and pass).
    pub bucket_updates: u64,
    /// Group all-reduces issued.
    pub amax_reductions: u64,
    /// Scaling states updated, summed over the launches.
    pub states_updated: u64,
}

/// Element-wise activations with a forward and a backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Activation {
    /// max(x, 0).
    Relu,
    /// GELU, tanh approximation (as TE).
    Gelu,
    /// `x [..., 2n] -> silu(x[..., :n]) * x[..., n:] : [..., n]`.
    Swiglu,
    /// `x [..., 2n] -> gelu(x[..., :n]) * x[..., n:] : [..., n]`.
    Geglu,
    /// Squared ReLU: max(x, 0)^2.
    Srelu,
}

impl Activation {
    pub(crate) fn from_raw(raw: sys::te_activation) -> Option<Activation> {
        match raw {
            sys::te_activation::TE_ACTIVATION_RELU => Some(Activation::Relu),
            sys::te_activation::TE_ACTIVATION_GELU => Some(Activation::Gelu),
            sys::te_activation::TE_ACTIVATION_SWIGLU => Some(Activation::Swiglu),
            sys::te_activation::TE_ACTIVATION_GEGLU => Some(Activation::Geglu),
            sys::te_activation::TE_ACTIVATION_SRELU => Some(Activation::Srelu),
            _ => None,
        }
    }

    pub(crate) fn to_raw(self) -> sys::te_activation {
        match self {
            Activation::Relu => sys::te_activation::TE_ACTIVATION_RELU,
            Activation::Gelu => sys::te_activation::TE_ACTIVATION_GELU,
            Activation::Swiglu => sys::te_activation::TE_ACTIVATION_SWIGLU,
            Activation::Geglu => sys::te_activation::TE_ACTIVATION_GEGLU,
            Activation::Srelu => sys::te_activation::TE_ACTIVATION_SRELU,
        }
    }

    /// Gated: halves the last dimension (SwiGLU, GeGLU).
    pub fn is_gated(self) -> bool {
        matches!(self, Activation::Swiglu | Activation::Geglu)
    }
}

/// How `Context::quantize` picks its scale.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum QuantizeScale {
    /// Delayed scaling: this scale (per-tensor scaling only).
    Given(f32),
    /// Current scaling: from the tensor's amax, clamped up to `amax_epsilon`, optionally keeping
    /// only the scale's power of two.
    FromAmax {
        /// amax is clamped up to this; >= 0.
        amax_epsilon: f32,
        /// Keep only the scale's exponent.
        power_of_2_scales: bool,
    },
}

impl Default for QuantizeScale {
    fn default() -> Self {
        QuantizeScale::FromAmax {
            amax_epsilon: 0.0,
            power_of_2_scales: false,
        }
    }
}

/// An execution context (`te_context`): one device, one stream, one autocast stack.
///
/// `Send` but not `Sync`: one thread at a time, as libte requires. Every call that needs a
/// context takes `&Context`; opening an autocast scope takes `&mut Context`
/// (see [`crate::Autocast`]).
/// Layers and backward contexts made with it keep the `te_context` alive, so dropping them in
/// any order is safe.
pub struct Context {
    shared: Arc<Shared>,
    device: Device,
    _not_sync: PhantomData<Cell<()>>,
}

impl Context {
    /// A context on the default device: CUDA 0 when usable, else the CPU.
    pub fn new() -> Result<Context> {
        Context::create(None)
    }

    /// A context on `device`.
    pub fn with_device(device: Device) -> Result<Context> {
        Context::create(Some(device))
    }

    /// A context on the CPU (the host): what slices-backed tensors need.
    pub fn cpu() -> Result<Context> {
        Context::with_device(Device::Cpu)
    }

    fn create(device: Option<Device>) -> Result<Context> {
        let mut opts = sys::te_context_options::default();
        check(unsafe { sys::te_context_options_init(&mut opts) })?;
        if let Some(device) = device {
            opts.use_default_device = 0;
            opts.device = device.to_raw();
        }
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_context_create(&mut raw, &opts) })?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::Internal, "te_context_create returned NULL"))?;
        let shared = Arc::new(Shared {
            raw,
            graveyard: Mutex::new(Graveyard {
                owner_alive: true,
                dead: Vec::new(),
            }),
            pending: AtomicBool::new(false),
            groups: Mutex::new(Vec::new()),
        });
        let mut dev = sys::te_device::default();
        check(unsafe { sys::te_context_get_device(raw.as_ptr(), &mut dev) })?;
        let device = Device::from_raw(dev).ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                "te_context_get_device: a device type this binding does not know",
            )
        })?;
        Ok(Context {
            shared,
            device,
            _not_sync: PhantomData,
        })
    }

    /// The raw handle, for calling `libte-sys` directly. Valid while `self` lives; the usual
    /// rules apply (this thread only, do not destroy it).
    pub fn as_ptr(&self) -> *mut sys::te_context {
        self.shared.collect();
        self.shared.raw()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Makes a libte call that may all-reduce amaxes over the groups this context's scopes used
    /// (`te_autocast_end`, a forward, a backward, `te_autocast_flush_backward`), holding the
    /// turn of each multi-rank one: NCCL communicators are not thread-safe, and
    /// `te_group_abort` must not run meanwhile. Turns are taken in id order (the list is
    /// sorted), the same in every context, so two contexts cannot deadlock.
    pub(crate) fn reducing<T>(&self, call: impl FnOnce(*mut sys::te_context) -> T) -> T {
        let raw = self.as_ptr();
        let groups = self.shared.lock_groups();
        let _turns: Vec<_> = groups.iter().filter_map(|g| g.lock_reductions()).collect();
        call(raw)
    }

    /// The context's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets the CUDA stream work is enqueued on (NULL: the legacy default stream).
    ///
    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the context's device (or NULL), alive while
    /// the context uses it. A non-NULL stream on a CPU context is an error.
    pub unsafe fn set_stream(&self, stream: *mut c_void) -> Result<()> {
        check(sys::te_context_set_stream(self.as_ptr(), stream))
    }

    /// Waits for all work enqueued by this context (a no-op on the CPU).
    pub fn synchronize(&self) -> Result<()> {
        check(unsafe { sys::te_context_synchronize(self.as_ptr()) })
    }

    /// What autocast did on this context so far.
    pub fn stats(&self) -> Result<ContextStats> {
        let mut raw = sys::te_context_stats {
            struct_size: std::mem::size_of::<sys::te_context_stats>(),
            ..Default::default()
        };
        check(unsafe { sys::te_context_get_stats(self.as_ptr(), &mut raw) })?;
        Ok(ContextStats {
            scopes_closed: raw.scopes_closed,
            bucket_updates: raw.bucket_updates,
            amax_reductions: raw.amax_reductions,
            states_updated: raw.states_updated,
        })
    }

    /// Reduces and updates every pending backward bucket now, oldest pass first.
    pub fn flush_backward(&self) -> Result<()> {
        check(self.reducing(|ctx| unsafe { sys::te_autocast_flush_backward(ctx) }))
    }

    /// `y = act(x)`, computed in fp32. x, y: F32, F16 or BF16, same dtype; y has x's shape
    /// (last dimension halved for the gated SwiGLU and GeGLU).
    pub fn activation_forward(
        &self,
        act: Activation,
        x: &TensorView<'_>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        check(unsafe {
            sys::te_activation_forward(self.as_ptr(), act.to_raw(), x.as_raw(), y.as_raw_mut())
        })
    }

    /// `dx = dy * act'(x)`: dy has y's shape, dx has x's.
    pub fn activation_backward(
        &self,
        act: Activation,
        x: &TensorView<'_>,
        dy: &TensorView<'_>,
        dx: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        check(unsafe {
            sys::te_activation_backward(
                self.as_ptr(),
                act.to_raw(),
                x.as_raw(),
                dy.as_raw(),
                dx.as_raw_mut(),
            )
        })
    }

    /// `out = saturate_rne(x * scale)` into FP8 `out`, writing its scale_inv (per tensor or per
    /// block, by `out`'s scaling mode). Returns x's amax.
    ///
    /// The scale and the amax live in host memory here, so this needs a CPU context.
    pub fn quantize(
        &self,
        x: &TensorView<'_>,
        out: &mut TensorViewMut<'_>,
        scale: QuantizeScale,
    ) -> Result<f32> {
        self.require_host("Context::quantize")?;
        let mut opts = sys::te_quantize_options::default();
        check(unsafe { sys::te_quantize_options_init(&mut opts) })?;
        let given;
        match scale {
            QuantizeScale::Given(s) => {
                given = s;
                opts.scale = &given;
            }
            QuantizeScale::FromAmax {
                amax_epsilon,
                power_of_2_scales,
            } => {
                opts.amax_epsilon = amax_epsilon;
                opts.power_of_2_scales = power_of_2_scales as i32;
            }
        }
        let mut amax = 0.0f32;
        opts.amax = &mut amax;
        check(unsafe { sys::te_quantize(self.as_ptr(), x.as_raw(), out.as_raw_mut(), &opts) })?;
        Ok(amax)
    }

    /// `out = code * scale_inv` (per block), into F32, F16 or BF16 of x's shape.
    pub fn dequantize(&self, x: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
        check(unsafe { sys::te_dequantize(self.as_ptr(), x.as_raw(), out.as_raw_mut()) })
    }

    /// max |x| (NaN if x holds a NaN). Needs a CPU context (the result is written to the host).
    pub fn amax(&self, x: &TensorView<'_>) -> Result<f32> {
        self.require_host("Context::amax")?;
        let mut amax = 0.0f32;
        check(unsafe { sys::te_amax(self.as_ptr(), x.as_raw(), &mut amax) })?;
        Ok(amax)
    }

    fn require_host(&self, func: &str) -> Result<()> {
        if self.device == Device::Cpu {
            Ok(())
        } else {
            Err(Error::new(
                Status::Unsupported,
                format!(
                    "{}: needs a CPU context (its scalars are host memory), this one is on {:?}",
                    func, self.device
                ),
            ))
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Destroy what was dropped already, and from now on let handles destroy themselves.
        // Under the lock, so that a handle dropped on another thread meanwhile waits.
        let mut yard = self.shared.lock();
        yard.owner_alive = false;
        for dead in yard.dead.drain(..) {
            unsafe { dead.destroy() };
        }
        self.shared.pending.store(false, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}
