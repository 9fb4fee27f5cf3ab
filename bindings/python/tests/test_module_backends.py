"""The transformer modules through both low-level backends: the same bytes (a training step of
each module run in a subprocess per backend), the struct layouts, and the SWIG module's own
conventions for the modules' structs and arrays."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import libte
from libte import _constants as C
from libte import _lowlevel_ctypes

STEP = r'''
import hashlib, sys
import numpy as np
import libte

assert libte.BACKEND == sys.argv[1], libte.BACKEND
rng = np.random.default_rng(7)
out = hashlib.sha256()
def feed(*arrays):
    for a in arrays:
        if a is None:
            out.update(b"none")
        elif isinstance(a, libte.Float8Tensor):
            out.update(a.numpy_codes().tobytes() + a.scale_inv.tobytes())
        else:
            out.update(np.ascontiguousarray(a).tobytes())
f = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
with libte.Context("cpu") as ctx:
    for kind in ("delayed", "current", "block", None):
        recipe = libte.Recipe(kind=kind, amax_history_len=4) if kind == "delayed" else (
            libte.Recipe(kind=kind) if kind else None)
        scope = lambda: libte.autocast(ctx, recipe=recipe, enabled=kind is not None)
        lnl = libte.LayerNormLinear(ctx, 64, 48, normalization="rmsnorm", zero_centered_gamma=True)
        mlp = libte.LayerNormMLP(ctx, 64, 32, activation="swiglu", eps=1e-3)
        grp = libte.GroupedLinear(ctx, 3, 64, 32)
        x, g, b = f(32, 64), f(64), f(64)
        for step in range(2):
            with scope():
                y1, ln, r1 = lnl.forward_compute(x, g, None, f(48, 64), f(48), ln_out=True)
                y2, r2 = mlp.forward_compute(x, g, b, f(64, 64), f(64), f(64, 32), f(64))
                y3, b3 = grp.forward(x, [7, 0, 25], f(3, 32, 64), f(3, 32))
            feed(y1, ln, y2, y3, r1.ln_out_t, r1.weight_t, r1.mu, r1.rsigma, r2.ln_out_t,
                 r2.fc1_weight_t, r2.fc1_out, r2.act_out_t, r2.fc2_weight_t, r2.mu, r2.rsigma)
            b1, b2 = lnl.forward_save(r1), mlp.forward_save(r2)
            feed(*b1.backward(f(32, 48)), *b2.backward(f(32, 64)))
            g3 = b3.backward(f(32, 32), once=True)
            feed(g3.dx, *g3.dw, *g3.db)
        for m in (lnl, mlp):
            out.update(m.state_dict())
            feed(*m.scaling_state("grad_output")[:2])
        out.update(grp.state_dict())
print(out.hexdigest())
'''


def _swig():
    try:
        from libte import _lowlevel_swig
    except ImportError:
        pytest.skip("SWIG extension not built")
    return _lowlevel_swig


def _digest(backend):
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(libte.__file__)))
    env = dict(os.environ, LIBTE_BACKEND=backend, PYTHONPATH=pkg)
    r = subprocess.run([sys.executable, "-c", STEP, backend], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_both_backends_write_the_same_bytes():
    _swig()
    assert _digest("ctypes") == _digest("swig")


def test_struct_layouts_match():
    swig = _swig()
    names = [n for n in _lowlevel_ctypes.SIZEOF if "layernorm" in n or "grouped" in n]
    assert len(names) == 11
    for name in names:
        assert _lowlevel_ctypes.SIZEOF[name] == swig.SIZEOF[name] > 0, name
    # te_tensor is 104 bytes; the residual structs hold 4 and 7 of them plus fp8 and internal.
    assert _lowlevel_ctypes.SIZEOF["te_layernorm_linear_residuals"] == 8 + 4 * 104 + 8 + 8
    assert _lowlevel_ctypes.SIZEOF["te_layernorm_mlp_residuals"] == 8 + 7 * 104 + 8 + 8


def test_swig_struct_members_take_proxies_only():
    """A tuple converted for a struct member would live on the setter's stack and dangle: the
    members that point to tensors take te_tensor proxies (or None) only, while function
    parameters of the same names (te_linear_backward's dx, dw, db, ...) still take tuples."""
    _swig()
    from libte import _te_swig as te
    tup = (0, C.DTYPE_F32, (1,), 0, 0, 0, 0)
    t = te.te_tensor()
    for struct, members in (
            (te.te_layernorm_linear_forward_args(), ("input", "ln_weight", "ln_bias", "weight",
                                                     "bias", "ln_out")),
            (te.te_layernorm_linear_grads(), ("dx", "dln_weight", "dln_bias", "dw", "db")),
            (te.te_layernorm_mlp_forward_args(), ("fc1_weight", "fc1_bias", "fc2_weight",
                                                  "fc2_bias", "ln_out")),
            (te.te_layernorm_mlp_grads(), ("dx", "dfc1_weight", "dfc1_bias", "dfc2_weight",
                                           "dfc2_bias"))):
        for name in members:
            with pytest.raises(TypeError, match="proxy"):
                setattr(struct, name, tup)
            setattr(struct, name, t)
            setattr(struct, name, None)
    with pytest.raises(AttributeError):  # the arrays would dangle too: read-only
        te.te_grouped_linear_forward_args().weights = None
    ctx = te.te_context_create(None)
    for call, arg in ((lambda: te.te_linear_backward(ctx, None, tup, tup, tup, tup, None), "bwd"),
                      (lambda: te.te_activation_backward(ctx, 0, tup, tup, tup), "x->data"),
                      (lambda: te.te_norm_backward(ctx, None, tup, tup, tup, None, tup, tup,
                                                   None, None), "x->data")):
        with pytest.raises(libte.InvalidArgument, match=arg):
            call()
    # Options and grads structs come with their _init defaults.
    o = te.te_layernorm_mlp_options()
    assert (o.bias, o.activation, o.activation_dtype, o.eps) == (
        1, C.ACTIVATION_GELU, C.DTYPE_BF16, np.float32(1e-5))
    assert te.te_grouped_linear_options().bias == 1
    assert te.te_layernorm_linear_grads().struct_size == \
        _lowlevel_ctypes.SIZEOF["te_layernorm_linear_grads"]


def test_swig_raw_grouped_linear_takes_lists(rng):
    """te_grouped_linear_backward's arrays of tensor pointers are lists (proxies, tuples or
    None); a short list ends in NULLs the library reports, never a read past the array."""
    _swig()
    from libte import _te_swig as te
    ctx = te.te_context_create(None)
    o = te.te_grouped_linear_options()
    o.num_gemms, o.in_features, o.out_features, o.bias = 2, 16, 16, 0
    o.activation_dtype = C.DTYPE_F32
    g = te.te_grouped_linear_create(ctx, o)
    x = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (2, 16, 16)).astype(np.float32)
    y = np.zeros((8, 16), np.float32)
    desc = lambda a: (a.ctypes.data, C.DTYPE_F32, a.shape, 0, 0, 0, 0)
    bwd = te.te_swig_grouped_linear_forward(ctx, g, desc(x), [3, 5], [desc(w[0]), desc(w[1])],
                                            None, 0, desc(y))
    np.testing.assert_allclose(y[:3], x[:3] @ w[0].T, rtol=1e-5, atol=1e-5)
    dw = np.zeros((2, 16, 16), np.float32)
    dy = np.ones((8, 16), np.float32)
    te.te_grouped_linear_backward(ctx, bwd, desc(dy), None, [desc(dw[0]), desc(dw[1])], None,
                                  None)
    np.testing.assert_allclose(dw[1], np.ones((16, 5)) @ x[3:], rtol=1e-5)
    with pytest.raises(libte.InvalidArgument, match=r"dw\[1\]"):
        te.te_grouped_linear_backward(ctx, bwd, desc(dy), None, [desc(dw[0])], None, None)
    with pytest.raises(TypeError, match="grad_ws"):
        te.te_grouped_linear_backward(ctx, bwd, desc(dy), None, [1], None, None)
    # m_splits is zero past the list: a short one is a sum the library refuses.
    with pytest.raises(libte.InvalidArgument, match="args->m_splits"):
        te.te_swig_grouped_linear_forward(ctx, g, desc(x), [3], [desc(w[0]), desc(w[1])], None,
                                          0, desc(y))
