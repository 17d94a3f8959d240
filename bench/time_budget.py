#!/usr/bin/env python3
"""Does a plan under precision.budget_unit = time run in the time it
predicts? (issue 34; docs/method.md "Budget in measured time").

One run on one machine, in this order:
  1. `snip doctor --calibrate` times every GEMM of the model (configs/study.toml
     by default) under each option and writes RUN/gemm_times.json;
  2. `snip train` (with that table) for --steps steps under policy none (every GEMM in BF16),
     uniform-<option> for each option, and precision.policy = snip with
     budget_unit = time at per-GEMM granularity and a budget half-way between
     the fastest plan the table allows and the fastest uniform plan (so the
     solver has to mix options to meet it);
  3. for each run: its plan's predicted GEMM seconds per step (the table's
     seconds summed over the plan's items, the same sum the planner
     constrains), the measured step time (median step_s over the steps after
     the BF16 warm-up, stats steps excluded), and the prediction of the step
     time: measured BF16 step - predicted BF16 GEMM seconds (everything that
     is not a linear GEMM: attention, norms, the optimizer, the LM head) +
     the plan's predicted GEMM seconds.

Prints a Markdown table with each run's predicted and measured step time,
the error of the prediction, and, for the time-budget run, the measured
GEMM time ratio ((measured step - non-GEMM seconds) / BF16 GEMM seconds)
against its budget. The tolerance stated in docs/benchmarks.md is what this
prints, not an assertion: speed is measured here, not timed in tests.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/time_budget.py \\
        [--snip build/snip] [--config configs/study.toml] [--steps 60] [--json OUT]

Needs the config's prepared data (configs/study.toml: data/kjv2k,
`build/snip data prepare --corpus kjv --out data/kjv2k --vocab-size 2048`).
Every run uses the config's train.threads (1 in study.toml); keep the
machine otherwise idle.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib

WARMUP = 5


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"time_budget: {' '.join(cmd)} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def layer_items(plan):
    """{item name: option} of a plan file's items."""
    return {it["name"]: it["option"] for it in plan["items"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snip", default="build/snip")
    ap.add_argument("--config", default="configs/study.toml")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--keep", help="keep the runs in this folder (default: a temporary one)")
    a = ap.parse_args()
    out = a.keep or tempfile.mkdtemp(prefix="snip-time-budget-")
    os.makedirs(out, exist_ok=True)
    cal = os.path.join(out, "cal")
    table_path = os.path.join(cal, "gemm_times.json")
    if os.path.exists(table_path):  # --keep of an earlier run: its table (doctor never replaces one)
        print(f"time_budget: reusing {table_path}", file=sys.stderr)
    else:
        print(f"time_budget: calibrating GEMM times ({a.config}) into {cal}", file=sys.stderr)
        run([a.snip, "doctor", "--calibrate", "--config", a.config, "--run", cal])
    table = json.load(open(table_path))
    options = sorted({e["option"] for e in table["entries"]} - {"bf16"})

    common = ["--config", a.config, "--set", f"train.max_steps={a.steps}", "--set", f"train.eval_interval={a.steps}",
              "--set", f"precision.warmup_steps={WARMUP}",
              "--set", "precision.final_high_precision_fraction=0", "--set", f"precision.gemm_times={table_path}"]

    def train(name, sets):
        d = os.path.join(out, name)
        print(f"time_budget: training {name} ({a.steps} steps)", file=sys.stderr)
        run([a.snip, "train", "--run-dir", d] + common + [x for s in sets for x in ("--set", s)])
        return d

    # Each GEMM's seconds per option from the table: a layer of IN -> OUT on
    # T rows runs fprop {T, IN, OUT}, dgrad {T, OUT, IN}, wgrad {OUT, T, IN}
    # (docs/method.md); the Llama projections' IN and OUT from the config.
    cfg = tomllib.load(open(a.config, "rb"))
    m, t = cfg["model"], cfg["train"]
    C, I = m["hidden_size"], m["intermediate_size"]
    KV = C // m["num_attention_heads"] * m["num_key_value_heads"]
    T = t["batch_size"] * t["seq_len"]
    dims = {"self_attn.q_proj": (C, C), "self_attn.k_proj": (C, KV), "self_attn.v_proj": (C, KV),
            "self_attn.o_proj": (C, C), "mlp.gate_proj": (C, I), "mlp.up_proj": (C, I), "mlp.down_proj": (I, C)}
    look = {(e["gemm"], e["m"], e["k"], e["n"], e["option"]): e["seconds"] for e in table["entries"]}
    accum = t.get("grad_accum", 1)
    secs = {}
    for layer in range(m["num_hidden_layers"]):
        for proj, (i, o) in dims.items():
            for g, shape in (("fprop", (T, i, o)), ("dgrad", (T, o, i)), ("wgrad", (o, T, i))):
                secs[f"model.layers.{layer}.{proj}:{g}"] = {
                    opt: accum * look[(g, *shape, opt)] for opt in options + ["bf16"]}
    ref = sum(s["bf16"] for s in secs.values())
    fastest = sum(min(s[o] for o in options) for s in secs.values()) / ref
    uniform = {o: sum(s[o] for s in secs.values()) / ref for o in options}
    budget = round((fastest + min(uniform.values())) / 2, 4)
    print(f"time_budget: BF16 GEMMs {ref * 1e3:.2f} ms/step; fastest plan {fastest:.3f}x, uniform "
          + ", ".join(f"{o} {r:.3f}x" for o, r in uniform.items()) + f"; time budget {budget}x", file=sys.stderr)

    arms = [("none", ["precision.policy=none"], {n: "bf16" for n in secs})]
    for o in options:
        arms.append((f"uniform-{o}", [f"precision.policy=uniform-{o}"], {n: o for n in secs}))
    arms.append((f"snip time {budget}x", ["precision.policy=snip", "precision.granularity=gemm",
                                          "precision.budget_unit=time", f"precision.budget={budget}",
                                          f"precision.initial_interval={a.steps}"], None))
    rows = []
    solver_ratio = None
    for name, sets, assign in arms:
        d = train(name.replace(" ", "-"), sets)
        if assign is None:  # the solver's plan
            plan = [json.load(open(f)) for f in glob.glob(os.path.join(d, "plans", "step-*.json"))]
            plan = [p for p in plan if p.get("phase") == "plan"]
            if len(plan) != 1:
                sys.exit(f"time_budget: expected one plan-phase plan in {d}, got {len(plan)}")
            assign = layer_items(plan[0])
            solver_ratio = plan[0].get("time_ratio")
            # The planner's own sum of the chosen seconds: the same table.
            mine = sum(secs[n][o] for n, o in assign.items()) / ref
            if abs(mine - solver_ratio) > 1e-6 * mine:
                sys.exit(f"time_budget: the plan's time_ratio {solver_ratio} differs from the table's sum {mine}")
        gemm = sum(secs[n][o] for n, o in assign.items())
        stats = {int(os.path.basename(f)[5:-5]) for f in glob.glob(os.path.join(d, "plans", "step-*.json"))}
        steps = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"step_s"' in l]
        # After the warm-up; a stats step (the step before a plan) excluded.
        measured = statistics.median(r["step_s"] for r in steps
                                     if r["step"] > WARMUP + 2 and r["step"] not in stats
                                     and r["step"] + 1 not in stats)
        counts = {}
        for o in assign.values():
            counts[o] = counts.get(o, 0) + 1
        rows.append({"arm": name, "gemm_ratio_predicted": gemm / ref, "gemm_s": gemm, "measured_step_s": measured,
                     "options": counts})
    overhead = rows[0]["measured_step_s"] - ref
    print(f"\nnon-GEMM seconds per step (measured BF16 step {rows[0]['measured_step_s'] * 1e3:.1f} ms - predicted "
          f"BF16 GEMMs {ref * 1e3:.1f} ms): {overhead * 1e3:.1f} ms\n")
    print("| run | GEMMs per option | predicted GEMM time / BF16 | predicted step | measured step | error |"
          " measured GEMM time / BF16 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        r["predicted_step_s"] = overhead + r["gemm_s"]
        r["error"] = r["measured_step_s"] / r["predicted_step_s"] - 1
        r["gemm_ratio_measured"] = (r["measured_step_s"] - overhead) / ref
        print(f"| {r['arm']} | {', '.join(f'{k} {v}' for k, v in sorted(r['options'].items()))} "
              f"| {r['gemm_ratio_predicted']:.3f}x | {r['predicted_step_s'] * 1e3:.1f} ms "
              f"| {r['measured_step_s'] * 1e3:.1f} ms | {r['error'] * 100:+.1f}% | {r['gemm_ratio_measured']:.3f}x |")
    t = rows[-1]
    print(f"\ntime budget {budget}x: the solver's plan predicts {t['gemm_ratio_predicted']:.3f}x "
          f"(plan file time_ratio {solver_ratio}), the run measured {t['gemm_ratio_measured']:.3f}x "
          f"({(t['gemm_ratio_measured'] / budget - 1) * 100:+.1f}% of the budget)")
    if a.json:
        json.dump({"budget": budget, "fastest": fastest, "uniform": uniform, "reference_gemm_s": ref,
                   "non_gemm_s": overhead, "table": table_path, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
