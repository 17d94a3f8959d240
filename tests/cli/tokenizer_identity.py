#!/usr/bin/env python3
"""Which tokenizer a model was trained with, through the real binary: a
checkpoint records the data's tokenizer SHA-256; evaluating or resuming on data
tokenized by another tokenizer is refused (one line, exit 2) unless
--allow-other-tokenizer; `snip export` writes the tokenizer beside the model
(tokenizer.model byte-identical to the data's, the Hugging Face
tokenizer_config.json / special_tokens_map.json with the pieces of the
BOS/EOS/UNK ids, bos_token_id/eos_token_id in config.json); `snip eval
--checkpoint HF_DIR --data D` evaluates the exported folder to the same loss as
its checkpoint, and checks its tokenizer too.

A run folder is self-contained: every checkpoint carries the tokenizer files,
so after the data folder moves `snip sample` (with --run-dir, or a checkpoint
alone) and `snip export` still work, and export writes the same tokenizer; a
checkpoint of an earlier snip (no tokenizer files) whose data folder is gone
makes export fail (exit 2, nothing written) unless --model-only.

usage: tokenizer_identity.py SNIP_BINARY PREPARED_DATA_DIR
"""
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
tmp = tempfile.mkdtemp(prefix="snip-tok-")
T = Checks(snip)
check = T.check


def run(*args):
    return T.run(args, timeout=300)


def refused(name, args, needle):
    T.expect_error(name, args, needle)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 2")
run_dir = os.path.join(tmp, "run")
rc, out, err = run("train", "--config", cfg, "--run-dir", run_dir)
check(rc == 0, "train", err[-400:])
st = json.load(open(os.path.join(run_dir, "checkpoints", "step-2", "trainer_state.json")))
check(st.get("data", {}).get("tokenizer_sha256") == sha(os.path.join(data, "tokenizer.model")),
      "checkpoint records the tokenizer's SHA-256", json.dumps(st.get("data")))

# Another tokenizer: the same folder with a changed tokenizer.model and its
# meta.json updated (a consistent folder, made by another tokenizer).
other = os.path.join(tmp, "other")
shutil.copytree(data, other)
with open(os.path.join(other, "tokenizer.model"), "ab") as f:
    f.write(b"\n")
meta = json.load(open(os.path.join(other, "meta.json")))
meta["tokenizer"]["sha256"] = sha(os.path.join(other, "tokenizer.model"))
json.dump(meta, open(os.path.join(other, "meta.json"), "w"))

refused("eval on another tokenizer's data", ["eval", "--run-dir", run_dir, "--data", other, "--batches", "1"],
        "was tokenized with another tokenizer")
rc, out, err = run("eval", "--run-dir", run_dir, "--data", other, "--batches", "1", "--allow-other-tokenizer")
check(rc == 0 and "--allow-other-tokenizer" in err + out, "eval --allow-other-tokenizer", f"rc={rc} {err[-300:]!r}")
resumed = os.path.join(tmp, "resumed")
shutil.copytree(run_dir, resumed)
refused("resume on another tokenizer's data",
        ["train", "--run-dir", resumed, "--resume", "--set", "train.max_steps=3", "--set", f"data.dir={other}"],
        "was tokenized with another tokenizer")
rc, out, err = run("train", "--run-dir", resumed, "--resume", "--set", "train.max_steps=3", "--set",
                   f"data.dir={other}", "--allow-other-tokenizer")
check(rc == 0, "resume --allow-other-tokenizer", err[-400:])

# The export carries the tokenizer.
hf = os.path.join(tmp, "hf")
rc, out, err = run("export", "--run-dir", run_dir, "--out", hf)
check(rc == 0, "export", err[-400:])
check(sha(os.path.join(hf, "tokenizer.model")) == sha(os.path.join(data, "tokenizer.model")),
      "exported tokenizer.model is the data's")
