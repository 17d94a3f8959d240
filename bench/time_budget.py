#!/usr/bin/env python3
"""Does a plan under precision.budget_unit = time run in the time it
predicts? (issue 34; docs/method.md "Budget in measured time").

One run on one machine, in this order:
  1. `snip doctor --calibrate` times every GEMM of the model (configs/study.toml
     by default) under each option and writes RUN/gemm_times.json, once per
     --calibration (default both: in_step, inside training steps of the
     model, and isolated, each GEMM alone);
  2. `snip train` (with that table) for --steps steps under policy none (every GEMM in BF16),
     uniform-<option> for each option, and precision.policy = snip with
     budget_unit = time at per-GEMM granularity and a budget half-way between
     the fastest plan the table allows and the fastest uniform plan (so the
     solver has to mix options to meet it), one such run per table;
  3. for each run: its plan's predicted GEMM seconds per step (the table's
     seconds summed over the plan's items, the same sum the planner
     constrains), the measured step time (median step_s over the steps after
     the BF16 warm-up, stats steps excluded), and the prediction of the step
     time: measured BF16 step - predicted BF16 GEMM seconds (everything that
     is not a linear GEMM: attention, norms, the optimizer, the LM head) +
     the plan's predicted GEMM seconds.

Prints, per table, a Markdown table with each run's predicted and measured step time,
the error of the prediction, and, for the time-budget run, the measured
GEMM time ratio ((measured step - non-GEMM seconds) / BF16 GEMM seconds)
against its budget. The tolerance stated in docs/benchmarks.md is what this
prints, not an assertion: speed is measured here, not timed in tests.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/time_budget.py \\
        [--snip build/snip] [--config configs/study.toml] [--steps 60] [--calibration both] [--json OUT]

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


def gemm_seconds(cfg, table, options):
    """Seconds per training step of every linear GEMM of a Llama config
    (`cfg`: its parsed TOML) at each of `options`, from a snip-gemm-times
    table (`table`: its parsed JSON): {"model.layers.L.<proj>:<gemm>":
    {option: seconds}}. A layer of IN -> OUT on T = batch_size x seq_len
    rows runs fprop {T, IN, OUT}, dgrad {T, OUT, IN}, wgrad {OUT, T, IN}
    (docs/method.md), each train.grad_accum times per step. KeyError for a
    GEMM the table lacks. Also scripts/study_time_budget.sh's."""
    m, t = cfg["model"], cfg["train"]
    C, I = m["hidden_size"], m["intermediate_size"]
    KV = C // m["num_attention_heads"] * m["num_key_value_heads"]
    T = t["batch_size"] * t["seq_len"]
    dims = {"self_attn.q_proj": (C, C), "self_attn.k_proj": (C, KV), "self_attn.v_proj": (C, KV),
            "self_attn.o_proj": (C, C), "mlp.gate_proj": (C, I), "mlp.up_proj": (C, I), "mlp.down_proj": (I, C)}
    accum = t.get("grad_accum", 1)
    look = {(e["gemm"], e["m"], e["k"], e["n"], e["option"]): e["seconds"] for e in table["entries"]}
    secs = {}
    for layer in range(m["num_hidden_layers"]):
        for proj, (i, o) in dims.items():
            for g, shape in (("fprop", (T, i, o)), ("dgrad", (T, o, i)), ("wgrad", (o, T, i))):
                secs[f"model.layers.{layer}.{proj}:{g}"] = {opt: accum * look[(g, *shape, opt)] for opt in options}
    return secs


