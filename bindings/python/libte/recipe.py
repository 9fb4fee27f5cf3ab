"""Recipe: immutable FP8 scaling options, with TransformerEngine's names and defaults."""

import numbers

from . import _constants as C
from ._lowlevel import ll
from .errors import InvalidArgument

__all__ = ["Recipe"]

_KINDS = {"delayed": C.RECIPE_DELAYED, "delayed_scaling": C.RECIPE_DELAYED,
          "current": C.RECIPE_CURRENT, "current_scaling": C.RECIPE_CURRENT,
          "block": C.RECIPE_BLOCK, "block_scaling": C.RECIPE_BLOCK}
_KIND_NAMES = {C.RECIPE_DELAYED: "delayed", C.RECIPE_CURRENT: "current", C.RECIPE_BLOCK: "block"}
_FORMATS = {"HYBRID": C.FORMAT_HYBRID, "E4M3": C.FORMAT_E4M3}
_FORMAT_NAMES = {v: k for k, v in _FORMATS.items()}
_ALGOS = {"max": C.AMAX_MAX, "most_recent": C.AMAX_MOST_RECENT}
_ALGO_NAMES = {v: k for k, v in _ALGOS.items()}
_INT32 = (-2 ** 31, 2 ** 31 - 1)


def _choice(value, table, name):
    # TE passes enums (Format.HYBRID): accept anything whose name is in the table.
    key = getattr(value, "name", value)
    if isinstance(key, str):
        hit = table.get(key) if key in table else table.get(key.upper(), table.get(key.lower()))
        if hit is not None:
            return hit
    raise InvalidArgument("argument '%s': expected one of %s, got %r"
                          % (name, ", ".join(repr(k) for k in table), value))


def _int32(value, name):
    if not isinstance(value, numbers.Integral) or not _INT32[0] <= int(value) <= _INT32[1]:
        raise InvalidArgument("argument '%s': expected a 32-bit integer, got %r" % (name, value))
    return int(value)


def _flag(value, name):
    if isinstance(value, (bool, numbers.Integral)) and int(value) in (0, 1):
        return int(value)
    raise InvalidArgument("argument '%s': expected a bool, got %r" % (name, value))


class Recipe:
    """An FP8 recipe: `Recipe()` is TE's DelayedScaling() default.

    kind                'delayed' | 'current' | 'block'
    fp8_format          'HYBRID' (E4M3 forward, E5M2 backward) | 'E4M3'
    margin              delayed: scale = (fp8_max / amax) / 2**margin
    amax_history_len    delayed: window of amaxes (default 1024)
    amax_compute_algo   delayed: 'max' | 'most_recent'
    reduce_amax         all-reduce amaxes over the autocast group
    power_2_scale       current, block: keep only the scale's exponent (alias power_of_2_scales)
    amax_epsilon        current, block: amax clamped up to this
    fprop_split_accumulator, dgrad_split_accumulator, wgrad_split_accumulator

    Anything left as None takes the kind's default from the C library. Recipes are immutable;
    equal options give equal `key`s (and compare equal).
    """

    __slots__ = ("_h", "_key", "_describe", "_options")

    def __init__(self, kind="delayed", fp8_format=None, margin=None, amax_history_len=None,
                 amax_compute_algo=None, reduce_amax=None, power_2_scale=None,
                 power_of_2_scales=None, amax_epsilon=None, fprop_split_accumulator=None,
                 dgrad_split_accumulator=None, wgrad_split_accumulator=None):
        self._h = None
        code = _choice(kind, _KINDS, "kind")
        fields = ll.recipe_defaults(code)
        if power_2_scale is not None and power_of_2_scales is not None \
                and bool(power_2_scale) != bool(power_of_2_scales):
            raise InvalidArgument("arguments 'power_2_scale' and 'power_of_2_scales' are aliases "
                                  "and disagree: %r vs %r" % (power_2_scale, power_of_2_scales))
        if power_2_scale is None:
            power_2_scale = power_of_2_scales
        if fp8_format is not None:
            fields["format"] = _choice(fp8_format, _FORMATS, "fp8_format")
        if margin is not None:
            fields["margin"] = _int32(margin, "margin")
        if amax_history_len is not None:
            fields["amax_history_len"] = _int32(amax_history_len, "amax_history_len")
        if amax_compute_algo is not None:
            fields["amax_algo"] = _choice(amax_compute_algo, _ALGOS, "amax_compute_algo")
        for name, value, field in (("reduce_amax", reduce_amax, "reduce_amax"),
                                   ("power_2_scale", power_2_scale, "power_of_2_scales"),
                                   ("fprop_split_accumulator", fprop_split_accumulator, None),
                                   ("dgrad_split_accumulator", dgrad_split_accumulator, None),
                                   ("wgrad_split_accumulator", wgrad_split_accumulator, None)):
            if value is not None:
                fields[field or name] = _flag(value, name)
        if amax_epsilon is not None:
            if not isinstance(amax_epsilon, numbers.Real) or isinstance(amax_epsilon, bool):
                raise InvalidArgument("argument 'amax_epsilon': expected a float, got %r"
                                      % (amax_epsilon,))
            fields["amax_epsilon"] = float(amax_epsilon)
        self._h = ll.recipe_create(fields)
        self._key = ll.recipe_key(self._h)
        self._describe = ll.recipe_describe(self._h)
        self._options = ll.recipe_get_options(self._h)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h is not None:
            try:
                ll.recipe_release(h)
            except Exception:  # interpreter shutdown
                pass

    @property
    def key(self):
        """te_recipe_key: equal options <=> equal keys (within this process)."""
        return self._key

    @property
    def describe(self):
        """te_recipe_describe: the canonical description."""
        return self._describe

    kind = property(lambda self: _KIND_NAMES[self._options["kind"]])
    fp8_format = property(lambda self: _FORMAT_NAMES[self._options["format"]])
    margin = property(lambda self: self._options["margin"])
    amax_history_len = property(lambda self: self._options["amax_history_len"])
    amax_compute_algo = property(lambda self: _ALGO_NAMES[self._options["amax_algo"]])
    reduce_amax = property(lambda self: bool(self._options["reduce_amax"]))
    power_2_scale = property(lambda self: bool(self._options["power_of_2_scales"]))
    power_of_2_scales = power_2_scale
    amax_epsilon = property(lambda self: self._options["amax_epsilon"])
    fprop_split_accumulator = property(lambda self: bool(self._options["fprop_split_accumulator"]))
    dgrad_split_accumulator = property(lambda self: bool(self._options["dgrad_split_accumulator"]))
    wgrad_split_accumulator = property(lambda self: bool(self._options["wgrad_split_accumulator"]))

    def options(self):
        """The options as keyword arguments that recreate this recipe."""
        o = self._options
        return dict(kind=self.kind, fp8_format=self.fp8_format, margin=o["margin"],
                    amax_history_len=o["amax_history_len"],
                    amax_compute_algo=self.amax_compute_algo, reduce_amax=self.reduce_amax,
                    power_2_scale=self.power_2_scale, amax_epsilon=o["amax_epsilon"],
                    fprop_split_accumulator=self.fprop_split_accumulator,
                    dgrad_split_accumulator=self.dgrad_split_accumulator,
                    wgrad_split_accumulator=self.wgrad_split_accumulator)

    def __eq__(self, other):
        return isinstance(other, Recipe) and other._key == self._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return "libte.Recipe(%s)" % self._describe

    def __reduce__(self):
        return (_recreate, (self.options(),))


def _recreate(options):
    return Recipe(**options)
