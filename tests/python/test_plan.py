"""SNIP's plan in a user's model: `snip plan --init-from` measures a Hugging
Face folder (the stats step) and solves the ILP; snip.load_plan reads the
plan file and snip.convert applies it, per layer or per GEMM. And a
per-GEMM recipe runs each GEMM exactly as that GEMM's recipe does."""
import json
import os
import subprocess

import pytest
import torch
import transformers

import snip


def test_per_gemm_recipe_runs_each_gemm_as_its_recipe():
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(32, 64, generator=g), torch.randn(48, 64, generator=g) * 0.1, torch.randn(32, 48, generator=g)
    by = {"fprop": "nvfp4", "dgrad": "fp8", "wgrad": "mxfp8"}

    def run(recipe):
        layer = snip.nn.Linear(64, 48, bias=False, recipe=recipe, seed=1, layer=2)
        with torch.no_grad():
            layer.weight.copy_(w)
        xr = x.clone().requires_grad_(True)
        y = layer(xr)
        y.backward(dy)
        return y, xr.grad, layer.weight.grad

    mixed = run(by)
    assert torch.equal(mixed[0], run("nvfp4")[0])
    assert torch.equal(mixed[1], run("fp8")[1])
    assert torch.equal(mixed[2], run("mxfp8")[2])
    r = snip.per_gemm(by)
    assert r.operands["dgrad.dy"] == snip.recipes()["fp8"].operands["dgrad.dy"]
    with pytest.raises(snip.RecipeError, match="expected the keys fprop, dgrad and wgrad"):
        snip.per_gemm({"fprop": "fp8"})
    with pytest.raises(snip.RecipeError, match="dgrad: unknown recipe 'fp5'"):
        snip.per_gemm({"fprop": "fp8", "dgrad": "fp5", "wgrad": "fp8"})


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg)
    m.save_pretrained(d)
    toml = d / "plan.toml"
    toml.write_text(f'[data]\ndir = "{os.environ.get("SNIP_DATA", "")}"\n[train]\nbatch_size = 2\nseq_len = 32\n'
                    'threads = 1\n')
    return m, str(d), str(toml)


def snip_plan(snip_bin, hf, toml, out, *extra):
    data = os.environ.get("SNIP_DATA")
    if not data:
        pytest.skip("SNIP_DATA is not set (run through ctest)")
    p = subprocess.run([snip_bin, "plan", "--config", toml, "--init-from", hf, "--data", data, "--budget", "0.5",
                        "--out", str(out), *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_a_measured_plan_applies_to_the_users_model(snip_bin, hf_model, tmp_path):
    ref, hf, toml = hf_model
    doc = snip_plan(snip_bin, hf, toml, tmp_path / "plan.json")
    plan = snip.load_plan(tmp_path / "plan.json")
    assert plan == doc["assignments"] and len(plan) == 14
    assert set(plan.values()) == {"fp4", "fp8"}  # a budget of 0.5: some of each
    model = transformers.LlamaForCausalLM(ref.config)
    model.load_state_dict(ref.state_dict())
    snip.convert(model, plan=plan, module_filter_fn=lambda m, fqn: fqn in plan)
    assert snip.precision_table(model) == plan
    flops = {it["name"]: it["flops"] for it in doc["items"]}
    share = sum(f for n, f in flops.items() if plan[n] == "fp4") / sum(flops.values())
    assert share >= 0.5 - 1e-9 and abs(share - doc["fp4_share"]) < 1e-9
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_a_per_gemm_plan_applies_per_gemm(snip_bin, hf_model, tmp_path):
    ref, hf, toml = hf_model
    doc = snip_plan(snip_bin, hf, toml, tmp_path / "plan.json", "--per-gemm")
    assert all(":" in k for k in doc["assignments"])
    plan = snip.load_plan(tmp_path / "plan.json")
    assert len(plan) == 14 and all(set(v) == {"fprop", "dgrad", "wgrad"} for v in plan.values())
    for layer, by in plan.items():
        for g, option in by.items():
            assert doc["assignments"][f"{layer}:{g}"] == option
    model = transformers.LlamaForCausalLM(ref.config)
    snip.convert(model, plan=plan, module_filter_fn=lambda m, fqn: fqn in plan)
    table = snip.precision_table(model)
    assert table[next(iter(plan))] == ",".join(f"{g}={plan[next(iter(plan))][g]}" for g in ("fprop", "dgrad", "wgrad"))
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    assert torch.isfinite(model(ids, labels=ids).loss)


def test_load_plan_names_bad_files(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"assignments": {"a:fprop": "fp4", "a:dgrad": "fp8"}}')
    with pytest.raises(snip.RecipeError, match="layer 'a' has \\['dgrad', 'fprop'\\], expected fprop, dgrad and wgrad"):
        snip.load_plan(bad)
    bad.write_text('{"plan": 1}')
    with pytest.raises(snip.RecipeError, match="expected a plan file of `snip plan`"):
        snip.load_plan(bad)
    with pytest.raises(snip.RecipeError, match="cannot read"):
        snip.load_plan(tmp_path / "missing.json")


def test_load_plan_resolves_a_recipe_files_options(tmp_path):
    rf = tmp_path / "r.toml"
    rf.write_text('[recipes.w4a8]\nactivations = { element = "e4m3", rule = "mx_floor", scale_format = "e8m0", '
                  'block = "1x32" }\nweights = { element = "e2m1", rule = "mx_floor", scale_format = "e8m0", '
                  'block = "1x32" }\ngradients = { element = "e4m3", rule = "mx_floor", scale_format = "e8m0", '
                  'block = "1x32" }\n')
    p = tmp_path / "plan.json"
    p.write_text('{"assignments": {"0": "w4a8", "1": "fp8", "2:fprop": "w4a8", "2:dgrad": "bf16", "2:wgrad": "fp8"}}')
    with pytest.raises(snip.RecipeError, match="option 'w4a8' is not a built-in recipe .*pass recipe_file="):
        snip.load_plan(p)
    plan = snip.load_plan(p, recipe_file=rf)
    assert isinstance(plan["0"], snip.Recipe) and plan["0"].name == "w4a8" and plan["1"] == "fp8"
    assert plan["2"]["fprop"].name == "w4a8" and plan["2"]["dgrad"] == "bf16"
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
    snip.convert(m, plan=plan)
    assert snip.precision_table(m) == {"0": "w4a8", "1": "fp8", "2": "fprop=w4a8,dgrad=bf16,wgrad=fp8"}
    assert torch.isfinite(m(torch.randn(4, 32))).all()
