#!/usr/bin/env python3
"""SNIP-LoRA (docs/lora.md) through the real binary, on the micro model
(clitest.micro_toml, 2 blocks) pretrained for 20 steps on Brown and exported
with `snip export` as the base:

  learns    adapters (rank 4) under policy snip at FP4 budget 0.5 on Brown:
            the validation loss falls at each of the 3 evaluations;
            only the adapters train (summary: trainable parameters =
            r x (IN + OUT) summed over the 14 layers, hand-computed); the
            base's linear weights are held packed (summary: stored bytes <
            FP32 bytes / 2, all 14 layers packed); the stats files carry WD
            = 0 and Q = LD / (sum of LD at fp4) (LD alone)
  packed    lora.pack_base = false (FP32 base, quantized every step) gives
            the same loss, grad_norm and val_loss at every step, bit for bit
  resume    the run with its last checkpoint deleted, resumed without
            --init-from (the checkpoint names its base) == uninterrupted,
            bit for bit; the checkpoint holds model.safetensors with the
            adapters alone (28 tensors) and adapter_config.json
  export    `snip export` writes adapter_config.json + adapter_model.safetensors
            in PEFT's layout (read here with a plain safetensors parser:
            names base_model.model.<module>.lora_A.weight [r, IN] and
            lora_B.weight [OUT, r], F32; config peft_type LORA, r, lora_alpha,
            target_modules, bias none); `snip export --merge` writes a plain
            HF folder of the base's size whose validation loss equals the
            checkpoint's (as printed, 4 decimals: the merge sums in another
            order) and whose weights differ from the base's
  changed   the base's model.safetensors changed after the run started: the
            resume and the export stop with one line naming the file and
            "changed since the run started", nothing written; the same base
            moved to another folder resumes with --init-from NEW (bit for
            bit) and the later checkpoints name the new place
  errors    lora.rank without --init-from; a lora.target glob matching no
            layer; --merge on a checkpoint without adapters; a LoRA checkpoint
            resumed with lora.rank = 0; per-GEMM plans; alpha 0; a resume
            with another lora.alpha, rank, train_norms or target; --init-from
            a LoRA checkpoint; --merge into a folder of adapters; a
            checkpoint missing its adapter_config.json: one `snip: error:`
            line each, exit 2, nothing written

usage: test_lora.py SNIP_BINARY PREPARED_DATA_DIR [CASE...]
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
cases = sys.argv[3:] or ["learns", "packed", "resume", "export", "changed", "errors"]
tmp = tempfile.mkdtemp(prefix="snip-lora-")
T = Checks(snip)
check = T.check
KEYS = ["step", "loss", "grad_norm", "val_loss"]
C, F, NH, NKV = 32, 64, 2, 1  # micro_toml's model (2 blocks here)
R = 4


def d(name):
    p = os.path.join(tmp, name)
    shutil.rmtree(p, ignore_errors=True)
    return p


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: r.get(k) for k in KEYS} for r in map(json.loads, f)]


def safetensors_header(path):
    """The header of a safetensors file, read with nothing but the format's
    definition (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def two_blocks(path):
    """micro_toml's model with 2 decoder blocks instead of 1."""
    text = open(path).read()
    assert "num_hidden_layers = 1" in text
    open(path, "w").write(text.replace("num_hidden_layers = 1", "num_hidden_layers = 2"))


def train(run, cfg, extra=(), init=True, resume=False):
    args = ["train", "--config", cfg, "--run-dir", run] + (["--resume"] if resume else []) + \
           (["--init-from", base_hf] if init and not resume else []) + list(extra)
    return T.run(args, timeout=300)


try:
    # The base: 20 steps of the micro model with 2 blocks, exported.
    base_cfg = os.path.join(tmp, "base.toml")
    micro_toml(base_cfg, data, "max_steps = 20\neval_interval = 20\nsample_tokens = 0\nlr = 1e-2\n")
    two_blocks(base_cfg)
    rc, out, err = T.run(["train", "--config", base_cfg, "--run-dir", d("base")], timeout=300)
    check(rc == 0, "base trains", err[-400:])
    base_hf = d("base-hf")
    rc, out, err = T.run(["export", "--run-dir", os.path.join(tmp, "base"), "--out", base_hf])
    check(rc == 0, "base exports", err[-400:])
    lora_cfg = os.path.join(tmp, "lora.toml")
    micro_toml(lora_cfg, data, "max_steps = 12\neval_interval = 4\neval_batches = 4\ncheckpoint_interval = 6\n"
               "sample_tokens = 0\nlr = 1e-2\nwarmup_steps = 2\nlog_interval = 1\n"
               "[precision]\npolicy = \"snip\"\nbudget = 0.5\nwarmup_steps = 2\ninitial_interval = 4\n"
               "final_interval = 4\nfinal_high_precision_fraction = 0.1\n"
               f"[lora]\nrank = {R}\nalpha = 8\n")
    two_blocks(lora_cfg)
    run1 = d("run1")
    rc, out, err = train(run1, lora_cfg)
    check(rc == 0, "lora run", err[-800:])
    m1 = metrics(run1) if rc == 0 else []

    if "learns" in cases and m1:
        vals = [r["val_loss"] for r in m1 if r["val_loss"] is not None]
        check(len(vals) == 3 and vals[0] > vals[1] > vals[2], "learns: the validation loss decreases at every "
              "evaluation (steps 4, 8, 12)", vals)
        s = json.load(open(os.path.join(run1, "summary.json")))["lora"]
        layers = 2 * [(C, C), (C, NKV * C // NH), (C, NKV * C // NH), (C, C), (C, F), (C, F), (F, C)]
        want = sum(R * (i + o) for i, o in layers)
        check(s["trainable_parameters"] == want, "learns: trainable = r x (IN + OUT) summed", (s, want))
        fp32 = 4 * sum(i * o for i, o in layers)
        check(s["base_linear_fp32_bytes"] == fp32, "learns: FP32 bytes of the base's linear weights", s)
        check(s["packed_layers"] == 14 and s["base_linear_stored_bytes"] < fp32 / 2,
              "learns: the base is held packed, under half its FP32 bytes", s)
        stats = sorted(os.listdir(os.path.join(run1, "stats")))
        check(len(stats) >= 1, "learns: stats steps ran", stats)
        for name in stats:
            st = json.load(open(os.path.join(run1, "stats", name)))["measured"]["details"]  # this step's, unsmoothed
            check(st["alpha"] == 1.0, f"learns: {name}: alpha 1 (LD alone)", st["alpha"])
            lay = st["layers"]
            ld_low = sum(l["options"]["fp4"]["ld"] for l in lay)
            good = all(o["wd_own"] == 0 and o["wd_up"] == 0 and abs(o["q"] - o["ld"] / ld_low) <= 1e-9 * max(1, o["q"])
                       for l in lay for o in l["options"].values())
            check(good and ld_low > 0, f"learns: {name}: LD alone (WD = 0, Q = LD / sum LD at fp4)",
                  json.dumps(lay[0])[:400])

    if "packed" in cases and m1:
        run = d("nopack")
        rc, out, err = train(run, lora_cfg, ["--set", "lora.pack_base=false"])
        check(rc == 0 and metrics(run) == m1, "packed: FP32 base quantized every step == packed base, bit for bit",
              err[-400:])
        s = json.load(open(os.path.join(run, "summary.json")))["lora"] if rc == 0 else {}
        check(s.get("packed_layers") == 0 and s.get("base_linear_stored_bytes") == s.get("base_linear_fp32_bytes"),
              "packed: pack_base = false holds FP32", s)

    if "resume" in cases and m1:
        ck = os.path.join(run1, "checkpoints", "step-12")
        hdr = safetensors_header(os.path.join(ck, "model.safetensors"))
        names = [k for k in hdr if k != "__metadata__"]
        check(len(names) == 28 and all(".lora_A." in n or ".lora_B." in n for n in names),
              "resume: the checkpoint holds the adapters alone", names[:4])
        check(os.path.exists(os.path.join(ck, "adapter_config.json")), "resume: adapter_config.json in the checkpoint")
        st = json.load(open(os.path.join(ck, "trainer_state.json")))
        check(st["lora"]["base"]["weights"] == os.path.join(os.path.abspath(base_hf), "model.safetensors") and
              len(st["lora"]["base"]["sha256"]) == 64, "resume: the base's path and SHA-256", st.get("lora"))
        run = d("resumed")
        shutil.copytree(run1, run)
        shutil.rmtree(os.path.join(run, "checkpoints", "step-12"))
        os.remove(os.path.join(run, "summary.json"))
        rc, out, err = train(run, lora_cfg, resume=True)
        check(rc == 0 and metrics(run) == m1, "resume: from step 6 without --init-from == uninterrupted, bit for bit",
              err[-600:])

    if "export" in cases and m1:
        peft = d("peft")
        rc, out, err = T.run(["export", "--run-dir", run1, "--out", peft])
        check(rc == 0 and sorted(os.listdir(peft)) == ["adapter_config.json", "adapter_model.safetensors"],
              "export: a PEFT folder", (err[-300:], os.listdir(peft) if os.path.exists(peft) else None))
        if rc == 0:
            cfg = json.load(open(os.path.join(peft, "adapter_config.json")))
            check(cfg["peft_type"] == "LORA" and cfg["r"] == R and cfg["lora_alpha"] == 8 and cfg["bias"] == "none"
                  and cfg["task_type"] == "CAUSAL_LM" and sorted(cfg["target_modules"]) ==
                  sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]) and
                  cfg["base_model_name_or_path"] == os.path.abspath(base_hf), "export: adapter_config.json fields", cfg)
            hdr = safetensors_header(os.path.join(peft, "adapter_model.safetensors"))
            a = hdr.get("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", {})
            b = hdr.get("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", {})
            check(a.get("shape") == [R, F] and b.get("shape") == [C, R] and a.get("dtype") == "F32" and
                  len(hdr) - 1 == 28, "export: PEFT tensor names and shapes", (a, b, len(hdr)))
        merged = d("merged")
        rc, out, err = T.run(["export", "--run-dir", run1, "--out", merged, "--merge"])
        check(rc == 0 and os.path.exists(os.path.join(merged, "model.safetensors")), "export --merge", err[-300:])

        def val(path):
            rc, out, err = T.run(["eval", "--checkpoint", path, "--data", data], timeout=120)
            m = re.search(r"val loss ([0-9.]+) nats/token", out + err)
            return float(m.group(1)) if m else None

        v_ck, v_m = val(os.path.join(run1, "checkpoints", "step-12")), val(merged)
        check(v_ck is not None and v_m is not None and abs(v_ck - v_m) <= 2e-4,
              "export --merge: the merged model's loss == the adapted checkpoint's (printed to 1e-4)", (v_ck, v_m))
        hdr = safetensors_header(os.path.join(merged, "model.safetensors"))
        check(not any("lora" in k for k in hdr), "export --merge: a plain Llama (no adapter tensors)")
        base_bytes = open(os.path.join(base_hf, "model.safetensors"), "rb").read()
        merged_bytes = open(os.path.join(merged, "model.safetensors"), "rb").read()
        check(len(base_bytes) == len(merged_bytes) and base_bytes != merged_bytes,
              "export --merge: same tensors as the base, other weights (the adapters folded in)")

    if "changed" in cases and m1:
        run = d("changed")
        shutil.copytree(run1, run)
        shutil.rmtree(os.path.join(run, "checkpoints", "step-12"))
        os.remove(os.path.join(run, "summary.json"))
        w = os.path.join(base_hf, "model.safetensors")
        orig = open(w, "rb").read()
        try:
            b = bytearray(orig)
            b[-3] ^= 0x01  # one bit of the last weight
            open(w, "wb").write(bytes(b))
            T.expect_error("changed: resume refuses a changed base", ["train", "--config", lora_cfg, "--run-dir",
                           run, "--resume"], "changed since the run started", untouched=run)
            T.expect_error("changed: export refuses a changed base", ["export", "--run-dir", run, "--out",
                           os.path.join(tmp, "x")], "changed since the run started", absent=os.path.join(tmp, "x"))
        finally:
            open(w, "wb").write(orig)
        # The same base moved elsewhere: --init-from NEW resumes (the SHA-256 decides), == uninterrupted.
        moved = d("moved-base")
        shutil.copytree(base_hf, moved)
        os.rename(base_hf, base_hf + ".away")
        try:
            rc, out, err = T.run(["train", "--config", lora_cfg, "--run-dir", run, "--resume", "--init-from", moved],
                                 timeout=300)
            check(rc == 0 and metrics(run) == m1, "changed: a moved base resumes with --init-from NEW, bit for bit",
                  err[-400:])
            st = json.load(open(os.path.join(run, "checkpoints", "step-12", "trainer_state.json")))
            check(st["lora"]["base"]["dir"] == os.path.abspath(moved), "changed: later checkpoints name the new place",
                  st["lora"]["base"])
        finally:
            os.rename(base_hf + ".away", base_hf)

    if "errors" in cases:
        T.expect_error("errors: lora without a base", ["train", "--config", lora_cfg, "--run-dir", d("e1")],
                       "--init-from HF_DIR", absent=os.path.join(tmp, "e1", "checkpoints"))
        T.expect_error("errors: a target glob matching nothing",
                       ["train", "--config", lora_cfg, "--run-dir", d("e2"), "--init-from", base_hf,
                        "--set", "lora.target=*.q_proj,*.qq_proj"], "'*.qq_proj' matches no linear layer",
                       absent=os.path.join(tmp, "e2", "checkpoints"))
        T.expect_error("errors: --merge without adapters", ["export", "--run-dir", os.path.join(tmp, "base"), "--out",
                       d("e3"), "--merge"], "holds no LoRA adapters", absent=os.path.join(tmp, "e3"))
        T.expect_error("errors: per-GEMM plans on a frozen base",
                       ["train", "--config", lora_cfg, "--run-dir", d("e5"), "--init-from", base_hf,
                        "--set", "precision.granularity=gemm"], "granularity = gemm is not supported with adapters")
        T.expect_error("errors: alpha 0", ["train", "--config", lora_cfg, "--run-dir", d("e6"), "--init-from",
                       base_hf, "--set", "lora.alpha=0"], "lora.alpha: expected a positive number")
        if m1:
            T.expect_error("errors: a LoRA checkpoint resumed with lora.rank = 0",
                           ["train", "--config", lora_cfg, "--run-dir", run1, "--resume", "--set", "lora.rank=0",
                            "--set", "train.max_steps=20"], "holds LoRA adapters but lora.rank is 0", untouched=run1)
            for key, val, needle in (("lora.alpha", "16", "lora.alpha is 16 but"),
                                     ("lora.rank", "8", "lora.rank is 8 but"),
                                     ("lora.train_norms", "true", "lora.train_norms is true but"),
                                     ("lora.target", "*.q_proj", "lora.target selects 2 layers")):
                T.expect_error(f"errors: resumed with another {key}",
                               ["train", "--config", lora_cfg, "--run-dir", run1, "--resume", "--set", f"{key}={val}",
                                "--set", "train.max_steps=20"], needle, untouched=run1)
            T.expect_error("errors: snip correlate on a LoRA run says LoRA is not supported",
                           ["correlate", "--run", run1, "--steps", "1", "--out", d("e8")],
                           "trains LoRA adapters (lora.rank = 4): snip correlate studies full training only",
                           untouched=run1)
            T.expect_error("errors: --init-from a LoRA checkpoint",
                           ["train", "--config", lora_cfg, "--run-dir", d("e7"), "--init-from",
                            os.path.join(run1, "checkpoints", "step-12")], "export --merge")
            mixed = d("mixed")
            T.run(["export", "--run-dir", run1, "--out", mixed])
            T.expect_error("errors: --merge into a folder holding adapters",
                           ["export", "--run-dir", run1, "--out", mixed, "--merge", "--force"], "holds LoRA adapters",
                           untouched=mixed)
            broken = d("broken")
            shutil.copytree(run1, broken)
            os.remove(os.path.join(broken, "checkpoints", "step-12", "adapter_config.json"))
            T.expect_error("errors: a checkpoint without its adapter_config.json",
                           ["export", "--run-dir", broken, "--out", d("e8")], "missing file adapter_config.json",
                           absent=os.path.join(tmp, "e8"))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
T.finish()
