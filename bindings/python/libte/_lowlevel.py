"""Chooses the low-level backend: the SWIG extension (libte._te_swig) when it is built and
importable, ctypes otherwise. LIBTE_BACKEND=ctypes|swig forces one (forcing swig without the
extension is an ImportError that says why). Everything else in the package calls `ll`."""

import os

from ._loader import load

_FORCED = os.environ.get("LIBTE_BACKEND", "").strip().lower()
if _FORCED not in ("", "ctypes", "swig"):
    raise ImportError("LIBTE_BACKEND must be 'ctypes' or 'swig', got %r" % _FORCED)

load()  # first, by full path: the SWIG extension then binds to this same copy of libte.so

if _FORCED == "ctypes":
    from . import _lowlevel_ctypes as ll
elif _FORCED == "swig":
    try:
        from . import _lowlevel_swig as ll
    except ImportError as e:
        raise ImportError("LIBTE_BACKEND=swig, but the SWIG extension libte._te_swig is not "
                          "importable (build it with bindings/swig/build.py): %s" % e) from e
else:
    try:
        from . import _lowlevel_swig as ll
    except ImportError:
        from . import _lowlevel_ctypes as ll

BACKEND = ll.NAME
