//! `Checkpoint`: a set of named records (tensors and byte strings) written to one file in
//! libte's versioned, checksummed format (`te_checkpoint_*`).

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_void;
use std::path::Path;
use std::ptr::{self, NonNull};

use libte_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::tensor::{DType, TensorView, TensorViewMut};

/// What a checkpoint record holds ([`Checkpoint::record_info`]), so that a reader can size the
/// buffer it passes to [`get_tensor`](Checkpoint::get_tensor) or
/// [`get_bytes_into`](Checkpoint::get_bytes_into).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordInfo {
    /// A tensor record: its dtype, its shape and its payload's length in bytes
    /// (elements x `dtype.size()`).
    Tensor {
        /// The stored element type.
        dtype: DType,
        /// The row-major shape, as `put_tensor` took it.
        shape: Vec<i64>,
        /// The payload's length in bytes.
        size: usize,
    },
    /// A byte record.
    Bytes {
        /// Its length in bytes.
        size: usize,
    },
}

impl RecordInfo {
    /// Whether it is a tensor record.
    pub fn is_tensor(&self) -> bool {
        matches!(self, RecordInfo::Tensor { .. })
    }

    /// The payload's length in bytes.
    pub fn size(&self) -> usize {
        match *self {
            RecordInfo::Tensor { size, .. } | RecordInfo::Bytes { size } => size,
        }
    }
}

/// A checkpoint (`te_checkpoint`): named records — tensors (weights, optimizer moments) and byte
/// strings (the modules' `save_state` buffers, the step, a data position) — kept in host
/// memory, written to one file ([`write`](Checkpoint::write), replaced atomically) or a buffer
/// ([`serialize`](Checkpoint::serialize)). Reading ([`read`](Checkpoint::read),
/// [`deserialize`](Checkpoint::deserialize)) checks the magic, the version, every length and
/// the CRC-32: a truncated or corrupted checkpoint is an `InvalidArgument` naming what is
/// wrong. Names are 1..=255 bytes, unique; putting a name again replaces its record.
///
/// Destroyed when dropped. `Send`, not `Sync` (libte's handles are not thread-safe).
pub struct Checkpoint {
    raw: NonNull<sys::te_checkpoint>,
}

// The handle owns only host memory and is used through `&`/`&mut` of this owner (not Sync).
unsafe impl Send for Checkpoint {}

/// A record name as a C string; an interior NUL cannot be passed to libte.
fn c_name(func: &str, name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| {
        Error::invalid_argument(format!(
            "{}: argument 'name': {:?} contains a NUL byte",
            func, name
        ))
    })
}

fn c_path(func: &str, path: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::invalid_argument(format!(
            "{}: argument 'path': {:?} contains a NUL byte",
            func, path
        ))
    })
}

impl Checkpoint {
    /// An empty checkpoint.
    pub fn new() -> Result<Checkpoint> {
        let mut out = ptr::null_mut();
        check(unsafe { sys::te_checkpoint_create(&mut out) })?;
        Checkpoint::own(out, "te_checkpoint_create")
    }

