"""Context: one device, one stream, one autocast stack. Use one per thread."""

import weakref

from . import _constants as C
from ._handle import NativeHandle, closed_error
from ._lowlevel import ll
from .errors import InvalidArgument

__all__ = ["Context", "ContextStats"]


def _parse_device(device):
    """None -> None (the library's default); 'cpu', 'cuda', 'cuda:N' -> (type, index)."""
    if device is None:
        return None
    if isinstance(device, str):
        kind, _, index = device.strip().lower().partition(":")
        if kind == "cpu" and not index:
            return (C.DEVICE_CPU, 0)
        if kind == "cuda":
            try:
                i = int(index) if index else 0
            except ValueError:
                i = -1
            if i >= 0:
                return (C.DEVICE_CUDA, i)
    raise InvalidArgument("argument 'device': expected 'cpu', 'cuda', 'cuda:N' or None, got %r"
                          % (device,))


class AutocastState(tuple):
    """te_autocast_state of a context's innermost scope (Context.autocast_state()).

    It lives here, not in autocast.py, so that autocast.py depends on context.py and not back."""
    __slots__ = ()
    enabled = property(lambda s: bool(s[0]))
    calibrating = property(lambda s: bool(s[1]))
    depth = property(lambda s: s[2])
    recipe_key = property(lambda s: s[3])
    recipe_describe = property(lambda s: s[4])

    def __repr__(self):
        return ("AutocastState(enabled=%s, calibrating=%s, depth=%d, recipe=%r)"
                % (self.enabled, self.calibrating, self.depth, self.recipe_describe))


class ContextStats(tuple):
    """te_context_stats: what autocast did on this context since its creation."""
    __slots__ = ()
    _fields = ("scopes_closed", "bucket_updates", "amax_reductions", "states_updated")

    scopes_closed = property(lambda s: s[0])
    bucket_updates = property(lambda s: s[1])
    amax_reductions = property(lambda s: s[2])
    states_updated = property(lambda s: s[3])

    def __repr__(self):
        return "ContextStats(%s)" % ", ".join("%s=%d" % kv for kv in zip(self._fields, self))


class Context:
    """An execution context: `Context('cpu')`, `Context('cuda:0')`, or `Context()` for the
    library's default (CUDA 0 when usable, else the CPU).

    close() (or leaving a `with` block) frees it, and first closes every linear layer,
    residuals and backward context created with it; using any of them afterwards raises
    InvalidState.
    """

    def __init__(self, device=None):
        self._native = NativeHandle(ll.context_create(_parse_device(device)), ll.context_destroy)
        self._h = self._native.ptr
        self.device_type, self.device_index = ll.context_get_device(self._h)
        self.device = (C.DEVICE_CPU, 0) if self.device_type == C.DEVICE_CPU else (
            C.DEVICE_CUDA, self.device_index)
        self._stream = 0
        self._children = weakref.WeakSet()  # Python objects to close before the context

    # The handle for a call, or InvalidState when closed.
    def _handle(self):
        h = self._h
        if h is None:
            raise closed_error("Context")
        return h

    def _adopt(self, child):
        self._children.add(child)

    @property
    def closed(self):
        return self._h is None

    @property
    def device_name(self):
        return "cpu" if self.device_type == C.DEVICE_CPU else "cuda:%d" % self.device_index

    @property
    def stream(self):
        """The CUDA stream (an int cudaStream_t; 0 = the legacy default) work is enqueued on."""
        return self._stream

    def set_stream(self, stream):
        """Enqueues later work on `stream`: an int cudaStream_t, or an object with
        `.cuda_stream` or `.ptr` (CuPy, PyTorch streams); 0 or None: the legacy default."""
        if stream is not None and not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))
        if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool)
                                   or stream < 0):
            raise InvalidArgument("argument 'stream': expected a cudaStream_t as an int, got %r"
                                  % (stream,))
        stream = stream or 0
        if stream != self._stream:
            ll.context_set_stream(self._handle(), stream)
            self._stream = stream

    def synchronize(self):
        ll.context_synchronize(self._handle())

    def stats(self):
        return ContextStats(ll.context_get_stats(self._handle()))

    def autocast_state(self):
        """The innermost scope: an AutocastState (enabled, calibrating, depth, recipe key and
        description; 0 and '' outside any scope)."""
        return AutocastState(ll.autocast_get_state(self._handle()))

    def flush_backward(self):
        """te_autocast_flush_backward: reduce and update every pending backward bucket now, and
        enqueue a forward pass's deferred scale update."""
        ll.autocast_flush_backward(self._handle())

    def close(self):
        if self._h is None:
            return
        for child in list(self._children):
            child.close()
        self._h = None
        self._native.release()

    def __enter__(self):
        self._handle()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<libte.Context %s%s>" % (self.device_name, " closed" if self.closed else "")
