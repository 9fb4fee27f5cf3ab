//! What the transformer modules share: te.h gives `LayerNormLinear`, `LayerNormMLP` and
//! `GroupedLinear` `te_linear`'s contract point for point, so their handles, scaling states,
//! state bytes and backward flags work alike.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use libte_sys as sys;

use crate::context::{Context, Shared};
use crate::error::{check, Error, Result, Status};
use crate::linear::ScalingStateInfo;
use crate::tensor::{DType, TensorView};

/// A libte handle owned by a Rust value: destroyed by `destroy` when dropped, through the
/// context's graveyard (so on the context's thread, and before the `te_context`).
pub(crate) struct Owned<T> {
    raw: NonNull<T>,
    shared: Arc<Shared>,
    destroy: unsafe fn(*mut c_void),
    _not_sync: PhantomData<Cell<()>>,
}

// The handle is used only through `&mut`/`&` of its owner, which is Send and not Sync.
unsafe impl<T> Send for Owned<T> {}

impl<T> Owned<T> {
    /// Takes over `raw`, which `func` just made on `ctx` (NULL is libte's bug: `Internal`).
    pub(crate) fn new(
        raw: *mut T,
        ctx: &Context,
        func: &str,
        destroy: unsafe fn(*mut c_void),
    ) -> Result<Owned<T>> {
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::Internal, format!("{} returned NULL", func)))?;
        Ok(Owned {
            raw,
            shared: Arc::clone(ctx.shared()),
            destroy,
            _not_sync: PhantomData,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut T {
        self.raw.as_ptr()
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        self.shared
            .dispose_with(self.raw.as_ptr().cast(), self.destroy);
    }
}

/// A residuals struct libte filled (its tensors are views of what `internal` owns): released
/// by `release` when dropped unless it was handed to a `forward_save` (which empties
/// `internal`).
pub(crate) struct OwnedResiduals<R> {
    pub(crate) raw: R,
    internal: fn(&R) -> *mut c_void,
    release: unsafe fn(*mut c_void),
    shared: Arc<Shared>,
    _not_sync: PhantomData<Cell<()>>,
}

// The tensors point to libte's storage, used only through the owner (Send, not Sync).
unsafe impl<R> Send for OwnedResiduals<R> {}

impl<R> OwnedResiduals<R> {
    pub(crate) fn new(
        raw: R,
        ctx: &Context,
        internal: fn(&R) -> *mut c_void,
        release: unsafe fn(*mut c_void),
    ) -> OwnedResiduals<R> {
        OwnedResiduals {
            raw,
            internal,
            release,
            shared: Arc::clone(ctx.shared()),
            _not_sync: PhantomData,
        }
    }
}

impl<R> Drop for OwnedResiduals<R> {
    fn drop(&mut self) {
        let internal = (self.internal)(&self.raw);
        if !internal.is_null() {
            self.shared.dispose_with(internal, self.release);
        }
    }
}

/// A residual tensor as a view borrowed from its owner; `None` for one the forward did not
/// keep (RMSNorm's mu has NULL data).
pub(crate) fn residual_view(raw: &sys::te_tensor) -> Result<Option<TensorView<'_>>> {
    if raw.data.is_null() {
        return Ok(None);
    }
    // libte owns it until the residuals are saved or released; the borrow outlives neither.
    unsafe { TensorView::from_foreign(*raw) }.map(Some)
}

/// A residual tensor every forward keeps.
pub(crate) fn required_view<'r>(raw: &'r sys::te_tensor, func: &str) -> Result<TensorView<'r>> {
    residual_view(raw)?.ok_or_else(|| {
        Error::new(
            Status::Internal,
            format!("{}: libte left a residual tensor empty", func),
        )
    })
}

/// `te_linear_backward_args` with `flags`.
pub(crate) fn backward_args(flags: u32) -> sys::te_linear_backward_args {
    let mut args = sys::te_linear_backward_args::default();
    let _ = unsafe { sys::te_linear_backward_args_init(&mut args) };
    args.struct_size = std::mem::size_of::<sys::te_linear_backward_args>();
    args.flags = flags;
    args
}

