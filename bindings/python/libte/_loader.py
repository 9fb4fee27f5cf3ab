"""Finds and loads libte.so: LIBTE_PATH (a file or a directory), then this package's directory,
then the system loader. Loading it here, by full path, before any backend imports its module also
makes the SWIG extension (whose DT_NEEDED is the SONAME libte.so.0) bind to this same copy."""

import ctypes
import ctypes.util
import os

SONAME = "libte.so.0"
_NAMES = ("libte.so", SONAME)

_library = None
_library_path = None


def _candidates():
    """(path or name, where it came from) in search order."""
    env = os.environ.get("LIBTE_PATH")
    if env:
        if os.path.isdir(env):
            for name in _NAMES:
                yield os.path.join(env, name), "LIBTE_PATH directory"
        else:
            yield env, "LIBTE_PATH file"
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _NAMES:
        yield os.path.join(here, name), "package directory"
    found = ctypes.util.find_library("te")
    if found:
        yield found, "ctypes.util.find_library('te')"
    yield SONAME, "system loader"


def load():
    """The loaded ctypes.CDLL (loaded once, with RTLD_GLOBAL). ImportError lists every place
    tried, and why each failed."""
    global _library, _library_path
    if _library is not None:
        return _library
    tried = []
    for path, origin in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (%s): no such file" % (path, origin))
            continue
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            lib.te_version  # a libte, not some other libte.so
        except (OSError, AttributeError) as e:
            tried.append("%s (%s): %s" % (path, origin, e))
            continue
        _library, _library_path = lib, path
        return lib
    raise ImportError("libte: could not load libte.so. Set LIBTE_PATH to the library file or its "
                      "directory (e.g. build/release). Tried:\n  " + "\n  ".join(tried))


def path():
    """Where the loaded library came from."""
    load()
    return _library_path
