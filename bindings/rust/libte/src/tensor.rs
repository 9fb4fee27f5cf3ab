//! Tensor views: `te_tensor` descriptors of memory the caller owns, borrowed for `'a`.

use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::slice;

use libte_sys as sys;

use crate::error::{check, Error, Result};
use crate::half::{Bf16, F16};

/// Element types of a `te_tensor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `TE_DTYPE_F32`.
    F32,
    /// `TE_DTYPE_F16`.
    F16,
    /// `TE_DTYPE_BF16`.
    BF16,
    /// `TE_DTYPE_E4M3`: FP8 e4m3fn, max 448, no infinities.
    E4M3,
    /// `TE_DTYPE_E5M2`: FP8 e5m2, max 57344, IEEE-style inf and NaN.
    E5M2,
    /// `TE_DTYPE_I32`: 32-bit integers (attention's and RoPE's sequence offsets, `cu_seqlens`).
    I32,
}

impl DType {
    pub(crate) fn to_raw(self) -> sys::te_dtype {
        match self {
            DType::F32 => sys::te_dtype::TE_DTYPE_F32,
            DType::F16 => sys::te_dtype::TE_DTYPE_F16,
            DType::BF16 => sys::te_dtype::TE_DTYPE_BF16,
            DType::E4M3 => sys::te_dtype::TE_DTYPE_E4M3,
            DType::E5M2 => sys::te_dtype::TE_DTYPE_E5M2,
            DType::I32 => sys::te_dtype::TE_DTYPE_I32,
        }
    }

    pub(crate) fn from_raw(raw: sys::te_dtype) -> Option<DType> {
        Some(match raw {
            sys::te_dtype::TE_DTYPE_F32 => DType::F32,
            sys::te_dtype::TE_DTYPE_F16 => DType::F16,
            sys::te_dtype::TE_DTYPE_BF16 => DType::BF16,
            sys::te_dtype::TE_DTYPE_E4M3 => DType::E4M3,
            sys::te_dtype::TE_DTYPE_E5M2 => DType::E5M2,
            sys::te_dtype::TE_DTYPE_I32 => DType::I32,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::E4M3 | DType::E5M2 => 1,
        }
    }

    /// E4M3 or E5M2.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::E4M3 | DType::E5M2)
    }
}

/// How an FP8 tensor's `scale_inv` is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScalingMode {
    /// One float for the whole tensor.
    PerTensor,
    /// One float per 1x128 block of each row: `[rows][ceil(cols/128)]`.
    Block1x128,
    /// One float per 128x128 tile: `[ceil(rows/128)][ceil(cols/128)]`.
    Block128x128,
}

impl ScalingMode {
    pub(crate) fn to_raw(self) -> sys::te_scaling_mode {
        match self {
            ScalingMode::PerTensor => sys::te_scaling_mode::TE_SCALING_PER_TENSOR,
            ScalingMode::Block1x128 => sys::te_scaling_mode::TE_SCALING_BLOCK_1X128,
            ScalingMode::Block128x128 => sys::te_scaling_mode::TE_SCALING_BLOCK_128X128,
        }
    }

