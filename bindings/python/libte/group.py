"""Process groups for amax reduction: the single-rank group, and NCCL groups (a communicator
libte makes from an id shared by every rank, or one of the caller's that libte borrows)."""

import numbers

from . import _constants as C
from ._handle import NativeHandle, closed_error
from ._lowlevel import ll
from .errors import InvalidArgument

__all__ = ["Group", "nccl_unique_id"]


def _int32(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument("argument '%s': expected an int, got %s"
                              % (name, type(value).__name__))
    value = int(value)
    if not -2 ** 31 <= value < 2 ** 31:
        raise InvalidArgument("argument '%s': expected a 32-bit int, got %d" % (name, value))
    return value


def _unique_id(unique_id):
    """The id as bytes of length NCCL_ID_BYTES, or InvalidArgument naming 'unique_id'."""
    if not isinstance(unique_id, (bytes, bytearray, memoryview)):
        raise InvalidArgument("argument 'unique_id': expected bytes from libte.nccl_unique_id(), "
                              "got %s" % type(unique_id).__name__)
    data = bytes(unique_id)
    if len(data) != C.NCCL_ID_BYTES:
        raise InvalidArgument("argument 'unique_id': expected %d bytes (from "
                              "libte.nccl_unique_id()), got %d" % (C.NCCL_ID_BYTES, len(data)))
    return data


def nccl_unique_id():
    """te_nccl_get_unique_id: a new NCCL id (bytes, length 128). Make it on one rank and send it
    to the others (a multiprocessing queue, a TCP store, a file), which all pass it to
    Group.init_nccl. Raises Unsupported where libte has no NCCL or no usable CUDA device."""
    return ll.nccl_get_unique_id()


class Group:
    """A process group for amax reduction, as given to `libte.autocast(ctx, group=g)`:

    - `Group()` (or `Group.single()`): one rank; reductions are no-ops.
    - `Group.init_nccl(rank, nranks, unique_id, timeout_ms=None)`: a new NCCL communicator the
      group owns (collective: every rank calls it).
    - `Group.from_nccl_comm(comm_ptr)`: borrows an ncclComm_t of yours.

    Each group has a process-unique `id`, never reused, and its `rank` and `size`. An autocast
    scope's context keeps the group alive (close() then only marks it) until the context is
    closed: the context's buckets keep reducing over it.
    """

    def __init__(self, _ptr=None, _kind="single"):
        if _ptr is None:
            _ptr = ll.group_create_single()
        self._native = NativeHandle(_ptr, ll.group_destroy)
        self._h = _ptr
        self.kind = _kind  # 'single', 'nccl' (owned communicator) or 'nccl_borrowed'

    @classmethod
    def single(cls):
        """The single-rank group (as Group())."""
        return cls(ll.group_create_single())

    @classmethod
    def init_nccl(cls, rank, nranks, unique_id, timeout_ms=None):
        """te_group_init_nccl: joins `nranks` ranks into a new NCCL communicator that the group
        owns (closing the group destroys it). Collective: every rank calls it with the same
        `unique_id` (from libte.nccl_unique_id() on one rank) and blocks until all have joined.
        The communicator is made on the calling thread's current CUDA device: select it first
        (torch.cuda.set_device(i), or CUDA_VISIBLE_DEVICES so that it is device 0), and use the
        group with a Context on that device.

        timeout_ms: how long to wait for the other ranks (None: the library's default, 10
        minutes; 0: no limit); when they do not all join in time the call raises NcclError
        instead of hanging. Raises InvalidArgument for a bad rank, nranks, id or timeout,
        Unsupported where libte has no NCCL or no usable CUDA device."""
        rank = _int32(rank, "rank")
        nranks = _int32(nranks, "nranks")
        data = _unique_id(unique_id)
        if timeout_ms is None:
            ptr = ll.group_init_nccl(rank, nranks, data)
        else:
            ptr = ll.group_init_nccl_with_options(rank, nranks, data,
                                                  _int32(timeout_ms, "timeout_ms"))
        return cls(ptr, "nccl")

    @classmethod
    def from_nccl_comm(cls, comm_ptr):
        """te_group_create_nccl: a group over your NCCL communicator, given as its ncclComm_t
        address (an int); rank and size come from NCCL. The group only borrows it: the
        communicator must outlive the group, and so every Context whose autocast scopes used
        the group (close those first). Amaxes are reduced on the context's stream, so the
        communicator must be on the context's CUDA device. Raises Unsupported where libte has
        no NCCL or no usable CUDA device."""
        if (isinstance(comm_ptr, bool) or not isinstance(comm_ptr, numbers.Integral)
                or not 0 < comm_ptr < 2 ** 64):
            raise InvalidArgument("argument 'comm_ptr': expected an ncclComm_t address (a "
                                  "non-zero int), got %r" % (comm_ptr,))
        return cls(ll.group_create_nccl(int(comm_ptr)), "nccl_borrowed")

    def _handle(self):
        if self._h is None:
            raise closed_error("Group")
        return self._h

    @property
    def closed(self):
        return self._h is None

    @property
    def id(self):
        return ll.group_id(self._handle())

    @property
    def rank(self):
        return ll.group_rank(self._handle())

    @property
    def size(self):
        return ll.group_size(self._handle())

    def abort(self):
        """te_group_abort, the failure path: aborts the communicator the group owns
        (ncclCommAbort), ending its reductions still waiting for a rank that will never come,
        so that a Context.synchronize() blocked on them returns. Meant for a watchdog thread:
        it may run while another thread waits in Context.synchronize() (both backends release
        the GIL there), not while one is inside a call that reduces over this group (the end
        of an autocast scope, a backward, a current-scaling forward). Afterwards every
        reduction over the group raises NcclError: close it and make a new one. Aborting twice
        is a no-op. InvalidState for the single-rank group and for a borrowed communicator
        (from_nccl_comm: abort it yourself with ncclCommAbort)."""
        ll.group_abort(self._handle())

    def close(self):
        """Frees the group (destroying an owned communicator), or, while contexts whose autocast
        scopes used it are open, marks it to be freed after the last of them."""
        self._h = None
        self._native.release()

    def __enter__(self):
        self._handle()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._h is None:
            return "<libte.Group %s closed>" % self.kind
        return "<libte.Group %s id=%d rank=%d size=%d>" % (self.kind, self.id, self.rank,
                                                           self.size)
