#!/usr/bin/env python3
"""The SNIP-LoRA demonstration (docs/results.md "Fine-tuning: SNIP-LoRA on a
new corpus"): adapt the tiny Llama pretrained on the King James Bible (the
main job) to WordNet's glosses (modern English definitions; both corpora
from Debian's packages), four ways, and tabulate validation loss on the new
corpus and on the KJV (forgetting), trainable parameters, memory and time.

  base            the pretrained model (configs/tiny.toml on data/kjv),
                  exported with `snip export`; reused from --base-run when it
                  holds a finished run, else trained into OUT/base
  full-bf16       every parameter trains, BF16 GEMMs (precision.policy none)
  lora-bf16       rank-8 adapters on every *_proj, base frozen, BF16 GEMMs
  snip-lora-0.5   the same adapters, base GEMMs planned by SNIP at FP4 budget 0.5
  snip-lora-0.75  ... at FP4 budget 0.75

usage: bench/lora_demo.py [--out runs/lora-demo] [--steps 300] [--snip build/snip]
Writes OUT/results.md (the table) and OUT/results.json; each arm is a run
folder OUT/<arm> (resumed when interrupted, skipped when finished).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ARMS = [
    # name, lr, [lora], [precision]
    ("full-bf16", 3e-4, None, None),
    ("lora-bf16", 2e-3, "rank = 8\nalpha = 16\n", None),
    ("snip-lora-0.5", 2e-3, "rank = 8\nalpha = 16\n", "policy = \"snip\"\nbudget = 0.5\n"),
    ("snip-lora-0.75", 2e-3, "rank = 8\nalpha = 16\n", "policy = \"snip\"\nbudget = 0.75\n"),
]


def run(cmd, log=None):
    """Runs cmd; returns (seconds, max RSS in KiB) from /usr/bin/time -v."""
    t0 = time.time()
    full = ["/usr/bin/time", "-v"] + cmd
    with open(log or os.devnull, "w") as f:
        p = subprocess.run(full, stdout=f, stderr=subprocess.PIPE, text=True)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        sys.exit(f"lora_demo: failed ({p.returncode}): {' '.join(cmd)}")
    return time.time() - t0, int(rss.group(1)) if rss else None


def eval_loss(snip, ckpt, data):
    out = subprocess.run([snip, "eval", "--checkpoint", ckpt, "--data", data], capture_output=True, text=True)
    m = re.search(r"val loss ([0-9.]+) nats/token", out.stdout + out.stderr)
    if not m:
        sys.exit(f"lora_demo: no loss from snip eval {ckpt} --data {data}:\n{out.stdout}{out.stderr}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/lora-demo")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--snip", default=os.environ.get("SNIP_BUILD_DIR", "build") + "/snip")
    ap.add_argument("--base-run", default="runs/tiny", help="a finished configs/tiny.toml run to reuse as the base")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    snip = a.snip
    subprocess.run([snip, "data", "prepare", "--corpus", "kjv", "--out", "data/kjv"], check=True,
                   stdout=subprocess.DEVNULL)
    # The base's tokenizer, so that the ids mean the same pieces (1% of the
    # 117,659 synsets held out).
    new = "data/wordnet-kjv"
    subprocess.run([snip, "data", "prepare", "--corpus", "wordnet", "--tokenizer", "data/kjv/tokenizer.model",
                    "--out", new], check=True, stdout=subprocess.DEVNULL)
    base_run = a.base_run if os.path.exists(os.path.join(a.base_run, "summary.json")) else os.path.join(a.out, "base")
    if not os.path.exists(os.path.join(base_run, "summary.json")):
        print(f"pretraining the base into {base_run} (configs/tiny.toml, about 12 minutes on 2 cores)", flush=True)
        resume = ["--resume"] if os.path.exists(os.path.join(base_run, "config.toml")) else []
        run([snip, "train", "--config", "configs/tiny.toml", "--run-dir", base_run] + resume,
            os.path.join(a.out, "base.log"))
    base_hf = os.path.join(a.out, "base-hf")
    if not os.path.exists(os.path.join(base_hf, "model.safetensors")):
        subprocess.run([snip, "export", "--run-dir", base_run, "--out", base_hf], check=True, stdout=subprocess.DEVNULL)
    rows = [{"arm": "base (no fine-tuning)", "new_val": eval_loss(snip, base_hf, new),
             "base_val": eval_loss(snip, base_hf, "data/kjv")}]
    for name, lr, lora, prec in ARMS:
        rd = os.path.join(a.out, name)
        toml = os.path.join(a.out, name + ".toml")
        with open(toml, "w") as f:
            f.write(f"""[data]
