"""libte.torch.DotProductAttention and apply_rotary_pos_emb on the CPU: against
torch.nn.functional.scaled_dot_product_attention (forward and backward, masks, GQA, THD per
sequence), torch.compile(fullgraph=True) with no graph break and bitwise the eager numbers, FP8
state in state_dict, FP8 attention (delayed scaling) within FP8 tolerance, and RoPE against TE's
formula (TE-shaped freqs)."""

import pytest

torch = pytest.importorskip("torch")

import libte  # noqa: E402
import libte.torch as lt  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

F = torch.nn.functional


def _has_attention():
    try:
        libte.Attention(lt.context("cpu"), 1, 8).close()
        return True
    except libte.Unsupported:
        return False


pytestmark = pytest.mark.skipif(not _has_attention(),
                                reason="this libte.so (or SWIG module) has no te_attention_*")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def graph_breaks():
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def sdpa_bshd(q, k, v, mask, scale=None):
    """torch's SDPA on [b, s, h, d] tensors -> [b, s, h*d]."""
    sq, skv = q.shape[1], k.shape[1]
    am, causal = None, False
    if mask == "causal":
        if sq == skv:
            causal = True
        else:  # top-left: key j visible to query i iff j <= i
            am = torch.ones(sq, skv, dtype=torch.bool).tril()
    elif mask == "causal_bottom_right":
        am = causal_lower_right(sq, skv)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=am, is_causal=causal, scale=scale,
                                       enable_gqa=q.shape[2] != k.shape[2])
    o = o.transpose(1, 2)
    return o.reshape(o.shape[0], o.shape[1], -1)


def qkv(b, sq, skv, h, hk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(dtype)  # noqa: E731
    return (mk(b, sq, h, d).requires_grad_(), mk(b, skv, hk, d).requires_grad_(),
            mk(b, skv, hk, d).requires_grad_())


def grads(fn, tensors, dy):
    for t in tensors:
        t.grad = None
    y = fn(*tensors)
    y.backward(dy)
    return y.detach(), [t.grad.clone() for t in tensors]


def assert_close(a, b, tol):
    a, b = a.double(), b.double()
    err = ((a - b).abs() / (b.abs() + b.abs().max())).max().item()
    assert err <= tol, err


# ---- numerics against SDPA ---------------------------------------------------------------------

@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("heads,groups", [(4, 4), (8, 2)])
def test_bshd_matches_sdpa_forward_backward(mask, heads, groups):
    b, sq, skv, d = 2, 24, 40 if mask != "causal" else 24, 16
    m = lt.DotProductAttention(heads, d, num_gqa_groups=groups, qkv_format="bshd",
                               attn_mask_type=mask)
    ts = qkv(b, sq, skv, heads, groups, d)
    dy = torch.randn(b, sq, heads * d)
    y, g = grads(m, ts, dy)
    assert y.shape == (b, sq, heads * d)  # TE's [b, s, h*d]
    yr, gr = grads(lambda q, k, v: sdpa_bshd(q, k, v, mask), ts, dy)
    assert_close(y, yr, 2e-5)
    for a, r in zip(g, gr):
        assert_close(a, r, 1e-4)


def test_sbhd_default_format_and_softmax_scale():
    m = lt.DotProductAttention(4, 16, softmax_scale=0.2)  # TE's defaults: sbhd, causal
    assert m.qkv_format == "sbhd" and m.attn_mask_type == "causal"
    q, k, v = qkv(2, 12, 12, 4, 4, 16)
    y = m(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
    assert y.shape == (12, 2, 64)  # [s, b, h*d]
    ref = sdpa_bshd(q, k, v, "causal", scale=0.2)
    assert_close(y.transpose(0, 1), ref, 2e-5)


def test_thd_matches_sdpa_per_sequence():
    lens_q = [1, 17, 0, 33]
    lens_kv = [3, 17, 0, 40]
    heads, groups, d = 8, 2, 16
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lens_kv).cumsum(0).tolist(), dtype=torch.int32)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(int(cu_q[-1]), heads, d, generator=g).requires_grad_()
    k = torch.randn(int(cu_kv[-1]), groups, d, generator=g).requires_grad_()
    v = torch.randn(int(cu_kv[-1]), groups, d, generator=g).requires_grad_()
    m = lt.DotProductAttention(heads, d, num_gqa_groups=groups, qkv_format="thd",
                               attn_mask_type="causal_bottom_right")
    y = m(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=33, max_seqlen_kv=40)
    assert y.shape == (q.shape[0], heads * d)
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    y2 = m(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)  # max_seqlen from the offsets
    assert torch.equal(y, y2)
    y3 = m(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=4096,
           max_seqlen_kv=4096)  # a configured bound above the token count
    assert torch.equal(y, y3)
    for i in range(len(lens_q)):
        a, e, ka, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_kv[i]), int(cu_kv[i + 1])
        if e == a:
            continue
        qs, ks, vs = (t.detach()[None, lo:hi].clone().requires_grad_()
                      for t, lo, hi in ((q, a, e), (k, ka, ke), (v, ka, ke)))
        yr = sdpa_bshd(qs, ks, vs, "causal_bottom_right")
        yr.backward(dy[None, a:e])
        assert_close(y[a:e].detach(), yr[0].detach(), 2e-5)
        assert_close(q.grad[a:e], qs.grad[0], 1e-4)
        assert_close(k.grad[ka:ke], ks.grad[0], 1e-4)
        assert_close(v.grad[ka:ke], vs.grad[0], 1e-4)


