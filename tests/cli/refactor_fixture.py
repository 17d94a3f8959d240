#!/usr/bin/env python3
"""The refactor fixture: numbers that a change of code layout must not move.

Runs the real `snip` binary on the micro model (the same shapes as
tests/core/test_util.h) on the KJV with a 512-piece BPE, 40 steps each, one
thread, under every precision path the trainer has:

  bf16            precision.policy = bf16, nothing quantized
  recipe-fp4      precision.recipe = fp4 on every layer, every step
  uniform-fp4     precision.policy = uniform-fp4 (warmup BF16, last 10% FP8)
  uniform-mxfp4   precision.policy = uniform-mxfp4
  snip-layer      precision.policy = snip, budget 0.75, granularity layer
  snip-gemm       precision.policy = snip, budget 0.75, granularity gemm
  correlate       `snip correlate` from the bf16 run's step-20 checkpoint,
                  K = 3 steps, the layers of block 0

and collects what the run produced: per step loss, grad_norm, lr and
fp4_share (metrics.jsonl); per plan its step, phase, FP4 share and every
item's option (plans/step-N.json); per stats step every layer's Q per option
(stats/step-N.json); the study's base losses and per-layer Q and measured
deltas (correlation.json).

  --record FILE  writes them to FILE under this machine's key
  --check FILE   compares them with FILE's entry for this machine's key, bit
                 for bit (floats compared as IEEE doubles, no tolerance),
                 after applying the faults fixed since the recording
                 (expected_after_fixes, each checked independently)

Floating-point results depend on the CPU's kernels (MKL and oneDNN pick
AVX2 or AVX-512 paths; BF16 GEMMs are native only with AVX512_BF16), so the
fixture holds one entry per machine key (the torch wheel's version + vector
ISA: amx, avx512bf16, avx512 or avx2). A machine with no entry fails under CI
(SNIP_CI or CI set: .ci/run sets SNIP_CI) and skips elsewhere (exit 77, CTest
SKIP_RETURN_CODE); both say how to record one, from a commit before the
change being proven.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

from cpu_flags import cpu_flags

MICRO = """
[model]
hidden_size = 64
intermediate_size = 172
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 64
[train]
batch_size = 8
seq_len = 64
lr = 1e-2
warmup_steps = 10
max_steps = 40
eval_interval = 20
eval_batches = 4
log_interval = 1000
checkpoint_interval = 20
keep_checkpoints = 0
threads = 1
"""

ARMS = {
    "bf16": ["precision.policy=bf16"],
    "recipe-fp4": ["precision.recipe=fp4"],
    "uniform-fp4": ["precision.policy=uniform-fp4"],
    "uniform-mxfp4": ["precision.policy=uniform-mxfp4"],
    "snip-layer": ["precision.policy=snip", "precision.budget=0.75", "precision.granularity=layer"],
    "snip-gemm": ["precision.policy=snip", "precision.budget=0.75", "precision.granularity=gemm"],
}


def machine_key():
    flags = cpu_flags()
    # AMX (Sapphire Rapids and later) has its own BF16 GEMM kernels in
    # oneDNN, which may round differently from AVX512-BF16 ones (Zen 4).
    isa = "amx" if "amx_bf16" in flags else "avx512bf16" if "avx512_bf16" in flags else \
        "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    # The LibTorch snip is built on is the venv's torch wheel (requirements.txt):
    # this script runs with that venv's Python (SNIP_PYTHON).
    try:
        import torch
        torch_version = "torch-" + torch.__version__
    except ImportError:
        torch_version = "unknown"
    return f"{torch_version}/{isa}"


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"refactor_fixture: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def collect_run(run_dir):
    out = {"steps": [], "plans": [], "stats": []}
    for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        row = {k: r[k] for k in ("step", "loss", "grad_norm", "lr", "fp4_share")}
        if "val_loss" in r:
            row["val_loss"] = r["val_loss"]
        out["steps"].append(row)

    def by_step(folder):
        d = os.path.join(run_dir, folder)
        if not os.path.isdir(d):
            return []
        names = [n for n in os.listdir(d) if n.startswith("step-") and n.endswith(".json")]
        return [os.path.join(d, n) for n in sorted(names, key=lambda n: int(n[5:-5]))]

    for p in by_step("plans"):
        with open(p) as f:
            j = json.load(f)
        out["plans"].append({
            "file": os.path.basename(p),
            "phase": j["phase"],
            "fp4_share": j["fp4_share"],
            "assignment": {it["name"]: it["option"] for it in j["items"]},
        })
    for p in by_step("stats"):
        with open(p) as f:
            j = json.load(f)
        layers = {}
        for e in j["layers"]:  # the smoothed cost table the planner used (plan/cost_table.h)
            layers[e["name"]] = e["q"] if "q" in e else {g: d["q"] for g, d in e["gemms"].items()}
        out["stats"].append({"file": os.path.basename(p), "layers": layers})
    return out


def collect(snip, data, workdir):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    cfg = os.path.join(workdir, "micro.toml")
    with open(cfg, "w") as f:
        f.write(MICRO + f'[data]\ndir = "{data}"\n')
    result = {}
    for name, sets in ARMS.items():
        rd = os.path.join(workdir, name)
        cmd = [snip, "train", "--config", cfg, "--run-dir", rd]
        for s in sets:
            cmd += ["--set", s]
        run(cmd, env)
        result[name] = collect_run(rd)
    out = os.path.join(workdir, "corr")
    run([snip, "correlate", "--run", os.path.join(workdir, "bf16"), "--step", "20", "--steps", "3",
         "--layers", "layers.0.*", "--out", out], env)
    with open(os.path.join(out, "correlation.json")) as f:
        c = json.load(f)
    result["correlate"] = {
        "base_val_loss": c["base_val_loss"], "base_train_loss": c["base_train_loss"],
        "layers": {l["name"]: {k: l[k] for k in ("q", "ld", "wd", "val_loss", "train_loss")} for l in c["layers"]},
    }
    return result


def diff(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: {'missing now' if k not in b else 'new'}")
            else:
                diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} entries recorded, {len(b)} now")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif a != b or type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        out.append(f"{path}: recorded {a!r}, now {b!r}")


def expected_after_fixes(recorded, now, problems):
    """The recorded numbers with the fixes of the faults below applied, each
    checked against an independent expectation instead of being skipped:

    - uniform-mxfp4 reported an FP4 FLOPs share of 0 (only precision.low_option
      = fp4 counted); every GEMM runs MXFP4, so its share must now equal the
      uniform-fp4 arm's, step by step and plan by plan (same schedule).
    - precision.recipe = fp4 is now the policy uniform-fp4 with no warmup and
      no final phase: it writes plans, and every plan must put every layer in
      fp4 at a share of 1.0. Its losses must not move.
    """
    exp = copy.deepcopy(recorded)
    mx, fp4 = exp.get("uniform-mxfp4"), recorded.get("uniform-fp4")
    if mx and fp4:
        for a, b in zip(mx["steps"], fp4["steps"]):
            a["fp4_share"] = b["fp4_share"]
        for a, b in zip(mx["plans"], fp4["plans"]):
            a["fp4_share"] = b["fp4_share"]
    rec = exp.get("recipe-fp4")
    if rec is not None and not rec["plans"] and now.get("recipe-fp4", {}).get("plans"):
        for p in now["recipe-fp4"]["plans"]:
            if p["phase"] != "plan" or p["fp4_share"] != 1.0 or set(p["assignment"].values()) != {"fp4"}:
                problems.append(f"/recipe-fp4/plans/{p['file']}: expected every layer in fp4 at share 1.0, got {p}")
        rec["plans"] = now["recipe-fp4"]["plans"]
    return exp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--snip", required=True)
    ap.add_argument("--data", required=True, help="prepared data folder (BPE 512)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--record")
    g.add_argument("--check")
    a = ap.parse_args()
    key = machine_key()
    path = a.record or a.check
    fixture = {}
    if os.path.exists(path):
        with open(path) as f:
            fixture = json.load(f)
    if a.check and key not in fixture.get("machines", {}):
        ci = any(os.environ.get(v, "").lower() not in ("", "0", "false", "no") for v in ("SNIP_CI", "CI"))
        print(f"refactor_fixture: {'FAIL' if ci else 'SKIP'}: no entry for machine key '{key}' in {path} (entries: "
              f"{sorted(fixture.get('machines', {}))}); record one at a commit before the change: "
              f".venv/bin/python tests/cli/refactor_fixture.py --snip build/snip --data build/test-data/kjv512 "
              f"--record {path}")
        sys.exit(1 if ci else 77)
    workdir = tempfile.mkdtemp(prefix="snip-fixture-")
    try:
        now = collect(a.snip, a.data, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if a.record:
        fixture.setdefault("machines", {})[key] = now
        fixture["about"] = ("tests/cli/refactor_fixture.py: losses, grad norms, FP4 shares, plans, stats and a "
                            "correlation study of the micro model; one entry per machine key")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(fixture, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
        n = sum(len(v["steps"]) for k, v in now.items() if k != "correlate")
        print(f"refactor_fixture: recorded {n} steps, {sum(len(v['plans']) for k, v in now.items() if k != 'correlate')}"
              f" plans under '{key}' in {path}")
        return
    problems = []
    diff(expected_after_fixes(fixture["machines"][key], now, problems), now, "", problems)
    if problems:
        print(f"refactor_fixture: {len(problems)} differences from {path} ['{key}']:")
        for p in problems[:40]:
            print("  " + p)
        sys.exit(1)
    n = sum(len(v["steps"]) for k, v in now.items() if k != "correlate")
    print(f"refactor_fixture: {n} steps, plans, stats and the correlation study equal the fixture bit for bit")


if __name__ == "__main__":
    main()