    pub(crate) fn from_raw(raw: sys::te_scaling_mode) -> Option<ScalingMode> {
        Some(match raw {
            sys::te_scaling_mode::TE_SCALING_PER_TENSOR => ScalingMode::PerTensor,
            sys::te_scaling_mode::TE_SCALING_BLOCK_1X128 => ScalingMode::Block1x128,
            sys::te_scaling_mode::TE_SCALING_BLOCK_128X128 => ScalingMode::Block128x128,
            _ => return None,
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for crate::half::F16 {}
    impl Sealed for crate::half::Bf16 {}
    impl Sealed for i32 {}
}

/// An element type a slice of which can back a tensor: `f32`, [`F16`], [`Bf16`] (the
/// high-precision types) and `i32` (sequence offsets). Sealed: libte reads and writes these as
/// its `DTYPE`, so the layout must match exactly.
pub trait Element: Copy + sealed::Sealed {
    /// The `te_dtype` of this type.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for F16 {
    const DTYPE: DType = DType::F16;
}
impl Element for Bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

/// The most dimensions a tensor has (`TE_MAX_DIMS`).
pub const MAX_DIMS: usize = sys::TE_MAX_DIMS as usize;

/// Fills a descriptor for `len` elements of `dtype` at `data`, checking what only Rust knows:
/// the shape fits `te_tensor` and its product is the slice's length. The rest (a dimension < 1,
/// a dtype the callee does not take, shapes that do not fit together) libte checks and reports.
fn describe(
    func: &str,
    data: *mut c_void,
    len: usize,
    dtype: DType,
    shape: &[usize],
) -> Result<sys::te_tensor> {
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return Err(Error::invalid_argument(format!(
            "{}: argument 'shape': expected 1..={} dimensions, got {}",
            func,
            MAX_DIMS,
            shape.len()
        )));
    }
    let mut raw = sys::te_tensor::default();
    let mut numel: usize = 1;
    for (i, &d) in shape.iter().enumerate() {
        let dim = i64::try_from(d).map_err(|_| {
            Error::invalid_argument(format!(
                "{}: argument 'shape': dimension {} is {}, more than i64::MAX",
                func, i, d
            ))
        })?;
        raw.shape[i] = dim;
        numel = numel.checked_mul(d).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{}: argument 'shape': {:?} has more elements than usize holds",
                func, shape
            ))
        })?;
    }
    if numel != len {
        return Err(Error::invalid_argument(format!(
            "{}: argument 'data': expected {} elements for shape {:?}, got a slice of {}",
            func, numel, shape, len
        )));
    }
    raw.data = data;
    raw.dtype = dtype.to_raw();
    raw.ndim = shape.len() as i32;
    raw.device = sys::te_device {
        type_: sys::te_device_type::TE_DEVICE_CPU,
        index: 0,
    };
    raw.scaling = sys::te_scaling_mode::TE_SCALING_PER_TENSOR;
    Ok(raw)
}

/// [`describe`] for FP8 codes with their `scale_inv` attached: also checks that `dtype` is FP8
/// and that `scale_inv_len` floats are enough for the shape and scaling mode.
#[allow(clippy::too_many_arguments)] // two (pointer, length) pairs, as in `describe`
fn describe_fp8(
    func: &str,
    codes: *mut c_void,
    codes_len: usize,
    dtype: DType,
    shape: &[usize],
    scale_inv: *mut f32,
    scale_inv_len: usize,
    scaling: ScalingMode,
) -> Result<sys::te_tensor> {
    let mut raw = describe(func, codes, codes_len, dtype, shape)?;
    if !dtype.is_fp8() {
        return Err(Error::invalid_argument(format!(
            "{}: argument 'dtype': expected E4M3 or E5M2, got {:?}",
            func, dtype
        )));
    }
    raw.scaling = scaling.to_raw();
    raw.scale_inv = scale_inv;
    let mut needed: i64 = 0;
    check(unsafe { sys::te_tensor_scale_inv_count(&mut needed, &raw) })?;
    if (scale_inv_len as u64) < needed as u64 {
        return Err(Error::invalid_argument(format!(
            "{}: argument 'scale_inv': expected {} floats for {:?} scaling of shape {:?}, got {}",
            func,
            needed,
            scaling,
            &raw.shape[..raw.ndim as usize],
            scale_inv_len
        )));
    }
    Ok(raw)
}

/// Checks a descriptor libte filled (a residual) before a safe view is made of it.
fn check_foreign(raw: &sys::te_tensor) -> Result<()> {
    let ok = !raw.data.is_null()
        && raw.ndim >= 1
        && raw.ndim as usize <= MAX_DIMS
        && raw.shape[..raw.ndim as usize].iter().all(|&d| d >= 1)
        && DType::from_raw(raw.dtype).map_or(false, |d| !d.is_fp8() || !raw.scale_inv.is_null())
        && ScalingMode::from_raw(raw.scaling).is_some();
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            crate::Status::Internal,
            "libte returned a tensor descriptor this binding does not understand".to_string(),
        ))
    }
}

/// A read-only view of a tensor: a `te_tensor` over memory borrowed for `'a`.
///
/// Cheap to copy. Views made from slices are host (CPU) memory.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    raw: sys::te_tensor,
    _data: PhantomData<&'a [u8]>,
}

// A view is a shared borrow of plain numbers.
unsafe impl Send for TensorView<'_> {}
unsafe impl Sync for TensorView<'_> {}