def test_retain_graph_second_backward_is_identical():
    m = lt.DotProductAttention(4, 16, qkv_format="bshd")
    q, k, v = qkv(1, 16, 16, 4, 4, 16)
    with lt.retain_residuals():
        y = m(q, k, v)
    y.square().sum().backward(retain_graph=True)
    first = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    y.square().sum().backward()
    for a, t in zip(first, (q, k, v)):
        assert torch.equal(a, t.grad)


def test_second_backward_without_retain_residuals_is_a_clear_error():
    m = lt.DotProductAttention(4, 16, qkv_format="bshd")
    q, k, v = qkv(1, 8, 8, 4, 4, 16)
    y = m(q, k, v)
    y.sum().backward(retain_graph=True)
    with pytest.raises(libte.InvalidState, match="retain_residuals"):
        y.sum().backward()


def test_errors_are_libte_errors():
    m = lt.DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd")
    q, k, v = qkv(1, 8, 8, 4, 2, 16)
    with pytest.raises(libte.InvalidArgument, match="key_layer"):
        m(q, q, v)
    with pytest.raises(libte.InvalidArgument, match="attention_mask"):
        m(q, k, v, attention_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(libte.InvalidArgument, match="attention_dropout"):
        lt.DotProductAttention(4, 16, attention_dropout=0.1)
    with pytest.raises(libte.InvalidArgument, match="te_attention_create"):
        lt.DotProductAttention(4, 12, qkv_format="bshd")(*qkv(1, 8, 8, 4, 4, 12))
    with pytest.raises(libte.InvalidArgument, match="thd"):
        m(q, k, v, cu_seqlens_q=torch.tensor([0, 8], dtype=torch.int32))


# ---- torch.compile -------------------------------------------------------------------------------

class Block(torch.nn.Module):
    """RoPE on q and k, GQA attention, THD or BSHD."""

    def __init__(self, fmt):
        super().__init__()
        self.fmt = fmt
        self.attn = lt.DotProductAttention(8, 16, num_gqa_groups=2, qkv_format=fmt,
                                           attn_mask_type="causal")

    def forward(self, q, k, v, freqs, cu=None):
        q = lt.apply_rotary_pos_emb(q, freqs, tensor_format=self.fmt, cu_seqlens=cu)
        k = lt.apply_rotary_pos_emb(k, freqs, tensor_format=self.fmt, cu_seqlens=cu)
        if cu is None:
            return self.attn(q, k, v)
        return self.attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=20,
                         max_seqlen_kv=20)


