#!/usr/bin/env python3
"""train_gpt_torch: a byte-level GPT built from libte.torch modules, trained in FP8 on real text,
beside the same model in PyTorch bf16 and (on a GPU, when installed) torchao float8.

  model   pre-norm decoder-only GPT: token + learned position embedding; per block
          LayerNormLinear (QKV) -> RoPE -> causal attention (libte.torch.DotProductAttention,
          BF16; --attention sdpa: PyTorch's) -> Linear (proj) + residual, LayerNormMLP (GELU) + residual;
          final LayerNorm; LM head tied to the token embedding; vocab 256 (bytes)
  data    the Python standard library's own sources (*.py next to the `os` module: present
          wherever python3 is), concatenated in sorted order; the last 5% held out
  optim   AdamW, linear warmup then cosine decay, identical for every run
  runs    every implementation starts from the same initial weights and sees the same batches:
            libte     libte.torch modules inside libte.torch.autocast (FP8), optimizer AdamW
            libte_hp  the same libte.torch modules with the autocast disabled (high precision)
            torch     the same model from torch.nn modules in the compute dtype (bf16 on a GPU,
                      fp32 on the CPU)
            torchao   the torch model converted with torchao.float8 (GPU only; skipped with a
                      message when torchao is not installed)
          `--compile` compiles every model with torch.compile(fullgraph=True).

Usage:  python3 examples/python/train_gpt_torch.py [--preset cpu|gpu] [--impl libte,torch,...]
            [--steps N] [--recipe delayed|current|block] [--compile] [--csv FILE]
        (from a source tree: LIBTE_PATH=build/release PYTHONPATH=bindings/python)
Output: a progress line every --log-every steps, a CSV of every run's loss curve, a summary line
        per run (final train and validation loss, tokens/s), and a last line comparing libte FP8's
        final validation loss with the torch baseline's.
Exit:   0  libte FP8's final validation loss within --tolerance (default 5%) of the baseline's
        1  it was not (or a run diverged)
        2  bad arguments, no text found, or PyTorch / libte.torch missing
"""

import argparse
import csv
import glob
import math
import os
import sys
import time

