#!/usr/bin/python3
"""Independent float64 reference for snip's Llama model (llm.c test_gpt2 style).

Implements Hugging Face `LlamaForCausalLM` semantics in plain PyTorch (no
`transformers`), in float64, and writes a safetensors fixture with the
parameters (Hugging Face names), a batch, the logits, the loss, every
gradient and the trajectory of a few AdamW steps. snip's C++ model test reads
the fixture and compares tensor by tensor.

Run with Debian's interpreter (python3-torch 1.13):

    /usr/bin/python3 tools/ref_llama.py --out ref.safetensors [--seed 0] [--tied]
        [--vocab 64 --dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 48
         --batch 2 --seq 8 --steps 5]
    /usr/bin/python3 tools/ref_llama.py --selfcheck

Exit status 77 ("skipped" for CTest) when torch cannot be imported.

Dimensions: B batch, T sequence, D hidden (hidden_size), H query heads, KV
key/value heads, hd = D/H head dim, F intermediate_size, V vocab, L layers.

Model (HF LlamaForCausalLM, modeling_llama.py):
  x = embed_tokens[input_ids]                                  [B,T,D]
  per layer:
    h = RMSNorm(x; input_layernorm)      RMSNorm(x;w) = x*rsqrt(mean(x^2,-1)+eps)*w
    q = h q_proj^T [B,T,H*hd], k = h k_proj^T, v = h v_proj^T [B,T,KV*hd]
    RoPE on q,k: inv_freq = 1/theta^(arange(0,hd,2)/hd), positions 0..T-1,
      emb = cat(freqs, freqs), q' = q*cos + rotate_half(q)*sin,
      rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2])
    GQA: kv head j serves query heads j*(H/KV) .. (j+1)*(H/KV)-1
    causal softmax(q k^T / sqrt(hd)) v, concat heads, o_proj
    x = x + attn
    x = x + down_proj(silu(gate_proj(RMSNorm(x; post_attention_layernorm)))
                      * up_proj(RMSNorm(x; post_attention_layernorm)))
  logits = RMSNorm(x; model.norm) lm_head^T                    [B,T,V]
  loss = mean over B*T of cross_entropy(logits, targets)       (targets are
         given separately; no shift inside)
lm_head is embed_tokens when tie_word_embeddings.

Fixture layout (safetensors, all F64 except input_ids/targets I64):
  <param name>             every parameter, HF names
  input_ids, targets       [B,T]
  logits [B,T,V], loss []
  grad.<param name>        dloss/dparam at the initial parameters
  adamw_losses [steps]     loss before each torch.optim.AdamW step on the same
                           batch (lr 1e-2, betas (0.9, 0.95), eps 1e-8,
                           weight_decay 0.1 on ALL parameters)
  final.<param name>       parameters after the `steps` AdamW steps
  __metadata__: magic "snip-llama-ref", version "1", config (HF config.json as
  a JSON string), adamw (JSON string: lr, beta1, beta2, eps, weight_decay,
  steps), seed, batch, seq.
"""

import argparse
import json
import math
import os
import struct
import sys
import tempfile
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the machine
    print("ref_llama.py: torch is not importable by %s; skipping" % sys.executable,
          file=sys.stderr)
    sys.exit(77)

F64 = torch.float64
MAGIC = "snip-llama-ref"
VERSION = "1"
ADAMW = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}


# ----------------------------------------------------------------- config ---

