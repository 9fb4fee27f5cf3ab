#!/usr/bin/env python3
"""gpt_torch_peer.py: the GPT of examples/c/train_gpt.c (--preset gpu) in PyTorch bf16, for the
tokens/s comparison of issue 14 (a benchmark, not part of libte).

The model, as examples/c/gpt/gpt_model.h describes the C one:
  x = Embedding(256, d)(tokens)
  per block: qkv = Linear(d, 3d, bias)(LayerNorm(x)); q, k, v = split(qkv) as [B, T, H, Dh];
             q, k = RoPE(q), RoPE(k) (GPT-NeoX halves, base 10000, positions 0..T-1);
             a = F.scaled_dot_product_attention(q, k, v, is_causal=True);
             x = x + Linear(d, d, bias)(a);
             x = x + Linear(d_ff, d, bias)(GELU_tanh(Linear(d, d_ff, bias)(LayerNorm(x))))
  logits = Linear(d, 256, no bias)(LayerNorm(x))  (not tied to the embedding)
  loss = mean cross-entropy
GELU is the tanh approximation (te.h: TE_ACTIVATION_GELU, "tanh approximation, as TE");
LayerNorm eps 1e-5. Init GPT-2 style (normal 0.02, proj and fc2 0.02/sqrt(2 layers), biases 0).
AdamW (fused=True; betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on the matrices qkv, proj, fc1,
fc2, head only), gradient norm clipped to 1.0, and train_gpt.c's schedule: lr rises linearly over
--warmup steps to --lr (4e-4, the gpu preset's), then decays along a cosine to 10% of it at the
last of --steps. The same flags and defaults as train_gpt --preset gpu, so one command line
drives both. The initial weights come from torch's RNG (--seed), not from the C model's
generator: the same distribution, not the same numbers.
Precision (--precision): amp (default) keeps fp32 parameters and runs the model under
torch.autocast(bfloat16), as libte keeps fp32 masters and BF16 model copies; bf16 makes the
parameters themselves bf16 (no masters: faster, not the same numerics). The model is
torch.compile'd (--no-compile: eager).

Text: the same bytes examples/c/gpt/gpt_data.c reads: the *.py files under the directory
`python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])"` names (or the newest
/usr/lib/python3.N holding os.py), outside directories named site-packages, dist-packages,
test, tests, idle_test and __pycache__, symlinks not followed, sorted by relative path (byte
order), concatenated up to --max-bytes (0: all); --data FILE_OR_DIR instead (every regular file
of a directory). The last 10% is the validation split. Batches: random windows of seq + 1 bytes
drawn with gpt_data.c's splitmix64 sampler, seeded as train_gpt.c seeds it (--seed S: training
batches from S * 0x9E3779B97F4A7C15 + 17, validation batches from 0x76616c5f73657421), so the
peer trains on the same batches as train_gpt and reports its validation loss on the same
--eval-batches validation batches. Every batch is real text, built before the timed region and
kept on the device.

Timing: of the --steps steps, the first --untimed (compilation, autotuning) are not timed; the
rest are timed between two torch.cuda.synchronize() calls. Output: one JSON object on stdout (tokens/s, ms per
step, first and final train loss, validation loss after training, peak memory, device name,
torch version, shapes); progress on stderr.

Usage: python3 bench/gpt_torch_peer.py [--d-model 2048 --layers 8 --heads 16 --d-ff 8192
         --seq-len 1024 --batch 8 --steps 300 --warmup 30 --untimed 10] [--device cuda|cpu] [--no-compile]
         [--precision amp|bf16] [--json FILE]
  CPU smoke test: python3 bench/gpt_torch_peer.py --device cpu --no-compile --d-model 64
         --layers 2 --heads 4 --seq 64 --batch 4 --steps 5 --warmup 2 --untimed 1
Exit status 0, or 2 on bad arguments or missing text.
"""
import argparse
import glob
import json
import math
import os
import re
import stat
import subprocess
import sys
import time

EXCLUDED_DIRS = {b"site-packages", b"dist-packages", b"test", b"tests", b"idle_test", b"__pycache__"}
MASK64 = (1 << 64) - 1


def log(msg):
    sys.stderr.write("gpt_torch_peer: %s\n" % msg)
    sys.stderr.flush()


# --- text: gpt_data.c's rules ----------------------------------------------------------------------

