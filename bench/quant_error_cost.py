#!/usr/bin/env python3
"""What the per-step quantization error costs (docs/benchmarks.md
"Per-step quantization error"): `snip train` on configs/tiny.toml under a
recipe, with monitor.quant_error on (the default: every quantized operand's
||Q(x)-x||/||x|| measured in the quantizer's own pass, summed and all-reduced
with the loss) and off, interleaved A B A B ... in one run so that the
machine's drift hits both alike. Prints, per recipe, the median step time of
each arm (steps after --skip, from metrics.jsonl's step_s) and the cost in
percent of the step.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/quant_error_cost.py \
        [--snip build/snip] [--data data/kjv] [--steps 30] [--skip 5] [--pairs 3] [--recipes nvfp4,fp8]

Needs the prepared KJV data (`scripts/run.sh` or `snip data prepare`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def arm(snip, config, data, steps, recipe, on, tmp, tag):
    run_dir = os.path.join(tmp, tag)
    cmd = [snip, "train", "--config", config, "--run-dir", run_dir, "--quiet",
           "--set", f"data.dir={data}", "--set", f"train.max_steps={steps}",
           "--set", f"train.eval_interval={steps}", "--set", "train.eval_batches=1",
           "--set", "train.checkpoint_interval=0", "--set", "train.sample_tokens=0",
           "--set", "monitor.listen=", "--set", f"precision.recipe={recipe}",
           "--set", f"monitor.quant_error={'true' if on else 'false'}"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        sys.exit(f"quant_error_cost: {tag}: snip train failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    has = any("quant_err" in row for row in rows)
    if has != on:
        sys.exit(f"quant_error_cost: {tag}: quant_err {'missing' if on else 'present'} in metrics.jsonl")
    return [row["step_s"] for row in rows if "step_s" in row]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snip", default=os.path.join(root, "build", "snip"))
    ap.add_argument("--config", default=os.path.join(root, "configs", "tiny.toml"))
    ap.add_argument("--data", default=os.path.join(root, "data", "kjv"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--recipes", default="nvfp4,fp8")
    a = ap.parse_args()
    print("| recipe | step, error measured (ms) | step, not measured (ms) | cost |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="snip-qe-cost-") as tmp:
        for recipe in a.recipes.split(","):
            on, off = [], []
            for p in range(a.pairs):
                on += arm(a.snip, a.config, a.data, a.steps, recipe, True, tmp, f"{recipe}-on-{p}")[a.skip:]
                off += arm(a.snip, a.config, a.data, a.steps, recipe, False, tmp, f"{recipe}-off-{p}")[a.skip:]
            m_on, m_off = statistics.median(on), statistics.median(off)
            print(f"| {recipe} | {1e3 * m_on:.1f} | {1e3 * m_off:.1f} | {100 * (m_on / m_off - 1):+.2f}% |",
                  flush=True)


if __name__ == "__main__":
    main()