def te_freqs(s, rot_dim, interleaved=False, base=10000.0):
    """TE's RotaryPositionEmbedding(rot_dim)(s): [s, 1, 1, rot_dim], each angle twice."""
    inv = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    f = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    emb = torch.stack((f, f), -1).reshape(s, -1) if interleaved else torch.cat((f, f), -1)
    return emb.reshape(s, 1, 1, rot_dim)


def _inputs(fmt):
    g = torch.Generator().manual_seed(5)
    if fmt == "thd":
        cu = torch.tensor([0, 7, 7, 27], dtype=torch.int32)
        shapes = ((27, 8, 16), (27, 2, 16), (27, 2, 16))
    else:
        cu = None
        shapes = ((2, 20, 8, 16), (2, 20, 2, 16), (2, 20, 2, 16))
    ts = [torch.randn(*s, generator=g).requires_grad_() for s in shapes]
    return ts, cu


def _step(model, ts, freqs, cu, kind=None):
    for t in ts:
        t.grad = None
    if kind is None:
        y = model(*ts, freqs, cu)
    else:
        with lt.autocast(recipe=libte.Recipe(kind=kind)):
            y = model(*ts, freqs, cu)
    (y * y).sum().backward()
    return y.detach(), [t.grad.clone() for t in ts]


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
def test_compile_fullgraph_no_graph_break_bitwise(fmt):
    torch.manual_seed(0)
    eager, comp = Block(fmt), Block(fmt)
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    ts, cu = _inputs(fmt)
    freqs = te_freqs(20, 8)
    for _ in range(2):
        ye, ge = _step(eager, ts, freqs, cu)
        yc, gc = _step(compiled, ts, freqs, cu)
        assert torch.equal(ye, yc)
        for a, b in zip(ge, gc):
            assert torch.equal(a, b)
    assert graph_breaks() == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_explain_reports_no_graph_break():
    model = Block("bshd")
    ts, _ = _inputs("bshd")
    explanation = torch._dynamo.explain(model)(*ts, te_freqs(20, 8))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


KINDS = ("delayed", "current", None)


def test_inductor_fullgraph_fp8_bitwise():
    torch.manual_seed(0)
    eager, comp = Block("bshd"), Block("bshd")
    eager.attn.fp8_dpa = comp.attn.fp8_dpa = True
    compiled = torch.compile(comp, fullgraph=True)
    ts, _ = _inputs("bshd")
    freqs = te_freqs(20, 8)
    for kind in KINDS:
        ye, ge = _step(eager, ts, freqs, None, kind)
        yc, gc = _step(compiled, ts, freqs, None, kind)
        assert torch.equal(ye, yc)
        for a, b in zip(ge, gc):
            assert torch.equal(a, b)
    assert graph_breaks() == 0


# ---- FP8 and state_dict --------------------------------------------------------------------------

