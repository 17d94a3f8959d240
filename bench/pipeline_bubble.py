#!/usr/bin/python3
"""Pipeline stages: the measured bubble against (S-1)/(M+S-1), step time
against one process, and the bytes at the stage boundaries.

One run on one machine measures, on configs/tiny.toml (4 decoder blocks,
tied lm_head) with B = --batch sequences of T = 128 tokens per micro-batch,
FP32 GEMMs, in this order:
  - 1 process with grad_accum M (the baseline: no pipeline);
  - 2 stages (`snip train --nproc-per-node 2 --set dist.pipeline_stages=2`,
    c10d Gloo on 127.0.0.1, one thread each) with the 1F1B schedule for
    each M of --micro-batches, GPipe at the largest M, and 1F1B with
    dist.boundary_comm = fp8 at the largest M.
Per arm, over steps --skip+1 .. --steps (rank 0's metrics.jsonl; the stats
steps of an adaptive policy are not in these runs): the median step time,
tokens/s, the mean measured bubble (`pipe_bubble`: the fraction of the
schedule's wall time the stages waited for a neighbour's activation or
gradient, mean over ranks), the ideal (S-1)/(M+S-1), the bytes that crossed
boundaries per step (`boundary_bytes`) and the estimated stage imbalance of
summary.json. Prints a Markdown table.

Note: with 2 processes on 2 cores each stage has a core of its own; on a
machine with fewer cores than ranks the stages share them and the bubble
measures the sharing too.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/pipeline_bubble.py \\
        [--snip build/snip] [--data data/brown] [--steps 10] [--skip 3] [--batch 4] [--micro-batches 1,2,4,8]

Needs the prepared Brown data (`scripts/run.sh` or `snip data prepare`).
docs/benchmarks.md and docs/distributed.md record its output.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_arm(a, tmp, i, ranks, m, extra):
    run_dir = os.path.join(tmp, f"arm{i}")
    cmd = [a.snip, "train", "--config", a.config, "--run-dir", run_dir,
           "--set", f"data.dir={a.data}", "--set", f"train.max_steps={a.steps}",
           "--set", f"train.eval_interval={a.steps}", "--set", "train.eval_batches=1",
           "--set", "train.checkpoint_interval=0", "--set", "train.checkpoint_minutes=0",
           "--set", "train.sample_tokens=0", "--set", "train.gemm_dtype=fp32",
           "--set", f"train.batch_size={a.batch}", "--set", f"train.grad_accum={m}", *extra]
    if ranks > 1:
        cmd += ["--nproc-per-node", str(ranks), "--set", f"dist.pipeline_stages={ranks}"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"pipeline_bubble: arm {i}: snip train failed ({r.returncode}):\n{r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    timed = [row for row in rows if "step_s" in row and a.skip < row["step"] <= a.steps]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    step_s = statistics.median(row["step_s"] for row in timed)
    out = {"ranks": ranks, "m": m, "step_s": step_s, "tokens_per_s": summary["tokens"] / summary["steps"] / step_s}
    if ranks > 1:
        out["bubble"] = statistics.mean(row["pipe_bubble"] for row in timed)
        out["bytes"] = timed[-1]["boundary_bytes"]
        out["ideal"] = summary["pipeline"]["ideal_bubble"]
        out["imbalance"] = summary["pipeline"]["stage_imbalance"]
        out["bounds"] = summary["pipeline"]["bounds"]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snip", default=os.path.join(root, "build", "snip"))
    ap.add_argument("--config", default=os.path.join(root, "configs", "tiny.toml"))
    ap.add_argument("--data", default=os.path.join(root, "data", "brown"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4, help="sequences per micro-batch (default 4)")
    ap.add_argument("--micro-batches", default="1,2,4,8")
    a = ap.parse_args()
    if not (os.path.isfile(a.snip) and os.access(a.snip, os.X_OK)):
        sys.exit(f"pipeline_bubble: {a.snip} is not an executable snip (build it: scripts/setup.sh)")
    if not 1 <= a.skip < a.steps:
        sys.exit(f"pipeline_bubble: --skip must be at least 1 and below --steps ({a.steps}), got {a.skip}")
    if not os.path.exists(os.path.join(a.data, "train.bin")):
        sys.exit(f"pipeline_bubble: {a.data} has no train.bin: run `snip data prepare --out {a.data}` first")
    ms = [int(x) for x in a.micro_batches.split(",")]
    arms = []
    for m in ms:
        arms.append((f"1 process, grad_accum {m}", 1, m, []))
        arms.append((f"2 stages 1F1B, M = {m}", 2, m, []))
    arms.append((f"2 stages GPipe, M = {ms[-1]}", 2, ms[-1], ["--set", "dist.pipeline_schedule=gpipe"]))
    arms.append((f"2 stages 1F1B, M = {ms[-1]}, fp8 boundaries", 2, ms[-1], ["--set", "dist.boundary_comm=fp8"]))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, ranks, m, extra) in enumerate(arms):
            print(f"{name} ...", file=sys.stderr, flush=True)
            r = run_arm(a, tmp, i, ranks, m, extra)
            r["arm"] = name
            results.append(r)
    print("| run | step time (s) | tokens/s | bubble, measured | (S-1)/(M+S-1) | boundary bytes per step | "
          "blocks per stage | estimated imbalance |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for r in results:
        if r["ranks"] == 1:
            print(f"| {r['arm']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | - | - | 0 | - | - |")
        else:
            b = r["bounds"]
            split = " / ".join(str(b[k + 1] - b[k]) for k in range(len(b) - 1))
            print(f"| {r['arm']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['bubble']:.3f} | "
                  f"{r['ideal']:.3f} | {r['bytes']:,} | {split} | {r['imbalance']:.3f} |")


if __name__ == "__main__":
    main()
