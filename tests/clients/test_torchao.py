"""MXFP8, MXFP4 and NVFP4 fake quantization: snip (`snip quantize --scheme
R --operand fprop.x`, along the last dimension) against torchao's reference
implementation (torchao.prototype.mx_formats: `to_mx` + `to_dtype` with
ScaleCalculationMode.FLOOR, `nvfp4_quantize` with a per-tensor scale), on
random, wide-range, tie and edge tensors.

MXFP8 and MXFP4 (OCP MX v1.0 section 6.3, the floor rule): bit for bit,
but for one rule (3, below) where torchao's dequantization does not invert
its own quantization: blocks whose scale clamps to E8M0's smallest, 2^-127.

NVFP4 (two-level: E4M3 block scale over 16 elements, FP32 tensor scale):
snip follows TransformerEngine's formulas (docs/formats.md, `two_level`),
torchao its own. The element codes and the E4M3 block scales are equal, with
two differences, each pinned below and explained in docs/formats.md
("snip and torchao"):
  1. torchao clamps the block scale to at least 2^-6, E4M3's smallest
     *normal* value (torch.finfo(float8_e4m3fn).tiny), where TE and snip
     round it to the nearest E4M3 value, subnormals and zero included. Only
     blocks whose scale is below 2^-6 differ (blocks far below the tensor's
     amax).
  2. The decoded value: snip decodes code x fl(s_b x fl(1/S_enc)) (TE's
     decode scale, S_enc = fl(2688 / amax)); torchao code x fl(s_b x
     fl(amax / 2688)). fl(1/fl(2688/amax)) and fl(amax/2688) can differ in
     the last bit, so snip's output equals code x TE's decode scale exactly
     (checked), and torchao's to within 2 float32 ulps.
  3. (MX) a block whose floor-rule exponent is below -127 (amax below
     2^-119 for E4M3, 2^-125 for E2M1) gets E8M0 code 0 = 2^-127; torchao
     divides it by max(2^-127, 2^-126) = 2^-126 before the cast but
     multiplies by 2^-127 after, so its result is half the quantized value;
     snip uses 2^-127 both ways (checked against ml_dtypes' cast).
"""
import subprocess

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

F32 = np.float32
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=F32)


def tensors():
    g = torch.Generator().manual_seed(0)
    t = {}
    t["random"] = torch.randn(64, 256, generator=g) * 3
    # rows 2^-20 .. 2^20 apart: blocks far below the tensor's amax
    t["wide"] = torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-20, 21, (64, 1), generator=g).float())
    # ties of E2M1 and E4M3 after the block scale: a block's amax sets the
    # scale to a power of two (MX) and the other elements sit on midpoints
    ties = []
    for k in range(-8, 9):
        e2m1_mid = [6, 2.5, 5, 0.25, 0.75, 1.25, 1.75, 3.5, -2.5, -5, -0.25, -0.75, -1.25, -1.75, -3.5, 0]
        e4m3_mid = [448, 1.0625, 1.1875, 0.00390625 * 1.5, 17, 19, 208, 232, -1.0625, -17, -232, 0.5, 0.25, 3, 5, 0]
        ties.append(torch.tensor(e2m1_mid * 2, dtype=torch.float32) * 2.0 ** k)
        ties.append(torch.tensor(e4m3_mid * 2, dtype=torch.float32) * 2.0 ** k)
    t["ties"] = torch.stack(ties)
    edge = torch.zeros(8, 64)
    edge[1, :32] = 1e-30           # tiny blocks
    edge[2, 3] = 1.0               # one nonzero
    edge[3, :] = -0.0              # negative zeros
    edge[4, :] = torch.linspace(-1e30, 1e30, 64)   # huge
    edge[5, :] = 2.0 ** -126       # the smallest normal FP32
    edge[6, :32] = 1.0
    edge[6, 32:] = 1e-3
    edge[7, :] = torch.arange(64) - 31.5
    t["edge"] = edge
    return {k: v.contiguous() for k, v in t.items()}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ao")
    t = tensors()
    save_file(t, str(d / "in.safetensors"))
    return d, t


