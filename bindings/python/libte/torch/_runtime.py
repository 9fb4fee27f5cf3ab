"""libte.torch's runtime: per-thread, per-device libte contexts, the Python-side autocast stack
(which torch.compile traces and guards on), recipes, process groups, and te_tensor descriptions
of torch tensors built from data_ptr/shape (no DLPack on the hot path)."""

import itertools
import threading
import weakref

import torch

from .. import _constants as C
from ..autocast import autocast as _c_autocast
from ..context import Context
from ..errors import InvalidArgument, InvalidState
from ..group import Group, nccl_unique_id
from ..recipe import Recipe

# ---- tensors -----------------------------------------------------------------------------------

DTYPES = {torch.float32: C.DTYPE_F32, torch.float16: C.DTYPE_F16, torch.bfloat16: C.DTYPE_BF16}
_DEVICES = {}  # torch.device -> (te_device_type, index)


def device_key(device):
    """torch.device -> (te device type, index); InvalidArgument for other device types."""
    key = _DEVICES.get(device)
    if key is None:
        if device.type == "cpu":
            key = (C.DEVICE_CPU, 0)
        elif device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            key = (C.DEVICE_CUDA, index)
        else:
            raise InvalidArgument("libte.torch: device %s is not supported (cpu or cuda)" % device)
        if device.index is not None or device.type == "cpu":
            _DEVICES[device] = key
    return key


def desc(t, code):
    """A te_tensor description of contiguous tensor t (zero copy: its data_ptr)."""
    dt, di = device_key(t.device)
    return (t.data_ptr(), code, tuple(t.shape), dt, di, 0, C.SCALING_PER_TENSOR)


def shape_desc(shape, code, device):
    """A shape-only te_tensor description (data NULL): what *_residuals_size reads."""
    dt, di = device_key(device)
    return (0, code, tuple(int(s) for s in shape), dt, di, 0, C.SCALING_PER_TENSOR)


# ---- contexts ----------------------------------------------------------------------------------

class DeviceContext:
    """One libte.Context (one device) with the autocast scopes begun on it, innermost last:
    [(stack entry, libte.autocast)]."""

    __slots__ = ("ctx", "h", "device", "is_cuda", "applied", "__weakref__")

    def __init__(self, key):
        name = "cpu" if key[0] == C.DEVICE_CPU else "cuda:%d" % key[1]
        self.ctx = Context(name)
        self.h = self.ctx._h
        self.device = key
        self.is_cuda = key[0] == C.DEVICE_CUDA
        self.applied = []

    def follow_stream(self, torch_device):
        """Enqueue on PyTorch's current stream of the device (te_context_set_stream only when it
        changed)."""
        if self.is_cuda:
            s = torch.cuda.current_stream(torch_device).cuda_stream
            if s != self.ctx._stream:
                self.ctx.set_stream(s)


class _Thread(threading.local):
    def __init__(self):
        self.contexts = {}   # (type, index) -> DeviceContext
        self.stack = []      # open autocast entries, innermost last
        self.mode = 0        # the innermost entry's mode key; 0 outside any autocast
        self.retain = False  # residuals kept for a second backward (retain_graph)


TLS = _Thread()


def context_for(device):
    """This thread's DeviceContext for a torch.device, created on first use."""
    key = device_key(device)
    cw = TLS.contexts.get(key)
    if cw is None:
        cw = TLS.contexts[key] = DeviceContext(key)
    return cw


def context(device=None):
    """The libte.Context libte.torch uses on this thread for `device` (default: CPU, or the
    current CUDA device when CUDA is available)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) \
            if torch.cuda.is_available() else torch.device("cpu")
    return context_for(torch.device(device)).ctx


# ---- recipes -----------------------------------------------------------------------------------

class Format:
    """TE's recipe.Format names: Format.HYBRID (E4M3 forward, E5M2 backward), Format.E4M3."""

    class _F:
        __slots__ = ("name",)

        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return "Format.%s" % self.name

    HYBRID = _F("HYBRID")
    E4M3 = _F("E4M3")


def DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
                   amax_compute_algo="max", reduce_amax=True, **kwargs):
    """transformer_engine.common.recipe.DelayedScaling's signature -> a libte.Recipe."""
    return Recipe(kind="delayed", margin=margin, fp8_format=fp8_format,
                  amax_history_len=amax_history_len, amax_compute_algo=amax_compute_algo,
                  reduce_amax=reduce_amax, **kwargs)


