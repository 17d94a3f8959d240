#!/usr/bin/env python3
"""precision.recipe_file through the real binary: a recipe file's recipe
(weights E2M1 per channel with error feedback, activations E4M3 per tensor,
gradients E5M2 delayed with compensation_freq) trains the micro model under
precision.policy = uniform-<name>; the plan names it; the run keeps
recipes.json and precision.recipe_file; a run stopped by SIGTERM and resumed
has the losses of an uninterrupted run bit for bit (the checkpoint holds the
error-feedback residuals); a changed file warns on resume;
`snip formats --recipes --config` lists it; `snip experiment --no-train`
tabulates an arm trained with it; bad files are one-line errors naming file,
recipe and field.

usage: recipe_file.py SNIP_BINARY PREPARED_DATA_DIR
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="snip-recipe-file-")
T = Checks(snip)
check = T.check

RECIPES = """
[recipes.w4a8ef]
description = "test: W4 per-channel E2M1 with error feedback, A8 E4M3, dY E5M2 delayed"
error_feedback = true
compensation_freq = 4

[recipes.w4a8ef.activations]
element = "e4m3"

[recipes.w4a8ef.weights]
element = "e2m1"
block = "row"

[recipes.w4a8ef.gradients]
element = "e5m2"
rule = "delayed"
amax_history_len = 16
"""
rfile = os.path.join(tmp, "recipes.toml")
with open(rfile, "w") as f:
    f.write(RECIPES)

cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 24\ncheckpoint_interval = 1000\neval_interval = 12\neval_batches = 1\n"
           "sample_tokens = 0\nlog_interval = 1\n"
           f"[precision]\npolicy = \"uniform-w4a8ef\"\nrecipe_file = \"{rfile}\"\nwarmup_steps = 0\n"
           "final_high_precision_fraction = 0.0", seq_len=32)


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def wait_for_steps(run, n, proc, limit=120):
    t0 = time.time()
    while time.time() - t0 < limit and proc.poll() is None:
        try:
            if len(metrics(run)) >= n:
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return False


# --- the uninterrupted run
ref = os.path.join(tmp, "ref")
rc, out, err = T.run(["train", "--config", cfg, "--run-dir", ref], timeout=300)
check(rc == 0, "reference run", err[-800:])
ref_m = metrics(ref) if rc == 0 else []
check(len(ref_m) == 24, "24 steps", str(len(ref_m)))
plans = sorted(glob.glob(os.path.join(ref, "plans", "*.json")))
check(len(plans) > 0, "a plan is written", str(os.listdir(ref)))
if plans:
    with open(plans[0]) as f:
        plan = json.load(f)
    text = json.dumps(plan)
    check("w4a8ef" in text, "the plan names the custom recipe", text[:400])
    options = set()

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            options.add(x)
    walk(plan.get("assign", plan))
    check("w4a8ef" in options, "layers are assigned w4a8ef", text[:400])
with open(os.path.join(ref, "config.toml")) as f:
    saved = f.read()
check(f"recipe_file = '{rfile}'" in saved or f'recipe_file = "{rfile}"' in saved,
      "config.toml keeps precision.recipe_file", [l for l in saved.splitlines() if "recipe_file" in l])
rj = os.path.join(ref, "recipes.json")
check(os.path.isfile(rj), "RUN/recipes.json is written")
if os.path.isfile(rj):
    with open(rj) as f:
        rec = json.load(f)
    names = [r["name"] for r in rec["recipes"]]
    check(names == ["w4a8ef"] and rec["recipes"][0].get("error_feedback") is True,
          "recipes.json holds the resolved recipe", json.dumps(rec)[:300])
    dy = rec["recipes"][0]["operands"]["dgrad.dy"]
    check(dy.get("scale_refresh_interval") == 4 and dy.get("rule") == "delayed",
          "compensation_freq became the delayed refresh interval", json.dumps(dy))
check(all(r["loss"] == r["loss"] and r["loss"] < 1e9 for r in ref_m), "finite losses")

# The residuals are in the checkpoint.
ck = sorted(glob.glob(os.path.join(ref, "checkpoints", "step-*")))
if ck:
    with open(os.path.join(ck[-1], "trainer_state.json")) as f:
        st = json.load(f)
    q = st.get("precision", {}).get("quantizers", {}).get("w4a8ef", {})
    res = q.get("residuals", [])
    check(len(res) > 0 and all("f32_base64" in r for r in res), "the checkpoint holds the residuals",
          json.dumps(q)[:300])

# --- stopped by SIGTERM, resumed: the losses of the uninterrupted run
# The micro model's 24 steps take well under a second on a fast machine: a
# run that finished before the signal landed is started again (a new folder),
# up to 5 times, before the check below calls it a failure.
for attempt in range(5):
    run = os.path.join(tmp, f"stopped-{attempt}")
    proc = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", run], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    reached = wait_for_steps(run, 2, proc)
    proc.send_signal(signal.SIGTERM)  # a no-op when the run already ended
    out, err = proc.communicate(timeout=120)
    n = len(metrics(run))
    if not (proc.returncode == 0 and n == 24):
        break
check(reached, "stopped run reached step 2")
check(proc.returncode == -signal.SIGTERM and 0 < n < 24, "stopped by SIGTERM with a checkpoint",
      f"rc={proc.returncode} n={n} {err[-400:]}")
rc, out, err = T.run(["train", "--run-dir", run, "--resume"], timeout=300)
check(rc == 0, "resume finishes", err[-600:])
check("not be bit-identical" not in err, "no warning when the file is unchanged", err[-600:])
got = metrics(run)
check([r["step"] for r in got] == list(range(1, 25)), "every step once", str([r["step"] for r in got]))
check([r["loss"] for r in got] == [r["loss"] for r in ref_m], "resume is exact: losses of the uninterrupted run",
      f"stopped at {n}: " + str([(a["loss"], b["loss"]) for a, b in zip(got, ref_m) if a["loss"] != b["loss"]][:3]))
check([r.get("val_loss") for r in got] == [r.get("val_loss") for r in ref_m], "resume is exact: validation losses")
check([r.get("grad_norm") for r in got] == [r.get("grad_norm") for r in ref_m], "resume is exact: grad norms")

# The resumed run rewound to the checkpoint its SIGTERM wrote (step n), as
# if it had just stopped there: the start of each resume below. (Checkpoints
# are written only at that stop and at the end: checkpoint_interval = 1000.)
def rewound(name):
    d = os.path.join(tmp, name)
    shutil.copytree(run, d)
    os.remove(os.path.join(d, "summary.json"))
    with open(os.path.join(d, "metrics.jsonl")) as f:
        lines = f.readlines()
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(lines[:n])
    for c in glob.glob(os.path.join(d, "checkpoints", "step-*")):
        if not c.endswith(f"step-{n}"):
            shutil.rmtree(c)
    check(os.path.isdir(os.path.join(d, "checkpoints", f"step-{n}")), f"{name}: the stop's checkpoint step-{n}")
    return d


# --- a description-only change does not warn
run3 = rewound("described")
rfile3 = os.path.join(tmp, "recipes3.toml")
with open(rfile3, "w") as f:
    f.write(RECIPES.replace('description = "test:', 'description = "renamed test:'))
rc, out, err = T.run(["train", "--run-dir", run3, "--resume", "--set", f"precision.recipe_file={rfile3}"],
                     timeout=300)
check(rc == 0, "resume with a new description runs", err[-600:])
check("not be bit-identical" not in err, "a description-only change does not warn (it changes no number)",
      err[-600:])

# --- a changed recipe file warns on resume
run2 = rewound("changed")
rfile2 = os.path.join(tmp, "recipes2.toml")
with open(rfile2, "w") as f:
    f.write(RECIPES.replace('block = "row"', 'block = "1x16"'))
rc, out, err = T.run(["train", "--run-dir", run2, "--resume", "--set", f"precision.recipe_file={rfile2}"],
                     timeout=300)
check(rc == 0, "resume with a changed file runs", err[-600:])
check("w4a8ef" in err and "not be bit-identical" in err, "a changed recipe warns on resume", err[-600:])

# --- resumed after the recipe file moved away: the run's recipes.json is
# used (a warning says so) and the losses are the uninterrupted run's
run4 = rewound("moved")
gone = os.path.join(tmp, "moved-away.toml")
rc, out, err = T.run(["train", "--run-dir", run4, "--resume", "--set", f"precision.recipe_file={gone}"], timeout=300)
check(rc == 0, "resume without the recipe file runs", err[-600:])
check("does not exist; the run goes on with the recipes it trained with" in err, "and says it used the copy",
      err[-600:])
check("not be bit-identical" not in err, "the copy is what the run trained with: no warning", err[-600:])
check([r["loss"] for r in metrics(run4)] == [r["loss"] for r in ref_m],
      "resume from the copy is exact: losses of the uninterrupted run")

# --- snip experiment --no-train tabulates an arm trained with the recipe,
# registered from the arm's recipes.json (the file itself is not needed)
exp = os.path.join(tmp, "exp")
os.makedirs(exp)
shutil.copytree(ref, os.path.join(exp, "uniform-w4a8ef"))
rc, out, err = T.run(["experiment", "--no-train", "--out", exp], timeout=120)
check(rc == 0 and "| uniform-w4a8ef |" in out, "experiment --no-train tabulates the custom arm", out[-400:] + err[-400:])

# --- snip formats --recipes --config lists it (and --json holds error_feedback)
rc, out, err = T.run(["formats", "--recipes", "--config", cfg])
check(rc == 0 and "w4a8ef: test: W4" in out and "[error feedback on W]" in out, "formats --recipes --config",
      out[-400:] + err)
rc, out, err = T.run(["formats", "--recipes", "--json", "--recipe-file", rfile])
try:
    js = {r["name"]: r for r in json.loads(out)}
except ValueError:
    js = {}
check("w4a8ef" in js and js["w4a8ef"].get("error_feedback") is True and "fp8" in js, "formats --recipes --json",
      out[-300:] + err)

# --- errors: one line naming the file, the recipe and the field; nothing written
def bad(name, text, needle, ext=".toml"):
    p = os.path.join(tmp, name + ext)
    with open(p, "w") as f:
        f.write(text)
    run = os.path.join(tmp, "bad-" + name)
    T.expect_error(name, ["train", "--config", cfg, "--run-dir", run, "--set", f"precision.recipe_file={p}"],
                   needle, absent=run)


bad("bad_block", RECIPES.replace('block = "row"', 'block = "3y"'),
    "recipe 'w4a8ef': weights.block: expected a block shape")
bad("unknown_key", RECIPES.replace("error_feedback = true", "error_feedbak = true"),
    "recipe 'w4a8ef': error_feedbak: unknown key")
bad("clash", RECIPES.replace("w4a8ef", "fp8"), "recipe 'fp8': name: the name of a built-in recipe")
bad("no_delayed", RECIPES.replace('rule = "delayed"', 'rule = "current"'),
    "recipe 'w4a8ef': compensation_freq: expected a recipe with delayed scaling")
bad("json_bad", '{"recipes": {"w4a8ef": {"all": {}, "weights": {"rounding": "up"}}}}',
    "recipe 'w4a8ef': weights.rounding", ext=".json")
bad("yaml", "x", "precision.recipe_file: expected a .toml or .json file", ext=".yaml")
# The guarded readers every other file goes through (io/json.h, io/toml.h):
# no crash on deep nesting, no internal error on overflow, each key once,
# finite numbers only.
bad("json_deep", '{"recipes": ' + "[" * 100000 + "]" * 100000 + "}", "expected at most 128 nested arrays/objects",
    ext=".json")
bad("toml_deep_header", "[" + ".".join(["a"] * 40000) + "]\n", "nested at most 64 deep")
bad("json_overflow", '{"recipes": {"d8": {"all": {"element": "e4m3", "rule": "delayed", "amax_history_len": 1e309}}}}',
    "expected a number a double can hold", ext=".json")
bad("json_duplicate", '{"recipes": {"x8": {"all": {"element": "e4m3"}, "all": {"element": "e2m1"}}}}',
    "expected each key once, got \"all\" twice", ext=".json")
bad("description_two_lines", RECIPES.replace('description = "test:', 'description = "line one\\nline two, test:'),
    "recipe 'w4a8ef': description: expected one line of at most 500 bytes without control characters")
bad("description_huge", RECIPES.replace('description = "test:', 'description = "' + "x" * 600 + ' test:'),
    "description: expected one line of at most 500 bytes without control characters, got 6")
bad("toml_nan", RECIPES.replace('description = "test:', 'description = nan\nnote = "test:'),
    "recipes.w4a8ef.description: expected a finite number, got nan")
T.expect_error("missing file", ["train", "--config", cfg, "--run-dir", os.path.join(tmp, "bad-missing"), "--set",
                                "precision.recipe_file=" + os.path.join(tmp, "nope.toml")],
               "does not exist", absent=os.path.join(tmp, "bad-missing"))
T.expect_error("recipe not in the file", ["train", "--config", cfg, "--run-dir", os.path.join(tmp, "bad-name"),
                                          "--set", "precision.policy=uniform-w4a9"],
               "w4a9", absent=os.path.join(tmp, "bad-name"))

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
