"""snip.formats, snip.recipes, snip.load_recipes and snip.fake_quant: the
same tables as the `snip` program, values known independently (the
formats' largest values by hand, torchao's MX reference bit for bit), and
one-line errors."""
import json
import math

import pytest
import torch
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

import snip
from conftest import run_snip


def test_formats_are_the_programs_and_have_the_known_limits(snip_bin):
    got = snip.formats()
    assert got == json.loads(run_snip(snip_bin, "formats", "--json"))
    by = {f["name"]: f for f in got}
    # By hand: E4M3 (OCP FP8) 1.75 * 2^8, E5M2 1.75 * 2^15, E2M1 1.5 * 2^2.
    assert by["e4m3"]["max"] == 448.0
    assert by["e5m2"]["max"] == 57344.0
    assert by["e2m1"]["max"] == 6.0


def test_recipes_are_the_programs_and_files_add_theirs(snip_bin, tmp_path):
    r = snip.recipes()
    want = {x["name"]: x for x in json.loads(run_snip(snip_bin, "formats", "--recipes", "--json"))}
    assert sorted(r) == sorted(want)
    assert json.loads(r["nvfp4"].json) == want["nvfp4"]
    assert r["fp8"].operands["fprop.w"]["block"] == "128x128"
    f = tmp_path / "r.toml"
    f.write_text('[recipes.w4a8]\nactivations = { element = "e4m3", rule = "mx_floor", scale_format = "e8m0", '
                 'block = "1x32" }\nweights = { element = "e2m1", rule = "mx_floor", scale_format = "e8m0", '
                 'block = "1x32" }\ngradients = { element = "e4m3", rule = "mx_floor", scale_format = "e8m0", '
                 'block = "1x32" }\n')
    mine = snip.load_recipes(f)
    assert list(mine) == ["w4a8"]
    assert mine["w4a8"].operands["fprop.w"]["element"] == "e2m1"
    assert "w4a8" not in snip.recipes()  # a value: loading a file registers nothing
    # The file's recipe runs: its fprop.w equals mxfp4's, its fprop.x mxfp8's.
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(snip.fake_quant(x, mine["w4a8"], "fprop.w"), snip.fake_quant(x, "mxfp4", "fprop.w"))
    assert torch.equal(snip.fake_quant(x, mine["w4a8"], "fprop.x"), snip.fake_quant(x, "mxfp8", "fprop.x"))
    bad = tmp_path / "bad.toml"
    bad.write_text('[recipes.x]\nweights = { element = "e9m9" }\n')
    with pytest.raises(snip.RecipeError) as e:
        snip.load_recipes(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


@pytest.mark.parametrize("recipe,elem", [("mxfp8", torch.float8_e4m3fn), ("mxfp4", torch.float4_e2m1fn_x2)])
def test_fake_quant_equals_torchao_bit_for_bit(recipe, elem):
    # OCP MX floor rule; blocks well above 2^-119 (torchao's one documented
    # difference, tests/clients/test_torchao.py rule 3, is not reached).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-8, 9, (64, 1), generator=g).float())
    s, q = to_mx(x, elem, 32, ScaleCalculationMode.FLOOR)
    ref = to_dtype(q, s, elem, 32, torch.float32)
    for op in snip.OPERANDS[:1] + ("fprop.w",):
        y = snip.fake_quant(x, recipe, op)
        assert torch.equal(y.view(torch.int32), ref.view(torch.int32)), (recipe, op)
    # Leading dimensions are rows: [4, 16, 256] quantizes as [64, 256].
    assert torch.equal(snip.fake_quant(x.view(4, 16, 256), recipe), ref.view(4, 16, 256))
    # float64 in, float64 out, the same values.
    assert torch.equal(snip.fake_quant(x.double(), recipe), ref.double())


def test_stochastic_rounding_is_keyed_and_unbiased():
    # One 1.0 per 16-element block sets the block scale to 1/6 (E2M1's 6 at
    # 1.0); 0.3 is then 1.8 units, between the E2M1 values 1.5 and 2.
    x = torch.full((256, 64), 0.3)
    x[:, ::16] = 1.0
    a = snip.fake_quant(x, "fp4", "dgrad.dy", seed=1, step=5, layer=2)
    assert torch.equal(a, snip.fake_quant(x, "fp4", "dgrad.dy", seed=1, step=5, layer=2))
    assert not torch.equal(a, snip.fake_quant(x, "fp4", "dgrad.dy", seed=1, step=6, layer=2))
    mid = a[x == 0.3]
    assert len(torch.unique(mid)) == 2  # the two neighbours of 0.3: 1.5/6 and 2/6
    assert math.isclose(mid.mean().item(), 0.3, rel_tol=0.02)  # unbiased: 0.6 of the draws go up
    assert torch.equal(snip.fake_quant(x, "fp4", "fprop.x"), snip.fake_quant(x, "fp4", "fprop.x", step=9))  # RNE


def _linear_with(step=None, bias=None):
    """A snip.nn.Linear(32, 8) whose step buffer or bias sits on another device."""
    layer = snip.nn.Linear(32, 8, recipe="fp8")
    if step:
        layer._step = layer._step.to(step)
    if bias:
        layer.bias = torch.nn.Parameter(torch.empty(8, device=bias))
    return layer


@pytest.mark.parametrize("call,kind,text", [
    (lambda: snip.fake_quant(torch.ones(2, 32), "fp3"), snip.RecipeError, "unknown recipe 'fp3' (known: bf16"),
    (lambda: snip.fake_quant(torch.ones(2, 32), "fp8", "fprop.z"), snip.RecipeError, "operand: unknown GEMM operand"),
    (lambda: snip.fake_quant(torch.ones(2, 32, dtype=torch.int32), "fp8"), snip.RecipeError, "x: expected a float32"),
    (lambda: snip.fake_quant(torch.ones(2, 32), "fp8_tensor"), snip.RecipeError, "keeps state between calls"),
    (lambda: snip.fake_quant(torch.ones(2, 32), "fp8", seed=-1), snip.RecipeError, "expected integers >= 0"),
    (lambda: snip.fake_quant(torch.ones(2, 32, device="meta"), "fp8"), snip.DeviceError,
     "tensor on meta: this snip operator has kernels for the CPU and CUDA"),
    (lambda: snip.quantize(torch.ones(2, 32, device="meta"), "fp8"), snip.DeviceError,
     "kernels for the CPU only (packed codes and scales live on the host)"),
    (lambda: snip.nn.Linear(32, 8, recipe="fp8")(torch.ones(2, 32, device="meta")), snip.DeviceError,
     "tensor on meta: this snip operator has kernels for the CPU and CUDA"),
    # The step buffer and the bias are checked too (a meta step once gave uninitialised output).
    (lambda: _linear_with(step="meta")(torch.ones(2, 32)), snip.DeviceError, "tensor on meta"),
    (lambda: _linear_with(bias="meta")(torch.ones(2, 32)), snip.DeviceError, "tensor on meta"),
    (lambda: snip.fake_quant(torch.ones(2, 32), 3), snip.RecipeError, "expected a recipe name"),
])
def test_bad_input_is_one_line_of_the_right_class(call, kind, text):
    with pytest.raises(kind) as e:
        call()
    assert text in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, snip.Error)