def Float8CurrentScaling(fp8_format=Format.HYBRID, **kwargs):
    """TE's Float8CurrentScaling -> a libte.Recipe (kind 'current')."""
    return Recipe(kind="current", fp8_format=fp8_format, **kwargs)


def Float8BlockScaling(fp8_format=Format.E4M3, **kwargs):
    """TE's Float8BlockScaling -> a libte.Recipe (kind 'block')."""
    return Recipe(kind="block", fp8_format=fp8_format, **kwargs)


_DEFAULT_RECIPE = []


def default_recipe():
    if not _DEFAULT_RECIPE:
        _DEFAULT_RECIPE.append(Recipe())
    return _DEFAULT_RECIPE[0]


# ---- process groups ----------------------------------------------------------------------------

_GROUPS = {}  # id(torch ProcessGroup) -> (ProcessGroup, libte.Group)


def libte_group(group):
    """None, a libte.Group, or a torch.distributed ProcessGroup -> None or a libte.Group.

    A ProcessGroup of one rank maps to the single-rank group; a larger one to an NCCL group
    whose unique id rank 0 of the group makes and broadcasts over torch.distributed (a
    collective: every rank of the group must enter its first autocast with it together). The
    CUDA device is the current one (torch.cuda.set_device first). Cached per ProcessGroup."""
    if group is None or isinstance(group, Group):
        return group
    import torch.distributed as dist
    if not isinstance(group, dist.ProcessGroup):
        raise InvalidArgument("argument 'group': expected None, a libte.Group or a "
                              "torch.distributed ProcessGroup, got %s" % type(group).__name__)
    hit = _GROUPS.get(id(group))
    if hit is not None and hit[0] is group:
        return hit[1]
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        g = Group.single()
    else:
        box = [nccl_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        g = Group.init_nccl(rank, size, box[0])
    _GROUPS[id(group)] = (group, g)
    return g


# ---- autocast ----------------------------------------------------------------------------------

_MODES = {}        # (enabled, calibrating, recipe key, group id) -> mode key (1, 2, ...)
_MODE_INFO = {}    # mode key -> (enabled, calibrating, recipe description)
_next_mode = itertools.count(1)


def _mode_key(enabled, calibrating, recipe, group):
    k = (enabled, calibrating, recipe.key, 0 if group is None else group.id)
    m = _MODES.get(k)
    if m is None:
        m = _MODES[k] = next(_next_mode)
        _MODE_INFO[m] = (enabled, calibrating, recipe.describe)
    return m


def describe_mode(mode):
    if mode == 0:
        return "no libte.torch.autocast (high precision)"
    e, c, r = _MODE_INFO.get(mode, (None, None, "?"))
    return "autocast(enabled=%s, calibrating=%s, recipe=%s)" % (e, c, r)


class _Entry:
    __slots__ = ("owner", "mode")

    def __init__(self, owner, mode):
        self.owner = owner
        self.mode = mode


def _is_compiling():
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # older torch
        return False


_INSIDE_COMPILE = ("libte.torch.autocast cannot be entered inside a torch.compile'd function: "
                   "enter it around the compiled call (with libte.torch.autocast(...): "
                   "y = compiled_model(x))")


def _not_in_compile(fn):
    """torch.compiler.disable with the reason dynamo prints (older torch: without it)."""
    try:
        return torch.compiler.disable(fn, reason=_INSIDE_COMPILE)
    except TypeError:
        return torch.compiler.disable(fn)


class autocast:
    """FP8 autocast for libte.torch modules, as TE's fp8_autocast / te.autocast:

        with libte.torch.autocast(recipe=libte.torch.DelayedScaling()):
            y = model(x)
        y.sum().backward()

    Per thread, for every device: the libte scope opens on a device's context when the first
    libte.torch op runs there inside the block, and ends (amax reduction, scale update) when
    the block exits. Nestable; one instance may be entered again while open.

    enabled=False: high precision inside (as outside any autocast). recipe: a libte.Recipe
    (None: DelayedScaling's defaults); group: None, a libte.Group or a torch.distributed
    ProcessGroup (amax reduction over its ranks).

    torch.compile: enter the block around the compiled call
    (`with autocast(...): y = compiled(x)`); the modules pass the autocast mode to their ops,
    so the compiled graph is guarded on it. Entering it inside a compiled region raises.
    """

    @_not_in_compile
    def __init__(self, enabled=True, recipe=None, group=None, calibrating=False):
        if recipe is not None and not isinstance(recipe, Recipe):
            raise InvalidArgument("argument 'recipe': expected a libte.Recipe (or "
                                  "libte.torch.DelayedScaling(...) etc.) or None, got %s"
                                  % type(recipe).__name__)
        self.enabled = bool(enabled)
        self.calibrating = bool(calibrating)
        self.recipe = recipe if recipe is not None else default_recipe()
        self._group_arg = group
        self.group = group if (group is None or isinstance(group, Group)) else None
        if group is not None and not isinstance(group, Group):
            libte_group_check(group)
        self._mode = None
        self._scopes = weakref.WeakKeyDictionary()  # DeviceContext -> libte.autocast

    def _resolve(self):
        if self._mode is None:
            self.group = libte_group(self._group_arg)
            self._mode = _mode_key(self.enabled, self.calibrating, self.recipe, self.group)
        return self._mode

    def _c_scope(self, cw):
        s = self._scopes.get(cw)
        if s is None:
            s = self._scopes[cw] = _c_autocast(cw.ctx, enabled=self.enabled,
                                               calibrating=self.calibrating,
                                               recipe=self.recipe, group=self.group)
        return s

    @_not_in_compile
    def __enter__(self):
        if _is_compiling():
            raise InvalidState(_INSIDE_COMPILE)
        t = TLS
        t.stack.append(_Entry(self, self._resolve()))
        t.mode = self._mode
        return self

    @_not_in_compile
    def __exit__(self, exc_type, exc, tb):
        t = TLS
        if not t.stack or t.stack[-1].owner is not self:
            raise InvalidState("libte.torch.autocast: exiting a scope that is not the innermost")
        entry = t.stack.pop()
        t.mode = t.stack[-1].mode if t.stack else 0
        error = None
        for cw in list(t.contexts.values()):
            if cw.applied and cw.applied[-1][0] is entry:
                scope = cw.applied.pop()[1]
                try:
                    scope.end()
                except Exception as e:  # end the other devices' scopes too
                    error = error or e
        if error is not None and exc_type is None:
            raise error
        return False

    def __repr__(self):
        return "<libte.torch.autocast enabled=%s calibrating=%s recipe=%r>" % (
            self.enabled, self.calibrating, self.recipe)


fp8_autocast = autocast  # TE's older name


def libte_group_check(group):
    import torch.distributed as dist
    if not isinstance(group, dist.ProcessGroup):
        raise InvalidArgument("argument 'group': expected None, a libte.Group or a "
                              "torch.distributed ProcessGroup, got %s" % type(group).__name__)


def sync_scopes(cw, mode):
    """Begins on cw the thread's open autocast scopes it lacks, then checks that the innermost
    one is the mode the op was called (or traced) with."""
    t = TLS
    stack = t.stack
    applied = cw.applied
    if len(applied) != len(stack) or (stack and applied[-1][0] is not stack[-1]):
        n = 0
        while n < len(applied) and n < len(stack) and applied[n][0] is stack[n]:
            n += 1
        while len(applied) > n:  # scopes of entries gone (cannot happen through autocast)
            applied.pop()[1].end()
        for entry in stack[n:]:
            scope = entry.owner._c_scope(cw)
            scope.begin()
            applied.append((entry, scope))
    current = t.mode
    if current != mode:
        raise InvalidState("libte.torch: this op was called (or compiled) for %s but runs under "
                           "%s" % (describe_mode(mode), describe_mode(current)))


class retain_residuals:
    """Forwards inside keep their FP8 residual records after a backward, so that a second
    backward through the same graph (loss.backward(retain_graph=True) then again) works. Outside
    it every backward releases them (TE_BACKWARD_ONCE): a second backward then raises
    InvalidState. Records still age out after 64 newer forwards of the same layer."""

    def __enter__(self):
        self._prev = TLS.retain
        TLS.retain = True
        return self

    def __exit__(self, *exc):
        TLS.retain = self._prev
        return False


# ---- modules registry --------------------------------------------------------------------------

LAYERS = {}  # key -> weakref to the module
_next_layer = itertools.count(1)


def register(module):
    key = next(_next_layer)
    LAYERS[key] = weakref.ref(module, lambda _r, k=key: LAYERS.pop(k, None))
    return key


def module_of(key):
    ref = LAYERS.get(key)
    m = ref() if ref is not None else None
    if m is None:
        raise InvalidState("libte.torch: layer %d no longer exists" % key)
    return m
