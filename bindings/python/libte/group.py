"""Process groups for amax reduction."""

from ._handle import NativeHandle, closed_error
from ._lowlevel import ll

__all__ = ["Group"]


class Group:
    """A process group for amax reduction. Only the single-rank group is creatable from Python
    for now (`Group.single()`); NCCL groups need a communicator from the C API.
    Each group has a process-unique `id`, never reused."""

    def __init__(self, _ptr):
        self._native = NativeHandle(_ptr, ll.group_destroy)
        self._h = _ptr

    @classmethod
    def single(cls):
        return cls(ll.group_create_single())

    def _handle(self):
        if self._h is None:
            raise closed_error("Group")
        return self._h

    @property
    def id(self):
        return ll.group_id(self._handle())

    @property
    def rank(self):
        return ll.group_rank(self._handle())

    @property
    def size(self):
        return ll.group_size(self._handle())

    def close(self):
        """Frees the group, or, while contexts whose autocast scopes used it are open, marks it
        to be freed after the last of them."""
        self._h = None
        self._native.release()

    def __repr__(self):
        if self._h is None:
            return "<libte.Group closed>"
        return "<libte.Group id=%d rank=%d size=%d>" % (self.id, self.rank, self.size)
