"""Shared fixtures. The backend is chosen at import (LIBTE_BACKEND=ctypes|swig); the suite runs
once per backend (scripts/test_python.sh), and the summary line says which one ran."""

import numpy as np
import pytest

import libte


# tests/gpu holds scripts for GPU machines, run by hand (nccl_two_ranks.py): never collected.
collect_ignore = ["gpu"]


def pytest_report_header(config):
    return "libte backend: %s, library: %s" % (libte.BACKEND, libte.library_path())


@pytest.fixture
def ctx():
    c = libte.Context("cpu")
    yield c
    c.close()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def fp64_linear_reference(res, bias=None):
    """y = x W^T (+ b) in fp64 from the dequantized FP8 residuals x^T and W^T."""
    xt = dequant64(res.input_t)
    wt = dequant64(res.weight_t)
    y = xt.T @ wt
    return y if bias is None else y + bias.astype(np.float64)


def dequant64(t):
    """A Float8Tensor (per-tensor scaling) or an array, as float64."""
    if isinstance(t, libte.Float8Tensor):
        assert t.scaling_name == "per_tensor"
        return t.numpy_codes().astype(np.float64) * np.float64(t.scale_inv[0])
    return np.asarray(t, np.float64)
