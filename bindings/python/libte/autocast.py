"""libte.autocast: a context manager over te_autocast_begin / te_autocast_end."""

from ._lowlevel import ll
from .errors import InvalidArgument, InvalidState
from .context import AutocastState, Context  # AutocastState: re-exported here too
from .group import Group
from .recipe import Recipe

__all__ = ["autocast", "AutocastState"]


class autocast:
    """An FP8 autocast scope on `ctx`:

        with libte.autocast(ctx, recipe=libte.Recipe()):
            y, bwd = layer.forward(x, w, b)

    Options are fixed at construction (the C options struct is built once), so entering is
    one C call. One object may be entered again while open (nested scopes): each entry pushes
    its token, each exit ends the innermost one. Ending a scope that is not the innermost open
    scope of the context raises InvalidState and changes nothing.
    """

    __slots__ = ("_ctx", "_opts", "_tokens", "recipe", "group", "enabled", "calibrating")

    def __init__(self, ctx, enabled=True, calibrating=False, recipe=None, group=None):
        if not isinstance(ctx, Context):
            raise InvalidArgument("argument 'ctx': expected a libte.Context, got %s"
                                  % type(ctx).__name__)
        if recipe is not None and not isinstance(recipe, Recipe):
            raise InvalidArgument("argument 'recipe': expected a libte.Recipe or None, got %s"
                                  % type(recipe).__name__)
        if group is not None and not isinstance(group, Group):
            raise InvalidArgument("argument 'group': expected a libte.Group or None, got %s"
                                  % type(group).__name__)
        ctx._handle()
        if group is not None:
            # Buckets keep using the group after the scope: it must outlive the context.
            ctx._native.depend_on(group._native)
        self._ctx = ctx
        self.recipe = recipe  # holds the recipe (and group) alive while this object lives
        self.group = group
        self.enabled = bool(enabled)
        self.calibrating = bool(calibrating)
        self._opts = ll.autocast_options(self.enabled, self.calibrating,
                                         recipe._h if recipe is not None else None,
                                         group._handle() if group is not None else None)
        self._tokens = []

    def begin(self):
        """Opens a scope; returns its token (as te_autocast_begin)."""
        h = self._ctx._h
        if h is None:
            raise InvalidState("Context is closed")
        token = ll.autocast_begin(h, self._opts)
        self._tokens.append(token)
        return token

    def end(self):
        """Closes this object's most recent open scope, which must be the context's innermost."""
        h = self._ctx._h
        if h is None:
            raise InvalidState("Context is closed")
        tokens = self._tokens
        if not tokens:
            raise InvalidState("autocast.end: this autocast object has no open scope")
        ll.autocast_end(h, tokens[-1])
        tokens.pop()

    def __enter__(self):
        self.begin()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.end()
            return False
        # Leaving by an exception: close the scope if we still can, but never mask the error.
        try:
            self.end()
        except Exception:
            pass
        return False

    @property
    def depth(self):
        """Scopes this object has open."""
        return len(self._tokens)

    def __repr__(self):
        return "<libte.autocast enabled=%s calibrating=%s recipe=%r open=%d>" % (
            self.enabled, self.calibrating, self.recipe, len(self._tokens))
