#!/usr/bin/env python3
"""`snip plan --config MODEL.toml` through the real binary:

* --stats: a micro SNIP run's stats file planned for the same model through
  --config gives the plan of `snip plan --stats` alone (FLOPs from the shapes
  at B x T x accum tokens are proportional to the stats step's, and Q is
  only rescaled), and planned for a deeper model gives a plan for every
  layer of that model, with FLOPs 6*T*in*out;
* --init-from HF_DIR --data DIR: the exported micro model measured by one
  stats step: a plan for every layer, the FLOPs of the shapes, the same plan
  twice (the stats step is seeded), and refusals (another tokenizer, a config
  that contradicts the folder) as one line, exit 2.

usage: plan_model.py SNIP_BINARY PREPARED_DATA_DIR
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile

from clitest import Checks, micro_toml

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
tmp = tempfile.mkdtemp(prefix="snip-planmodel-")
T = Checks(snip)
check = T.check


def run(*args):
    return T.run(args, timeout=300)


# The micro model (C 32, F 64, 1 block, 2/1 heads: k/v project to 16), SNIP
# with a stats step at step 1.
cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, """max_steps = 3
[precision]
policy = "snip"
budget = 0.5
warmup_steps = 1
""")
run_dir = os.path.join(tmp, "run")
rc, out, err = run("train", "--config", cfg, "--run-dir", run_dir)
check(rc == 0, "train", err[-400:])
stats_dir = os.path.join(run_dir, "stats")
stats = sorted(os.listdir(stats_dir)) if os.path.isdir(stats_dir) else []
check(len(stats) >= 1, "the SNIP run wrote a stats file", str(stats))
stats = os.path.join(stats_dir, stats[0]) if stats else ""


def plan_json(*args):
    rc, out, err = run("plan", *args, "--json")
    check(rc == 0, "plan " + " ".join(args), err[-400:])
    return json.loads(out) if rc == 0 else {}, err


# --- --stats through --config, the same model: the plan of --stats alone.
alone, _ = plan_json("--stats", stats, "--budget", "0.5")
via, err = plan_json("--config", cfg, "--stats", stats, "--budget", "0.5")
check(alone.get("assignments") and alone.get("assignments") == via.get("assignments"),
      "--config --stats on the same model plans as --stats alone", f"{alone.get('assignments')} vs {via.get('assignments')}")
check(abs(alone.get("fp4_share", -1) - via.get("fp4_share", -2)) < 1e-12, "same FP4 share")
check("block for block (1 block)" in err, "the note says block for block", err)
tokens = 2 * 16  # micro_toml: batch_size 2 x seq_len 16, grad_accum 1
shapes = {"self_attn.q_proj": (32, 32), "self_attn.k_proj": (32, 16), "self_attn.v_proj": (32, 16),
          "self_attn.o_proj": (32, 32), "mlp.gate_proj": (32, 64), "mlp.up_proj": (32, 64),
          "mlp.down_proj": (64, 32)}
for it in via.get("items", []):
    role = it["name"].split(".", 3)[3]
    i, o = shapes[role]
    check(it["flops"] == 6 * tokens * i * o, f"FLOPs of {it['name']}", f"{it['flops']} vs {6 * tokens * i * o}")

# --- a deeper model (4 blocks) from the 1-block stats: every layer planned.
deep = os.path.join(tmp, "deep.toml")
micro_toml(deep, data, "")
with open(deep) as f:
    text = f.read().replace("num_hidden_layers = 1", "num_hidden_layers = 4")
with open(deep, "w") as f:
    f.write(text)
p, err = plan_json("--config", deep, "--stats", stats, "--budget", "0.5")
names = sorted(p.get("assignments", {}))
want = sorted(f"model.layers.{b}.{r}" for b in range(4) for r in shapes)
check(names == want, "4 blocks x 7 layers planned", f"{names[:4]}... ({len(names)})")
check(p.get("fp4_share", 0) >= 0.5 - 1e-9, "budget met", str(p.get("fp4_share")))
check("carried over to 4 blocks by role and relative depth" in err, "the note says how Q was carried", err)

# --- --init-from: one stats step on the exported model.
hf = os.path.join(tmp, "hf")
rc, out, err = run("export", "--run-dir", run_dir, "--out", hf)
check(rc == 0, "export", err[-400:])
plain = os.path.join(tmp, "plain.toml")
micro_toml(plain, data, "")
a, err = plan_json("--config", plain, "--init-from", hf, "--data", data, "--budget", "0.5")
b, _ = plan_json("--config", plain, "--init-from", hf, "--data", data, "--budget", "0.5")
check(sorted(a.get("assignments", {})) == sorted(f"model.layers.0.{r}" for r in shapes),
      "--init-from plans every layer of the folder's model", str(a.get("assignments")))
check(a.get("assignments") == b.get("assignments") and a.get("objective") == b.get("objective"),
      "the measured plan is the same twice", f"{a.get('objective')} vs {b.get('objective')}")
check(a.get("fp4_share", 0) >= 0.5 - 1e-9 and a.get("objective", -1) > 0, "budget met, Q measured",
      f"{a.get('fp4_share')} {a.get('objective')}")
for it in a.get("items", []):
    i, o = shapes[it["name"].split(".", 3)[3]]
    check(it["flops"] == 6 * tokens * i * o, f"--init-from FLOPs of {it['name']}")
check("stats step on" in err and "block for block" in err, "--init-from says what it measured", err[-300:])

# Refusals: data of another tokenizer; a config that contradicts the folder.
other = os.path.join(tmp, "other")
shutil.copytree(data, other)
with open(os.path.join(other, "tokenizer.model"), "ab") as f:
    f.write(b"\n")
meta = json.load(open(os.path.join(other, "meta.json")))
meta["tokenizer"]["sha256"] = hashlib.sha256(open(os.path.join(other, "tokenizer.model"), "rb").read()).hexdigest()
json.dump(meta, open(os.path.join(other, "meta.json"), "w"))
T.expect_error("--init-from on data of another tokenizer",
               ["plan", "--config", plain, "--init-from", hf, "--data", other], "another tokenizer")
T.expect_error("--init-from with a config that contradicts the folder",
               ["plan", "--config", plain, "--set", "model.hidden_size=64", "--init-from", hf, "--data", data],
               "hidden_size 32 differs from the run's model.hidden_size 64")
T.expect_error("--init-from a folder that does not exist",
               ["plan", "--config", plain, "--init-from", os.path.join(tmp, "nope"), "--data", data], "nope")
T.expect_error("a stats file of another architecture", ["plan", "--config", cfg, "--costs", stats], "--costs")

shutil.rmtree(tmp)
T.finish()
