"""snip's Hugging Face files opened by the real transformers and PEFT, and
transformers' files opened by snip (pinned versions: requirements.txt).

  export    a micro model trained by `snip train` for several shapes (GQA,
            multi-head with an untied lm_head, another rope_theta, a BF16
            export), `snip export`ed, loaded with
            AutoModelForCausalLM.from_pretrained: its logits on snip's first
            validation micro-batch equal `snip eval --logits-out`'s of the
            run's checkpoint (of the folder itself for the BF16 export) (FP32,
            relative to the largest logit: within 1e-5); AutoTokenizer gives
            the ids of snip's tokenizer (`snip data encode`) on KJV text
  init      save_pretrained of a randomly initialised LlamaForCausalLM
            (several configs, transformers 5's `rope_parameters` among them):
            `snip eval` on the folder gives transformers' logits, and
            `snip train --init-from` it for one step at lr 1e-30 then `snip
            export` writes the same tensors, bit for bit; config fields snip
            cannot honour (a bias, another activation, YaRN RoPE) are one
            `snip: error:` line and exit status 2
  peft      a SNIP-LoRA run (FP32 GEMMs) exported as a PEFT adapter folder:
            PeftModel.from_pretrained on the exported base gives the logits
            of `snip eval` of the LoRA checkpoint; merge_and_unload() gives
            the tensors of `snip export --merge` (to float32 rounding: the
            two fold B A in another order) and its logits
"""
import json
import os
import subprocess

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from conftest import run_snip

torch.set_num_threads(1)
REL = 1e-5  # FP32 logits, relative to the largest |logit|


def micro_toml(path, data, model_extra="", train_extra="", tail=""):
    """A 2-block model (C = 64, 4 heads, 2 KV heads) on `data`, 8 steps in
    FP32 GEMMs; `model_extra` lines ("key = value") replace or add [model]
    keys, `tail` opens further tables."""
    model = {"hidden_size": "64", "intermediate_size": "128", "num_hidden_layers": "2", "num_attention_heads": "4",
             "num_key_value_heads": "2", "max_position_embeddings": "64"}
    for line in filter(None, model_extra.splitlines()):
        k, v = (p.strip() for p in line.split("=", 1))
        model[k] = v
    model_lines = "\n".join(f"{k} = {v}" for k, v in model.items())
    with open(path, "w") as f:
        f.write(f"""[model]
{model_lines}
[data]
dir = "{data}"
[train]
batch_size = 4
seq_len = 32
threads = 1
max_steps = 8
eval_interval = 8
eval_batches = 1
sample_tokens = 0
lr = 1e-2
gemm_dtype = "fp32"
{train_extra}
{tail}
""")


def snip_logits(snip_bin, ckpt_args, data, out):
    run_snip(snip_bin, "eval", *ckpt_args, "--data", data, "--batch-size", 4, "--seq-len", 32, "--batches", 1,
             "--logits-out", out)
    t = load_file(out)
    return torch.from_numpy(t["input_ids"]), torch.from_numpy(t["logits"])


def hf_logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(ids).logits.float()


def assert_close(ours, ref, what):
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    err = (ours - ref).abs().max().item() / ref.abs().max().item()
    print(f"{what}: max |snip - transformers| / max |logit| = {err:.3g}")
    assert err < REL, f"{what}: relative logit difference {err:.3g} >= {REL}"