/// One scaling state, read with `get(info, history, capacity)` (a module's
/// `te_*_get_scaling_state` with its other arguments bound): called twice, without a buffer
/// for the history's length, then to fill it.
pub(crate) fn read_scaling_state(
    get: impl Fn(&mut sys::te_scaling_state_info, *mut f32, usize) -> sys::te_status,
) -> Result<ScalingStateInfo> {
    let mut info = sys::te_scaling_state_info {
        struct_size: std::mem::size_of::<sys::te_scaling_state_info>(),
        ..Default::default()
    };
    check(get(&mut info, ptr::null_mut(), 0))?;
    let mut history = vec![0.0f32; info.amax_history_len.max(0) as usize];
    if !history.is_empty() {
        check(get(&mut info, history.as_mut_ptr(), history.len()))?;
        history.truncate(info.amax_history_len.max(0) as usize);
    }
    Ok(ScalingStateInfo {
        scale: info.scale,
        scale_inv: info.scale_inv,
        amax_history: history,
        fp8_dtype: DType::from_raw(info.fp8_dtype),
    })
}

/// A module's state bytes, from `save(buf, capacity, size)` (its `te_*_state_save`): called
/// twice, without a buffer for the size, then to fill it.
pub(crate) fn save_state(
    save: impl Fn(*mut c_void, usize, &mut usize) -> sys::te_status,
) -> Result<Vec<u8>> {
    let mut size = 0usize;
    check(save(ptr::null_mut(), 0, &mut size))?;
    let mut buf = vec![0u8; size];
    check(save(buf.as_mut_ptr().cast(), buf.len(), &mut size))?;
    buf.truncate(size);
    Ok(buf)
}

/// A feature count as libte's `int64_t` (`func`'s `opts.name`).
pub(crate) fn features(n: usize, func: &str, name: &str) -> Result<i64> {
    i64::try_from(n).map_err(|_| {
        Error::invalid_argument(format!(
            "{}: argument 'opts.{}': expected at most i64::MAX, got {}",
            func, name, n
        ))
    })
}

/// Host memory for residuals in the caller's memory (`forward_compute_into` /
/// `backward_from` of every module): zeroed, 16-byte aligned as libte requires, of a given
/// size in bytes. Dereferences to `[u8]`.
#[derive(Clone)]
pub struct ResidualBuffer {
    blocks: Vec<Align16>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Align16([u8; 16]);

impl ResidualBuffer {
    /// `bytes` zero bytes (a `residuals_size` result).
    pub fn new(bytes: usize) -> ResidualBuffer {
        ResidualBuffer {
            blocks: vec![Align16([0; 16]); (bytes + 15) / 16],
            len: bytes,
        }
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for ResidualBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // `blocks` holds at least `len` initialised bytes, contiguous (repr(C) arrays).
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.len) }
    }
}

impl std::ops::DerefMut for ResidualBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl std::fmt::Debug for ResidualBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidualBuffer")
            .field("len", &self.len)
            .finish()
    }
}

/// Host residual memory for a C call: refused on a device context (libte's kernels would read
/// host memory as device memory); an empty slice is NULL with 0 bytes.
fn host_residuals(ctx: &Context, func: &str) -> Result<()> {
    if ctx.device() == crate::context::Device::Cpu {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "{}: argument 'residuals': host memory needs a CPU context, this one is {:?} (device memory goes through libte::sys)",
            func,
            ctx.device()
        )))
    }
}

pub(crate) fn residual_memory(
    ctx: &Context,
    func: &str,
    mem: &[u8],
) -> Result<(*const c_void, usize)> {
    host_residuals(ctx, func)?;
    if mem.is_empty() {
        Ok((ptr::null(), 0))
    } else {
        Ok((mem.as_ptr().cast(), mem.len()))
    }
}

pub(crate) fn residual_memory_mut(
    ctx: &Context,
    func: &str,
    mem: &mut [u8],
) -> Result<(*mut c_void, usize)> {
    host_residuals(ctx, func)?;
    if mem.is_empty() {
        Ok((ptr::null_mut(), 0))
    } else {
        Ok((mem.as_mut_ptr().cast(), mem.len()))
    }
}
