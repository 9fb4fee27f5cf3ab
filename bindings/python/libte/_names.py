"""The checks of checkpoint record names and paths both low-level layers run before calling C:
C strings end at the first NUL, so a name or path holding one would silently name something
else. Everything else (empty names, names over 255 bytes) is the C library's to refuse."""

import os

from .errors import InvalidArgument


def check_name(name):
    """A record name (bytes; str is encoded as UTF-8) -> bytes; None -> None (NULL)."""
    if name is None:
        return None
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    elif isinstance(name, (bytearray, memoryview)):
        name = bytes(name)
    elif not isinstance(name, bytes):
        raise InvalidArgument("argument 'name': expected str or bytes, got %s"
                              % type(name).__name__)
    if b"\0" in name:
        raise InvalidArgument("argument 'name': a record name cannot hold a NUL byte, got %r"
                              % (name,))
    return name


def check_path(path):
    """A file path (str, bytes or os.PathLike) -> bytes; None -> None (NULL)."""
    if path is None:
        return None
    try:
        raw = os.fsencode(path)
    except TypeError:
        raise InvalidArgument("argument 'path': expected str, bytes or os.PathLike, got %s"
                              % type(path).__name__) from None
    if b"\0" in raw:
        raise InvalidArgument("argument 'path': a path cannot hold a NUL byte, got %r" % (raw,))
    return raw


def buffer_bytes(data, name="data"):
    """A bytes-like object -> bytes (a copy); TypeError for anything else (an int would make
    bytes(n) zeros)."""
    try:
        return bytes(memoryview(data).cast("B"))
    except TypeError:
        raise InvalidArgument("argument '%s': expected a bytes-like object, got %s"
                              % (name, type(data).__name__)) from None
