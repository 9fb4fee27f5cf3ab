import numpy as np
import pytest

import libte
from conftest import dequant64

ml_dtypes = pytest.importorskip("ml_dtypes")


def test_quantize_matches_ml_dtypes(ctx, rng):
    x = (rng.standard_normal((16, 32)) * 3).astype(np.float32)
    q = libte.quantize(ctx, x, dtype="e4m3")
    scale = 1.0 / q.scale_inv[0]
    assert scale == pytest.approx(448.0 / np.abs(x).max(), rel=1e-6)
    expect = (x * np.float32(scale)).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(q.data.view(np.uint8), expect.view(np.uint8))
    back = libte.dequantize(ctx, q)
    np.testing.assert_allclose(back, dequant64(q), rtol=1e-6)


def test_quantize_with_given_scale_and_amax(ctx, rng):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    amax = np.zeros(1, np.float32)
    q = libte.quantize(ctx, x, dtype="e5m2", scale=2.0, amax=amax)
    assert q.dtype_name == "float8_e5m2"
    assert q.scale_inv[0] == 0.5
    assert amax[0] == np.abs(x).max()
    out = libte.Float8Tensor.empty(x.shape, "e5m2")
    assert libte.quantize(ctx, x, out, dtype="e5m2", scale=np.array([2.0], np.float32)) is out
    np.testing.assert_array_equal(out.data.view(np.uint8), q.data.view(np.uint8))


def test_uint8_codes_need_dtype(ctx):
    codes = np.zeros((4, 4), np.uint8)
    with pytest.raises(libte.InvalidArgument, match="argument 'dtype': required"):
        libte.Float8Tensor(codes, np.ones(1, np.float32))
    t = libte.Float8Tensor(codes, np.ones(1, np.float32), dtype="e4m3")
    np.testing.assert_array_equal(libte.dequantize(ctx, t), np.zeros((4, 4)))


def test_scale_inv_size_checked(ctx):
    codes = np.zeros((4, 256), ml_dtypes.float8_e4m3fn)
    assert libte.Float8Tensor.scale_inv_count((4, 256), scaling="block_1x128") == 8
    with pytest.raises(libte.InvalidArgument) as e:
        libte.Float8Tensor(codes, np.ones(1, np.float32), scaling="block_1x128")
    assert "expected 8 float32 values" in str(e.value)


def test_block_quantize(ctx, rng):
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[:, 128:] *= 100
    q = libte.quantize(ctx, x, scaling="block_1x128")
    assert q.scale_inv.shape == (8,)
    assert q.scale_inv[1] > q.scale_inv[0] * 10
    np.testing.assert_allclose(libte.dequantize(ctx, q), x, rtol=0.07, atol=1e-3)


def test_cast_transpose(ctx, rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    out, out_t = libte.cast_transpose(ctx, x)
    np.testing.assert_array_equal(out.data.view(np.uint8).T, out_t.data.view(np.uint8))
    assert out.scale_inv[0] == out_t.scale_inv[0]
    only_t = libte.cast_transpose(ctx, x, out=False)
    assert only_t[0] is None and only_t[1].shape == (16, 32)


def test_amax(ctx, rng):
    x = rng.standard_normal(100).astype(np.float32)
    assert libte.amax(ctx, x) == np.abs(x).max()
    out = np.zeros(1, np.float32)
    assert libte.amax(ctx, x, out) is out and out[0] == np.abs(x).max()
    x[3] = np.nan
    assert np.isnan(libte.amax(ctx, x))


def test_gemm_high_precision_and_fp8(ctx, rng):
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((48, 16)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    d = libte.gemm(ctx, a, b, transb=True, bias=bias)
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.T + bias, rtol=1e-5, atol=1e-5)
    libte.gemm(ctx, a, b, d, transb=True, accumulate=True)
    np.testing.assert_allclose(d, 2 * a.astype(np.float64) @ b.T + bias, rtol=1e-5, atol=1e-4)
    qa, qb = libte.quantize(ctx, a), libte.quantize(ctx, b)
    d8 = libte.gemm(ctx, qa, qb, transb=True)
    np.testing.assert_allclose(d8, dequant64(qa) @ dequant64(qb).T, rtol=1e-5, atol=1e-4)
    with pytest.raises(libte.Unsupported) as e:  # FP8 needs the TN layout
        libte.gemm(ctx, qa, libte.quantize(ctx, b.T.copy()))
    assert "te_gemm" in str(e.value)


def test_activations(ctx, rng):
    x = rng.standard_normal((8, 32)).astype(np.float32)
    np.testing.assert_array_equal(libte.activation_forward(ctx, "relu", x), np.maximum(x, 0))
    g = libte.activation_forward(ctx, "gelu", x)
    ref = 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6)
    s = libte.activation_forward(ctx, "swiglu", x)
    assert s.shape == (8, 16)
    a, b = x[:, :16].astype(np.float64), x[:, 16:]
    np.testing.assert_allclose(s, a / (1 + np.exp(-a)) * b, rtol=1e-5, atol=1e-6)
    dy = np.ones_like(x)
    np.testing.assert_array_equal(libte.activation_backward(ctx, "relu", x, dy),
                                  (x > 0).astype(np.float32))
    with pytest.raises(libte.InvalidArgument, match="even last dimension"):
        libte.activation_forward(ctx, "swiglu", x[:, :3].copy())
    with pytest.raises(libte.InvalidArgument) as e:
        libte.activation_forward(ctx, "relu", x, out=np.empty((8, 31), np.float32))
    assert "te_activation_forward" in str(e.value)
