"""Float64 references for the transformer-module tests: norms, activations, and the modules'
forward and backward chains, written from the formulas (not from libte)."""

import numpy as np

import libte


def f64(a):
    return np.asarray(a, np.float64)


def dequant64(t):
    """A per-tensor FP8 Float8Tensor (or an array) as float64."""
    if isinstance(t, libte.Float8Tensor):
        assert t.scaling_name == "per_tensor"
        return t.numpy_codes().astype(np.float64) * np.float64(t.scale_inv[0])
    return f64(t)


def rel_err(a, ref):
    """Relative Frobenius error."""
    a, ref = f64(a), f64(ref)
    return np.linalg.norm(a - ref) / np.linalg.norm(ref)


def assert_close(got, ref, tol):
    """|got - ref| <= tol * (|ref| + max|ref|) elementwise: relative where values are large,
    relative to the tensor's scale where they cancel."""
    got, ref = f64(got), f64(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    bound = tol * (np.abs(ref) + np.abs(ref).max())
    worst = np.max(np.abs(got - ref) - bound)
    assert worst <= 0, "max excess %g over tol %g (max|ref| %g)" % (worst, tol,
                                                                    np.abs(ref).max())


# ---- norms -----------------------------------------------------------------------------------

def norm(kind, x, gamma, beta=None, eps=1e-5, zcg=False):
    """(y, mu, rsigma) over the last dimension; mu is zeros for RMSNorm."""
    x = f64(x)
    g = f64(gamma) + (1.0 if zcg else 0.0)
    if kind == "layernorm":
        mu = x.mean(-1, keepdims=True)
        rs = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        y = (x - mu) * rs * g + f64(beta)
    else:
        mu = np.zeros(x.shape[:-1] + (1,))
        rs = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        y = x * rs * g
    return y, mu[..., 0], rs[..., 0]


def norm_backward(kind, dy, x, gamma, eps=1e-5, zcg=False):
    """(dx, dgamma, dbeta) of norm() for the gradient dy of its output."""
    x, dy = f64(x), f64(dy).reshape(np.shape(x))
    g = f64(gamma) + (1.0 if zcg else 0.0)
    _, mu, rs = norm(kind, x, gamma, np.zeros_like(g), eps, zcg)
    mu, rs = mu[..., None], rs[..., None]
    xhat = (x - mu) * rs
    dyg = dy * g
    c1 = (dyg * xhat).mean(-1, keepdims=True)
    c2 = dyg.mean(-1, keepdims=True) if kind == "layernorm" else 0.0
    dx = rs * (dyg - xhat * c1 - c2)
    axes = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(axes), dy.sum(axes)


# ---- activations -----------------------------------------------------------------------------

_K = np.sqrt(2.0 / np.pi)


def _gelu(z):
    return 0.5 * z * (1.0 + np.tanh(_K * (z + 0.044715 * z ** 3)))


def _dgelu(z):
    t = np.tanh(_K * (z + 0.044715 * z ** 3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _K * (1.0 + 3 * 0.044715 * z * z)


def _silu(z):
    return z / (1.0 + np.exp(-z))


def _dsilu(z):
    s = 1.0 / (1.0 + np.exp(-z))
    return s * (1.0 + z * (1.0 - s))


_PLAIN = {"relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(np.float64)),
          "gelu": (_gelu, _dgelu),
          "srelu": (lambda z: np.maximum(z, 0.0) ** 2, lambda z: 2.0 * np.maximum(z, 0.0))}
_GATED = {"swiglu": (_silu, _dsilu), "geglu": (_gelu, _dgelu)}


def activation(name, h):
    h = f64(h)
    if name in _GATED:
        n = h.shape[-1] // 2
        return _GATED[name][0](h[..., :n]) * h[..., n:]
    return _PLAIN[name][0](h)


def activation_backward(name, h, da):
    h, da = f64(h), f64(da)
    if name in _GATED:
        n = h.shape[-1] // 2
        f, df = _GATED[name]
        return np.concatenate([da * h[..., n:] * df(h[..., :n]), da * f(h[..., :n])], -1)
    return da * _PLAIN[name][1](h)


# ---- modules ---------------------------------------------------------------------------------

def layernorm_linear(kind, x, gamma, beta, w, b, dy, eps=1e-5, zcg=False):
    """Forward and backward of y = norm(x) W^T + b: a dict of every output and gradient."""
    ln, mu, rs = norm(kind, x, gamma, beta, eps, zcg)
    y = ln @ f64(w).T + (f64(b) if b is not None else 0.0)
    dy = f64(dy).reshape(y.shape)
    dln = dy @ f64(w)
    dx, dg, dbeta = norm_backward(kind, dln, x, gamma, eps, zcg)
    rows = dy.reshape(-1, dy.shape[-1])
    return {"y": y, "ln_out": ln, "mu": mu, "rsigma": rs, "dx": dx, "dln_weight": dg,
            "dln_bias": dbeta, "dw": rows.T @ ln.reshape(-1, ln.shape[-1]),
            "db": rows.sum(0)}


def layernorm_mlp(kind, act, x, gamma, beta, w1, b1, w2, b2, dy, eps=1e-5, zcg=False):
    """Forward and backward of y = fc2(act(fc1(norm(x)))): a dict of everything."""
    ln, mu, rs = norm(kind, x, gamma, beta, eps, zcg)
    h = ln @ f64(w1).T + (f64(b1) if b1 is not None else 0.0)
    a = activation(act, h)
    y = a @ f64(w2).T + (f64(b2) if b2 is not None else 0.0)
    dy = f64(dy).reshape(y.shape)
    da = dy @ f64(w2)
    dh = activation_backward(act, h, da)
    dln = dh @ f64(w1)
    dx, dg, dbeta = norm_backward(kind, dln, x, gamma, eps, zcg)
    flat = lambda t: t.reshape(-1, t.shape[-1])
    return {"y": y, "ln_out": ln, "fc1_out": h, "act_out": a, "mu": mu, "rsigma": rs, "dx": dx,
            "dln_weight": dg, "dln_bias": dbeta, "dfc1_weight": flat(dh).T @ flat(ln),
            "dfc1_bias": flat(dh).sum(0), "dfc2_weight": flat(dy).T @ flat(a),
            "dfc2_bias": flat(dy).sum(0)}


def e5m2_exact(rng, shape):
    """Values exactly representable in E5M2 (and in every activation dtype): with scale 1 (a
    fresh delayed-scaling state) their FP8 quantization is exact."""
    vals = np.array([-1.5, -1.0, -0.5, -0.25, 0.0, 0.125, 0.375, 0.75, 1.25], np.float32)
    return vals[rng.integers(0, len(vals), shape)]