dir = "{new}"
[train]
batch_size = 16
seq_len = 128
max_steps = {a.steps}
lr = {lr}
warmup_steps = 20
gemm_dtype = "bf16"
eval_interval = {max(1, a.steps // 3)}
eval_batches = 0
checkpoint_interval = {a.steps}
sample_tokens = 0
""")
            if lora:
                f.write("[lora]\n" + lora)
            if prec:
                f.write("[precision]\n" + prec)
        seconds, rss = None, None
        if not os.path.exists(os.path.join(rd, "summary.json")):
            print(f"{name}: training {a.steps} steps", flush=True)
            resume = ["--resume"] if os.path.exists(os.path.join(rd, "config.toml")) else ["--init-from", base_hf]
            seconds, rss = run([snip, "train", "--config", toml, "--run-dir", rd] + resume, os.path.join(a.out, name + ".log"))
            with open(os.path.join(rd, "demo_measure.json"), "w") as f:
                json.dump({"wall_s": seconds, "max_rss_kib": rss}, f)
        meas = json.load(open(os.path.join(rd, "demo_measure.json"))) if os.path.exists(
            os.path.join(rd, "demo_measure.json")) else {}
        s = json.load(open(os.path.join(rd, "summary.json")))
        ckpt = os.path.join(rd, "checkpoints", f"step-{a.steps}")
        lo = s.get("lora") or {}
        rows.append({"arm": name, "new_val": s["final_val_loss"], "base_val": eval_loss(snip, ckpt, "data/kjv"),
                     "trainable": lo.get("trainable_parameters", s["parameters"]), "parameters": s["parameters"],
                     "base_linear_bytes": lo.get("base_linear_stored_bytes"),
                     "base_linear_bytes_max": lo.get("base_linear_stored_bytes_max"),
                     "base_linear_fp32_bytes": lo.get("base_linear_fp32_bytes"),
                     "train_s": s["seconds"], "tokens_per_s": s["tokens_per_s"],
                     "max_rss_mib": meas.get("max_rss_kib", 0) / 1024 if meas.get("max_rss_kib") else None,
                     "ckpt_bytes": sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))})
    json.dump(rows, open(os.path.join(a.out, "results.json"), "w"), indent=2)
    mib = lambda b: f"{b / 2**20:.2f}" if b is not None else "-"
    fp32_linear = next((r["base_linear_fp32_bytes"] for r in rows if r.get("base_linear_fp32_bytes")), None)
    lines = ["| arm | val loss WordNet | val loss KJV | trainable parameters | linear weights held, most / at the end (MiB) "
             "| peak RSS (MiB) | checkpoint (MiB) | train time (s) | tokens/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "trainable" not in r:
            lines.append(f"| {r['arm']} | {r['new_val']:.4f} | {r['base_val']:.4f} | - | - | - | - | - | - |")
            continue
        held = (f"{mib(r['base_linear_bytes_max'])} / {mib(r['base_linear_bytes'])}" if r["base_linear_bytes"] is not None
                else f"{mib(fp32_linear)} (FP32, trained)")
        lines.append(f"| {r['arm']} | {r['new_val']:.4f} | {r['base_val']:.4f} | {r['trainable']:,} of "
                     f"{r['parameters']:,} | {held} | {r['max_rss_mib']:.0f} | {mib(r['ckpt_bytes'])} | "
                     f"{r['train_s']:.0f} | {r['tokens_per_s']:.0f} |" if r["max_rss_mib"] else
                     f"| {r['arm']} | {r['new_val']:.4f} | {r['base_val']:.4f} | {r['trainable']:,} | {held} | - | "
                     f"{mib(r['ckpt_bytes'])} | {r['train_s']:.0f} | {r['tokens_per_s']:.0f} |")
    open(os.path.join(a.out, "results.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
