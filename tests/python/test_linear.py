"""snip.nn.Linear and snip.convert: forward and gradients against
independent computations (torch's own linear without quantization; the
operands quantized by snip.fake_quant, or by torchao's MX reference, and
multiplied by torch), parameters and state_dict keys kept, one-line errors."""
import pytest
import torch
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

import snip


def data(n=48, fin=64, fout=32, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, fin, generator=g, dtype=dtype)
    w = torch.randn(fout, fin, generator=g, dtype=dtype) * 0.1
    dy = torch.randn(n, fout, generator=g, dtype=dtype)
    return x, w, dy


def run(layer, x, dy):
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad


def make(recipe, w, gemm="fp32", bias=False, **kw):
    layer = snip.nn.Linear(w.shape[1], w.shape[0], bias=bias, dtype=w.dtype, recipe=recipe, gemm=gemm, **kw)
    with torch.no_grad():
        layer.weight.copy_(w)
    return layer


def test_without_quantization_it_is_torch_linear():
    x, w, dy = data()
    ref = torch.nn.Linear(64, 32, dtype=torch.float64)
    layer = make("none", w, bias=True)
    with torch.no_grad():
        ref.weight.copy_(w)
        layer.bias.copy_(ref.bias)
    for a, b in zip(run(layer, x, dy), run(ref, x, dy)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# Every built-in recipe but fp8_tensor (delayed scaling keeps state between
# calls: refused from Python with one line, tests/python/test_formats.py).
STATELESS = [n for n, r in snip.recipes().items()
             if not r.error_feedback and all(o.get("rule") != "delayed" for o in r.operands.values())]


def test_the_stateless_recipes_are_all_but_fp8_tensor():
    assert set(snip.recipes()) - set(STATELESS) == {"fp8_tensor"} and len(STATELESS) == 13


@pytest.mark.parametrize("recipe", STATELESS)
def test_gemms_are_the_quantized_operands_multiplied(recipe):
    # Each GEMM's operands quantized along its reduction dim by fake_quant
    # with the layer's keys (stochastic rounding included), then multiplied
    # in float64 by torch: the layer must give the same up to summation order.
    x, w, dy = data()
    layer = make(recipe, w, seed=3, layer=5)
    layer.step = 7
    y, dx, dw, _ = run(layer, x, dy)
    q = lambda t, op: snip.fake_quant(t.contiguous(), recipe, op, seed=3, step=7, layer=5)
    torch.testing.assert_close(y, q(x, "fprop.x") @ q(w, "fprop.w").T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, q(dy, "dgrad.dy") @ q(w.T, "dgrad.w").T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, q(dy.T, "wgrad.dy") @ q(x.T, "wgrad.x").T, rtol=1e-12, atol=1e-12)


def test_mxfp8_forward_equals_torchao_reference_then_matmul():
    x, w, _ = data(dtype=torch.float32)
    layer = make("mxfp8", w)
    ref = lambda t: to_dtype(*reversed(to_mx(t, torch.float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)),
                             torch.float8_e4m3fn, 32, torch.float32)
    want = ref(x).double() @ ref(w).double().T
    torch.testing.assert_close(layer(x).double(), want, rtol=1e-5, atol=1e-5)


def test_bf16_gemm_rounds_the_output_to_bf16():
    x, w, _ = data(dtype=torch.float32)
    y = make("none", w, gemm="bf16")(x)
    assert torch.equal(y, y.bfloat16().float())  # every value is a BF16 value
    exact = x.bfloat16().double() @ w.bfloat16().double().T
    torch.testing.assert_close(y.double(), exact, rtol=2 ** -8, atol=1e-6)


def test_convert_keeps_parameters_names_and_state_dict():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    snip.convert(model, recipe="mxfp8", plan={"2": "fp8"}, gemm="fp32")
    assert isinstance(model[0], snip.nn.Linear) and isinstance(model[2], snip.nn.Linear)
    assert snip.precision_table(model) == {"0": "mxfp8", "2": "fp8"}
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert list(model.state_dict()) == list(before)
    assert all(torch.equal(a, model.state_dict()[k]) for k, a in before.items())
    assert (model[0].layer, model[2].layer) == (0, 1)
    model(torch.randn(4, 16)).square().mean().backward()
    opt.step()  # the optimizer built before the conversion updates the converted layers
    assert not torch.equal(before["0.weight"], model[0].weight)
    snip.set_step(model, 3)
    assert model[0].step == 3


def test_convert_filter_and_errors():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    snip.convert(model, recipe="fp8", module_filter_fn=lambda m, fqn: m.out_features % 16 == 0)
    assert isinstance(model[0], snip.nn.Linear) and type(model[1]) is torch.nn.Linear
    with pytest.raises(snip.ConvertError, match="no nn.Linear of ReLU was converted"):
        snip.convert(torch.nn.ReLU())
    with pytest.raises(snip.ConvertError, match="all refused by module_filter_fn"):
        snip.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), module_filter_fn=lambda m, n: False)
    with pytest.raises(snip.ConvertError, match="plan: 'nope' is not an nn.Linear"):
        snip.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), plan={"nope": "fp8"})
    with pytest.raises(snip.RecipeError, match="unknown recipe 'fp5'"):
        snip.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), recipe="fp5")
    with pytest.raises(snip.RecipeError, match="gemm: expected bf16 or fp32"):
        snip.nn.Linear(4, 4, gemm="fp16")
    with pytest.raises(snip.RecipeError, match=r"expected input \[..., 4\]"):
        snip.nn.Linear(4, 4)(torch.ones(2, 5))