class Config:
    def __init__(self, vocab=64, dim=32, layers=2, heads=4, kv_heads=2, ffn=48,
                 tied=False, eps=1e-5, theta=10000.0, max_pos=None):
        if dim % heads:
            raise ValueError("--dim %d must be a multiple of --heads %d" % (dim, heads))
        if heads % kv_heads:
            raise ValueError("--heads %d must be a multiple of --kv-heads %d" % (heads, kv_heads))
        if (dim // heads) % 2:
            raise ValueError("head dim %d must be even for RoPE" % (dim // heads))
        self.V, self.D, self.L, self.H, self.KV, self.F = vocab, dim, layers, heads, kv_heads, ffn
        self.hd = dim // heads
        self.tied, self.eps, self.theta = tied, eps, theta
        self.max_pos = max_pos

    def hf_config(self):
        """HF config.json keys for LlamaForCausalLM."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "vocab_size": self.V,
            "hidden_size": self.D,
            "intermediate_size": self.F,
            "num_hidden_layers": self.L,
            "num_attention_heads": self.H,
            "num_key_value_heads": self.KV,
            "rms_norm_eps": self.eps,
            "rope_theta": self.theta,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": self.max_pos,
        }


def param_shapes(cfg):
    """[(HF name, shape)] in a fixed order; lm_head absent when tied."""
    D, F_, V, hd = cfg.D, cfg.F, cfg.V, cfg.hd
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        out += [
            (p + "input_layernorm.weight", (D,)),
            (p + "self_attn.q_proj.weight", (cfg.H * hd, D)),
            (p + "self_attn.k_proj.weight", (cfg.KV * hd, D)),
            (p + "self_attn.v_proj.weight", (cfg.KV * hd, D)),
            (p + "self_attn.o_proj.weight", (D, cfg.H * hd)),
            (p + "post_attention_layernorm.weight", (D,)),
            (p + "mlp.gate_proj.weight", (F_, D)),
            (p + "mlp.up_proj.weight", (F_, D)),
            (p + "mlp.down_proj.weight", (D, F_)),
        ]
    out.append(("model.norm.weight", (D,)))
    if not cfg.tied:
        out.append(("lm_head.weight", (V, D)))
    return out


def init_params(cfg, gen):
    """Weights ~ normal(0, 0.02); RMSNorm weights = 1 + normal(0, 0.1)."""
    params = {}
    for name, shape in param_shapes(cfg):
        r = torch.randn(shape, generator=gen, dtype=F64)
        params[name] = 1.0 + 0.1 * r if name.endswith("norm.weight") else 0.02 * r
    return params


# ------------------------------------------------------ vectorised model ---

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(T, hd, theta):
    """cos, sin [T, hd] in HF's layout (emb = cat(freqs, freqs))."""
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=F64) / hd)
    freqs = torch.outer(torch.arange(T, dtype=F64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def attention(x, wq, wk, wv, wo, cfg):
    """x [B,T,D] (already normed) -> [B,T,D]."""
    B, T, _ = x.shape
    H, KV, hd = cfg.H, cfg.KV, cfg.hd
    q = (x @ wq.t()).view(B, T, H, hd).transpose(1, 2)   # [B,H,T,hd]
    k = (x @ wk.t()).view(B, T, KV, hd).transpose(1, 2)  # [B,KV,T,hd]
    v = (x @ wv.t()).view(B, T, KV, hd).transpose(1, 2)  # [B,KV,T,hd]
    cos, sin = rope_cos_sin(T, hd, cfg.theta)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rep = H // KV                                        # HF repeat_kv
    k = k.repeat_interleave(rep, dim=1)                  # [B,H,T,hd]
    v = v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)      # [B,H,T,T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
    return y @ wo.t()


def forward(params, cfg, ids):
    """ids [B,T] int64 -> logits [B,T,V]."""
    x = params["model.embed_tokens.weight"][ids]
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        h = rms_norm(x, params[p + "input_layernorm.weight"], cfg.eps)
        x = x + attention(h, params[p + "self_attn.q_proj.weight"],
                          params[p + "self_attn.k_proj.weight"],
                          params[p + "self_attn.v_proj.weight"],
                          params[p + "self_attn.o_proj.weight"], cfg)
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.eps)
        g = h @ params[p + "mlp.gate_proj.weight"].t()
        u = h @ params[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(g) * u) @ params[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, params["model.norm.weight"], cfg.eps)
    head = params["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    return x @ head.t()


def loss_fn(logits, targets):
    """Mean cross-entropy over all B*T positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ------------------------------------------- naive loop reference (check) ---

def naive_forward(params, cfg, ids):
    """The same model with explicit per-token / per-head loops and hand-written
    RoPE pairs, softmax and GQA mapping; shares no code with forward()."""
    B, T = ids.shape
    H, KV, hd, D = cfg.H, cfg.KV, cfg.hd, cfg.D
    half = hd // 2

    def norm(vec, w):
        ms = sum(float(vec[j]) ** 2 for j in range(D)) / D
        return vec / math.sqrt(ms + cfg.eps) * w

    def rope(vec, pos):  # vec [hd]; pairs (j, j+hd/2) rotated by pos*theta^(-2j/hd)
        out = vec.clone()
        for j in range(half):
            ang = pos * cfg.theta ** (-2.0 * j / hd)
            c, s = math.cos(ang), math.sin(ang)
            out[j] = vec[j] * c - vec[j + half] * s
            out[j + half] = vec[j + half] * c + vec[j] * s
        return out

    logits = torch.zeros(B, T, cfg.V, dtype=F64)
    for b in range(B):
        xs = [params["model.embed_tokens.weight"][int(ids[b, t])].clone() for t in range(T)]
        for i in range(cfg.L):
            p = "model.layers.%d." % i
            wq, wk = params[p + "self_attn.q_proj.weight"], params[p + "self_attn.k_proj.weight"]
            wv, wo = params[p + "self_attn.v_proj.weight"], params[p + "self_attn.o_proj.weight"]
            hs = [norm(x, params[p + "input_layernorm.weight"]) for x in xs]
            qs = [[rope(wq[h * hd:(h + 1) * hd] @ hs[t], t) for h in range(H)] for t in range(T)]
            ks = [[rope(wk[j * hd:(j + 1) * hd] @ hs[t], t) for j in range(KV)] for t in range(T)]
            vs = [[wv[j * hd:(j + 1) * hd] @ hs[t] for j in range(KV)] for t in range(T)]
            new = []
            for t in range(T):
                heads = []
                for h in range(H):
                    j = h // (H // KV)  # kv head serving query head h
                    sc = [float(qs[t][h] @ ks[s][j]) / math.sqrt(hd) for s in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(z - m) for z in sc]
                    z = sum(e)
                    heads.append(sum((e[s] / z) * vs[s][j] for s in range(t + 1)))
                new.append(xs[t] + wo @ torch.cat(heads))
            xs = new
            new = []
            for t in range(T):
                h2 = norm(xs[t], params[p + "post_attention_layernorm.weight"])
                g = params[p + "mlp.gate_proj.weight"] @ h2
                u = params[p + "mlp.up_proj.weight"] @ h2
                act = torch.tensor([gi / (1.0 + math.exp(-gi)) for gi in g.tolist()], dtype=F64)
                new.append(xs[t] + params[p + "mlp.down_proj.weight"] @ (act * u))
            xs = new
        head = params["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
        for t in range(T):
            logits[b, t] = head @ norm(xs[t], params["model.norm.weight"])
    return logits


def naive_loss(logits, targets):
    tot, n = 0.0, 0
    for row, tgt in zip(logits.reshape(-1, logits.shape[-1]).tolist(), targets.reshape(-1).tolist()):
        m = max(row)
        lse = m + math.log(sum(math.exp(z - m) for z in row))
        tot += lse - row[tgt]
        n += 1
    return tot / n


def naive_adamw(params, grads_fn, steps, hp):
    """Hand-written AdamW (Loshchilov & Hutter, decoupled decay as in
    torch.optim.AdamW: p *= 1 - lr*wd, then the Adam update with bias
    correction). grads_fn(params) -> (loss, {name: grad})."""
    p = {k: v.clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    losses = []
    for step in range(1, steps + 1):
        loss, g = grads_fn(p)
        losses.append(loss)
        for k in p:
            p[k] = p[k] * (1 - hp["lr"] * hp["weight_decay"])
            m[k] = hp["beta1"] * m[k] + (1 - hp["beta1"]) * g[k]
            v2[k] = hp["beta2"] * v2[k] + (1 - hp["beta2"]) * g[k] * g[k]
            mhat = m[k] / (1 - hp["beta1"] ** step)
            vhat = v2[k] / (1 - hp["beta2"] ** step)
            p[k] = p[k] - hp["lr"] * mhat / (vhat.sqrt() + hp["eps"])
    return losses, p


# --------------------------------------------------------- the reference ---

def grads_at(params, cfg, ids, targets):
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    logits = forward(leaves, cfg, ids)
    loss = loss_fn(logits, targets)
    loss.backward()
    return logits.detach(), loss.detach(), {k: v.grad.detach().clone() for k, v in leaves.items()}


def run_adamw(params, cfg, ids, targets, steps):
    """`steps` torch.optim.AdamW steps on one batch; losses before each update."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.AdamW(list(leaves.values()), lr=ADAMW["lr"],
                            betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(forward(leaves, cfg, ids), targets)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return torch.tensor(losses, dtype=F64), {k: v.detach().clone() for k, v in leaves.items()}


def build_reference(cfg, seed, B, T, steps):
    """[(name, tensor)] and metadata for the fixture file."""
    gen = torch.Generator().manual_seed(seed)
    params = init_params(cfg, gen)
    ids = torch.randint(0, cfg.V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg.V, (B, T), generator=gen, dtype=torch.int64)
    logits, loss, grads = grads_at(params, cfg, ids, targets)
    losses, final = run_adamw(params, cfg, ids, targets, steps)
    names = [n for n, _ in param_shapes(cfg)]
    tensors = [(n, params[n]) for n in names]
    tensors += [("input_ids", ids), ("targets", targets), ("logits", logits), ("loss", loss)]
    tensors += [("grad." + n, grads[n]) for n in names]
    tensors.append(("adamw_losses", losses))
    tensors += [("final." + n, final[n]) for n in names]
    metadata = {
        "magic": MAGIC,
        "version": VERSION,
        "config": json.dumps(cfg.hf_config(), sort_keys=True),
        "adamw": json.dumps(dict(ADAMW, steps=steps), sort_keys=True),
        "seed": str(seed),
        "batch": str(B),
        "seq": str(T),
    }
    return tensors, metadata


# ---------------------------------------------------------- safetensors ---

_DTYPES = {torch.float64: ("F64", "<f8"), torch.float32: ("F32", "<f4"),
           torch.int64: ("I64", "<i8"), torch.int32: ("I32", "<i4")}


def serialize_safetensors(tensors, metadata):
    """File image: u64 LE header length, compact JSON with sorted keys padded
    with spaces to a multiple of 8 bytes, then the data in list order."""
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        code, np_dtype = _DTYPES[t.dtype]
        data = t.detach().contiguous().numpy().astype(np_dtype).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_safetensors(path, tensors, metadata):
    """Atomic: temp file in the same directory, fsync, rename."""
    data = serialize_safetensors(tensors, metadata)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_safetensors(path):
    """-> (metadata, {name: tensor}); used by the self-check only."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    buf = raw[8 + n:]
    rev = {code: (dt, np_dt) for dt, (code, np_dt) in _DTYPES.items()}
    import numpy as np
    out = {}
    for name, e in header.items():
        dt, np_dt = rev[e["dtype"]]
        b, en = e["data_offsets"]
        arr = np.frombuffer(buf[b:en], dtype=np_dt).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy()).to(dt)
    return meta, out


# ------------------------------------------------------------ self-check ---

def selfcheck():
    t0 = time.time()
    torch.manual_seed(1234)

    # 1. Vectorised model == naive loop model, untied and tied, with GQA
    #    (H=4, KV=2) and plain MHA (KV=H).
    for kw in [dict(tied=False, kv_heads=2), dict(tied=True, kv_heads=1), dict(tied=False, kv_heads=4)]:
        cfg = Config(vocab=11, dim=16, layers=2, heads=4, ffn=24, **kw)
        gen = torch.Generator().manual_seed(7)
        params = init_params(cfg, gen)
        ids = torch.randint(0, cfg.V, (2, 5), generator=gen)
        tg = torch.randint(0, cfg.V, (2, 5), generator=gen)
        lg = forward(params, cfg, ids)
        lg_naive = naive_forward(params, cfg, ids)
        err = (lg - lg_naive).abs().max().item()
        assert err < 1e-12, "forward vs naive loops (%s): max |diff| %g" % (kw, err)
        l1, l2 = loss_fn(lg, tg).item(), naive_loss(lg_naive, tg)
        assert abs(l1 - l2) < 1e-12, "loss vs naive: %r vs %r" % (l1, l2)
        # Causality: changing the last token leaves earlier logits unchanged.
        ids2 = ids.clone()
        ids2[:, -1] = (ids2[:, -1] + 1) % cfg.V
        lg2 = forward(params, cfg, ids2)
        assert torch.equal(lg[:, :-1], lg2[:, :-1]), "attention is not causal"
        assert not torch.equal(lg[:, -1], lg2[:, -1])

    # 2. RoPE: rotation preserves each pair's norm and q.k depends only on the
    #    position difference (relative-position property).
    hd, theta = 8, 10000.0
    cos, sin = rope_cos_sin(12, hd, theta)
    q, k = torch.randn(hd, dtype=F64), torch.randn(hd, dtype=F64)
    rq = q * cos + rotate_half(q) * sin
    rk = k * cos + rotate_half(k) * sin
    dots = [(rq[m] @ rk[m - 3]).item() for m in range(3, 12)]
    assert max(dots) - min(dots) < 1e-12, "RoPE q.k not shift invariant"
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(12), atol=1e-13, rtol=0)

    # 3. Autograd gradients vs central finite differences (gradcheck), with
    #    GQA, untied and tied (tied: embed gets input + output contributions).
    for tied in (False, True):
        cfg = Config(vocab=7, dim=8, layers=1, heads=2, kv_heads=1, ffn=6, tied=tied)
        gen = torch.Generator().manual_seed(3)
        params = init_params(cfg, gen)
        ids = torch.randint(0, cfg.V, (2, 3), generator=gen)
        tg = torch.randint(0, cfg.V, (2, 3), generator=gen)
        names = [n for n, _ in param_shapes(cfg)]
        leaves = tuple(params[n].clone().requires_grad_(True) for n in names)

        def f(*ps):
            return loss_fn(forward(dict(zip(names, ps)), cfg, ids), tg)

        assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-8, rtol=1e-6), \
            "gradcheck failed (tied=%s)" % tied

    # 4. torch.optim.AdamW == hand-written AdamW (decoupled weight decay,
    #    bias correction, eps outside the sqrt), 4 steps, tied model.
    cfg = Config(vocab=9, dim=8, layers=1, heads=2, kv_heads=1, ffn=12, tied=True)
    gen = torch.Generator().manual_seed(5)
    params = init_params(cfg, gen)
    ids = torch.randint(0, cfg.V, (2, 4), generator=gen)
    tg = torch.randint(0, cfg.V, (2, 4), generator=gen)
    losses, final = run_adamw(params, cfg, ids, tg, 4)

    def gf(p):
        _, loss, g = grads_at(p, cfg, ids, tg)
        return loss.item(), g

    nl, nfinal = naive_adamw(params, gf, 4, ADAMW)
    assert max(abs(a - b) for a, b in zip(losses.tolist(), nl)) < 1e-13, "AdamW losses differ"
    for n in final:
        d = (final[n] - nfinal[n]).abs().max().item()
        assert d < 1e-13, "AdamW final %s differs by %g" % (n, d)
    assert losses[-1] < losses[0], "AdamW did not reduce the loss on a fixed batch"

    # 5. Fixture: the writer's file parses back (independent reader) to the
    #    same tensors and metadata; the header is 8-byte aligned; loss in the
    #    file equals the cross-entropy of the file's logits vs targets.
    cfg = Config(vocab=16, dim=8, layers=1, heads=2, kv_heads=1, ffn=12)
    tensors, meta = build_reference(cfg, 0, 2, 4, 3)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ref.safetensors")
        write_safetensors(path, tensors, meta)
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        assert n % 8 == 0 and raw[8:9] == b"{"
        meta2, back = read_safetensors(path)
        assert meta2 == meta
        assert set(back) == {name for name, _ in tensors}
        for name, t in tensors:
            assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
        assert abs(naive_loss(back["logits"], back["targets"]) - back["loss"].item()) < 1e-12
        assert [f for f in os.listdir(d) if ".tmp." in f] == []

    print("ref_llama selfcheck: OK (%.1f s)" % (time.time() - t0))
    return 0


# -------------------------------------------------------------------- cli ---

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="output .safetensors fixture")
    ap.add_argument("--selfcheck", action="store_true", help="verify the reference itself")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tied", action="store_true", help="tie lm_head to embed_tokens")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=48)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # deterministic summation order; shared machine
    if a.selfcheck:
        return selfcheck()
    if not a.out:
        ap.error("one of --out FILE or --selfcheck is required")
    try:
        cfg = Config(a.vocab, a.dim, a.layers, a.heads, a.kv_heads, a.ffn, tied=a.tied,
                     max_pos=a.seq)
    except ValueError as e:
        ap.error(str(e))
    tensors, meta = build_reference(cfg, a.seed, a.batch, a.seq, a.steps)
    write_safetensors(a.out, tensors, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
