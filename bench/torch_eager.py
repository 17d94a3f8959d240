#!/usr/bin/env python3
"""Plain PyTorch training throughput of snip's tiny Llama, eager and torch.compile: the baselines.

It measures how many training tokens per second ordinary PyTorch eager code
reaches on the model of configs/tiny.toml: the same shapes, initialisation,
batch, loss, optimizer and gradient clipping as snip, with no snip code
involved. docs/benchmarks.md quotes snip's tokens/s (bench/bench_train, `snip
train`) as a ratio to this number, measured on the same machine.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/torch_eager.py \
        [--mode fp32|bf16|both] [--compile] [--steps 20] [--warmup 3] [--threads T] [--json]

Run it with the project's venv (the PyTorch whose LibTorch snip is built on,
requirements.txt). --compile wraps the model in torch.compile (Inductor's
default mode, C++ code for the CPU); its warm-up steps include compilation,
which is not timed.

Model (HF LlamaForCausalLM semantics, like src/model/llama.cpp): vocab 8192,
hidden 256, intermediate 688 (SwiGLU), 4 layers, 8 query heads, 4 KV heads
(head_dim 32), RMSNorm eps 1e-5, RoPE theta 10000 (rotate_half), tied word
embeddings, no biases, causal attention; weights N(0, 0.02^2), norms 1.
Step: 16 sequences x 128 random tokens, mean cross-entropy over all
positions, backward, clip the global grad norm to 1.0, AdamW(lr 3e-3, betas
(0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D weights only, as snip),
zero_grad(set_to_none=True).

Modes: fp32 = everything in FP32; bf16 = forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16), which is how a PyTorch user runs
BF16 on a CPU (snip's bf16 mode runs the GEMMs in BF16, the rest in FP32).
Step time is wall time per optimizer step after the warm-up steps.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# configs/tiny.toml with the defaults of snip's LlamaConfig / config schema.
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, MAX_POS = 8192, 256, 688, 4, 8, 4, 256
RMS_EPS, ROPE_THETA, INIT_STD = 1e-5, 10000.0, 0.02
BATCH, SEQ = 16, 128
LR, BETAS, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 3e-3, (0.9, 0.95), 1e-8, 0.1, 1.0


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


def rope_tables(T, hd):
    """cos, sin [T, hd] in HF's cat(freqs, freqs) layout."""
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hd = HIDDEN // HEADS
        self.q_proj = linear(HIDDEN, HEADS * self.hd)
        self.k_proj = linear(HIDDEN, KV_HEADS * self.hd)
        self.v_proj = linear(HIDDEN, KV_HEADS * self.hd)
        self.o_proj = linear(HEADS * self.hd, HIDDEN)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, HEADS, self.hd).transpose(1, 2)     # [B, NH, T, HD]
        k = self.k_proj(x).view(B, T, KV_HEADS, self.hd).transpose(1, 2)  # [B, NKV, T, HD]
        v = self.v_proj(x).view(B, T, KV_HEADS, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # HF repeat_kv: KV head j serves query heads j*rep .. (j+1)*rep-1.
        rep = HEADS // KV_HEADS
        k = k.repeat_interleave(rep, dim=1)                               # [B, NH, T, HD]
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)              # [B, NH, T, T]
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, HEADS * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = linear(HIDDEN, FFN)
        self.up_proj = linear(HIDDEN, FFN)
        self.down_proj = linear(FFN, HIDDEN)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()
        self.mlp = MLP()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.post_attention_layernorm = RMSNorm(HIDDEN)

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    """Decoder stack + tied head: ids [B, T] -> logits [B, T, V]."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        with torch.no_grad():  # snip: every weight matrix N(0, init_std^2), norms 1
            for p in self.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, INIT_STD)

    def forward(self, ids):
        T = ids.shape[1]
        assert T <= MAX_POS, "sequence longer than max_position_embeddings"
        cos, sin = rope_tables(T, HIDDEN // HEADS)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return F.linear(self.norm(h), self.embed_tokens.weight)  # tied lm_head


def run(mode, steps, warmup, threads, compiled=False):
    torch.manual_seed(0)
    model = Llama()
    fwd = torch.compile(model) if compiled else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=ADAM_EPS)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
            logits = fwd(ids)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    seconds = time.perf_counter() - t0
    if not math.isfinite(loss):
        sys.exit("torch_eager.py: loss is %r in mode %s" % (loss, mode))
    return {"mode": mode, "compiled": compiled, "tokens_per_s": steps * BATCH * SEQ / seconds,
            "step_s": seconds / steps, "steps": steps, "threads": threads,
            "torch_version": torch.__version__, "seconds": seconds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["fp32", "bf16", "both"], default="both")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--json", action="store_true", help="one JSON object per mode")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (warm-up >= 1 compiles it)")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    if args.compile and args.warmup < 1:
        ap.error("--compile needs --warmup >= 1 (the first step compiles)")
    torch.set_num_threads(args.threads)

    n_params = sum(p.numel() for p in Llama().parameters())  # tied: embedding counted once
    if not args.json:
        print("torch-eager: tiny Llama, %d parameters (%.2fM), batch %dx%d, %d threads, torch %s"
              % (n_params, n_params / 1e6, BATCH, SEQ, args.threads, torch.__version__))
    for mode in (["fp32", "bf16"] if args.mode == "both" else [args.mode]):
        r = run(mode, args.steps, args.warmup, args.threads, args.compile)
        if args.json:
            print(json.dumps({k: r[k] for k in ("mode", "compiled", "tokens_per_s", "step_s", "steps",
                                                "threads", "torch_version")}))
        else:
            print("torch-%s %s: %.2f s for %d steps, %.0f tokens/s (step %.2f s)"
                  % ("compile" if args.compile else "eager", mode, r["seconds"], r["steps"], r["tokens_per_s"],
                     r["step_s"]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
