"""The one check of an NCCL unique id both low-level layers run before calling C."""

from . import _constants as C


def id_bytes(nccl_id):
    """bytes-like of NCCL_ID_BYTES -> bytes; None -> None (NULL, for the C library to name)."""
    if nccl_id is None:
        return None
    data = bytes(memoryview(nccl_id).cast("B"))
    if len(data) != C.NCCL_ID_BYTES:
        raise ValueError("te_nccl_id: expected %d bytes, got %d" % (C.NCCL_ID_BYTES, len(data)))
    return data
