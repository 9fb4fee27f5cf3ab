"""The two low-level backends: same layouts, the same answers, and the loader's messages."""

import os
import subprocess
import sys

import numpy as np
import pytest

import libte
from libte import _lowlevel_ctypes


def _swig():
    try:
        from libte import _lowlevel_swig
    except ImportError:
        pytest.skip("SWIG extension not built")
    return _lowlevel_swig


def test_struct_layouts_match_the_header():
    swig = _swig()
    assert _lowlevel_ctypes.SIZEOF == swig.SIZEOF


def test_backends_agree(rng):
    swig = _swig()
    for ll in (_lowlevel_ctypes, swig):
        c = ll.context_create((0, 0))
        r = ll.recipe_create(ll.recipe_defaults(1))
        assert ll.recipe_describe(r).startswith("current_scaling(")
        opts = ll.autocast_options(True, False, r, None)
        t1 = ll.autocast_begin(c, opts)
        t2 = ll.autocast_begin(c, opts)
        with pytest.raises(libte.InvalidState):
            ll.autocast_end(c, t1)
        ll.autocast_end(c, t2)
        ll.autocast_end(c, t1)
        ll.recipe_release(r)
        ll.context_destroy(c)


def test_selected_backend_is_reported():
    assert libte.BACKEND in ("ctypes", "swig")
    forced = os.environ.get("LIBTE_BACKEND")
    if forced:
        assert libte.BACKEND == forced


def _import_in_subprocess(env):
    code = "import libte; print(libte.BACKEND)"
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(libte.__file__)))
    full = dict(os.environ, PYTHONPATH=pkg, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def test_missing_library_lists_every_place_tried(tmp_path):
    r = _import_in_subprocess({"LIBTE_PATH": str(tmp_path / "nowhere.so"),
                               "LD_LIBRARY_PATH": str(tmp_path)})
    if r.returncode == 0:
        pytest.skip("a libte.so is installed in the package directory or on the system")
    assert "ImportError" in r.stderr and "LIBTE_PATH file" in r.stderr
    assert "package directory" in r.stderr and "system loader" in r.stderr


def test_bad_backend_name():
    r = _import_in_subprocess({"LIBTE_BACKEND": "cffi"})
    assert r.returncode != 0 and "LIBTE_BACKEND must be" in r.stderr
