"""`snip doctor`'s CPU rows for FP8/FP4, checked against what snip's
emulation does. "emulated exactly" promises that the quantized operands snip
feeds its BF16 GEMM (fake-quantized: element code x scales) are BF16 values,
so the BF16 GEMM with FP32 accumulation is the GEMM of the quantized values
up to FP32 summation order: here, for every row labelled so, the
fake-quantized operands of that format are cast to BF16 and back without
changing one bit, and snip's BF16 GEMM equals a float64 GEMM of the same
values within FP32 accumulation and the BF16 output rounding. NVFP4 is
labelled "emulated, operands rounded": its code x E4M3 block scale is a
BF16 value (decoded here from the packed codes with torch's float8_e4m3fn
and the E2M1 table), but the FP32 tensor scale snip multiplies into the
operands is not, and the test requires the label to say so."""
import json
import os
import subprocess

import pytest
import torch

import snip

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def recipe_with_element(base, element):
    """`base` (a built-in recipe name) with every operand's element format replaced."""
    spec = json.loads(snip.recipes()[base].json)  # a fresh dict
    spec["name"] = f"{base}_{element}"
    for op in spec["operands"].values():
        op["element"] = element
    return snip.Recipe(spec)


# The doctor's rows -> a recipe whose operands are that format (scales as the
# doctor's "how" says: power-of-two, E8M0, or E4M3 block x FP32 tensor scale).
ROWS = {
    "fp8_e4m3": snip.recipes()["fp8"],  # E4M3, FP32 power-of-two block scales
    "fp8_e5m2": recipe_with_element("fp8", "e5m2"),
    "fp4_e2m1": recipe_with_element("fp8", "e2m1"),
    "mxfp8": snip.recipes()["mxfp8"],
    "mxfp4": snip.recipes()["mxfp4"],
    "nvfp4": snip.recipes()["nvfp4"],
}


def exact_in_bf16(t):
    return torch.equal(t.to(torch.bfloat16).to(t.dtype), t)


def nvfp4_values_without_tensor_scale(x):
    """code x block scale of nvfp4's quantization of x [rows, K], decoded here."""
    q = snip.quantize(x, "nvfp4", "fprop.x")
    rows, cols = q.shape
    b = q.data.to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=1).reshape(-1)[: rows * cols]  # element 2i in the low nibble
    vals = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    block = q.scale_codes.to(torch.uint8).view(torch.float8_e4m3fn).float()  # [rows, K/16]
    br, bc = q.block
    return vals.view(rows, cols) * block.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]


def doctor_rows():
    b = os.environ.get("SNIP_BIN")
    if not b:
        pytest.skip("SNIP_BIN is not set (run through ctest)")
    p = subprocess.run([b, "doctor", "--json", "--min-time", "0.01"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return {r["precision"]: r["support"] for r in json.loads(p.stdout)["cpu_support"]}


def test_every_row_the_doctor_calls_emulated_exactly_is_exact():
    rows = doctor_rows()
    claimed = [p for p, s in rows.items() if s == "emulated exactly"]
    assert set(claimed) <= set(ROWS) | {"bf16"}, f"a row this test does not know: {claimed}"
    # Every FP8/FP4 row is checked one way or the other.
    assert set(ROWS) <= set(claimed) | {p for p, s in rows.items() if s == "emulated, operands rounded"}, rows
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 256).view(1, -1)
    for p, s in rows.items():
        if s == "emulated, operands rounded":  # the label must be true too: the operands are not BF16 values
            assert not exact_in_bf16(snip.fake_quant(x, ROWS[p], "fprop.x")), p
            if p == "nvfp4":  # and the reason is the tensor scale: code x block scale alone is exact
                assert exact_in_bf16(nvfp4_values_without_tensor_scale(x))
    w = torch.randn(48, 256, generator=g)
    for p in claimed:
        if p == "bf16":
            continue
        r = ROWS[p]
        vx, vw = snip.fake_quant(x, r, "fprop.x"), snip.fake_quant(w, r, "fprop.w")
        assert exact_in_bf16(vx) and exact_in_bf16(vw), f"{p}: quantized values are not all BF16 values"
        # snip's BF16 GEMM of the fake-quantized operands vs float64 on the same values.
        layer = snip.nn.Linear(256, 48, bias=False, recipe=r, gemm="bf16")
        with torch.no_grad():
            layer.weight.copy_(w)
            y_bf16 = layer(x).double()
        y_exact = vx.double() @ vw.double().t()
        bound = 256 * 2.0 ** -23 * (vx.double().abs() @ vw.double().abs().t())  # FP32 accumulation
        out_round = y_exact.abs() * 2.0 ** -8  # the BF16 GEMM's output is rounded to BF16
        assert ((y_bf16 - y_exact).abs() <= bound + out_round).all(), p


def test_a_format_that_is_not_exact_in_bf16_fails_the_check():
    # The check can fail: E4M3 with a non-power-of-two FP32 scale (the "fp8"
    # recipe with its scale_format fp32) gives values BF16 cannot hold.
    spec = json.loads(snip.recipes()["fp8"].json)
    spec["name"] = "fp8_fp32scale"
    for op in spec["operands"].values():
        op["scale_format"] = "fp32"
    r = snip.Recipe(spec)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 3.7
    assert not exact_in_bf16(snip.fake_quant(x, r, "fprop.x"))
