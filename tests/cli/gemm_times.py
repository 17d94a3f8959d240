#!/usr/bin/env python3
"""precision.budget_unit = time through the real binary (docs/method.md
"Budget in measured time"):

  calibrate    `snip doctor --calibrate --config FILE --run RUN` (in training
               steps of the model, or --calibration isolated) writes a
               valid RUN/gemm_times.json: every distinct GEMM shape of the
               micro model x each option x {fprop, dgrad, wgrad}, seconds > 0
  train        a time-budget run with that table: its plans carry the
               predicted GEMM seconds beside the BF16 ones and honour the
               budget; `snip plan show` prints them and the measured step
               time; the table is copied to RUN/gemm_times.json; a run with
               no table calibrates at start (in training steps) and writes
               one, and trains the same losses and plans bit for bit as a
               run given that table as a file; policy none times nothing;
               a resume under budget_unit flops warns and plans with the
               configured budget; an infeasible budget after calibrating
               leaves no folder and says how to keep a calibration
  bad tables   missing file, bad JSON, a bad field, a table of another
               model (missing shape), another device or GEMM dtype: one
               line naming the file and the field, exit 2, and no run
               folder files (nothing partial); doctor --calibrate without
               --run likewise

usage: gemm_times.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
c = Checks(snip)

PRECISION = """max_steps = 8
[precision]
policy = "snip"
options = "fp4,fp8,bf16"
warmup_steps = 2
initial_interval = 3
final_interval = 3
budget_unit = "time"
budget = {budget}
{extra}
"""

with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "micro.toml")
    micro_toml(cfg, data, PRECISION.format(budget=1.0, extra=""))

    # calibrate
    cal = os.path.join(tmp, "cal")
    rc, out, err = c.run(["doctor", "--calibrate", "--config", cfg, "--run", cal, "--repeats", "3"], timeout=120)
    path = os.path.join(cal, "gemm_times.json")
    c.check(rc == 0 and os.path.isfile(path), "calibrate writes RUN/gemm_times.json", f"rc={rc} {err}")
    t = json.load(open(path))
    c.check(t["units"] == "seconds" and t["device"] == "cpu" and t["format"] == "snip-gemm-times"
            and "in training steps" in t["machine"] and "3 timed steps per option" in err,
            "calibrate header (in step: the config's precision.calibration default)",
            str({k: v for k, v in t.items() if k != "entries"}))
    # Micro model: C = 32, I = 64, NH = 2, NKV = 1 -> (in, out) of q/o 32x32,
    # k/v 32x16, gate/up 32x64, down 64x32: 4 distinct shapes; options bf16,
    # fp4, fp8 (warmup bf16, final fp8): 4 x 3 x 3 = 36 entries at T = 2x16 rows.
    want = set()
    for i, o in [(32, 32), (32, 16), (32, 64), (64, 32)]:
        for opt in ("bf16", "fp4", "fp8"):
            want |= {("fprop", 32, i, o, opt), ("dgrad", 32, o, i, opt), ("wgrad", o, 32, i, opt)}
    got = {(e["gemm"], e["m"], e["k"], e["n"], e["option"]) for e in t["entries"]}
    c.check(got == want, "calibrate covers every distinct GEMM x option", f"{sorted(got ^ want)}")
    c.check(all(e["seconds"] > 0 and e["repeats"] == 3 for e in t["entries"]), "calibrate entries positive")

    # train with the table: a hand-made copy where FP4 is the fastest
    # everywhere, so the budget binds (on this CPU emulation makes fp4/fp8
    # slower than bf16, which would make any budget < 1 infeasible).
    hand = json.loads(json.dumps(t))
    for e in hand["entries"]:
        e["seconds"] = {"bf16": 4e-3, "fp8": 2e-3, "fp4": 1e-3}[e["option"]]
    hand_path = os.path.join(tmp, "hand.json")
    json.dump(hand, open(hand_path, "w"))
    cfg2 = os.path.join(tmp, "timed.toml")
    micro_toml(cfg2, data, PRECISION.format(budget=0.5, extra=f'gemm_times = "{hand_path}"'))
    run = os.path.join(tmp, "run")
    rc, out, err = c.run(["train", "-c", cfg2, "--run-dir", run], timeout=120)
    c.check(rc == 0, "train with a time budget", err[-2000:])
    plans = sorted(os.listdir(os.path.join(run, "plans")), key=lambda n: int(n[5:-5]))
    plan = [json.load(open(os.path.join(run, "plans", p))) for p in plans]
    planned = [p for p in plan if p["phase"] == "plan"]
    c.check(planned and all(p["time_budget"] == 0.5 and p["gemm_seconds"] <= 0.5 * p["reference_gemm_seconds"] + 1e-12
                            for p in planned), "plans honour the time budget",
            str([(p.get("gemm_seconds"), p.get("reference_gemm_seconds")) for p in planned]))
    # 14 GEMM-seconds per micro-batch would be 7 layers x 3 GEMMs x 4 ms at bf16.
    c.check(planned and abs(planned[0]["reference_gemm_seconds"] - 7 * 3 * 4e-3) < 1e-12,
            "reference time = sum of the table's bf16 entries", str(planned[0].get("reference_gemm_seconds")))
    c.check(os.path.isfile(os.path.join(run, "gemm_times.json")), "the table is copied to RUN/gemm_times.json")
    rc, out, err = c.run(["plan", "show", run])
    c.check(rc == 0 and "GEMM time:" in out and "ms/step predicted" in out and "measured:" in out,
            "plan show prints predicted and measured times", out[-800:])

    # snip plan --config --stats --gemm-times --time-budget: the plan against
    # brute force over every assignment of the micro model's 7 layers to
    # fp4/fp8 (2^7), on a table where FP4 is slower than FP8 for the small
    # layers (a fixed overhead) and faster for the large ones, so the time
    # budget, not the FLOPs, decides which layers go FP4.
    def secs(e):
        size = e["m"] * e["k"] * e["n"] / (32 * 32 * 32)
        return {"bf16": 4e-3 * size, "fp8": 2e-3 * size, "fp4": 1e-3 * size + 1.5e-3}[e["option"]]
    shaped = json.loads(json.dumps(t))
    for e in shaped["entries"]:
        e["seconds"] = secs(e)
    shaped_path = os.path.join(tmp, "shaped.json")
    json.dump(shaped, open(shaped_path, "w"))
    stats = os.path.join(run, "stats", sorted(os.listdir(os.path.join(run, "stats")))[0])
    layers = json.load(open(stats))["layers"]
    T = 2 * 16
    dims = {"q_proj": (32, 32), "k_proj": (32, 16), "v_proj": (32, 16), "o_proj": (32, 32), "gate_proj": (32, 64),
            "up_proj": (32, 64), "down_proj": (64, 32)}
    look = {(e["gemm"], e["m"], e["k"], e["n"], e["option"]): e["seconds"] for e in shaped["entries"]}
    def layer_s(name, opt):
        i, o = dims[name.rsplit(".", 1)[1]]
        return sum(look[(g, *sh, opt)] for g, sh in (("fprop", (T, i, o)), ("dgrad", (T, o, i)), ("wgrad", (o, T, i))))
    ref = sum(layer_s(l["name"], "bf16") for l in layers)
    best = {}
    for bits in range(2 ** len(layers)):
        a = ["fp4" if bits >> k & 1 else "fp8" for k in range(len(layers))]
        tm = sum(layer_s(l["name"], o) for l, o in zip(layers, a)) / ref
        q = sum(l["q"][o] for l, o in zip(layers, a))
        best[tm] = min(best.get(tm, float("inf")), q)
    fastest, all_fp8 = min(best), sum(layer_s(l["name"], "fp8") for l in layers) / ref
    budget = round((fastest + all_fp8) / 2, 6)
    optimum = min(q for tm, q in best.items() if tm <= budget + 1e-12)
    rc, out, err = c.run(["plan", "--config", cfg2, "--stats", stats, "--options", "fp4,fp8", "--gemm-times",
                          shaped_path, "--time-budget", str(budget), "--json"])
    j = json.loads(out) if rc == 0 else {}
    got_a = j.get("assignments", {})
    got_q = sum(l["q"][got_a.get(l["name"], "fp8")] for l in layers)
    got_t = sum(layer_s(l["name"], got_a.get(l["name"], "fp8")) for l in layers) / ref
    c.check(rc == 0 and fastest < budget < all_fp8 and abs(got_q - optimum) <= 1e-12 * max(1.0, optimum)
            and got_t <= budget + 1e-12 and abs(j.get("time_ratio", -1) - got_t) < 1e-9
            and "fp4" in got_a.values() and "fp8" in got_a.values(),
            "snip plan --time-budget: the brute-force optimum, a mix of fp4 and fp8",
            f"rc={rc} {err[-600:]} budget={budget} fastest={fastest} fp8={all_fp8} q={got_q} opt={optimum} t={got_t}")
    rc, out, err = c.run(["plan", "--config", cfg2, "--stats", stats, "--options", "fp4,fp8", "--gemm-times",
                          shaped_path, "--time-budget", str(budget)])
    c.check(rc == 0 and "budget:    linear-GEMM time <= " in out and "ms/step predicted" in out,
            "snip plan --time-budget prints the budget and the predicted GEMM time", out[-600:])
    # (after the note on where Q comes from)
    rc, out, err = c.run(["plan", "--config", cfg2, "--stats", stats, "--options", "fp4,fp8", "--gemm-times",
                          shaped_path, "--time-budget", str(round(fastest * 0.9, 6))])
    c.check(rc == 2 and err.splitlines()[-1].startswith("snip: error: time budget ")
            and f"is infeasible: the fastest plan takes {fastest:.3f} of the bf16 GEMM time" in err,
            "snip plan --time-budget below the fastest plan", err[-600:])
    c.expect_error("snip plan --time-budget without a table",
                   ["plan", "--config", cfg, "--stats", stats, "--time-budget", "0.9"], "--gemm-times FILE")
    c.expect_error("snip plan --time-budget without --config",
                   ["plan", "--stats", stats, "--time-budget", "0.9"], "--time-budget needs --config")
    # A step of a fraction of a micro-batch, a table of another GEMM dtype,
    # a bad budget: refused, one line, before the model summary.
    c.expect_error("snip plan --gemm-times with a partial micro-batch",
                   ["plan", "--config", cfg2, "--stats", stats, "--gemm-times", shaped_path, "--time-budget", "0.8",
                    "--tokens-per-step", "48"], "expected a multiple of batch_size x seq_len = 32")
    fp32 = dict(shaped, gemm_dtype="fp32")
    fp32_path = os.path.join(tmp, "fp32.json")
    json.dump(fp32, open(fp32_path, "w"))
    c.expect_error("snip plan --gemm-times of another GEMM dtype",
                   ["plan", "--config", cfg2, "--stats", stats, "--gemm-times", fp32_path, "--time-budget", "0.8"],
                   f'{fp32_path}: gemm_dtype: expected "bf16"')
    for bad_budget in ("0", "-1", "nan", "1e7"):
        rc, out, err = c.run(["plan", "--config", cfg2, "--stats", stats, "--gemm-times", shaped_path,
                              "--time-budget", bad_budget])
        c.check(rc == 2 and out == "" and "--time-budget: expected a ratio" in err,
                f"snip plan --time-budget {bad_budget}: refused before printing", f"rc={rc} out={out[:200]!r} {err}")
    # A sweep over shares: each point's predicted GEMM time with the table.
    rc, out, err = c.run(["plan", "--config", cfg2, "--stats", stats, "--options", "fp4,fp8", "--gemm-times",
                          shaped_path, "--sweep", "--steps", "4", "--json"])
    pts = json.loads(out)["points"] if rc == 0 else []
    c.check(len(pts) == 5 and all(abs(p["time_ratio"] - sum(layer_s(l["name"], p["assignments"][l["name"]])
                                                             for l in layers) / ref) < 1e-9 for p in pts),
            "snip plan --sweep --gemm-times: every point's time ratio is the table's", f"rc={rc} {err[-400:]}")
    c.expect_error("snip plan: two budgets",
                   ["plan", "--config", cfg2, "--stats", stats, "--gemm-times", shaped_path, "--time-budget", "0.9",
                    "--budget", "0.5"], "expected one of --budget, --cost-budget or --time-budget")

    # no table: calibrate at start (budget 1.0 with bf16 allowed is always feasible)
    run2 = os.path.join(tmp, "run2")
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", run2], timeout=120)
    c.check(rc == 0 and os.path.isfile(os.path.join(run2, "gemm_times.json")), "calibration at start", err[-1500:])
    # In step by default (precision.calibration): one progress line per
    # option, each GEMM timed inside training steps of the run's model.
    t2 = json.load(open(os.path.join(run2, "gemm_times.json")))
    c.check("in training steps" in t2["machine"] and err.count("calibrate: option ") == 3
            and {(e["gemm"], e["m"], e["k"], e["n"], e["option"]) for e in t2["entries"]} == want,
            "the calibration at start runs in training steps and covers every GEMM x option",
            t2["machine"] + " " + err[-800:])
    # It leaves no trace in the run: the same config planning with the same
    # table given as a file (no calibration) trains bit for bit the same
    # losses (the passes drew from no run RNG, wrote no gradient, touched no
    # quantizer state, left every precision as it was).
    table2 = os.path.join(tmp, "run2-table.json")
    with open(table2, "w") as f:
        json.dump(t2, f)
    run2b = os.path.join(tmp, "run2b")
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", run2b, "--set", f"precision.gemm_times={table2}"],
                         timeout=120)
    losses = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, open(os.path.join(d, "metrics.jsonl")))
                        if "loss" in r and "step_s" in r]
    plans = lambda d: {f: json.load(open(os.path.join(d, "plans", f)))["assignments"]
                       for f in sorted(os.listdir(os.path.join(d, "plans")))}
    c.check(rc == 0 and "calibrate:" not in err and losses(run2) == losses(run2b) and len(losses(run2)) == 8
            and plans(run2) == plans(run2b),
            "the in-step calibration changes no loss and no plan", f"rc={rc} {losses(run2)} {losses(run2b)}")
    # A new run in the folder `snip doctor --calibrate --run` wrote plans
    # with that table (no new calibration; the file unchanged).
    calq = os.path.join(tmp, "cal-q")
    # -q: the table, no progress lines.
    rc, out, err = c.run(["doctor", "--calibrate", "-q", "--config", cfg, "--run", os.path.join(tmp, "cal-q"),
                          "--repeats", "1"], timeout=120)
    c.check(rc == 0 and os.path.isfile(os.path.join(tmp, "cal-q", "gemm_times.json")) and "calibrate:" not in err,
            "doctor --calibrate -q prints no progress", err[-500:])
    before = open(os.path.join(calq, "gemm_times.json")).read()
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", calq], timeout=120)
    c.check(rc == 0 and "calibrate: option" not in err and "planning with " + os.path.join(calq, "gemm_times.json") in err
            and open(os.path.join(calq, "gemm_times.json")).read() == before,
            "a run in doctor's --run folder plans with doctor's table", err[-800:])
    # --resume with another precision.gemm_times: the run's own table, and a warning saying so.
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", calq, "--resume", "--set", "train.max_steps=10",
                          "--set", f"precision.gemm_times={table2}"], timeout=120)
    c.check(rc == 0 and "is not read on --resume" in err and open(os.path.join(calq, "gemm_times.json")).read() == before,
            "--resume keeps the run's table over a new precision.gemm_times, with a warning", err[-800:])
    # --calibration isolated: each GEMM alone, the same entries.
    cal_iso = os.path.join(tmp, "cal-iso")
    rc, out, err = c.run(["doctor", "--calibrate", "--config", cfg, "--run", cal_iso, "--calibration", "isolated",
                          "--repeats", "2"], timeout=120)
    ti = json.load(open(os.path.join(cal_iso, "gemm_times.json"))) if rc == 0 else {"machine": "", "entries": []}
    c.check(rc == 0 and "in training steps" not in ti["machine"] and "calibrate: shape 4/4" in err
            and {(e["gemm"], e["m"], e["k"], e["n"], e["option"]) for e in ti["entries"]} == want,
            "doctor --calibration isolated times each GEMM alone", err[-800:])

    # --resume plans with the run's own RUN/gemm_times.json: no new calibration
    # (run2), and a table file given at the start may be gone since (run).
    saved2 = open(os.path.join(run2, "gemm_times.json")).read()
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", run2, "--resume", "--set", "train.max_steps=10"],
                         timeout=120)
    c.check(rc == 0 and "calibrate:" not in err and open(os.path.join(run2, "gemm_times.json")).read() == saved2,
            "a resumed run keeps its calibrated table", err[-1500:])
    # --resume under the other budget unit: the saved time ratio (1.5, no
    # FP4 share) means nothing there, so the configured budget stands, with
    # a warning, and the next checkpoint holds it with its unit.
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", run2, "--resume", "--set", "train.max_steps=12",
                          "--set", "precision.budget=1.5"], timeout=120)
    c.check(rc == 0, "--resume with a larger time budget", err[-1500:])
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", run2, "--resume", "--set", "train.max_steps=14",
                          "--set", "precision.budget_unit=flops", "--set", "precision.budget=0.5"], timeout=120)
    st_path = os.path.join(run2, "checkpoints", "step-14", "trainer_state.json")
    pst = json.load(open(st_path))["precision"] if rc == 0 and os.path.isfile(st_path) else {}
    c.check(rc == 0 and "saved precision budget 1.5 is in time and precision.budget_unit is now flops: the next "
            "plan uses the configured budget 0.5" in err and pst.get("budget") == 0.5
            and pst.get("budget_unit") == "flops",
            "--resume with budget_unit flops after a time budget of 1.5 warns and keeps the configured budget",
            f"rc={rc} {pst} {err[-1500:]}")
    gone = os.path.join(tmp, "gone.json")
    json.dump(hand, open(gone, "w"))
    run3 = os.path.join(tmp, "run3")
    cfg3 = os.path.join(tmp, "gone.toml")
    micro_toml(cfg3, data, PRECISION.format(budget=0.5, extra=f'gemm_times = "{gone}"'))
    rc, out, err = c.run(["train", "-c", cfg3, "--run-dir", run3], timeout=120)
    os.remove(gone)
    rc, out, err = c.run(["train", "-c", cfg3, "--run-dir", run3, "--resume", "--set", "train.max_steps=10"],
                         timeout=120)
    c.check(rc == 0, "a resumed run reads RUN/gemm_times.json, not the file it started from", err[-1500:])

    # An infeasible time budget after a calibration at start: the run folder
    # goes (nothing partial) and the error says how to keep a calibration.
    tight = os.path.join(tmp, "tight.toml")
    micro_toml(tight, data, PRECISION.format(budget=0.01, extra=""))
    run_tight = os.path.join(tmp, "run-tight")
    rc, out, err = c.run(["train", "-c", tight, "--run-dir", run_tight], timeout=120)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    c.check(rc == 2 and last.startswith("snip: error: time budget 0.01 is infeasible")
            and "calibration is not kept: `snip doctor --calibrate" in last and not os.path.exists(run_tight),
            "an infeasible time budget after calibrating: one error line saying how to keep one, no folder",
            f"rc={rc} {err[-1500:]}")

    # policy none makes no plans: a time budget there times nothing (no
    # calibration, no table in the run folder), and the trainer says the
    # option has no effect.
    run_none = os.path.join(tmp, "run-none")
    rc, out, err = c.run(["train", "-c", cfg, "--run-dir", run_none, "--set", "precision.policy=none",
                          "--set", "train.max_steps=3"], timeout=120)
    c.check(rc == 0 and "calibrate:" not in err and "precision.budget_unit = 'time'" in err
            and "no effect under precision.policy = none" in err
            and not os.path.exists(os.path.join(run_none, "gemm_times.json")),
            "policy none with budget_unit time calibrates nothing and warns", err[-1500:])

    # bad tables: one line naming file and field, exit 2, no run folder left
    def bad(name, table_text, needle):
        p = os.path.join(tmp, name + ".json")
        if table_text is not None:
            open(p, "w").write(table_text)
        cf = os.path.join(tmp, name + ".toml")
        micro_toml(cf, data, PRECISION.format(budget=0.5, extra=f'gemm_times = "{p}"'))
        rd = os.path.join(tmp, "run-" + name)
        c.expect_error("bad table: " + name, ["train", "-c", cf, "--run-dir", rd], needle, absent=rd)

    bad("missing", None, "precision.gemm_times: " + os.path.join(tmp, "missing.json") + ": no such file")
    bad("syntax", "{not json", "syntax.json")
    neg = json.loads(json.dumps(hand))
    neg["entries"][5]["seconds"] = -1
    bad("negative", json.dumps(neg), "negative.json: entries[5].seconds: expected seconds per call in (0, 86400], got -1")
    other = json.loads(json.dumps(hand))
    other["entries"] = [e for e in other["entries"] if not (e["gemm"] == "wgrad" and e["option"] == "fp4")]
    bad("other-model", json.dumps(other), "other-model.json: no entry for wgrad")
    dev = json.loads(json.dumps(hand))
    dev["device"] = "cuda:0"
    bad("device", json.dumps(dev), "device.json: device: expected a table measured on cpu")
    dt = json.loads(json.dumps(hand))
    dt["gemm_dtype"] = "fp32"
    bad("dtype", json.dumps(dt), "dtype.json: gemm_dtype: expected \"bf16\"")
    c.expect_error("calibrate without --run", ["doctor", "--calibrate", "--config", cfg], "expected --run RUN")
    # A run's own table is not replaced (its plans and a --resume read it),
    # and a --run that is a file is refused before the timing.
    c.expect_error("calibrate over a run's table", ["doctor", "--calibrate", "--config", cfg, "--run", cal],
                   "gemm_times.json exists", untouched=cal)
    afile = os.path.join(tmp, "afile")
    open(afile, "w").write("x")
    c.expect_error("calibrate into a file", ["doctor", "--calibrate", "--config", cfg, "--run", afile],
                   "--run " + afile + ": expected a folder, got a file")
    c.expect_error("calibrate with --json", ["doctor", "--calibrate", "--json", "--config", cfg, "--run",
                                             os.path.join(tmp, "cal-json")], "excludes")
    # --run, --repeats and --max-seconds mean nothing without --calibrate:
    # refused rather than ignored (the user meant to calibrate).
    for flag in (["--run", os.path.join(tmp, "nocal")], ["--repeats", "3"], ["--max-seconds", "5"]):
        c.expect_error(f"doctor {flag[0]} without --calibrate", ["doctor", "--config", cfg] + flag,
                       f"{flag[0]} requires --calibrate")
    c.check(not os.path.exists(os.path.join(tmp, "nocal")), "doctor --run without --calibrate writes no folder")
c.finish()
