"""The Python operators on CUDA tensors (docs/gpu.md, docs/python.md):
snip.fake_quant gives the CPU's bits for every recipe the operators run,
snip.nn.Linear's forward and gradients on cuda agree with the CPU's (the
GEMMs differ only in summation order), and a mixed-device call is one
snip.DeviceError. Skipped, with the reason, without a CUDA device
(SNIP_REQUIRE_CUDA=1 makes that a failure). CTest label cuda."""
import json
import os

import pytest
import torch

import snip

if not torch.cuda.is_available():
    if os.environ.get("SNIP_REQUIRE_CUDA") == "1":
        raise RuntimeError("SNIP_REQUIRE_CUDA=1 but torch.cuda.is_available() is False")
    pytest.skip("no CUDA device: torch.cuda.is_available() is False", allow_module_level=True)

# The recipes the operators run: no state between calls (delayed scaling and
# error feedback are refused by the operators on every device).
RECIPES = [n for n, r in snip.recipes().items()
           if not r.error_feedback and all(o.get("rule") != "delayed" for o in r.operands.values())]


def data(rows=48, k=256, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-3, 3, rows).unsqueeze(1)
    x[0, 5] = 3e4
    return x


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("operand", snip.OPERANDS)
def test_fake_quant_bits_equal_the_cpu(recipe, operand):
    x = data()
    cpu = snip.fake_quant(x, recipe, operand, seed=5, step=2, layer=1)
    gpu = snip.fake_quant(x.cuda(), recipe, operand, seed=5, step=2, layer=1)
    assert gpu.device.type == "cuda"
    assert torch.equal(cpu.view(torch.int32), gpu.cpu().view(torch.int32))


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4", "mxfp4"])
def test_linear_on_cuda_matches_the_cpu(recipe):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g)
    w = torch.randn(96, 128, generator=g) * 0.05
    dy = torch.randn(64, 96, generator=g)
    out = {}
    for dev in ("cpu", "cuda"):
        layer = snip.nn.Linear(128, 96, bias=False, recipe=recipe, gemm="fp32", device=dev)
        with torch.no_grad():
            layer.weight.copy_(w)
        xi = x.to(dev).requires_grad_(True)
        y = layer(xi)
        y.backward(dy.to(dev))
        out[dev] = [t.detach().cpu() for t in (y, xi.grad, layer.weight.grad)]
    for a, b in zip(out["cpu"], out["cuda"]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_mixed_devices_are_one_error():
    layer = snip.nn.Linear(32, 16, recipe="fp8")
    with pytest.raises(snip.DeviceError, match="expected one device"):
        layer(torch.randn(4, 32, device="cuda"))