def test_compiled_layer_follows_the_step_without_recompiling():
    # fp4 rounds dY stochastically (dgrad.dy, wgrad.dy): the gradients
    # depend on the step. Compiled (fullgraph) and eager agree at every
    # step, and a new step is read from the layer, not compiled in.
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    snip.convert(eager, recipe="fp4", seed=11)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(eager, backend=backend, fullgraph=True)
    x = torch.randn(16, 64)
    grads = []
    for step in range(3):
        snip.set_step(eager, step)
        for f in (eager, compiled):
            eager.zero_grad()
            f(x).square().mean().backward()
            grads.append(eager[0].weight.grad.clone())
    assert len(graphs) == 1
    for step in range(3):
        assert torch.equal(grads[2 * step], grads[2 * step + 1]), step
    assert not torch.equal(grads[0], grads[2])  # another step, other random draws


def test_convert_tied_root_all_or_nothing_twice_and_hooks():
    # A module under two names (tied) is one snip.nn.Linear under both.
    m = torch.nn.Module()
    m.a = torch.nn.Linear(8, 8)
    m.b = m.a
    m.c = torch.nn.Linear(8, 8)
    fired = []
    m.c.register_forward_hook(lambda mod, i, o: fired.append(1))
    snip.convert(m, "mxfp4")
    assert isinstance(m.a, snip.nn.Linear) and m.b is m.a
    assert snip.precision_table(m) == {"a": "mxfp4", "b": "mxfp4", "c": "mxfp4"}
    m.c(torch.randn(2, 8))
    assert fired == [1]  # the hook registered before the conversion still fires
    assert (m.a.layer, m.c.layer) == (0, 1)
    # Converting again: another recipe where the filter says, layer keys unique.
    snip.convert(m, "fp8", module_filter_fn=lambda mod, fqn: fqn == "c", seed=4)
    assert snip.precision_table(m) == {"a": "mxfp4", "b": "mxfp4", "c": "fp8"}
    assert (m.a.layer, m.c.layer, m.c.seed) == (0, 1, 4)
    # All or nothing: a bad recipe in the plan leaves the model as it was.
    s = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(snip.RecipeError, match="unknown recipe 'bogus'"):
        snip.convert(s, "fp8", plan={"1": "bogus"})
    assert type(s[0]) is torch.nn.Linear and type(s[1]) is torch.nn.Linear
    with pytest.raises(snip.ConvertError, match="model is itself a Linear layer"):
        snip.convert(torch.nn.Linear(4, 4))
    with pytest.raises(snip.ConvertError, match="expected a torch.nn.Module"):
        snip.convert([torch.nn.Linear(4, 4)])


