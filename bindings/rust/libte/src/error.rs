//! `Error`: a failed libte call's status and the message `te_last_error()` gave right after it.

use std::ffi::CStr;
use std::fmt;

use libte_sys as sys;

/// Why a call failed: `te_status` without `TE_SUCCESS`.
///
/// `te_status` is append-only: a status this binding does not know yet is `Unknown(raw)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// `TE_ERROR_INVALID_ARGUMENT`: a NULL, out-of-range or inconsistent argument.
    InvalidArgument,
    /// `TE_ERROR_INVALID_STATE`: the call is not allowed now.
    InvalidState,
    /// `TE_ERROR_UNSUPPORTED`: a valid request this build, device or shape cannot do.
    Unsupported,
    /// `TE_ERROR_OUT_OF_MEMORY`.
    OutOfMemory,
    /// `TE_ERROR_CUDA`.
    Cuda,
    /// `TE_ERROR_CUBLAS`.
    Cublas,
    /// `TE_ERROR_NCCL`.
    Nccl,
    /// `TE_ERROR_INTERNAL`: a bug in libte; please report the message.
    Internal,
    /// A status newer than this binding.
    Unknown(u32),
}

impl Status {
    /// `None` for `TE_SUCCESS`.
    pub fn from_raw(status: sys::te_status) -> Option<Status> {
        Some(match status {
            sys::te_status::TE_SUCCESS => return None,
            sys::te_status::TE_ERROR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::te_status::TE_ERROR_INVALID_STATE => Status::InvalidState,
            sys::te_status::TE_ERROR_UNSUPPORTED => Status::Unsupported,
            sys::te_status::TE_ERROR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::te_status::TE_ERROR_CUDA => Status::Cuda,
            sys::te_status::TE_ERROR_CUBLAS => Status::Cublas,
            sys::te_status::TE_ERROR_NCCL => Status::Nccl,
            sys::te_status::TE_ERROR_INTERNAL => Status::Internal,
            other => Status::Unknown(other.0),
        })
    }

    /// The C value.
    pub fn to_raw(self) -> sys::te_status {
        match self {
            Status::InvalidArgument => sys::te_status::TE_ERROR_INVALID_ARGUMENT,
            Status::InvalidState => sys::te_status::TE_ERROR_INVALID_STATE,
            Status::Unsupported => sys::te_status::TE_ERROR_UNSUPPORTED,
            Status::OutOfMemory => sys::te_status::TE_ERROR_OUT_OF_MEMORY,
            Status::Cuda => sys::te_status::TE_ERROR_CUDA,
            Status::Cublas => sys::te_status::TE_ERROR_CUBLAS,
            Status::Nccl => sys::te_status::TE_ERROR_NCCL,
            Status::Internal => sys::te_status::TE_ERROR_INTERNAL,
            Status::Unknown(raw) => sys::te_status(raw),
        }
    }

    /// `te_status_string`: "TE_ERROR_INVALID_ARGUMENT", ...; "TE_ERROR_UNKNOWN" for unknown values.
    pub fn name(self) -> &'static str {
        // Static storage, never NULL, thread-safe (te.h).
        let text = unsafe { CStr::from_ptr(sys::te_status_string(self.to_raw())) };
        text.to_str().unwrap_or("TE_ERROR_UNKNOWN")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: its [`Status`] and the message libte gave for it, e.g.
/// `te_linear_forward: argument 'args->input': expected dtype BF16, got F32`.
///
/// The message is copied out of `te_last_error()` right after the failing call, on the thread
/// that made it, so it cannot be overwritten by a later call. Errors this crate detects itself
/// (what Rust types cannot express, e.g. a slice shorter than its shape) use the same statuses
/// and the same message style, naming the Rust function.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with a message of the caller's.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// The error of a call that just returned `status` (not `TE_SUCCESS`) on this thread.
    pub(crate) fn last(status: Status) -> Error {
        // Valid until this thread's next libte call; copied before anything else runs.
        let ptr = unsafe { sys::te_last_error() };
        let message = if ptr.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned()
        };
        Error { status, message }
    }

    pub(crate) fn invalid_argument(message: String) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    /// Why the call failed.
    pub fn status(&self) -> Status {
        self.status
    }

    /// What libte (or this crate) said: the function, the argument, expected vs. received.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("status", &self.status)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result<T, libte::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a status into a `Result`, copying the thread's last-error message on failure.
#[inline]
pub(crate) fn check(status: sys::te_status) -> Result<()> {
    match Status::from_raw(status) {
        None => Ok(()),
        Some(s) => Err(Error::last(s)),
    }
}
