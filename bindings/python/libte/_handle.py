"""Ownership of native handles, in the order the C library requires.

A handle may depend on others that must be destroyed after it: a linear, a backward context or
residuals on their context; a context on the groups its autocast scopes used. Each NativeHandle
counts the live handles depending on it; releasing one that still has some only marks it, and
the last dependent's release frees it. That keeps the order right even when the garbage
collector finalizes a whole cycle of objects in arbitrary order.
"""

from .errors import InvalidState


class NativeHandle:
    __slots__ = ("ptr", "_destroy", "_deps", "_dependents", "_pending", "__weakref__")

    def __init__(self, ptr, destroy, parent=None):
        self.ptr = ptr
        self._destroy = destroy
        self._deps = []
        self._dependents = 0
        self._pending = False
        if parent is not None:
            self.depend_on(parent)

    def depend_on(self, other):
        """`other` is destroyed only after this handle."""
        if other is not self and other not in self._deps:
            other._dependents += 1
            self._deps.append(other)

    def release(self):
        """Frees the native object now, or as soon as its last dependent is released.
        Idempotent."""
        if self.ptr is None:
            return
        if self._dependents:
            self._pending = True
            return
        ptr, self.ptr = self.ptr, None
        self._destroy(ptr)
        deps, self._deps = self._deps, []
        for dep in deps:
            dep._dependents -= 1
            if dep._pending and not dep._dependents:
                dep.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass


def closed_error(what):
    return InvalidState("%s is closed" % what)
