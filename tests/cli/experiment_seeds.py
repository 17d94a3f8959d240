#!/usr/bin/env python3
"""`snip experiment --seeds` (the shortened study): the micro model,
arms none, uniform-fp4, snip-0.75 and snip-gemm-0.75 with 2 seeds, 8 steps.
The statistics of results.json/md are checked against values computed here by
hand from each run's own summary.json (mean, sample standard deviation, paired
differences, the 95% Student-t interval with the published quantile
t(0.975, 1) = 12.7062, t(0.975, 2) = 4.3027); the seeds really differ (train.seed
and precision.seed per run, different losses); a third seed of one arm joins
the table and the pairing uses only common seeds; a second call reuses every
run; --no-train re-tabulates the same numbers; the chart has a band per arm;
mixing layouts or setting precision.seed with --seeds is a one-line error.

usage: experiment_seeds.py SNIP_BINARY PREPARED_DATA_DIR
"""
import csv
import json
import math
import os
import re
import shutil
import sys
import tempfile
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="snip-exp-seeds-")
T = Checks(snip)
check = T.check
T_975 = {1: 12.706204736174707, 2: 4.302652729911275}  # Student t, two-sided 95%, df = 1, 2

cfg = os.path.join(tmp, "micro.toml")
micro_toml(cfg, data, """max_steps = 8
lr = 1e-2
warmup_steps = 2
eval_interval = 4
eval_batches = 4
log_interval = 1000
checkpoint_interval = 0
[precision]
warmup_steps = 2
initial_interval = 3
final_interval = 3""")
out = os.path.join(tmp, "exp")
arms = ["none", "uniform-fp4", "snip-0.75", "snip-gemm-0.75"]


def experiment(*extra, timeout=600):
    return T.run(["experiment", "--config", cfg, "--out", out] + list(extra), timeout=timeout)


rc, stdout, err = experiment("--arms", ",".join(arms), "--seeds", "2")
check(rc == 0, "seeded experiment runs", err[-2000:])
if rc != 0:
    T.finish()

# Each run in OUT/<arm>/seed-<s>, trained with that seed.
vals = {}
for a in arms:
    for s in (1234, 1235):
        d = f"{out}/{a}/seed-{s}"
        conf = tomllib.load(open(f"{d}/config.toml", "rb"))
        check(conf["train"]["seed"] == s and conf["precision"]["seed"] == s,
              f"{a} seed {s}: train.seed and precision.seed", (conf["train"]["seed"], conf["precision"]["seed"]))
        vals[(a, s)] = json.load(open(f"{d}/summary.json"))["final_val_loss"]
gran = {a: tomllib.load(open(f"{out}/{a}/seed-1234/config.toml", "rb"))["precision"]["granularity"] for a in arms}
check(gran["snip-gemm-0.75"] == "gemm" and gran["snip-0.75"] == "layer", "snip-gemm-0.75 plans per GEMM", gran)
check(vals[("none", 1234)] != vals[("none", 1235)], "two seeds give two runs", vals)


def mean(v):
    return sum(v) / len(v)