SHAPES = {
    "gqa-tied": ("", ""),
    "mha-untied": ("num_key_value_heads = 4\ntie_word_embeddings = false", ""),
    "rope-theta": ("rope_theta = 500000.0\nrms_norm_eps = 1e-6", ""),
    "bf16-export": ("tie_word_embeddings = false", ""),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_export_loads_in_transformers_with_snips_logits(snip_bin, data_dir, tmp_path, shape):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cfg = tmp_path / "m.toml"
    micro_toml(cfg, data_dir, *SHAPES[shape])
    run_snip(snip_bin, "train", "--config", cfg, "--run-dir", tmp_path / "run")
    hf = tmp_path / "hf"
    dtype = ["--dtype", "bfloat16"] if shape == "bf16-export" else []
    run_snip(snip_bin, "export", "--run-dir", tmp_path / "run", "--out", hf, *dtype)
    # The run's own checkpoint (FP32 GEMMs), not the exported folder: an export
    # that changed a weight would otherwise agree with itself. A BF16 export
    # rounds every weight, so there snip reads the folder it wrote.
    src = ["--checkpoint", hf] if shape == "bf16-export" else ["--run-dir", tmp_path / "run"]
    ids, ours = snip_logits(snip_bin, src, data_dir, tmp_path / "logits.safetensors")
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    c = model.config
    assert (c.num_key_value_heads, c.tie_word_embeddings) == (
        {"mha-untied": 4}.get(shape, 2), shape not in ("mha-untied", "bf16-export"))
    assert_close(ours, hf_logits(model, ids), shape)

    # The tokenizer: transformers' ids == snip's on real text.
    tok = AutoTokenizer.from_pretrained(hf)
    text = "In the beginning God created the heaven and the earth. And the earth was without form, and void."
    p = subprocess.run([snip_bin, "data", "encode", "--tokenizer", str(hf / "tokenizer.model")], input=text,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    snip_ids = [int(t) for t in p.stdout.split()]
    assert tok(text, add_special_tokens=False)["input_ids"] == snip_ids
    assert (tok.bos_token_id, tok.eos_token_id) == (json.load(open(hf / "config.json"))["bos_token_id"],
                                                    json.load(open(hf / "config.json"))["eos_token_id"])


INIT_CONFIGS = {
    "gqa-untied": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "tied-mha": dict(num_key_value_heads=4, tie_word_embeddings=True),
    "rope-parameters": dict(num_key_value_heads=1, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 250000.0}, rms_norm_eps=1e-5),
}


def random_llama(path, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    base.update(kw)
    m = LlamaForCausalLM(LlamaConfig(**base))
    m.save_pretrained(path)
    return m


@pytest.mark.parametrize("name", list(INIT_CONFIGS))
def test_init_from_save_pretrained(snip_bin, data_dir, tmp_path, name):
    hf = tmp_path / "hf"
    model = random_llama(hf, **INIT_CONFIGS[name])
    if name == "rope-parameters":
        assert "rope_parameters" in json.load(open(hf / "config.json"))
    ids, ours = snip_logits(snip_bin, ["--checkpoint", hf], data_dir, tmp_path / "logits.safetensors")
    assert_close(ours, hf_logits(model, ids), name)

    # --init-from, one step at lr 1e-30 (the smallest lr snip takes is > 0; an AdamW
    # step of ~1e-30 rounds back to every weight of magnitude > 1e-22), exported:
    # the same tensors, bit for bit.
    cfg = tmp_path / "m.toml"
    with open(cfg, "w") as f:
        f.write(f'[data]\ndir = "{data_dir}"\n[train]\nbatch_size = 2\nseq_len = 32\nthreads = 1\nmax_steps = 1\n'
                'eval_interval = 1\neval_batches = 1\nsample_tokens = 0\nlr = 1e-30\nwarmup_steps = 0\n')
    run_snip(snip_bin, "train", "--config", cfg, "--run-dir", tmp_path / "run", "--init-from", hf)
    run_snip(snip_bin, "export", "--run-dir", tmp_path / "run", "--out", tmp_path / "back")
    a, b = load_file(hf / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


@pytest.mark.parametrize("field,value,message", [
    ("attention_bias", True, "attention_bias"),
    ("hidden_act", "gelu", "hidden_act"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}, "rope_type"),
])
def test_init_from_refuses_what_it_cannot_honour(snip_bin, data_dir, tmp_path, field, value, message):
    hf = tmp_path / "hf"
    random_llama(hf)
    c = json.load(open(hf / "config.json"))
    c[field] = value
    json.dump(c, open(hf / "config.json", "w"))
    cfg = tmp_path / "m.toml"
    cfg.write_text(f'[data]\ndir = "{data_dir}"\n[train]\nmax_steps = 1\nthreads = 1\n')
    p = run_snip(snip_bin, "train", "--config", cfg, "--run-dir", tmp_path / "run", "--init-from", hf, check=False)
    lines = [l for l in p.stderr.splitlines() if l.startswith("snip: error:")]
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr[-1000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_peft_opens_snip_lora_adapters(snip_bin, data_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    cfg = tmp_path / "base.toml"
    micro_toml(cfg, data_dir)
    run_snip(snip_bin, "train", "--config", cfg, "--run-dir", tmp_path / "base")
    base = tmp_path / "base-hf"
    run_snip(snip_bin, "export", "--run-dir", tmp_path / "base", "--out", base)
    lcfg = tmp_path / "lora.toml"
    micro_toml(lcfg, data_dir, train_extra="", tail="[lora]\nrank = 4\nalpha = 8\n")
    run_snip(snip_bin, "train", "--config", lcfg, "--run-dir", tmp_path / "lora", "--init-from", base)
    adapters = tmp_path / "adapters"
    run_snip(snip_bin, "export", "--run-dir", tmp_path / "lora", "--out", adapters)
    ids, ours = snip_logits(snip_bin, ["--run-dir", tmp_path / "lora"], data_dir, tmp_path / "l.safetensors")

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapters)
    assert_close(ours, hf_logits(model, ids), "PeftModel")

    merged = tmp_path / "merged"
    run_snip(snip_bin, "export", "--run-dir", tmp_path / "lora", "--out", merged, "--merge")
    mm = model.merge_and_unload()
    sd = {k: v.detach().numpy() for k, v in mm.state_dict().items()}
    ref = load_file(merged / "model.safetensors")
    for k, v in ref.items():
        assert k in sd, k
        scale = max(1.0, float(np.abs(v).max()))
        assert np.abs(sd[k] - v).max() <= 1e-6 * scale, k
    ids2, ours_m = snip_logits(snip_bin, ["--checkpoint", merged], data_dir, tmp_path / "m.safetensors")
    assert torch.equal(ids, ids2)
    assert_close(ours_m, hf_logits(mm, ids), "merge_and_unload")