def layer_items(plan):
    """{item name: option} of a plan file's items."""
    return {it["name"]: it["option"] for it in plan["items"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snip", default="build/snip")
    ap.add_argument("--config", default="configs/study.toml")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--keep", help="keep the runs in this folder (default: a temporary folder, removed at the end)")
    ap.add_argument("--calibration", choices=["in_step", "isolated", "both"], default="both",
                    help="which GEMM-time table(s) to predict with (snip doctor --calibrate --calibration); both: "
                         "the same BF16 and uniform runs predicted by each table, and one time-budget run per table")
    a = ap.parse_args()
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        measure(a, a.keep)
    else:  # removed afterwards, failures included
        with tempfile.TemporaryDirectory(prefix="snip-time-budget-") as out:
            measure(a, out)


def measure(a, out):
    """Calibrates, trains and prints the tables of main()'s arguments `a`
    with every run folder under `out`."""
    calibrations = ["in_step", "isolated"] if a.calibration == "both" else [a.calibration]
    tables = {}
    for c in calibrations:
        cal = os.path.join(out, f"cal-{c}")
        path = os.path.join(cal, "gemm_times.json")
        if os.path.exists(path):  # --keep of an earlier run: its table (doctor never replaces one)
            print(f"time_budget: reusing {path}", file=sys.stderr)
        else:
            print(f"time_budget: calibrating GEMM times ({a.config}, {c}) into {cal}", file=sys.stderr)
            run([a.snip, "doctor", "--calibrate", "--config", a.config, "--run", cal, "--calibration", c])
        tables[c] = (path, json.load(open(path)))
    options = sorted({e["option"] for e in tables[calibrations[0]][1]["entries"]} - {"bf16"})

    common = ["--config", a.config, "--set", f"train.max_steps={a.steps}", "--set", f"train.eval_interval={a.steps}",
              "--set", f"precision.warmup_steps={WARMUP}", "--set", "precision.final_high_precision_fraction=0"]

    def train(name, sets):
        d = os.path.join(out, name)
        print(f"time_budget: training {name} ({a.steps} steps)", file=sys.stderr)
        run([a.snip, "train", "--run-dir", d] + common + [x for s in sets for x in ("--set", s)])
        return d

    cfg = tomllib.load(open(a.config, "rb"))
    secs = {c: gemm_seconds(cfg, tables[c][1], options + ["bf16"]) for c in calibrations}
    ref = {c: sum(s["bf16"] for s in secs[c].values()) for c in calibrations}
    budget = {}
    for c in calibrations:
        fastest = sum(min(s[o] for o in options) for s in secs[c].values()) / ref[c]
        uniform = {o: sum(s[o] for s in secs[c].values()) / ref[c] for o in options}
        budget[c] = round((fastest + min(uniform.values())) / 2, 4)
        print(f"time_budget: {c} table: BF16 GEMMs {ref[c] * 1e3:.2f} ms/step; fastest plan {fastest:.3f}x, uniform "
              + ", ".join(f"{o} {r:.3f}x" for o, r in uniform.items()) + f"; time budget {budget[c]}x", file=sys.stderr)

    first = tables[calibrations[0]][0]
    names = list(secs[calibrations[0]])
    arms = [("none", ["precision.policy=none"], {n: "bf16" for n in names}, None)]
    for o in options:
        arms.append((f"uniform-{o}", [f"precision.policy=uniform-{o}", f"precision.gemm_times={first}"],
                     {n: o for n in names}, None))
    for c in calibrations:
        arms.append((f"snip time {budget[c]}x ({c} table)",
                     ["precision.policy=snip", "precision.granularity=gemm", "precision.budget_unit=time",
                      f"precision.budget={budget[c]}", f"precision.initial_interval={a.steps}",
                      f"precision.gemm_times={tables[c][0]}"], None, c))
    runs = []
    for name, sets, assign, own in arms:
        d = train(name.replace(" ", "-").replace("(", "").replace(")", ""), sets)
        ratio = None
        if assign is None:  # the solver's plan
            plan = [json.load(open(f)) for f in glob.glob(os.path.join(d, "plans", "step-*.json"))]
            plan = [p for p in plan if p.get("phase") == "plan"]
            if len(plan) != 1:
                sys.exit(f"time_budget: expected one plan-phase plan in {d}, got {len(plan)}")
            assign = layer_items(plan[0])
            ratio = plan[0].get("time_ratio")
            # The planner's own sum of the chosen seconds: the same table.
            mine = sum(secs[own][n][o] for n, o in assign.items()) / ref[own]
            if abs(mine - ratio) > 1e-6 * mine:
                sys.exit(f"time_budget: the plan's time_ratio {ratio} differs from the table's sum {mine}")
        stats = {int(os.path.basename(f)[5:-5]) for f in glob.glob(os.path.join(d, "plans", "step-*.json"))}
        steps = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"step_s"' in l]
        # After the warm-up; a stats step (the step before a plan) excluded.
        measured = statistics.median(r["step_s"] for r in steps
                                     if r["step"] > WARMUP + 2 and r["step"] not in stats
                                     and r["step"] + 1 not in stats)
        counts = {}
        for o in assign.values():
            counts[o] = counts.get(o, 0) + 1
        runs.append({"arm": name, "assign": assign, "measured_step_s": measured, "options": counts,
                     "own_table": own, "time_ratio": ratio})
    result = {"steps": a.steps, "calibrations": {}}
    for c in calibrations:
        overhead = runs[0]["measured_step_s"] - ref[c]
        print(f"\n### {c} table ({tables[c][0]})\n\nnon-GEMM seconds per step (measured BF16 step "
              f"{runs[0]['measured_step_s'] * 1e3:.1f} ms - predicted BF16 GEMMs {ref[c] * 1e3:.1f} ms): "
              f"{overhead * 1e3:.1f} ms\n")
        print("| run | GEMMs per option | predicted GEMM time / BF16 | predicted step | measured step | error |"
              " measured GEMM time / BF16 |")
        print("|---|---|---|---|---|---|---|")
        rows = []
        for r in runs:
            if r["own_table"] not in (None, c):
                continue
            gemm = sum(secs[c][n][o] for n, o in r["assign"].items())
            row = {"arm": r["arm"], "options": r["options"], "gemm_s": gemm, "gemm_ratio_predicted": gemm / ref[c],
                   "measured_step_s": r["measured_step_s"], "predicted_step_s": overhead + gemm}
            row["error"] = row["measured_step_s"] / row["predicted_step_s"] - 1
            row["gemm_ratio_measured"] = (row["measured_step_s"] - overhead) / ref[c]
            rows.append(row)
            print(f"| {row['arm']} | {', '.join(f'{k} {v}' for k, v in sorted(row['options'].items()))} "
                  f"| {row['gemm_ratio_predicted']:.3f}x | {row['predicted_step_s'] * 1e3:.1f} ms "
                  f"| {row['measured_step_s'] * 1e3:.1f} ms | {row['error'] * 100:+.1f}% "
                  f"| {row['gemm_ratio_measured']:.3f}x |")
        t = rows[-1]
        own = [r for r in runs if r["own_table"] == c][0]
        print(f"\ntime budget {budget[c]}x: the solver's plan predicts {t['gemm_ratio_predicted']:.3f}x "
              f"(plan file time_ratio {own['time_ratio']}), the run measured {t['gemm_ratio_measured']:.3f}x "
              f"({(t['gemm_ratio_measured'] / budget[c] - 1) * 100:+.1f}% of the budget)")
        result["calibrations"][c] = {"budget": budget[c], "reference_gemm_s": ref[c], "non_gemm_s": overhead,
                                     "table": tables[c][0], "rows": rows}
    if a.json:
        json.dump(result, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