def snip_quantize(snip_bin, d, recipe):
    out = d / f"{recipe}.safetensors"
    p = subprocess.run([snip_bin, "quantize", "--scheme", recipe, "--operand", "fprop.x", "--input",
                        str(d / "in.safetensors"), "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return load_file(str(out))


@pytest.mark.parametrize("recipe,elem,ml,emax", [("mxfp8", torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn, 448.0),
                                                  ("mxfp4", torch.float4_e2m1fn_x2, ml_dtypes.float4_e2m1fn, 6.0)])
def test_mx_equals_torchao_bit_for_bit(snip_bin, inputs, recipe, elem, ml, emax):
    d, t = inputs
    ours = snip_quantize(snip_bin, d, recipe)
    floor_blocks = 0
    for name, x in t.items():
        s, q = to_mx(x, elem, 32, ScaleCalculationMode.FLOOR)
        ref = to_dtype(q, s, elem, 32, torch.float32).numpy()
        y = ours[name].numpy()
        # Rule 3: where the floor rule's exponent clamps to E8M0's smallest,
        # 2^-127 (code 0), torchao divides by 2^-126 (it clamps the FP32
        # scale to the smallest normal) but decodes with 2^-127; snip scales
        # and decodes with the 2^-127 it stores: y = code(x / 2^-127) 2^-127.
        low = np.repeat(s.view(torch.uint8).numpy().reshape(x.shape[0], -1) == 0, 32, axis=1)
        floor_blocks += int(low.sum())
        want = np.clip(x.numpy().astype(np.float64) * 2.0 ** 127, -emax, emax).astype(F32).astype(ml)
        want = (want.astype(np.float64) * 2.0 ** -127).astype(F32)
        assert np.array_equal(y[low].view(np.uint32), want[low].view(np.uint32)), name
        a, b = y[~low].view(np.uint32), ref[~low].view(np.uint32)
        bad = np.nonzero(a != b)[0]
        assert bad.size == 0, (recipe, name, [(x.numpy()[~low][i], y[~low][i], ref[~low][i]) for i in bad[:5]])
    assert floor_blocks > 0, "no block reaches rule 3: the test would not see it"


def te_decode_scale(x):
    """TE's NVFP4 scales for x [R, K] (docs/formats.md, two_level): the
    E4M3 block scales s_b [R, K/16] and decode scales d = fl(s_b S_dec)."""
    a = x.numpy().astype(F32)
    amax = F32(np.abs(a).max())
    s_enc = F32(F32(448 * 6) / amax) if amax > 0 else F32(1)
    s_dec = F32(F32(1) / s_enc)
    bam = np.abs(a.reshape(a.shape[0], -1, 16)).max(-1).astype(F32)
    sb_real = np.minimum((bam * F32(s_enc * F32(F32(1) / F32(6)))).astype(F32), F32(448))
    sb = sb_real.astype(ml_dtypes.float8_e4m3fn).astype(F32)
    return sb, (sb * s_dec).astype(F32)


def test_nvfp4_equals_torchao_but_the_two_documented_rules(snip_bin, inputs):
    d, t = inputs
    ours = snip_quantize(snip_bin, d, "nvfp4")
    clamped_blocks = 0
    for name, x in t.items():
        if x.abs().max() == 0:
            continue
        R, K = x.shape
        pts = per_tensor_amax_to_scale(x.abs().max())
        s_ao, q = nvfp4_quantize(x, 16, pts)
        s_ao = s_ao.float().numpy().reshape(R, -1)
        c_ao = f4_unpacked_to_f32(unpack_uint4(q)).numpy().reshape(R, -1, 16)
        sb, dec = te_decode_scale(x)
        y = ours[name].numpy().reshape(R, -1, 16)
        # snip's codes: its output over TE's decode scale, on the E2M1 grid
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(dec[..., None] > 0, y / dec[..., None], 0).astype(F32)
        c = np.sign(r) * E2M1[np.abs(np.abs(r)[..., None] - E2M1).argmin(-1)]
        # the output is code x TE's decode scale, exactly
        assert np.array_equal((c * dec[..., None]).astype(F32).view(np.uint32) & 0x7FFFFFFF,
                              y.view(np.uint32) & 0x7FFFFFFF), name
        same_scale = sb == s_ao
        # rule 1: scales differ only where torchao clamps at E4M3's smallest normal
        assert np.all(s_ao[~same_scale] == 2.0 ** -6) and np.all(sb[~same_scale] < 2.0 ** -6), name
        clamped_blocks += int((~same_scale).sum())
        # with the same block scale, the same element codes
        assert np.array_equal(c[same_scale], c_ao[same_scale]), name
        # rule 2: torchao's decoded value within 2 ulps of snip's
        ref = (x.new_tensor(c_ao) * torch.from_numpy(s_ao)[..., None] * pts).numpy()
        keep = np.broadcast_to(same_scale[..., None], y.shape)
        ulp = np.spacing(np.abs(ref[keep]).astype(F32))
        assert np.all(np.abs(y[keep] - ref[keep]) <= 2 * ulp), name
    assert clamped_blocks > 0, "no tensor reaches rule 1: the test would not see it"
