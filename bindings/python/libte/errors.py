"""Exceptions: one class per te_status, each carrying the status and te_last_error()'s text."""

from . import _constants as C

__all__ = ["Error", "InvalidArgument", "InvalidState", "Unsupported", "OutOfMemory",
           "CudaError", "CublasError", "NcclError", "InternalError", "error_for_status"]


class Error(Exception):
    """Base of every libte error. `status` is the te_status code, `message` the library's text
    (te_last_error() for failures inside the C library, a message of the binding's own for
    arguments it rejects before calling it)."""

    status = C.ERROR_INTERNAL

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgument(Error, ValueError):
    """TE_ERROR_INVALID_ARGUMENT: a NULL, out-of-range, mistyped or inconsistent argument."""
    status = C.ERROR_INVALID_ARGUMENT


class InvalidState(Error, RuntimeError):
    """TE_ERROR_INVALID_STATE: the call is not allowed now (out-of-order autocast end, a closed
    handle, a backward context already consumed)."""
    status = C.ERROR_INVALID_STATE


class Unsupported(Error, NotImplementedError):
    """TE_ERROR_UNSUPPORTED: a valid request this build, device or shape cannot do."""
    status = C.ERROR_UNSUPPORTED


class OutOfMemory(Error, MemoryError):
    status = C.ERROR_OUT_OF_MEMORY


class CudaError(Error):
    status = C.ERROR_CUDA


class CublasError(Error):
    status = C.ERROR_CUBLAS


class NcclError(Error):
    status = C.ERROR_NCCL


class InternalError(Error):
    """TE_ERROR_INTERNAL: a bug in libte; please report the message."""
    status = C.ERROR_INTERNAL


_BY_STATUS = {cls.status: cls for cls in (InvalidArgument, InvalidState, Unsupported, OutOfMemory,
                                          CudaError, CublasError, NcclError, InternalError)}


def error_for_status(status, message):
    """The exception to raise for a failed call's status and message (unknown statuses, from a
    newer library, become the base Error with that status)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        return Error("status %d: %s" % (status, message), status)
    return cls(message)