def test_layer_settings_are_checked_when_set():
    layer = snip.nn.Linear(16, 4, recipe="fp8")
    for what, value, text in [("seed", -1, r"seed: expected an integer in \[0, 9223372036854775808\)"),
                              ("layer", 2 ** 32, r"layer: expected an integer in \[0, 4294967296\)"),
                              ("step", 2 ** 32, r"step: expected an integer in \[0, 4294967296\)"),
                              ("step", None, "step: expected an integer, got NoneType"),
                              ("recipe", "bogus", "unknown recipe 'bogus'"),
                              ("recipe", "", "expected a recipe name")]:
        with pytest.raises(snip.RecipeError, match=text):
            setattr(layer, what, value)
    assert layer.recipe == "fp8"  # a refused recipe changes nothing
    layer.recipe = "mxfp8"
    assert layer._recipe_arg == "mxfp8" and "recipe=mxfp8" in repr(layer)
    with pytest.raises(snip.RecipeError, match=r"expected input \[..., 16\], got \[\]"):
        layer(torch.tensor(1.0))


def test_operators_pass_pytorchs_opcheck():
    # Fake kernels (shapes and strides, transposed inputs included) and the
    # autograd registration agree with the real kernels.
    x = torch.randn(64, 8).t()
    torch.library.opcheck(torch.ops.snip.fake_quant.default, (x, "mxfp4", "fprop.x", 0, 0, 0))
    torch.library.opcheck(torch.ops.snip.fake_quant.default, (x.requires_grad_(), "mxfp4", "fprop.x", 0, 0, 0))
    w = torch.randn(16, 64, requires_grad=True)
    xs = torch.randn(8, 64, requires_grad=True)
    torch.library.opcheck(torch.ops.snip.linear_fprop.default,
                          (xs, w, "mxfp8", 0, torch.tensor(3), 0, "fp32"))


def test_fake_quant_gradient_is_straight_through():
    x = torch.randn(4, 64, requires_grad=True)
    dy = torch.randn(4, 64)
    snip.fake_quant(x, "mxfp4").backward(dy)
    assert torch.equal(x.grad, dy)


def test_bf16_models_autocast_and_glob_plans():
    # A BF16 layer computes from the float32 values of its BF16 operands and
    # answers in BF16: the float32 layer on the same values, cast.
    x, w, dy = data(dtype=torch.float32)
    x, w = x.bfloat16(), w.bfloat16()
    b16 = make("mxfp8", w, gemm="bf16")
    f32 = make("mxfp8", w.float(), gemm="bf16")
    y = b16(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, f32(x.float()).bfloat16())
    xr = x.clone().requires_grad_(True)
    b16(xr).backward(dy.bfloat16())
    assert xr.grad.dtype == torch.bfloat16 and b16.weight.grad.dtype == torch.bfloat16
    # torch.autocast: the previous layer hands over BF16, the output is BF16.
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
    snip.convert(m, "nvfp4")
    with torch.autocast("cpu", torch.bfloat16):
        out = m(torch.randn(4, 64))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    # Plans take globs (snip train's pins): exact names win, then the first match.
    mm = torch.nn.Module()
    mm.up_proj, mm.down_proj, mm.o_proj = (torch.nn.Linear(4, 4) for _ in range(3))
    snip.convert(mm, "nvfp4", plan={"*_proj": "mxfp8", "down_proj": "fp8"})
    assert snip.precision_table(mm) == {"up_proj": "mxfp8", "down_proj": "fp8", "o_proj": "mxfp8"}
    with pytest.raises(snip.ConvertError, match=r"plan: '\*.gate' matches no nn.Linear"):
        snip.convert(mm, plan={"*.gate": "fp8"})
    with pytest.raises(snip.RecipeError, match="input: expected float32, float64, bfloat16 or float16"):
        b16(torch.ones(2, 64, dtype=torch.int32))


def test_full_backward_and_state_dict_hooks_survive_convert():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8))
    seen = []
    m[0].register_full_backward_hook(lambda mod, gi, go: seen.append("backward"))
    m[0]._register_state_dict_hook(lambda mod, sd, prefix, local: seen.append("state_dict"))
    snip.convert(m, "mxfp8")
    m(torch.randn(2, 8, requires_grad=True)).sum().backward()
    m.state_dict()
    assert seen == ["backward", "state_dict"]