    fn own(raw: *mut sys::te_checkpoint, func: &str) -> Result<Checkpoint> {
        NonNull::new(raw)
            .map(|raw| Checkpoint { raw })
            .ok_or_else(|| Error::new(Status::Internal, format!("{} returned NULL", func)))
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::te_checkpoint {
        self.raw.as_ptr()
    }

    /// Adds (or replaces) record `name`: a copy of t's data with its dtype and shape (t on
    /// `ctx`'s device; FP8 tensors are refused: store their high-precision source).
    pub fn put_tensor(&mut self, ctx: &Context, name: &str, t: &TensorView<'_>) -> Result<()> {
        let name = c_name("Checkpoint::put_tensor", name)?;
        check(unsafe {
            sys::te_checkpoint_put_tensor(self.as_ptr(), ctx.as_ptr(), name.as_ptr(), t.as_raw())
        })
    }

    /// Adds (or replaces) byte record `name`: a copy of `data`.
    pub fn put_bytes(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let name = c_name("Checkpoint::put_bytes", name)?;
        check(unsafe {
            sys::te_checkpoint_put_bytes(
                self.as_ptr(),
                name.as_ptr(),
                data.as_ptr() as *const c_void,
                data.len(),
            )
        })
    }

    /// Copies tensor record `name` into t, which must have the stored dtype and shape. Errors:
    /// `InvalidArgument` (no such record, a byte record, dtype or shape differs); t is then
    /// unchanged.
    pub fn get_tensor(&self, ctx: &Context, name: &str, t: &mut TensorViewMut<'_>) -> Result<()> {
        let name = c_name("Checkpoint::get_tensor", name)?;
        check(unsafe {
            sys::te_checkpoint_get_tensor(
                self.as_ptr(),
                ctx.as_ptr(),
                name.as_ptr(),
                t.as_raw_mut(),
            )
        })
    }

    /// What record `name` holds (`te_checkpoint_record_info`): its kind, and for a tensor its
    /// dtype and shape, without copying it. A missing record: `InvalidArgument`.
    pub fn record_info(&self, name: &str) -> Result<RecordInfo> {
        let name = c_name("Checkpoint::record_info", name)?;
        let mut is_tensor = 0i32;
        // All zero is a valid te_tensor (F32, no data); the library fills it for a tensor.
        let mut shape: sys::te_tensor = unsafe { std::mem::zeroed() };
        let mut size = 0usize;
        check(unsafe {
            sys::te_checkpoint_record_info(
                self.as_ptr(),
                name.as_ptr(),
                &mut is_tensor,
                &mut shape,
                &mut size,
            )
        })?;
        if is_tensor == 0 {
            return Ok(RecordInfo::Bytes { size });
        }
        let dtype = DType::from_raw(shape.dtype).ok_or_else(|| {
            Error::new(
                Status::Internal,
                format!(
                    "te_checkpoint_record_info returned an unknown dtype {}",
                    shape.dtype.0
                ),
            )
        })?;
        let ndim = shape.ndim.clamp(0, shape.shape.len() as i32) as usize;
        Ok(RecordInfo::Tensor {
            dtype,
            shape: shape.shape[..ndim].to_vec(),
            size,
        })
    }

    /// The length of byte record `name`.
    pub fn bytes_len(&self, name: &str) -> Result<usize> {
        let name = c_name("Checkpoint::bytes_len", name)?;
        let mut size = 0usize;
        check(unsafe {
            sys::te_checkpoint_get_bytes(
                self.as_ptr(),
                name.as_ptr(),
                ptr::null_mut(),
                0,
                &mut size,
            )
        })?;
        Ok(size)
    }

    /// Copies byte record `name` into the start of `buf` and returns its length. A `buf`
    /// shorter than the record: `InvalidArgument`, `buf` untouched.
    pub fn get_bytes_into(&self, name: &str, buf: &mut [u8]) -> Result<usize> {
        let name = c_name("Checkpoint::get_bytes_into", name)?;
        let mut size = 0usize;
        check(unsafe {
            sys::te_checkpoint_get_bytes(
                self.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                &mut size,
            )
        })?;
        Ok(size)
    }

    /// A copy of byte record `name`.
    pub fn get_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.bytes_len(name)?];
        let n = self.get_bytes_into(name, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// The number of records.
    pub fn len(&self) -> Result<usize> {
        let mut count = 0usize;
        check(unsafe { sys::te_checkpoint_count(self.as_ptr(), &mut count) })?;
        Ok(count)
    }

    /// Whether it has no record.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The records' names, in libte's order. A name that is not UTF-8 (a file written by other
    /// code) is converted lossily and cannot be looked up through this binding.
    pub fn names(&self) -> Result<Vec<String>> {
        let count = self.len()?;
        let mut names = Vec::with_capacity(count);
        for i in 0..count {
            let mut p: *const std::os::raw::c_char = ptr::null();
            check(unsafe { sys::te_checkpoint_name(self.as_ptr(), i, &mut p) })?;
            if p.is_null() {
                return Err(Error::new(
                    Status::Internal,
                    format!("te_checkpoint_name returned NULL for record {}", i),
                ));
            }
            // Valid until the checkpoint changes: copied now, while `self` is borrowed.
            names.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        }
        Ok(names)
    }

    /// Writes the checkpoint to `path` (written beside it, then renamed over it).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path("Checkpoint::write", path.as_ref())?;
        check(unsafe { sys::te_checkpoint_write(self.as_ptr(), path.as_ptr()) })
    }

    /// Reads a checkpoint file, checked as described on [`Checkpoint`].
    pub fn read(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = c_path("Checkpoint::read", path.as_ref())?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::te_checkpoint_read(&mut out, path.as_ptr()) })?;
        Checkpoint::own(out, "te_checkpoint_read")
    }

    /// The file's bytes, in memory.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        check(unsafe {
            sys::te_checkpoint_serialize(self.as_ptr(), ptr::null_mut(), 0, &mut size)
        })?;
        let mut buf = vec![0u8; size];
        let mut written = 0usize;
        check(unsafe {
            sys::te_checkpoint_serialize(
                self.as_ptr(),
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                &mut written,
            )
        })?;
        buf.truncate(written);
        Ok(buf)
    }

    /// Parses [`serialize`](Checkpoint::serialize)'s bytes (or a file's), checked as a file is.
    pub fn deserialize(bytes: &[u8]) -> Result<Checkpoint> {
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::te_checkpoint_deserialize(&mut out, bytes.as_ptr() as *const c_void, bytes.len())
        })?;
        Checkpoint::own(out, "te_checkpoint_deserialize")
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        unsafe { sys::te_checkpoint_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("names", &self.names().unwrap_or_default())
            .finish()
    }
}