data_meta = json.load(open(os.path.join(data, "meta.json")))
tc = json.load(open(os.path.join(hf, "tokenizer_config.json")))
sm = json.load(open(os.path.join(hf, "special_tokens_map.json")))
cj = json.load(open(os.path.join(hf, "config.json")))
# SentencePiece's defaults, which `snip data prepare` trains with: <unk> 0, <s> 1, </s> 2.
check(data_meta["bos_id"] == 1 and data_meta["eos_id"] == 2, "the data's special ids are SentencePiece's")
check(sm == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, "special_tokens_map.json", str(sm))
check(tc.get("tokenizer_class") == "LlamaTokenizer" and tc.get("bos_token") == "<s>" and tc.get("eos_token") == "</s>"
      and tc.get("add_bos_token") is True and tc.get("add_eos_token") is False and tc.get("model_max_length") == 32,
      "tokenizer_config.json", str(tc))
check(cj.get("bos_token_id") == 1 and cj.get("eos_token_id") == 2, "config.json token ids", str(cj))

# The exported folder evaluates on its own, to its checkpoint's loss.
def loss_of(out):
    m = re.search(r"val loss ([0-9.]+)", out)
    return m.group(1) if m else None


rc1, out1, err1 = run("eval", "--run-dir", run_dir, "--batches", "3", "--seq-len", "16")
rc2, out2, err2 = run("eval", "--checkpoint", hf, "--data", data, "--batches", "3", "--seq-len", "16")
check(rc1 == 0 and rc2 == 0 and loss_of(out1) is not None and loss_of(out1) == loss_of(out2),
      "HF folder evaluates to its checkpoint's loss", f"{out1!r} {out2!r} {err2[-300:]!r}")
refused("HF folder on another tokenizer's data", ["eval", "--checkpoint", hf, "--data", other, "--batches", "1"],
        "was tokenized with another tokenizer")
refused("HF folder without --data", ["eval", "--checkpoint", hf], "give the data to evaluate on with --data")

# snip sample reads a Hugging Face folder with its own tokenizer.model: the
# exported run writes, greedily, what the run's checkpoint writes.
rc1, out1, err1 = run("sample", "--run-dir", run_dir, "--prompt", "In the beginning", "--max-new-tokens", "12",
                      "--temperature", "0")
rc2, out2, err2 = run("sample", "--checkpoint", hf, "--prompt", "In the beginning", "--max-new-tokens", "12",
                      "--temperature", "0")
check(rc1 == 0 and rc2 == 0 and out1.strip() and out1 == out2, "sample --checkpoint HF_DIR writes what the run writes",
      f"{out1!r} vs {out2!r} {err2[-300:]!r}")
refused("init-from a folder that is not a Hugging Face model",
        ["train", "--config", cfg, "--run-dir", os.path.join(tmp, "ft-data"), "--init-from", data],
        f"{data} is not a Hugging Face model folder: it has no config.json")

# A self-contained run: train on a copy of the data, then move the copy away.
movable = os.path.join(tmp, "movable")
shutil.copytree(data, movable)
cfg_m = os.path.join(tmp, "movable.toml")
micro_toml(cfg_m, movable, "max_steps = 2")
run_m = os.path.join(tmp, "run-m")
rc, out, err = run("train", "--config", cfg_m, "--run-dir", run_m)
check(rc == 0, "train on the movable data", err[-400:])
ck_m = os.path.join(run_m, "checkpoints", "step-2")
for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
    check(os.path.isfile(os.path.join(ck_m, f)), f"the checkpoint carries {f}")
check(os.path.isfile(os.path.join(ck_m, "tokenizer.model"))
      and sha(os.path.join(ck_m, "tokenizer.model")) == sha(os.path.join(data, "tokenizer.model")),
      "the checkpoint's tokenizer.model is the data's")
shutil.move(movable, os.path.join(tmp, "moved-away"))
rc1, out1, err1 = run("sample", "--run-dir", run_m, "--prompt", "In the beginning", "--max-new-tokens", "8",
                      "--temperature", "0")
check(rc1 == 0 and out1.strip(), "sample --run-dir after the data folder moved", f"rc={rc1} {err1[-300:]!r}")
rc2, out2, err2 = run("sample", "--checkpoint", ck_m, "--prompt", "In the beginning", "--max-new-tokens", "8",
                      "--temperature", "0")
check(rc2 == 0 and out2 == out1, "sample --checkpoint alone (no --run-dir) writes the same",
      f"rc={rc2} {out1!r} vs {out2!r} {err2[-300:]!r}")