impl<'a> TensorView<'a> {
    /// Views `data` as a row-major tensor of `shape` (whose product must be `data.len()`).
    pub fn from_slice<T: Element>(data: &'a [T], shape: &[usize]) -> Result<TensorView<'a>> {
        let raw = describe(
            "TensorView::from_slice",
            data.as_ptr() as *mut c_void,
            data.len(),
            T::DTYPE,
            shape,
        )?;
        Ok(TensorView::wrap(raw))
    }

    /// Views FP8 codes (`dtype` E4M3 or E5M2) with their `scale_inv`: dequantized value =
    /// code * scale_inv of its block. `scale_inv` must hold at least as many floats as the
    /// shape and scaling mode need (`te_tensor_scale_inv_count`).
    pub fn from_fp8(
        codes: &'a [u8],
        dtype: DType,
        shape: &[usize],
        scale_inv: &'a [f32],
        scaling: ScalingMode,
    ) -> Result<TensorView<'a>> {
        let raw = describe_fp8(
            "TensorView::from_fp8",
            codes.as_ptr() as *mut c_void,
            codes.len(),
            dtype,
            shape,
            scale_inv.as_ptr() as *mut f32,
            scale_inv.len(),
            scaling,
        )?;
        Ok(TensorView::wrap(raw))
    }

    /// A view of a descriptor libte filled; checked for what a safe view relies on.
    ///
    /// # Safety
    /// `raw.data` (and `raw.scale_inv` for FP8) must point to memory of the size its shape,
    /// dtype and scaling say, valid and unmodified for `'a`.
    pub(crate) unsafe fn from_foreign(raw: sys::te_tensor) -> Result<TensorView<'a>> {
        check_foreign(&raw)?;
        Ok(TensorView::wrap(raw))
    }

    /// Wraps a raw descriptor.
    ///
    /// # Safety
    /// `raw` must be well-formed (known dtype and scaling, 1..=8 dimensions each >= 1), and
    /// `raw.data` (and `raw.scale_inv` for FP8) must point to memory of the size it describes
    /// on `raw.device`, valid and not written by anyone else for `'a`.
    pub unsafe fn from_raw(raw: sys::te_tensor) -> TensorView<'a> {
        TensorView::wrap(raw)
    }

    /// The view of `raw`; every constructor has checked it (or made the caller promise it).
    fn wrap(raw: sys::te_tensor) -> TensorView<'a> {
        TensorView {
            raw,
            _data: PhantomData,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        DType::from_raw(self.raw.dtype).expect("checked when the view was made")
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim as usize]
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }

    /// The FP8 scaling mode; `None` for high-precision tensors.
    pub fn scaling(&self) -> Option<ScalingMode> {
        if self.dtype().is_fp8() {
            ScalingMode::from_raw(self.raw.scaling)
        } else {
            None
        }
    }

    /// Whether the memory is the host's (every view made from a slice is).
    pub fn is_host(&self) -> bool {
        self.raw.device.type_ == sys::te_device_type::TE_DEVICE_CPU
    }

    /// The elements, when the view is host memory of `T`'s dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        if T::DTYPE != self.dtype() || !self.is_host() {
            return Err(Error::invalid_argument(format!(
                "TensorView::as_slice: expected a host tensor of {:?}, this one is {:?} on {}",
                T::DTYPE,
                self.dtype(),
                if self.is_host() {
                    "the host"
                } else {
                    "a device"
                }
            )));
        }
        self.host_slice::<T>()
    }

    /// The FP8 codes, when the view is an FP8 tensor in host memory.
    pub fn fp8_codes(&self) -> Result<&'a [u8]> {
        if !self.dtype().is_fp8() || !self.is_host() {
            return Err(Error::invalid_argument(format!(
                "TensorView::fp8_codes: expected a host FP8 tensor, this one is {:?}",
                self.dtype()
            )));
        }
        self.host_slice::<u8>()
    }

    /// The scale_inv floats of an FP8 host tensor (one, or one per block).
    pub fn scale_inv(&self) -> Result<&'a [f32]> {
        if !self.dtype().is_fp8() || !self.is_host() {
            return Err(Error::invalid_argument(format!(
                "TensorView::scale_inv: expected a host FP8 tensor, this one is {:?}",
                self.dtype()
            )));
        }
        let mut count: i64 = 0;
        check(unsafe { sys::te_tensor_scale_inv_count(&mut count, &self.raw) })?;
        let ptr = self.raw.scale_inv as *const f32;
        if ptr.is_null() || (ptr as usize) % std::mem::align_of::<f32>() != 0 {
            return Err(Error::new(crate::Status::Internal, "misaligned scale_inv"));
        }
        // The view's contract: scale_inv holds `count` floats valid for 'a.
        Ok(unsafe { slice::from_raw_parts(ptr, count as usize) })
    }

    fn host_slice<T>(&self) -> Result<&'a [T]> {
        let ptr = self.raw.data as *const T;
        if (ptr as usize) % std::mem::align_of::<T>() != 0 {
            return Err(Error::new(
                crate::Status::Internal,
                "misaligned tensor data",
            ));
        }
        // The view's contract: data holds numel() elements of its dtype valid for 'a.
        Ok(unsafe { slice::from_raw_parts(ptr, self.numel()) })
    }

    /// The `te_tensor` for a C call.
    pub fn as_raw(&self) -> &sys::te_tensor {
        &self.raw
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("scaling", &self.scaling())
            .finish()
    }
}

