#!/usr/bin/python3
"""Step time and gradient-communication time of `snip train` on 1 and 2 ranks.

One run on one machine measures, in this order, on configs/tiny.toml (5.0M
parameters, B = 16 sequences of T = 128 per rank, FP32 GEMMs unless
--gemm-dtype says otherwise):
  - 1 rank (no communication);
  - 2 ranks (`snip train --nproc-per-node 2`, c10d Gloo on 127.0.0.1, one
    thread each: cores / ranks) under
      fp32, overlapped      dist.overlap = true (the default): FP32 buckets
                            all-reduced from autograd hooks during backward
      fp32, after backward  dist.overlap = false
      <q>, all-reduce       dist.grad_comm = <q> (default fp4), exact-numerics
                            path: decoded q summed by the FP32 all-reduce
      <q>, all-gather       dist.grad_comm_path = allgather: packed codes and
                            scales all-gathered, decoded, summed in rank order
and prints a Markdown table. Per arm, over steps --skip+1 .. --steps of its
metrics.jsonl (rank 0's): the median step time (`step_s`: wall time of the
step in the trainer's loop), the median communication time (`comm_s`: the
seconds rank 0 was blocked in collectives from the last micro-batch's
backward until the summed gradient; with overlap that is the part backward
did not hide), tokens/s over all ranks, and the bytes rank 0 handed to the
gradient collectives per step (`grad_comm_sent_bytes`).

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/dist_step.py \\
        [--snip build/snip] [--data data/brown] [--steps 12] [--skip 3] [--format fp4] [--json OUT]

Needs the prepared Brown data (`scripts/run.sh` or `snip data prepare`).
docs/benchmarks.md records its output with the machine it ran on.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def arms(fmt):
    return [
        ("1 rank", 1, []),
        ("2 ranks fp32, overlapped", 2, []),
        ("2 ranks fp32, after backward", 2, ["--set", "dist.overlap=false"]),
        (f"2 ranks {fmt}, all-reduce (exact numerics)", 2, ["--set", f"dist.grad_comm={fmt}"]),
        (f"2 ranks {fmt}, all-gather (packed)", 2,
         ["--set", f"dist.grad_comm={fmt}", "--set", "dist.grad_comm_path=allgather"]),
    ]


def run_arm(a, tmp, i, name, ranks, extra):
    run_dir = os.path.join(tmp, f"arm{i}")
    cmd = [a.snip, "train", "--config", a.config, "--run-dir", run_dir,
           "--set", f"data.dir={a.data}", "--set", f"train.max_steps={a.steps}",
           "--set", f"train.eval_interval={a.steps}", "--set", "train.eval_batches=1",
           "--set", "train.checkpoint_interval=0", "--set", "train.checkpoint_minutes=0",
           "--set", "train.sample_tokens=0", "--set", f"train.gemm_dtype={a.gemm_dtype}", *extra]
    if ranks > 1:
        cmd += ["--nproc-per-node", str(ranks)]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"dist_step: {name}: snip train failed ({r.returncode}):\n{r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    timed = [row for row in rows if "step_s" in row and a.skip < row["step"] <= a.steps]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    tokens_per_step = summary["tokens"] / summary["steps"]  # over every rank
    step_s = statistics.median(row["step_s"] for row in timed)
    comm_s = statistics.median(row["comm_s"] for row in timed) if ranks > 1 else 0.0
    return {"arm": name, "ranks": ranks, "step_s": step_s, "comm_s": comm_s,
            "tokens_per_s": tokens_per_step / step_s,
            "sent_bytes": timed[-1].get("grad_comm_sent_bytes", 0), "final_loss": rows[-1]["loss"]}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snip", default=os.path.join(root, "build", "snip"))
    ap.add_argument("--config", default=os.path.join(root, "configs", "tiny.toml"))
    ap.add_argument("--data", default=os.path.join(root, "data", "brown"))
    ap.add_argument("--steps", type=int, default=12, help="steps per arm (default 12)")
    ap.add_argument("--skip", type=int, default=3, help="first steps not timed (default 3)")
    ap.add_argument("--format", default="fp4", help="the quantized dist.grad_comm arm (default fp4)")
    ap.add_argument("--gemm-dtype", default="fp32", help="train.gemm_dtype (default fp32)")
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args()
    if not (os.path.isfile(a.snip) and os.access(a.snip, os.X_OK)):
        sys.exit(f"dist_step: {a.snip} is not an executable snip (build it: scripts/setup.sh)")
    if not 1 <= a.skip < a.steps:
        sys.exit(f"dist_step: --skip must be at least 1 and below --steps ({a.steps}), got {a.skip}")
    if not os.path.exists(os.path.join(a.data, "train.bin")):
        sys.exit(f"dist_step: {a.data} has no train.bin: run `snip data prepare --out {a.data}` first")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, ranks, extra) in enumerate(arms(a.format)):
            print(f"{name} ...", file=sys.stderr, flush=True)
            results.append(run_arm(a, tmp, i, name, ranks, extra))
    print("| run | step time (s) | communication time (s), exposed | share of the step | tokens/s | "
          "gradient bytes sent per rank and step |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        sent = f"{r['sent_bytes']:,}" if r["ranks"] > 1 else "0"
        print(f"| {r['arm']} | {r['step_s']:.3f} | {r['comm_s']:.3f} | {r['comm_s'] / r['step_s']:.1%} | "
              f"{r['tokens_per_s']:,.0f} | {sent} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