def stdlib_dir():
    """The directory python3 names as its standard library, else the newest /usr/lib/python3.N."""
    try:
        out = subprocess.run(["python3", "-c", "import sysconfig;print(sysconfig.get_paths()['stdlib'])"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True).stdout
        path = out.splitlines()[0] if out.strip() else ""
        if path and os.path.isdir(path):
            return path
    except OSError:
        pass
    best, best_minor = None, -1
    for p in glob.glob("/usr/lib/python3.*"):
        m = re.fullmatch(r"/usr/lib/python3\.(\d+)", p)
        if m and int(m.group(1)) > best_minor and os.path.isfile(os.path.join(p, "os.py")):
            best, best_minor = p, int(m.group(1))
    return best


def walk(root, py_only):
    """Relative paths (bytes) of the regular files under root, as gpt_data.c's walk() finds them."""
    found = []

    def visit(rel):
        path = os.path.join(root, rel) if rel else root
        try:
            names = os.listdir(path)
        except OSError:
            return
        for name in names:
            child_rel = os.path.join(rel, name) if rel else name
            try:
                st = os.lstat(os.path.join(root, child_rel))
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if name not in EXCLUDED_DIRS:
                    visit(child_rel)
            elif stat.S_ISREG(st.st_mode) and (not py_only or name.endswith(b".py")):
                found.append(child_rel)

    visit(b"")
    return sorted(found)  # bytes order, as strcmp


def load_text(path, max_bytes):
    """(bytes, train_size, description) or raises SystemExit(2) with a message."""
    if path:
        if not os.path.exists(path):
            log("cannot read the text %s; pass --data FILE_OR_DIRECTORY" % path)
            raise SystemExit(2)
        root, py_only = path, False
    else:
        root, py_only = stdlib_dir(), True
        if not root:
            log("no Python standard library found (python3's sysconfig stdlib, /usr/lib/python3.*/os.py); "
                "pass --data FILE_OR_DIRECTORY")
            raise SystemExit(2)
    broot = os.fsencode(root)
    files = [b""] if os.path.isfile(root) else walk(broot, py_only)
    chunks, size, used = [], 0, 0
    for rel in files:
        if max_bytes and size >= max_bytes:
            break
        with open(os.path.join(broot, rel) if rel else broot, "rb") as f:
            data = f.read(max_bytes - size if max_bytes else -1)
        chunks.append(data)
        size += len(data)
        used += 1
    text = b"".join(chunks)
    if not text:
        log("no text in %s; pass --data FILE_OR_DIRECTORY" % root)
        raise SystemExit(2)
    desc = {"dir": root, "files": used, "files_available": len(files), "bytes": len(text),
            "first": os.fsdecode(files[0]), "last": os.fsdecode(files[used - 1])}
    return text, len(text) - len(text) // 10, desc


class Sampler(object):
    """gpt_data.c's splitmix64 sampler: the same seed draws the same windows."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def windows(self, split, batch, seq):
        """batch windows of seq + 1 bytes (the caller checked len(split) >= seq + 1)."""
        n = len(split)
        out = bytearray()
        for _ in range(batch):
            start = self.next() % (n - seq)
            out += split[start:start + seq + 1]
        return bytes(out)


# --- the model -----------------------------------------------------------------------------------

def build(args, torch):
    import torch.nn as nn
    import torch.nn.functional as F

    d, heads, dh = args.d_model, args.heads, args.d_model // args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=1e-5)
            self.qkv = nn.Linear(d, 3 * d, bias=True)
            self.proj = nn.Linear(d, d, bias=True)
            self.ln2 = nn.LayerNorm(d, eps=1e-5)
            self.fc1 = nn.Linear(d, args.d_ff, bias=True)
            self.fc2 = nn.Linear(args.d_ff, d, bias=True)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.reshape(b, t, heads, dh) for z in (q, k, v))
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    def rope(x, cos, sin):
        """GPT-NeoX RoPE on [B, T, H, Dh]: features (i, i + Dh/2) rotate together, in fp32."""
        xf = x.float()
        x1, x2 = xf[..., : dh // 2], xf[..., dh // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
        return (xf * cos + rotated * sin).to(x.dtype)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, d)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(d, eps=1e-5)
            self.head = nn.Linear(d, 256, bias=False)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
            angles = torch.outer(torch.arange(args.seq, dtype=torch.float64), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)[None, :, None, :]  # [1, T, 1, Dh]
            self.register_buffer("cos", angles.cos().float(), persistent=False)
            self.register_buffer("sin", angles.sin().float(), persistent=False)

        def forward(self, tokens, targets):
            x = self.emb(tokens)
            for blk in self.blocks:
                x = blk(x, self.cos, self.sin)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))

    gen = torch.Generator().manual_seed(args.seed)
    model = GPT()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * args.layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--d-ff", type=int, default=0, help="MLP hidden size (default 4 * d-model)")
    ap.add_argument("--seq", "--seq-len", dest="seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300, help="training steps (as train_gpt)")
    ap.add_argument("--warmup", type=int, default=30, help="lr warm-up steps (as train_gpt)")
    ap.add_argument("--untimed", type=int, default=10, help="first steps left out of the timing")
    ap.add_argument("--lr", type=float, default=4e-4, help="peak lr (as train_gpt)")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decay down to this")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="0: no clipping")
    ap.add_argument("--seed", type=int, default=1, help="initial weights and batches (as train_gpt)")
    ap.add_argument("--data", default=None, help="a text file or directory instead of the Python stdlib")
    ap.add_argument("--max-bytes", "--data-bytes", dest="data_bytes", type=int, default=0,
                    help="read at most this many bytes of text (0: all)")
    ap.add_argument("--eval-batches", type=int, default=4, help="validation batches after training")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--precision", default="amp", choices=("amp", "bf16"))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default=None, help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    args.d_ff = args.d_ff or 4 * args.d_model
    if (args.d_model % args.heads or (args.d_model // args.heads) % 2 or min(args.seq, args.batch, args.layers,
                                                                            args.eval_batches) < 1
            or args.warmup < 0 or not 0 <= args.untimed < args.steps):
        ap.error("need d-model divisible by heads into an even head size, seq/batch/layers/eval-batches >= 1, "
                 "warmup >= 0, 0 <= untimed < steps")

    try:
        import torch
    except ImportError as e:
        log("PyTorch is not importable: %s" % e)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        log("no CUDA device (torch.cuda.is_available() is False); --device cpu for a smoke test")
        return 2
    dev = torch.device(args.device)

    text, train_size, desc = load_text(args.data, args.data_bytes)
    log("data: %(dir)s: %(files)d of %(files_available)d files, %(bytes)d bytes (first %(first)s, last %(last)s)" % desc)
    train, val = text[:train_size], text[train_size:]
    if min(len(train), len(val)) < args.seq + 1:
        log("the text is too short for --seq %d: train %d bytes, validation %d" % (args.seq, len(train), len(val)))
        return 2

    # Every batch, real text, built before the timed region and kept on the device.
    sampler = Sampler(args.seed * 0x9E3779B97F4A7C15 + 17)  # as train_gpt.c: the same batches
    n_steps = args.steps
    raw = b"".join(sampler.windows(train, args.batch, args.seq) for _ in range(n_steps))
    batches = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(n_steps, args.batch, args.seq + 1)
    batches = batches.to(dev).long()
    vsampler = Sampler(0x76616C5F73657421)  # train_gpt.c's fixed validation batches
    vraw = b"".join(vsampler.windows(val, args.batch, args.seq) for _ in range(args.eval_batches))
    vbatches = torch.frombuffer(bytearray(vraw), dtype=torch.uint8).view(-1, args.batch, args.seq + 1).to(dev).long()

    torch.manual_seed(args.seed)
    model = build(args, torch).to(dev)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)
        model.cos.data, model.sin.data = model.cos.float(), model.sin.float()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("emb.")]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith("emb."))]
    fused = args.device == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8, fused=fused)
    step_fn = model if args.no_compile else torch.compile(model)
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.precision == "amp")

    def lr_at(step):  # train_gpt.c's lr_at: step is 1-based
        if args.warmup > 0 and step <= args.warmup:
            return args.lr * step / args.warmup
        span = args.steps - args.warmup
        t = min((step - args.warmup) / span, 1.0) if span > 0 else 1.0
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    def train_step(i):
        for g in opt.param_groups:
            g["lr"] = lr_at(i + 1)
        b = batches[i]
        with autocast:
            loss = step_fn(b[:, :-1], b[:, 1:])
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    losses = []
    t0 = time.perf_counter()
    for i in range(args.untimed):
        losses.append(train_step(i))
    sync()
    log("untimed: %d steps in %.1f s (compilation included), loss %.4f"
        % (args.untimed, time.perf_counter() - t0, losses[-1].item() if losses else float("nan")))
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    t1 = time.perf_counter()
    for i in range(args.untimed, n_steps):
        losses.append(train_step(i))
    sync()
    elapsed = time.perf_counter() - t1
    loss_values = torch.stack(losses).float().cpu().tolist()
    if not all(math.isfinite(v) for v in loss_values):
        log("the loss is not finite")
    with torch.no_grad(), autocast:
        val_loss = sum(step_fn(b[:, :-1], b[:, 1:]).float().item() for b in vbatches) / len(vbatches)

    timed = args.steps - args.untimed
    tokens = timed * args.batch * args.seq
    result = {
        "impl": "pytorch", "precision": "bf16 autocast, fp32 params" if args.precision == "amp" else "bf16 params",
        "compiled": not args.no_compile, "optimizer": "AdamW fused" if fused else "AdamW",
        "attention": "F.scaled_dot_product_attention(is_causal=True)",
        "device": torch.cuda.get_device_name(dev) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": {"d_model": args.d_model, "layers": args.layers, "heads": args.heads, "d_ff": args.d_ff,
                  "seq": args.seq, "batch": args.batch, "vocab": 256},
        "params": n_params, "steps": args.steps, "untimed_steps": args.untimed, "timed_steps": timed,
        "lr": args.lr, "lr_warmup": args.warmup,
        "tokens_per_s": tokens / elapsed, "ms_per_step": 1000.0 * elapsed / timed,
        "first_train_loss": loss_values[0], "final_train_loss": loss_values[-1],
        "val_loss": val_loss, "eval_batches": args.eval_batches,
        "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2 ** 30 if args.device == "cuda" else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2 ** 30 if args.device == "cuda" else None,
        "data": desc, "seed": args.seed,
    }
    text_out = json.dumps(result, indent=1)
    print(text_out)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text_out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