/// A writable view of a tensor: a `te_tensor` over memory borrowed mutably for `'a`. Outputs
/// (y, dx, dW, ...) are passed as these.
pub struct TensorViewMut<'a> {
    raw: sys::te_tensor,
    _data: PhantomData<&'a mut [u8]>,
}

unsafe impl Send for TensorViewMut<'_> {}
unsafe impl Sync for TensorViewMut<'_> {}

impl<'a> TensorViewMut<'a> {
    /// Views `data` as a row-major tensor of `shape` (whose product must be `data.len()`).
    pub fn from_slice<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<TensorViewMut<'a>> {
        let raw = describe(
            "TensorViewMut::from_slice",
            data.as_mut_ptr() as *mut c_void,
            data.len(),
            T::DTYPE,
            shape,
        )?;
        Ok(TensorViewMut::wrap(raw))
    }

    /// Views a buffer for FP8 codes and their scale_inv, for `Context::quantize` to fill.
    pub fn from_fp8(
        codes: &'a mut [u8],
        dtype: DType,
        shape: &[usize],
        scale_inv: &'a mut [f32],
        scaling: ScalingMode,
    ) -> Result<TensorViewMut<'a>> {
        let raw = describe_fp8(
            "TensorViewMut::from_fp8",
            codes.as_mut_ptr() as *mut c_void,
            codes.len(),
            dtype,
            shape,
            scale_inv.as_mut_ptr(),
            scale_inv.len(),
            scaling,
        )?;
        Ok(TensorViewMut::wrap(raw))
    }

    /// Wraps a raw descriptor.
    ///
    /// # Safety
    /// As [`TensorView::from_raw`], and nobody else may read or write the memory for `'a`.
    pub unsafe fn from_raw(raw: sys::te_tensor) -> TensorViewMut<'a> {
        TensorViewMut::wrap(raw)
    }

    /// The view of `raw`; every constructor has checked it (or made the caller promise it).
    fn wrap(raw: sys::te_tensor) -> TensorViewMut<'a> {
        TensorViewMut {
            raw,
            _data: PhantomData,
        }
    }

    /// A read-only view of the same memory, for as long as this one is borrowed.
    pub fn as_view(&self) -> TensorView<'_> {
        TensorView::wrap(self.raw)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.as_view().dtype()
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape[..self.raw.ndim as usize]
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.as_view().numel()
    }

    /// The `te_tensor` for a C call that reads it.
    pub fn as_raw(&self) -> &sys::te_tensor {
        &self.raw
    }

    /// The `te_tensor` for a C call that writes it.
    pub fn as_raw_mut(&mut self) -> *mut sys::te_tensor {
        &mut self.raw
    }
}

impl fmt::Debug for TensorViewMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorViewMut")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("scaling", &self.as_view().scaling())
            .finish()
    }
}

/// Optional output tensor for a C call: NULL when absent.
pub(crate) fn opt_mut(t: Option<&mut TensorViewMut<'_>>) -> *mut sys::te_tensor {
    match t {
        Some(t) => t.as_raw_mut(),
        None => std::ptr::null_mut(),
    }
}