def test_fp8_delayed_close_to_bf16_and_state_dict_round_trip():
    heads, groups, d = 8, 2, 32
    m = lt.DotProductAttention(heads, d, num_gqa_groups=groups, qkv_format="bshd",
                               fp8_dpa=True)
    q, k, v = qkv(2, 64, 64, heads, groups, d, dtype=torch.bfloat16)
    ref = sdpa_bshd(q.detach().float(), k.detach().float(), v.detach().float(), "causal")
    recipe = lt.DelayedScaling(amax_history_len=16)
    for step in range(3):
        with lt.autocast(recipe=recipe):
            y = m(q, k, v)
        y.float().square().mean().backward()
    assert y.dtype == torch.bfloat16
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert rel < 0.08, rel  # E4M3 Q, K, V and P against fp32 SDPA; bf16 alone ~4e-3
    with torch.no_grad():
        y_hp = m(q, k, v)  # outside autocast: high precision
    assert ((y_hp.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert m.te_layer.scaling_state("q").amax_history_len == 16
    sd = m.state_dict()
    assert "_extra_state" in sd and sd["_extra_state"].numel() > 20
    m2 = lt.DotProductAttention(heads, d, num_gqa_groups=groups, qkv_format="bshd",
                                fp8_dpa=True)
    m2.load_state_dict(sd)
    with lt.autocast(recipe=recipe):
        y1 = m(q, k, v)
        y2 = m2(q, k, v)
    assert torch.equal(y1, y2)
    assert m.get_extra_state().tolist() == m2.get_extra_state().tolist()


# ---- RoPE ------------------------------------------------------------------------------------------

def te_rope_reference(t, freqs, interleaved):
    """TE's unfused apply_rotary_pos_emb on bshd t with TE-shaped freqs [s, 1, 1, rot_dim]."""
    rot_dim = freqs.shape[-1]
    f = freqs[: t.shape[1]].transpose(0, 1)  # [1, s, 1, rot_dim]
    x, rest = t[..., :rot_dim], t[..., rot_dim:]
    if interleaved:
        x1, x2 = x[..., ::2], x[..., 1::2]
        rot = torch.stack((-x2, x1), -1).reshape(x.shape)
    else:
        x1, x2 = x[..., : rot_dim // 2], x[..., rot_dim // 2:]
        rot = torch.cat((-x2, x1), -1)
    return torch.cat((x * f.cos() + rot * f.sin(), rest), -1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_rope_matches_te_formula_forward_backward(interleaved, fmt):
    g = torch.Generator().manual_seed(2)
    t = torch.randn(2, 12, 3, 32, generator=g, dtype=torch.float64).float().requires_grad_()
    freqs = te_freqs(16, 16, interleaved)
    dy = torch.randn(t.shape, generator=g)
    x = t if fmt == "bshd" else t.transpose(0, 1)
    y = lt.apply_rotary_pos_emb(x, freqs, tensor_format=fmt, interleaved=interleaved)
    y = y if fmt == "bshd" else y.transpose(0, 1)
    y.backward(dy)
    gt = t.grad.clone()
    t.grad = None
    yr = te_rope_reference(t, freqs, interleaved)
    yr.backward(dy)
    assert_close(y.detach(), yr.detach(), 1e-6)
    assert_close(gt, t.grad, 1e-6)
    # libte's own freqs form [s, rot_dim / 2] gives the same bytes.
    half = freqs[:, 0, 0, 0::2] if interleaved else freqs[:, 0, 0, :8]
    y2 = lt.apply_rotary_pos_emb(t.detach(), half.contiguous(), tensor_format="bshd",
                                 interleaved=interleaved)
    assert torch.equal(y2, y.detach())


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_position_embedding_is_tes_layout(interleaved):
    rpe = lt.RotaryPositionEmbedding(32, rotary_percent=0.5, interleaved=interleaved)
    f = rpe(20)
    assert f.shape == (20, 1, 1, 16) and f.dtype == torch.float32
    assert torch.equal(f, te_freqs(20, 16, interleaved))


def test_rope_thd_positions_restart():
    lens = [1, 17, 0, 33]
    cu = torch.tensor([0, 1, 18, 18, 51], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    t = torch.randn(51, 4, 16, generator=g)
    freqs = te_freqs(40, 16)
    y = lt.apply_rotary_pos_emb(t, freqs, tensor_format="thd", cu_seqlens=cu)
    for i, n in enumerate(lens):
        if n == 0:
            continue
        a = int(cu[i])
        ref = te_rope_reference(t[None, a:a + n], freqs, False)[0]
        assert_close(y[a:a + n], ref, 1e-6)