def sd(v):
    m = mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def check_tables(seeds_of, label):
    res = json.load(open(f"{out}/results.json"))
    check(res["seeded"] and res["reference"] == "none", label + ": seeded, reference none", res.get("reference"))
    by = {r["arm"]: r for r in res["arms"]}
    check(list(by) == arms, label + ": arms in order", list(by))
    for a in arms:
        r = by[a]
        v = [vals[(a, s)] for s in seeds_of[a]]
        check(r["seeds"] == seeds_of[a], f"{label}: {a} seeds", r["seeds"])
        check([x["final_val_loss"] for x in r["runs"]] == v, f"{label}: {a} per-seed values = summaries", r["runs"])
        check(abs(r["mean"] - mean(v)) < 1e-12 and abs(r["sd"] - sd(v)) < 1e-12, f"{label}: {a} mean and sd",
              (r["mean"], mean(v), r["sd"], sd(v)))
        gap = 100 * (mean(v) - by["none"]["mean"]) / by["none"]["mean"]
        check(abs(r["gap_pct"] - gap) < 1e-9, f"{label}: {a} gap", (r["gap_pct"], gap))
    nf = res["noise_floor"]
    ref = [vals[("none", s)] for s in seeds_of["none"]]
    check(nf["arm"] == "none" and nf["n"] == len(ref) and abs(nf["sd"] - sd(ref)) < 1e-12, label + ": noise floor", nf)
    md = open(f"{out}/results.md").read()
    check(f"over {len(ref)} seeds" in md and f"± {sd(ref):.4f}" in md, label + ": noise floor in the header",
          md[:300])
    pairs = {(p["a"], p["b"]): p for p in res["paired"]}
    want_pairs = [(a, "none") for a in arms[1:]] + [("snip-0.75", "uniform-fp4"), ("snip-gemm-0.75", "uniform-fp4"),
                                                    ("snip-gemm-0.75", "snip-0.75")]
    check(sorted(pairs) == sorted(want_pairs), label + ": the comparisons", sorted(pairs))
    for (a, b), p in pairs.items():
        common = [s for s in seeds_of[a] if s in seeds_of[b]]
        d = [vals[(a, s)] - vals[(b, s)] for s in common]
        half = T_975[len(d) - 1] * sd(d) / math.sqrt(len(d))
        ok = (p["seeds"] == common and all(abs(x - y) < 1e-12 for x, y in zip(p["differences"], d)) and
              abs(p["mean"] - mean(d)) < 1e-12 and abs(p["lo"] - (mean(d) - half)) < 1e-9 and
              abs(p["hi"] - (mean(d) + half)) < 1e-9 and p["interval"] == "student-t")
        check(ok, f"{label}: {a} - {b} by hand", (p, d, half))
        verdict = "A lower" if mean(d) + half < 0 else "A higher" if mean(d) - half > 0 else "not resolved"
        check(p["verdict"] == verdict, f"{label}: {a} - {b} verdict", (p["verdict"], verdict))
        check(f"| {a} | {b} | {len(d)} | {mean(d):+.4f} | [{mean(d) - half:+.4f}, {mean(d) + half:+.4f}] |" in md,
              f"{label}: {a} - {b} row in results.md", md)
    rows = list(csv.DictReader(open(f"{out}/results.csv")))
    n_runs = sum(len(s) for s in seeds_of.values())
    check(len(rows) == n_runs and all(float(r["final_val_loss"]) == vals[(r["arm"], int(r["seed"]))] for r in rows),
          label + ": the CSV holds every run's raw number", rows[:2])
    svg = open(f"{out}/val_loss.svg").read()
    check(len(re.findall(r'<path class="band"', svg)) == len(arms), label + ": a band per arm",
          re.findall(r'class="band" data-series="([^"]+)"', svg))
    names = re.findall(r'<path class="series" data-series="([^"]+)"', svg)
    check(names == [f"{a} (n={len(seeds_of[a])})" for a in arms], label + ": a mean curve per arm", names)


two = {a: [1234, 1235] for a in arms}
check_tables(two, "2 seeds")

# A second call trains nothing.
rc, stdout, err = experiment("--arms", ",".join(arms), "--seeds", "2")
check(rc == 0 and err.count("already trained") == 8 and "training (log" not in err, "second call reuses every run",
      err[-800:])

# A third seed of the reference arm: the table holds it, the pairing skips it.
rc, stdout, err = experiment("--arms", "none", "--seeds", "3")
check(rc == 0 and err.count("training (log") == 1, "one more seed trains one run", err[-800:])
vals[("none", 1236)] = json.load(open(f"{out}/none/seed-1236/summary.json"))["final_val_loss"]
three = dict(two, none=[1234, 1235, 1236])
rc, stdout, err = T.run(["experiment", "--out", out, "--no-train", "--arms", ",".join(arms)])
check(rc == 0, "--no-train re-tabulates", err)
check_tables(three, "3 reference seeds")

# Layouts do not mix; precision.seed belongs to the seeds.
T.expect_error("--seeds into an unseeded arm folder",
               ["experiment", "--config", cfg, "--out", out, "--arms", "none"], "trained with --seeds")
plain = os.path.join(tmp, "plain")
shutil.copytree(f"{out}/none/seed-1234", f"{plain}/none")
T.expect_error("unseeded arm, --seeds asked",
               ["experiment", "--config", cfg, "--out", plain, "--arms", "none", "--seeds", "2"],
               "trained without --seeds", untouched=plain)
T.expect_error("--set precision.seed with --seeds",
               ["experiment", "--config", cfg, "--out", out, "--arms", "none", "--seeds", "2", "--set",
                "precision.seed=3"], "precision.seed")
T.expect_error("-gemm on a policy that plans nothing",
               ["experiment", "--config", cfg, "--out", out, "--arms", "uniform-fp4-gemm", "--seeds", "2"],
               "no per-GEMM form")

shutil.rmtree(tmp)
T.finish()
