#!/usr/bin/env python3
"""`snip experiment` for a person, through the real binary:

- while an arm trains, the console shows that arm's progress (step/total,
  loss, ETA of the arm and of the experiment), read from the arm's own
  metrics.jsonl (not from its log): every step and loss shown is the one
  the arm's metrics.jsonl records for that step, and the last line of each
  arm is its last step;
- when stderr is not a terminal, lines come at most every
  --progress-interval seconds (the last step always);
- `--no-train` re-tabulates from each arm's own OUT/<arm>/config.toml:
  without the --set the arms were trained with, and without --config, it
  writes the same results.json; a missing arm folder, an arm folder holding
  another arm's run, or an arm trained on another model is refused in one
  line naming the folder, exit 2, nothing written.

usage: experiment_progress.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml, snapshot  # noqa: E402

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
tmp = tempfile.mkdtemp(prefix="snip-exp-")
T = Checks(snip)
check = T.check
STEPS = 12  # given only by --set: the config file says nothing of max_steps (default 1000)

cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, """eval_interval = 4
eval_batches = 2
log_interval = 2
checkpoint_interval = 0
[precision]
warmup_steps = 2
initial_interval = 4
final_interval = 4""")
out = os.path.join(tmp, "exp")
arms = ["none", "snip-0.75"]
rc, stdout, err = T.run(["experiment", "--config", cfg, "--out", out, "--arms", ",".join(arms),
                         "--set", f"train.max_steps={STEPS}", "--progress-interval", "0"], timeout=600)
check(rc == 0, "experiment trains", f"rc={rc} {err[-600:]!r}")

# Progress: "[i/2] ARM: step N/M | loss L | ETA arm 0m05s, experiment 0m12s"
line_re = re.compile(r"^\[(\d)/2\] (\S+): step (\d+)/(\d+) \| loss (\d+\.\d{4}) \| "
                     r"ETA arm (\d+m\d\ds|\?), experiment (\d+m\d\ds|\?)$")
shown = {}
for line in err.splitlines():
    m = line_re.match(line)
    if m:
        shown.setdefault(m.group(2), []).append(m)
check(list(shown) == arms, "a progress line per arm, in order", f"{list(shown)} {err[-600:]!r}")
for i, arm in enumerate(arms):
    lines = shown.get(arm, [])
    metrics = {r["step"]: r for r in map(json.loads, open(os.path.join(out, arm, "metrics.jsonl")))}
    steps = [int(m.group(3)) for m in lines]
    # --progress-interval 0: each new record of the arm's metrics.jsonl the
    # experiment sees (it polls every 0.25 s, so a fast arm's steps may be
    # skipped, never repeated or reordered).
    check(steps and steps == sorted(set(steps)) and all(1 <= k <= STEPS for k in steps),
          f"{arm}: steps of its metrics.jsonl, in order, each once", str(steps))
    check(all(int(m.group(1)) == i + 1 and int(m.group(4)) == STEPS for m in lines),
          f"{arm}: [i/2] and the total of --set train.max_steps", str([m.group(0) for m in lines]))
    check(all(f"{metrics[int(m.group(3))]['loss']:.4f}" == m.group(5) for m in lines),
          f"{arm}: each loss is metrics.jsonl's at that step",
          str([(m.group(3), m.group(5), metrics[int(m.group(3))]["loss"]) for m in lines]))
    check(lines and lines[-1].group(6) == "0m00s", f"{arm}: the arm's ETA is 0 at its last step",
          lines[-1].group(0) if lines else "")
    s = json.load(open(os.path.join(out, arm, "summary.json")))
    check(s["steps"] == STEPS and steps and steps[-1] == s["steps"], f"{arm}: progress reaches the arm's total",
          f"{steps} summary {s['steps']}")
last = shown.get(arms[-1], [])
check(last and last[-1].group(7) == "0m00s", "the experiment's ETA is 0 at the last arm's last step",
      last[-1].group(0) if last else "")
first = shown.get(arms[0], [])
check(first and first[-1].group(7) not in ("?",), "the experiment's ETA after the first arm counts the second",
      first[-1].group(0) if first else "")
results = open(os.path.join(out, "results.json")).read()
rows = json.loads(results)
check([r["arm"] for r in rows] == arms and all(r["steps"] == STEPS for r in rows), "results.json", results)

# Not a terminal, default --progress-interval (15 s): the micro arm trains in
# well under that, so only its last step is shown. The arm is named "bf16",
# the unquantized policy's name until 2026-12-01: it still names policy none.
out1 = os.path.join(tmp, "exp1")
rc, _, err1 = T.run(["experiment", "--config", cfg, "--out", out1, "--arms", "bf16",
                     "--set", "train.max_steps=6"], timeout=300)
p1 = [line for line in err1.splitlines() if "bf16: step" in line]
check(rc == 0 and len(p1) >= 1 and p1[-1].startswith("[1/1] bf16: step 6/6 | loss "),
      "default interval: the arm's last step is shown", f"rc={rc} {err1!r}")
check(len(p1) < 3, "default interval: not every progress line of the trainer (6 steps in < 15 s)", str(p1))
r1 = json.load(open(os.path.join(out1, "results.json"))) if os.path.exists(os.path.join(out1, "results.json")) else []
check(len(r1) == 1 and r1[0]["arm"] == "bf16" and r1[0]["policy"] == "none" and r1[0]["gemm_dtype"] == "bf16",
      "an arm named bf16 (the old name) runs policy none, BF16 GEMMs", str(r1))

# --no-train: the arms' own config.toml, no --set (nor --config) needed.
for name, args in [("--no-train without --config, --set, --arms", []),
                   ("--no-train with --arms", ["--arms", ",".join(arms)]),
                   ("--no-train with the --config but not the --set", ["--config", cfg])]:
    os.remove(os.path.join(out, "results.json"))
    rc, stdout2, err2 = T.run(["experiment", "--out", out, "--no-train"] + args)
    again = open(os.path.join(out, "results.json")).read() if os.path.exists(os.path.join(out, "results.json")) else ""
    check(rc == 0 and again == results, name + ": the same results.json", f"rc={rc} {err2!r}")
    check("step " not in err2, name + ": trains nothing", err2)
check("| snip-0.75 | snip | 0.75 |" in stdout2, "--no-train prints the table", stdout2)

# Refused, one line naming the arm folder, nothing written.
T.expect_error("--no-train, an arm never trained", ["experiment", "--out", out, "--no-train", "--arms", "none,snip-0.5"],
               os.path.join(out, "snip-0.5") + " does not exist", untouched=out)
T.expect_error("--no-train, OUT missing", ["experiment", "--out", os.path.join(tmp, "none"), "--no-train"],
               os.path.join(tmp, "none") + " does not exist", absent=os.path.join(tmp, "none"))
T.expect_error("two names of one run", ["experiment", "--config", cfg, "--out", os.path.join(tmp, "y"), "--arms",
               "none,bf16"], "'bf16' and 'none' are the same run (policy none; bf16 is its old name)",
               absent=os.path.join(tmp, "y"))
T.expect_error("a budget on the unquantized arm", ["experiment", "--config", cfg, "--out", os.path.join(tmp, "y"),
               "--arms", "none-0.5"], "'none-0.5': policy none takes no budget", absent=os.path.join(tmp, "y"))
T.expect_error("no --config without --no-train", ["experiment", "--out", os.path.join(tmp, "x")],
               "--config FILE is required", absent=os.path.join(tmp, "x"))
other = os.path.join(tmp, "other")
shutil.copytree(out, other)
os.remove(os.path.join(other, "results.json"))
conf = os.path.join(other, "snip-0.75", "config.toml")
text = open(conf).read()
open(conf, "w").write(re.sub(r"(?m)^hidden_size = 32\b", "hidden_size = 64", text))
T.expect_error("--no-train, an arm of another model", ["experiment", "--out", other, "--no-train"],
               "arm 'snip-0.75' in " + os.path.join(other, "snip-0.75") + " was trained with model.hidden_size = 64 "
               "but arm 'none' in " + os.path.join(other, "none") + " with 32", untouched=other)
open(conf, "w").write(text)
os.rename(os.path.join(other, "snip-0.75"), os.path.join(other, "snip-0.5"))
T.expect_error("--no-train, a folder holding another arm's run", ["experiment", "--out", other, "--no-train"],
               "arm 'snip-0.5' in " + os.path.join(other, "snip-0.5") + " was trained with precision.budget = 0.75, "
               "not 0.5", untouched=other)
os.rename(os.path.join(other, "none"), os.path.join(other, "uniform-fp8"))
T.expect_error("--no-train, another policy's folder",
               ["experiment", "--out", other, "--no-train", "--arms", "uniform-fp8"],
               "arm 'uniform-fp8' in " + os.path.join(other, "uniform-fp8") + " was trained with precision.policy = "
               "none", untouched=other)

shutil.rmtree(tmp)
T.finish()