@pytest.mark.parametrize("recipe", sorted(set(snip.recipes()) - {"fp8_tensor"}))
def test_dequantize_of_quantize_is_fake_quant(recipe):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 20, 48, generator=g) * torch.exp2(torch.randint(-6, 7, (3, 20, 1), generator=g).float())
    for op in snip.OPERANDS:
        q = snip.quantize(x, recipe, op, seed=2, step=3, layer=1)
        assert q.shape == (60, 48)
        y = snip.dequantize(q)
        assert torch.equal(y, snip.fake_quant(x, recipe, op, seed=2, step=3, layer=1).view(60, 48)), op


def test_mxfp4_codes_and_scales_are_torchaos():
    # torchao's to_mx gives E8M0 scale codes and float4_e2m1fn_x2 data: the
    # bytes snip packs must be the same bytes.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 128, generator=g) * 4
    s, q_ref = to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    q = snip.quantize(x, "mxfp4", "fprop.w")
    assert q.block == (1, 32) and q.scale_codes.shape == (16, 4)
    assert torch.equal(q.scale_codes, s.view(torch.uint8).view(16, 4).long())
    assert torch.equal(q.data.view(16, 64), q_ref.view(torch.uint8).view(16, 64))
    assert torch.equal(q.scales, torch.exp2(q.scale_codes.float() - 127))  # E8M0: 2^(code - 127)


def test_nvfp4_has_two_scale_levels():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6))
    q = snip.quantize(x, "nvfp4", "fprop.x")
    # TE's second level: S_enc = 448 * 6 / amax in float32, S_dec = 1 / S_enc.
    s_enc = torch.tensor(2688.0) / x.abs().max()
    assert q.tensor_scale[1] == s_enc and q.tensor_scale[0] == 1 / s_enc
    assert q.block == (1, 16) and q.data.numel() == 4 * 64 // 2
    with pytest.raises(snip.RecipeError, match="expected 128 packed uint8 bytes"):
        snip.dequantize(q._replace(data=q.data[:-1]))


def test_dequantize_reads_tensors_not_memory():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    q = snip.quantize(x, "mxfp4")
    strided = torch.stack([q.data, torch.zeros_like(q.data)], 1).reshape(-1)[::2]
    assert torch.equal(snip.dequantize(q._replace(data=strided)), snip.dequantize(q))
    empty = snip.quantize(torch.randn(0, 64), "mxfp4")
    assert snip.dequantize(empty).shape == (0, 64)
    with pytest.raises(snip.RecipeError, match="shape and block: expected two integers each"):
        snip.dequantize(q._replace(shape=(256,)))
    with pytest.raises(snip.DeviceError):
        snip.dequantize(q._replace(data=q.data.to("meta")))


def test_recipe_objects_are_checked():
    ops = snip.recipes()["mxfp4"].operands
    for name in ("none", "a b", ""):
        with pytest.raises(snip.RecipeError, match="name: expected"):
            snip.Recipe({"name": name, "operands": ops})
    with pytest.raises(snip.RecipeError, match="expected a recipe's JSON form"):
        snip.Recipe({})
    with pytest.raises(snip.RecipeError, match="expected a torch.Tensor, got list"):
        snip.fake_quant([[1.0]], "fp8")
    with pytest.raises(snip.RecipeError, match="expected a recipe name"):
        snip.fake_quant(torch.ones(1, 4), "")
    with pytest.raises(snip.RecipeError, match="^/nonexistent.toml"):
        snip.load_recipes("/nonexistent.toml")