hf_m = os.path.join(tmp, "hf-m")
rc, out, err = run("export", "--run-dir", run_m, "--out", hf_m)
check(rc == 0 and "warn" not in (out + err).lower(), "export after the data folder moved, without a warning",
      f"rc={rc} {out[-300:]!r} {err[-300:]!r}")
for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
    a, b = os.path.join(hf_m, f), os.path.join(hf, f)
    check(os.path.isfile(a) and sha(a) == sha(b), f"export from the moved run writes the same {f}")

# A checkpoint of an earlier snip: no tokenizer files (their CRC entries,
# the "tokenizer" record and the manifest's trainer_state.json entry updated
# to match), with its data folder gone.
old_run = os.path.join(tmp, "old-run")
shutil.copytree(run_m, old_run)
ck_old = os.path.join(old_run, "checkpoints", "step-2")
st_old = json.load(open(os.path.join(ck_old, "trainer_state.json")))
for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
    os.remove(os.path.join(ck_old, f))
    st_old["crc32"].pop(f, None)
st_old["data"].pop("tokenizer", None)
st_bytes = (json.dumps(st_old, indent=2) + "\n").encode()
open(os.path.join(ck_old, "trainer_state.json"), "wb").write(st_bytes)
man = json.load(open(os.path.join(ck_old, "manifest.json")))
man["files"]["trainer_state.json"] = {"bytes": len(st_bytes), "crc32": zlib.crc32(st_bytes)}
json.dump(man, open(os.path.join(ck_old, "manifest.json"), "w"))
T.expect_error("export of an old checkpoint whose data folder is gone",
               ["export", "--checkpoint", ck_old, "--out", os.path.join(tmp, "hf-old")],
               "--model-only", absent=os.path.join(tmp, "hf-old"))
rc, out, err = run("export", "--checkpoint", ck_old, "--out", os.path.join(tmp, "hf-old"), "--model-only")
check(rc == 0 and os.path.isfile(os.path.join(tmp, "hf-old", "model.safetensors"))
      and not os.path.exists(os.path.join(tmp, "hf-old", "tokenizer.model")),
      "export --model-only writes the model alone", f"rc={rc} {err[-300:]!r}")
refused("sample of an old checkpoint whose data folder is gone",
        ["sample", "--checkpoint", ck_old, "--prompt", "x"], "holds no tokenizer.model")
# ... and with its data folder back in place, the data's tokenizer is used.
shutil.move(os.path.join(tmp, "moved-away"), movable)
rc, out, err = run("export", "--checkpoint", ck_old, "--out", os.path.join(tmp, "hf-old2"))
check(rc == 0 and sha(os.path.join(tmp, "hf-old2", "tokenizer.model")) == sha(os.path.join(data, "tokenizer.model")),
      "export of an old checkpoint takes its data folder's tokenizer", f"rc={rc} {err[-300:]!r}")

# snip train --init-from checks the folder's tokenizer.model against the
# data's, as eval does (it trained silently to a loss worse than a uniform
# guess before).
refused("init-from on another tokenizer's data",
        ["train", "--config", cfg, "--run-dir", os.path.join(tmp, "ft-other"), "--init-from", hf,
         "--set", f"data.dir={other}"], "was tokenized with another tokenizer")
check(not os.path.exists(os.path.join(tmp, "ft-other", "metrics.jsonl")), "init-from refusal writes no run")
rc, out, err = run("train", "--config", cfg, "--run-dir", os.path.join(tmp, "ft-allowed"), "--init-from", hf,
                   "--set", f"data.dir={other}", "--allow-other-tokenizer")
check(rc == 0 and "--allow-other-tokenizer: training" in out + err, "init-from --allow-other-tokenizer warns and trains",
      f"rc={rc} {err[-400:]!r}")
rc, out, err = run("train", "--config", cfg, "--run-dir", os.path.join(tmp, "ft-same"), "--init-from", hf)
check(rc == 0 and "another tokenizer" not in out + err, "init-from on the model's own data trains without a word",
      f"rc={rc} {err[-400:]!r}")

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
