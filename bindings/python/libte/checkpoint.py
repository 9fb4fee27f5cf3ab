"""Checkpoint: named tensors and byte strings in one versioned, checksummed file (te_checkpoint_*).

    with libte.Checkpoint() as ck:
        ck.put_tensor("layer0.weight", w)            # a copy goes in
        ck.put_bytes("layer0.fp8_state", layer.state_dict())
        ck.write("model.teckpt")                     # atomic: written beside, then renamed
    with libte.Checkpoint.read("model.teckpt") as ck:
        ck.get_tensor("layer0.weight", w)            # into an array of the stored dtype/shape
        w2 = ck.get_tensor("layer0.weight")          # or a new NumPy array of them
        ck.record_info("layer0.weight")              # RecordInfo('tensor', 'float32', (7, 5), 140)
        layer.load_state_dict(ck.get_bytes("layer0.fp8_state"))
"""

import collections

import numpy as np

from . import _constants as C
from ._arrays import numpy_dtype
from ._handle import NativeHandle, closed_error
from ._lowlevel import ll
from .context import Context
from .errors import InvalidArgument
from .ops import _any_input
from .tensor import Float8Tensor, check_context, follow_streams

__all__ = ["Checkpoint", "RecordInfo"]

RecordInfo = collections.namedtuple("RecordInfo", "kind dtype shape nbytes")
RecordInfo.__doc__ = """What a checkpoint record holds (Checkpoint.record_info): kind 'tensor' or
'bytes'; for a tensor its dtype as libte names dtypes ('float32', 'float16', 'bfloat16', 'int32':
what modules' .dtype says) and its shape tuple, both None for a byte record; nbytes the payload's
length in bytes."""


def _decode(name):
    # Names are bytes to the library; str names went in as UTF-8 (surrogateescape keeps any
    # other bytes round-tripping).
    return name.decode("utf-8", "surrogateescape")


class Checkpoint:
    """A set of named records - tensors (weights, optimizer moments) and byte strings (the
    modules' state_dict() bytes, the step, a data position) - in memory, written to and read
    from one file (write / read) or bytes (to_bytes / from_bytes). Names are str (or bytes),
    1..255 bytes as UTF-8, unique; putting a name again replaces its record.

    Tensor calls take a context (`ctx=`): the one the array's memory belongs to (a CUDA
    context's stream is synchronised for the copy). Without one, a CPU context owned by the
    checkpoint is used, which suits NumPy arrays. close() (or leaving a `with` block) frees the
    checkpoint; using it afterwards raises InvalidState.
    """

    def __init__(self, _ptr=None):
        self._native = NativeHandle(_ptr if _ptr is not None else ll.checkpoint_create(),
                                    ll.checkpoint_destroy)
        self._cpu = None

    @classmethod
    def read(cls, path):
        """Reads a checkpoint file (checked: magic, version, every length, the CRC; a truncated
        or corrupted file raises InvalidArgument naming what is wrong)."""
        return cls(ll.checkpoint_read(path))

    @classmethod
    def from_bytes(cls, data):
        """Parses what to_bytes() returned (checked as a file is)."""
        return cls(ll.checkpoint_deserialize(data))

    def _handle(self):
        h = self._native.ptr
        if h is None:
            raise closed_error("Checkpoint")
        return h

    def _context(self, ctx):
        if ctx is None:
            if self._cpu is None or self._cpu.closed:
                self._cpu = Context("cpu")
            ctx = self._cpu
        return ctx

    @property
    def closed(self):
        return self._native.ptr is None

    def put_tensor(self, name, tensor, *, ctx=None):
        """Adds (or replaces) record `name`: a copy of `tensor` (float32, float16, bfloat16 or
        int32; FP8 is refused: store its high-precision source) with its dtype and shape."""
        ck = self._handle()
        ctx = self._context(ctx)
        h_ctx = check_context(ctx)
        if isinstance(tensor, Float8Tensor):
            raise InvalidArgument("argument 'tensor': FP8 tensors cannot be checkpointed; store "
                                  "their high-precision source")
        a = _any_input(ctx, tensor, "tensor")
        follow_streams(ctx, a)
        ll.checkpoint_put_tensor(ck, h_ctx, name, a.desc)

    def get_tensor(self, name, out=None, *, ctx=None):
        """Copies record `name` into `out`, which must have the stored dtype and shape (else
        InvalidArgument, out unchanged). Returns out.

        Without `out`, a new NumPy array of the stored dtype and shape is returned (read
        through record_info; bfloat16 records give ml_dtypes.bfloat16 arrays, as the package's
        bfloat16 NumPy arrays are everywhere: without ml_dtypes that raises InvalidArgument, and
        `out` is then required). A NumPy array is host memory: with a CUDA `ctx`, pass `out`."""
        ck = self._handle()
        if out is None:
            if ctx is not None and check_context(ctx) and ctx.device_type != C.DEVICE_CPU:
                raise InvalidArgument("argument 'out': required with a CUDA context (without "
                                      "it, get_tensor allocates a NumPy array: host memory)")
            is_tensor, code, shape, _ = ll.checkpoint_record_info(ck, name)
            if not is_tensor:
                raise InvalidArgument("argument 'name': record %r holds bytes, not a tensor "
                                      "(use get_bytes)" % (name,))
            out = np.empty(shape, numpy_dtype(code))
        ctx = self._context(ctx)
        h_ctx = check_context(ctx)
        if isinstance(out, Float8Tensor):
            raise InvalidArgument("argument 'out': FP8 tensors cannot be checkpointed")
        a = _any_input(ctx, out, "out", writable=True)
        follow_streams(ctx, a)
        ll.checkpoint_get_tensor(ck, h_ctx, name, a.desc)
        return out

    def put_bytes(self, name, data):
        """Adds (or replaces) byte record `name`: a copy of `data` (any bytes-like object)."""
        if data is None:
            raise InvalidArgument("argument 'data': expected a bytes-like object, got None")
        ll.checkpoint_put_bytes(self._handle(), name, data)

    def record_info(self, name):
        """What record `name` holds, without copying it: a RecordInfo (kind, dtype, shape,
        nbytes), e.g. to allocate the array get_tensor fills. A missing record raises
        InvalidArgument naming te_checkpoint_record_info."""
        is_tensor, code, shape, size = ll.checkpoint_record_info(self._handle(), name)
        if not is_tensor:
            return RecordInfo("bytes", None, None, size)
        return RecordInfo("tensor", C.DTYPE_NAMES.get(code, code), shape, size)

    def get_bytes(self, name):
        """Byte record `name` as bytes."""
        return ll.checkpoint_get_bytes(self._handle(), name)

    def names(self):
        """The records' names (str), in the checkpoint's order."""
        ck = self._handle()
        return [_decode(ll.checkpoint_name(ck, i)) for i in range(ll.checkpoint_count(ck))]

    def __len__(self):
        return ll.checkpoint_count(self._handle())

    def __contains__(self, name):
        if isinstance(name, (bytes, bytearray)):
            name = _decode(bytes(name))
        return name in self.names()

    def __iter__(self):
        return iter(self.names())

    def write(self, path):
        """Writes the checkpoint to `path` (str, bytes or os.PathLike), replacing any file
        there atomically."""
        ll.checkpoint_write(self._handle(), path)

    def to_bytes(self):
        """The file's bytes, in memory."""
        return ll.checkpoint_serialize(self._handle())

    def close(self):
        self._native.release()
        if self._cpu is not None:
            self._cpu.close()
            self._cpu = None

    def __enter__(self):
        self._handle()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "<libte.Checkpoint closed>"
        return "<libte.Checkpoint %d records>" % len(self)