PRESETS = {
    # name: d_model, layers, heads, seq, batch, steps, lr
    "cpu": dict(d_model=64, layers=2, heads=4, seq=64, batch=16, steps=120, lr=3e-3),
    "gpu": dict(d_model=1024, layers=8, heads=16, seq=1024, batch=8, steps=300, lr=6e-4),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model and run size (default: gpu when CUDA is available, else cpu)")
    p.add_argument("--impl", default=None,
                   help="comma-separated runs among libte, libte_hp, torch, torchao "
                        "(default: libte,torch; plus torchao on a GPU)")
    p.add_argument("--recipe", choices=("delayed", "current", "block"), default="delayed")
    p.add_argument("--amax-history", type=int, default=16,
                   help="delayed scaling's amax history length (default 16, as TE's examples use)")
    p.add_argument("--warmup", type=int, default=None,
                   help="linear learning-rate warmup steps before the cosine decay (default: 10%% of steps)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) each model")
    p.add_argument("--attention", choices=("libte", "sdpa"), default="libte",
                   help="the libte runs' attention and RoPE: libte.torch.DotProductAttention + "
                        "apply_rotary_pos_emb (default; BF16 attention, fp8_dpa off), or PyTorch's SDPA")
    p.add_argument("--csv", default=None, help="where to write the loss curves")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--text-mb", type=float, default=8.0, help="at most this much text")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def load_text(max_bytes):
    """The standard library's sources: (bytes, [files])."""
    root = os.path.dirname(os.__file__)
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    data, used = bytearray(), []
    for f in files:
        if len(data) >= max_bytes:
            break
        with open(f, "rb") as fh:
            data += fh.read()
        used.append(f)
    if len(data) < 1 << 16:
        sys.stderr.write("train_gpt_torch: found only %d bytes of text under %s; need at least 64 KiB\n"
                         % (len(data), root))
        sys.exit(2)
    return bytes(data[:max_bytes]), used, root


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        sys.stderr.write("train_gpt_torch: PyTorch is not installed (pip install torch)\n")
        return 2
    try:
        import libte
        import libte.torch as tet
    except ImportError as e:
        sys.stderr.write("train_gpt_torch: libte.torch is not importable: %s\n" % e)
        return 2

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cfg = dict(PRESETS[args.preset or ("gpu" if cuda else "cpu")])
    for k in ("steps", "d_model", "layers", "seq", "batch"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    impls = (args.impl or ("libte,torch,torchao" if cuda else "libte,torch")).split(",")
    for i in impls:
        if i not in ("libte", "libte_hp", "torch", "torchao"):
            sys.stderr.write("train_gpt_torch: unknown --impl %r\n" % i)
            return 2
    dtype = torch.bfloat16 if cuda else torch.float32
    d, L, H, T, B = cfg["d_model"], cfg["layers"], cfg["heads"], cfg["seq"], cfg["batch"]

    text, files, root = load_text(int(args.text_mb * (1 << 20)))
    print("text: %d files from %s, %.2f MB (%s ... %s)" % (len(files), root, len(text) / 1e6,
                                                          os.path.basename(files[0]),
                                                          os.path.basename(files[-1])))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.long)
    split = int(len(data) * 0.95)
    train, val = data[:split].to(device), data[split:].to(device)

    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(train) - T - 1, (cfg["steps"], B), generator=g)
    val_starts = torch.randint(0, len(val) - T - 1, (8, B), generator=g)

    def batch(src, idx):
        off = torch.arange(T + 1)
        rows = src[(idx[:, None].to(src.device) + off[None, :].to(src.device))]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def rope(q):  # q: [B, H, T, hd]
        hd = q.shape[-1]
        pos = torch.arange(q.shape[-2], device=q.device, dtype=torch.float32)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=q.device, dtype=torch.float32) / hd))
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
        q1, q2 = q[..., 0::2], q[..., 1::2]
        return torch.stack((q1 * cos - q2 * sin, q1 * sin + q2 * cos), dim=-1).flatten(-2)

    # RoPE angles for libte: [T, hd / 2], position p and pair i at p / 10000^(2i / hd).
    hd_ = d // H
    freqs = (torch.arange(T, dtype=torch.float32)[:, None]
             / (10000 ** (torch.arange(0, hd_, 2, dtype=torch.float32) / hd_))[None, :]).to(device)

    class Block(nn.Module):
        def __init__(self, use_libte):
            super().__init__()
            self.use_libte = use_libte
            if use_libte:
                self.qkv = tet.LayerNormLinear(d, 3 * d, bias=True, params_dtype=dtype, device=device)
                self.proj = tet.Linear(d, d, bias=True, params_dtype=dtype, device=device)
                self.mlp = tet.LayerNormMLP(d, 4 * d, bias=True, activation="gelu",
                                            params_dtype=dtype, device=device)
                if args.attention == "libte":
                    self.attn = tet.DotProductAttention(H, d // H, qkv_format="bshd",
                                                        attn_mask_type="causal")
            else:
                self.ln1 = nn.LayerNorm(d, device=device, dtype=dtype)
                self.qkv = nn.Linear(d, 3 * d, device=device, dtype=dtype)
                self.proj = nn.Linear(d, d, device=device, dtype=dtype)
                self.ln2 = nn.LayerNorm(d, device=device, dtype=dtype)
                self.fc1 = nn.Linear(d, 4 * d, device=device, dtype=dtype)
                self.fc2 = nn.Linear(4 * d, d, device=device, dtype=dtype)

        def forward(self, x):
            b, t, _ = x.shape
            qkv = self.qkv(x) if self.use_libte else self.qkv(self.ln1(x))
            if self.use_libte and args.attention == "libte":
                # [b, t, H, hd] each; the same interleaved rotation as rope() below.
                q, k, v = (u.contiguous() for u in qkv.view(b, t, 3, H, d // H).unbind(2))
                q = tet.apply_rotary_pos_emb(q, freqs, tensor_format="bshd", interleaved=True)
                k = tet.apply_rotary_pos_emb(k, freqs, tensor_format="bshd", interleaved=True)
                x = x + self.proj(self.attn(q, k, v))  # [b, t, H * hd]
            else:
                q, k, v = qkv.view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
                y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
                x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            if self.use_libte:
                return x + self.mlp(x)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, use_libte):
            super().__init__()
            self.tok = nn.Embedding(256, d, device=device, dtype=dtype)
            self.pos = nn.Embedding(T, d, device=device, dtype=dtype)
            self.blocks = nn.ModuleList(Block(use_libte) for _ in range(L))
            self.ln_f = nn.LayerNorm(d, device=device, dtype=dtype)

        def forward(self, idx, targets):
            x = self.tok(idx) + self.pos.weight[: idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.tok.weight.t()  # tied LM head
            return F.cross_entropy(logits.float().view(-1, 256), targets.view(-1))

    def init_weights(model, seed):
        gen = torch.Generator().manual_seed(seed)
        for name, p in sorted(model.named_parameters()):
            if name.endswith("bias"):
                vals = torch.zeros(p.shape)
            elif "ln" in name or "layer_norm_weight" in name:
                vals = torch.ones(p.shape)
            else:
                vals = torch.randn(p.shape, generator=gen) * 0.02
            with torch.no_grad():
                p.copy_(vals.to(p.dtype))

    def to_libte_names(ref):
        """The torch model's parameters under the libte model's names (same values)."""
        out = {"tok.weight": ref.tok.weight, "pos.weight": ref.pos.weight,
               "ln_f.weight": ref.ln_f.weight, "ln_f.bias": ref.ln_f.bias}
        for i, b in enumerate(ref.blocks):
            p = "blocks.%d." % i
            out.update({p + "qkv.layer_norm_weight": b.ln1.weight, p + "qkv.layer_norm_bias": b.ln1.bias,
                        p + "qkv.weight": b.qkv.weight, p + "qkv.bias": b.qkv.bias,
                        p + "proj.weight": b.proj.weight, p + "proj.bias": b.proj.bias,
                        p + "mlp.layer_norm_weight": b.ln2.weight, p + "mlp.layer_norm_bias": b.ln2.bias,
                        p + "mlp.fc1_weight": b.fc1.weight, p + "mlp.fc1_bias": b.fc1.bias,
                        p + "mlp.fc2_weight": b.fc2.weight, p + "mlp.fc2_bias": b.fc2.bias})
        return out

    reference = GPT(False)
    init_weights(reference, args.seed)
    initial = {k: v.detach().clone() for k, v in reference.state_dict().items()}

    recipe = (libte.Recipe(kind="delayed", amax_history_len=args.amax_history) if args.recipe == "delayed"
              else libte.Recipe(kind=args.recipe))
    warmup = args.warmup if args.warmup is not None else max(1, cfg["steps"] // 10)

    def lr_at(step):  # linear warmup, then cosine decay to 10%
        if step < warmup:
            return cfg["lr"] * (step + 1) / warmup
        t = (step - warmup) / max(1, cfg["steps"] - warmup)
        return cfg["lr"] * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))
    curves, summary = {}, {}
    for impl in impls:
        if impl == "torchao" and not cuda:
            print("torchao: skipped (float8 training needs a GPU)")
            continue
        torch.manual_seed(args.seed)
        if impl.startswith("libte"):
            model = GPT(True)
            named = dict(model.named_parameters())
            ref = GPT(False)
            ref.load_state_dict(initial)
            for k, v in to_libte_names(ref).items():
                with torch.no_grad():
                    named[k].copy_(v)
            del ref
        else:
            model = GPT(False)
            model.load_state_dict(initial)
            if impl == "torchao":
                try:
                    from torchao.float8 import convert_to_float8_training
                except ImportError as e:
                    print("torchao: skipped (%s)" % e)
                    continue
                convert_to_float8_training(model, module_filter_fn=lambda m, n: "blocks" in n)
        step_fn = model
        if args.compile or impl == "torchao":
            step_fn = torch.compile(model, fullgraph=True)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                                fused=cuda)

        def loss_of(x, y):
            if impl.startswith("libte"):
                with tet.autocast(enabled=impl == "libte", recipe=recipe):
                    return step_fn(x, y)
            return step_fn(x, y)

        losses, vals, t_start, warm = [], [], None, min(10, cfg["steps"] // 4)
        for step in range(cfg["steps"]):
            if step == warm:
                if cuda:
                    torch.cuda.synchronize()
                t_start = time.perf_counter()
            x, y = batch(train, starts[step])
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = loss_of(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if (step + 1) % args.log_every == 0 or step + 1 == cfg["steps"]:
                # Validation (and the no_grad graph it compiles the first time) is not timed.
                if cuda:
                    torch.cuda.synchronize()
                t_eval = time.perf_counter()
                with torch.no_grad():
                    v = sum(loss_of(*batch(val, s)).float() for s in val_starts) / len(val_starts)
                vals.append((step + 1, v.item()))
                print("%-8s step %5d  train %.4f  val %.4f" % (impl, step + 1, losses[-1].item(), v.item()),
                      flush=True)
                if t_start is not None:
                    t_start += time.perf_counter() - t_eval
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t_start
        tokens_per_s = (cfg["steps"] - warm) * B * T / elapsed
        train_curve = [l.item() for l in losses]
        if not all(math.isfinite(l) for l in train_curve):
            print("%s: diverged (non-finite loss)" % impl)
            return 1
        curves[impl] = (train_curve, dict(vals))
        summary[impl] = (sum(train_curve[-10:]) / len(train_curve[-10:]), vals[-1][1], tokens_per_s)
        print("%-8s final train %.4f  val %.4f  %.0f tokens/s" % ((impl,) + summary[impl]), flush=True)
        del model, step_fn, opt

    path = args.csv or os.path.join(os.getcwd(), "train_gpt_torch_loss.csv")
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        names = list(curves)
        w.writerow(["step"] + ["%s_train" % n for n in names] + ["%s_val" % n for n in names])
        for s in range(cfg["steps"]):
            w.writerow([s + 1] + ["%.6f" % curves[n][0][s] for n in names]
                       + [("%.6f" % curves[n][1][s + 1]) if (s + 1) in curves[n][1] else "" for n in names])
    print("loss curves: %s" % path)
    if "libte" in summary and "torch" in summary:
        fp8, base = summary["libte"][1], summary["torch"][1]
        rel = abs(fp8 - base) / base
        for other in summary:
            if other != "torch":
                print("tokens/s %s / torch: %.2fx" % (other, summary[other][2] / summary["torch"][2]))
        print("final val loss: libte FP8 %.4f vs torch %s %.4f: %.1f%% apart (limit %.0f%%) %s"
              % (fp8, str(dtype).replace("torch.", ""), base, 100 * rel, 100 * args.tolerance,
                 "ok" if rel <= args.tolerance else "FAIL"))
        return 0 if rel <= args.tolerance else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
