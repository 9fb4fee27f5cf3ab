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
