"""TEModule: what every libte.torch module shares: its key in the op registry, the libte layer
(created lazily on the context of the thread and device that first runs it, moved with the FP8
state when the device or dtype changes), input checks, and the FP8 state as extra state."""

import struct

import torch

from ..errors import InvalidArgument, InvalidState
from . import _runtime as rt

EXTRA_MAGIC = b"libte.torch\x00"
EXTRA_VERSION = 1
_HEADER = struct.Struct("<12sII")  # magic, version, kind code (the module class's)

KIND_LINEAR, KIND_LAYERNORM_LINEAR, KIND_LAYERNORM_MLP, KIND_GROUPED_LINEAR = 1, 2, 3, 4
KIND_ATTENTION = 5


def default_init(weight):
    """TE's default init_method: normal, std 0.023."""
    torch.nn.init.normal_(weight, mean=0.0, std=0.023)


class TEModule(torch.nn.Module):
    """Base class. Subclasses set _KIND and implement _create(ctx, dtype_name)."""

    _KIND = 0
    _NAME = "TEModule"

    def __init__(self):
        super().__init__()
        self._te_key = rt.register(self)
        self._te = None          # (DeviceContext, device key, dtype, libte module object)
        self._te_pending = None  # FP8 state bytes to load into the next layer created

    # -- the libte layer -------------------------------------------------------------------------

    def _create(self, ctx, dtype_name):
        raise NotImplementedError

    def _native(self, x):
        """(DeviceContext, te handle) for input x on this thread, creating or moving the layer."""
        te = self._te
        cw = rt.context_for(x.device)
        if te is not None and te[0] is cw and te[2] == x.dtype:
            return cw, te[3]._native.ptr
        return self._rebuild(cw, x.dtype)

    def _rebuild(self, cw, dtype):
        te = self._te
        state = self._te_pending
        if te is not None:
            if te[1] == cw.device and te[2] == dtype:
                raise InvalidState("libte.torch.%s: its libte layer lives on another thread's "
                                   "context; run a module from one thread" % self._NAME)
            state = te[3].state_dict()
            te[3].close()
            self._te = None
        obj = self._create(cw.ctx, str(dtype).rpartition(".")[2])
        if state:
            obj.load_state_dict(state)
        self._te_pending = None
        self._te = (cw, cw.device, dtype, obj)
        return cw, obj._native.ptr

    def _layer_for_backward(self):
        te = self._te
        if te is None:
            raise InvalidState("libte.torch.%s: backward without a forward" % self._NAME)
        return te[0], te[3]._native.ptr

    @property
    def te_layer(self):
        """The libte module object (libte.Linear, ...) behind this module, or None before the
        first forward: its scaling_state(...) reads the FP8 state."""
        return None if self._te is None else self._te[3]

    # -- input checks ----------------------------------------------------------------------------

    def _check_input(self, x, features, dtype):
        if x.dtype != dtype:
            raise InvalidArgument("libte.torch.%s: argument 'input': expected dtype %s (the "
                                  "module's params_dtype), got %s" % (self._NAME, dtype, x.dtype))
        if x.dim() < 2 or x.shape[-1] != features:
            raise InvalidArgument("libte.torch.%s: argument 'input': expected shape [..., %d], "
                                  "got %s" % (self._NAME, features, list(x.shape)))

    # -- FP8 state in state_dict -----------------------------------------------------------------

    def get_extra_state(self):
        """The FP8 state (te_*_state_save: amax histories, scales) as a uint8 tensor: a
        versioned header (magic, version, module kind) and the library's bytes (empty before
        the first forward)."""
        if self._te is not None:
            payload = self._te[3].state_dict()
        else:
            payload = self._te_pending or b""
        blob = _HEADER.pack(EXTRA_MAGIC, EXTRA_VERSION, self._KIND) + payload
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8)

    def set_extra_state(self, state):
        if state is None:
            return
        if isinstance(state, torch.Tensor):
            blob = state.detach().cpu().contiguous().numpy().tobytes()
        elif isinstance(state, (bytes, bytearray)):
            blob = bytes(state)
        else:
            raise InvalidArgument("libte.torch.%s: extra state: expected a uint8 tensor, got %s"
                                  % (self._NAME, type(state).__name__))
        if len(blob) < _HEADER.size:
            if not blob:
                return
            raise InvalidArgument("libte.torch.%s: extra state: %d bytes, too short for its "
                                  "header" % (self._NAME, len(blob)))
        magic, version, kind = _HEADER.unpack_from(blob)
        if magic != EXTRA_MAGIC:
            raise InvalidArgument("libte.torch.%s: extra state: not libte.torch's (bad magic)"
                                  % self._NAME)
        if version != EXTRA_VERSION:
            raise InvalidArgument("libte.torch.%s: extra state version %d, this libte reads "
                                  "version %d" % (self._NAME, version, EXTRA_VERSION))
        if kind != self._KIND:
            raise InvalidArgument("libte.torch.%s: extra state of another module kind (%d)"
                                  % (self._NAME, kind))
        payload = blob[_HEADER.size:]
        if self._te is not None:
            if payload:
                self._te[3].load_state_dict(payload)
            else:  # saved before its first forward: start afresh
                self._te[3].close()
                self._te = None
                self._te_pending = None
        else:
            self._te_pending = payload or None
