#!/usr/bin/env python3
"""Training throughput of the tiny config under each precision, side by side.

One run on one machine measures, in this order:
  - `snip train` on configs/tiny.toml (the main job's model, batch and data)
    under bf16 (the baseline), fp32 GEMMs, precision.recipe = fp8, fp4, mxfp4
    and nvfp4 (every layer, every step), and precision.policy = snip at budget
    0.75 (stats steps and plans included, BF16 warmup 2 steps, no final phase);
  - plain PyTorch on the same model (bench/torch_eager.py), eager and
    torch.compile, each in FP32 and in BF16 autocast, with the torch of the
    venv (the one snip's LibTorch comes from).
and prints a Markdown table: tokens/s, step time relative to snip's BF16
step, and each arm's tokens/s as a ratio to PyTorch eager FP32 and to
torch.compile FP32. Tokens/s of a snip arm
is measured from the run's metrics.jsonl between step `--skip` and the last
step (elapsed_s is wall time since the run started, so stats steps and plan
solves are counted; the final evaluation and checkpoint are not).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/train_throughput.py \
        [--snip build/snip] [--data data/kjv] [--steps 40] [--skip 5] [--eager-steps 10] [--json OUT]

Needs the prepared KJV data (`scripts/run.sh` or `snip data prepare`).
docs/benchmarks.md records its output with the machine it ran on.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ARMS = [
    ("bf16", []),
    ("fp32 GEMMs", ["--set", "train.gemm_dtype=fp32"]),
    ("fp8", ["--set", "precision.recipe=fp8"]),
    ("fp4", ["--set", "precision.recipe=fp4"]),
    ("mxfp4", ["--set", "precision.recipe=mxfp4"]),
    ("nvfp4", ["--set", "precision.recipe=nvfp4"]),
    ("snip@0.75", ["--set", "precision.policy=snip", "--set", "precision.budget=0.75",
                   "--set", "precision.warmup_steps=2", "--set", "precision.final_high_precision_fraction=0"]),
]


def snip_arm(snip, config, data, steps, skip, extra, tmp, name):
    run_dir = os.path.join(tmp, name.replace("@", "_").replace(" ", "_"))
    cmd = [snip, "train", "--config", config, "--run-dir", run_dir,
           "--set", f"data.dir={data}", "--set", f"train.max_steps={steps}",
           "--set", f"train.eval_interval={steps}", "--set", "train.eval_batches=1",
           "--set", "train.checkpoint_interval=0", "--set", "train.sample_tokens=0", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        sys.exit(f"train_throughput: {name}: snip train failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    by_step = {row["step"]: row for row in rows if "elapsed_s" in row}
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    tokens_per_step = summary["tokens"] / summary["steps"]  # B x T x grad_accum of this config
    first, last = by_step[skip], by_step[steps]
    tokens = (last["step"] - first["step"]) * tokens_per_step
    share = sum(row.get("fp4_share", 0.0) for row in rows[skip:]) / max(1, len(rows[skip:]))
    return tokens / (last["elapsed_s"] - first["elapsed_s"]), share


def eager(mode, steps, warmup, here, compiled=False):
    r = subprocess.run([sys.executable, os.path.join(here, "torch_eager.py"), "--mode", mode,
                        "--steps", str(steps), "--warmup", str(warmup), "--json"] + (["--compile"] if compiled else []),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"train_throughput: torch_eager.py --mode {mode} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snip", default=os.path.join(root, "build", "snip"))
    ap.add_argument("--config", default=os.path.join(root, "configs", "tiny.toml"))
    ap.add_argument("--data", default=os.path.join(root, "data", "kjv"))
    ap.add_argument("--steps", type=int, default=40, help="steps per snip arm (default 40)")
    ap.add_argument("--skip", type=int, default=5, help="first steps not timed (default 5)")
    ap.add_argument("--eager-steps", type=int, default=10, help="timed PyTorch eager steps per mode (default 10)")
    ap.add_argument("--bf16-eager-steps", type=int, default=2,
                    help="timed steps of eager BF16 autocast, very slow on CPUs without AVX512-BF16 (default 2)")
    ap.add_argument("--arms", default="", help="comma-separated subset of the snip arms (bf16 always runs: the "
                    "baseline): " + ", ".join(n for n, _ in ARMS))
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args()
    if not (os.path.isfile(a.snip) and os.access(a.snip, os.X_OK)):
        sys.exit(f"train_throughput: {a.snip} is not an executable snip (build it: scripts/setup.sh)")
    if not 1 <= a.skip < a.steps:
        sys.exit(f"train_throughput: --skip must be at least 1 and below --steps ({a.steps}), got {a.skip}")
    if min(a.eager_steps, a.bf16_eager_steps) < 1:
        sys.exit("train_throughput: --eager-steps and --bf16-eager-steps must be at least 1")
    names = [n for n, _ in ARMS]
    unknown = sorted(set(x.strip() for x in a.arms.split(",") if x.strip()) - set(names))
    if unknown:
        sys.exit(f"train_throughput: unknown arm(s) {', '.join(unknown)}; the arms: {', '.join(names)}")
    if not os.path.exists(os.path.join(a.data, "train.bin")):
        sys.exit(f"train_throughput: {a.data} has no train.bin: run `snip data prepare --out {a.data}` first")
    want = set(x.strip() for x in a.arms.split(",") if x.strip())
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in ARMS:
            if want and name not in want and name != "bf16":
                continue
            print(f"snip {name} ...", file=sys.stderr, flush=True)
            tps, share = snip_arm(a.snip, a.config, a.data, a.steps, a.skip, extra, tmp, name)
            results.append({"arm": f"snip {name}", "tokens_per_s": tps, "fp4_share": share})
    base_arms = {}
    for compiled in (False, True):
        kind = "torch.compile" if compiled else "eager"
        for mode, steps in (("fp32", a.eager_steps), ("bf16", a.bf16_eager_steps)):
            print(f"torch {kind} {mode} ...", file=sys.stderr, flush=True)
            # BF16 autocast is slow on CPUs without AVX512-BF16: fewer steps
            base_arms[(compiled, mode)] = eager(mode, steps, 2 if mode == "fp32" or compiled else 1, here, compiled)
            results.append({"arm": f"PyTorch {kind} {mode}" + (" autocast" if mode == "bf16" else ""),
                            "tokens_per_s": base_arms[(compiled, mode)]})
    base = results[0]["tokens_per_s"]
    e32, c32 = base_arms[(False, "fp32")], base_arms[(True, "fp32")]
    print(f"| run | tokens/s | step time vs snip bf16 | vs PyTorch eager fp32 | vs torch.compile fp32 |")
    print(f"|---|---:|---:|---:|---:|")
    for r in results:
        t = r["tokens_per_s"]
        r["step_time_vs_bf16"] = base / t
        r["vs_eager_fp32"] = t / e32
        r["vs_compile_fp32"] = t / c32
        print(f"| {r['arm']} | {t:,.0f} | {base / t:.2f}x | {t / e32:.2f}x | {t / c32:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
