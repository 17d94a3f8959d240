"""safetensors files between snip and the safetensors library (huggingface/
safetensors, the reference implementation; pinned in requirements.txt), for
every dtype both support: F64, F32, F16, BF16, F8_E4M3, F8_E5M2,
F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F4, BOOL, U8, I8, U16, I16, U32, I32,
U64, I64, C64.

The library writes a file of every dtype (safetensors.torch.save_file);
`snip quantize --scheme bf16` reads it and writes a file back: each float
tensor decoded by snip and cast to BF16 (RNE, IEEE overflow: the `bf16`
recipe), stored as F32; every other tensor copied in its own dtype. The
library reads snip's file: the copies are the original bytes, and each float
tensor equals torch's own decode and cast, x.float().bfloat16().float() (F4,
which torch cannot cast, decoded through its code table, element 2k in the
low nibble), bit for bit, NaNs as NaNs. So snip's reader agrees with the
library's writer and torch's decoders on every dtype, and snip's writer with
the library's reader.
"""
import json
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

FLOATS = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]
OTHERS = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "complex64"]
F4 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def make(name, g):
    dt = getattr(torch, name)
    if dt.itemsize == 1 and dt.is_floating_point or name == "float4_e2m1fn_x2":
        return torch.arange(256, dtype=torch.uint8).reshape(8, 32).view(dt)   # every code
    if dt.is_floating_point:
        x = torch.randn(8, 32, generator=g, dtype=torch.float64) * torch.logspace(-6, 6, 32, dtype=torch.float64)
        x[0, :6] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40])
        if dt != torch.float64:
            x[1, :2] = torch.tensor([3.0e38, -3.0e38])   # BF16 overflow -> Inf
        return x.to(dt)
    if name == "bool":
        return torch.rand(8, 32, generator=g) > 0.5
    if name == "complex64":
        return torch.randn(8, 32, generator=g, dtype=torch.complex64)
    info = torch.iinfo(dt)
    lo, hi = max(info.min, -2 ** 62), min(info.max, 2 ** 62)
    return torch.randint(lo, hi, (8, 32), generator=g, dtype=torch.int64).to(dt)


def decoded(name, x):
    """torch's decode of x to FP32, then its RNE cast to BF16, as FP32."""
    if name == "float4_e2m1fn_x2":
        b = x.view(torch.uint8).to(torch.int64)
        v = torch.stack([F4[b & 0xF], F4[b >> 4]], dim=-1).reshape(x.shape[0], -1)   # low nibble first
        return v.bfloat16().float()
    return x.float().bfloat16().float()


def test_every_dtype_both_ways(snip_bin, tmp_path):
    g = torch.Generator().manual_seed(0)
    t = {n: make(n, g) for n in FLOATS + OTHERS}
    src, out = tmp_path / "lib.safetensors", tmp_path / "snip.safetensors"
    save_file(t, str(src), metadata={"written_by": "safetensors"})
    p = subprocess.run([snip_bin, "quantize", "--scheme", "bf16", "--operand", "fprop.x", "--input", str(src),
                        "--output", str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    actions = {(r := json.loads(line))["tensor"]: r for line in p.stdout.splitlines() if line.startswith("{")}
    back = load_file(str(out))
    assert sorted(back) == sorted(t)
    for n in OTHERS:
        assert actions[n]["action"] == "copied", actions[n]
        assert back[n].dtype == t[n].dtype and back[n].shape == t[n].shape, n
        assert torch.equal(back[n].view(torch.uint8), t[n].view(torch.uint8)), n
    for n in FLOATS:
        assert actions[n]["action"] == "quantized", actions[n]
        ours, ref = back[n], decoded(n, t[n])
        assert ours.dtype == torch.float32 and ours.shape == ref.shape, (n, ours.shape, ref.shape)
        nan = torch.isnan(ref)
        assert torch.equal(torch.isnan(ours), nan), n
        assert torch.equal(ours[~nan].view(torch.int32), ref[~nan].view(torch.int32)), n
