#!/usr/bin/env python3
"""The user's path: the stories a new user hit, through the real binary, each
checked against what a person reads.

  log level    --quiet / --log-level / SNIP_LOG_LEVEL: no progress lines,
               info lines, plan tables or samples; warnings and the summary
               stay; a bad level is one error line
  plan table   printed once; later plan-phase re-plans print what changed
  quant error  a healthy FP4 run raises no quant_error warning (4-bit
               formats have their own threshold); a threshold below the
               measured error still fires
  eval window  `snip eval` of a checkpoint alone or of its export uses the
               run's train.seq_len and says so; same loss
  step-0 eval  --init-from evaluates before the first step; the value is
               the exported model's `snip eval` loss on the same windows
  papercuts    a quoted number, the missing-data hint, --skip-invalid, the
               output-folder line before a missing --input, "snip
               --nproc-per-node" (not torchrun) in a local launch's log, a
               misspelt command, --run-dir of a missing run, and what a
               fresh user met
  found later  by a fresh user and a tester: log lines on stderr, the
               log level's precedence, --skip-invalid in the up-to-date key,
               a damaged tokenizer copy, --model-only --force, a lone
               checkpoint's windows, init_val_loss across --resume, a
               finished run whose data moved

usage: user_path.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
tmp = tempfile.mkdtemp(prefix="snip-path-")
T = Checks(snip)
check = T.check


def run(*args, env=None, timeout=300):
    try:
        p = subprocess.run([snip] + list(args), capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


def val_loss(text):
    m = re.search(r"val loss ([0-9.]+)", text)
    return float(m.group(1)) if m else None


# ---- log level
cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 4\neval_interval = 2\nsample_tokens = 4\nlog_interval = 1\n"
           "[precision]\npolicy = \"snip\"\nbudget = 0.5\ninitial_interval = 1\n"
           "[dist]\ngrad_comm = \"fp8\"")
rc, out, err = run("train", "--config", cfg, "--run-dir", os.path.join(tmp, "loud"))
check(rc == 0 and re.search(r"^step +1/4 ", err, re.M) and "precision plan at step" in err and "sample:" in err
      and re.search(r"^\[\d\d:\d\d:\d\d\] (?!warning)", out + err, re.M),
      "the default level prints progress, plan tables, samples and info lines", f"rc={rc} {err[-500:]!r}")
check("warning: dist.grad_comm = fp8 has no effect" in err and "warning" not in out,
      "a warning at the default level, on stderr (stdout holds the summary)", out[-300:])
for name, args, env in [("--quiet", ["train", "--quiet"], None), ("-q before the command", ["-q", "train"], None),
                        ("--log-level warning", ["train", "--log-level", "warning"], None),
                        ("SNIP_LOG_LEVEL=warning", ["train"], {"SNIP_LOG_LEVEL": "warning"})]:
    rd = os.path.join(tmp, "quiet-" + re.sub(r"\W", "", name))
    rc, out, err = run(*args, "--config", cfg, "--run-dir", rd, env=env)
    both = out + err
    check(rc == 0, f"{name}: trains", err[-400:])
    check(not re.search(r"^step +\d+/4", err, re.M), f"{name}: no progress lines", err[-400:])
    check("precision plan at step" not in both and "re-plan" not in both and "sample:" not in both,
          f"{name}: no plan tables, re-plan lines or samples", both[-400:])
    check(not re.search(r"^\[\d\d:\d\d:\d\d\] (?!warning)", both, re.M), f"{name}: no info lines", both[-400:])
    check("warning: dist.grad_comm = fp8 has no effect" in both, f"{name}: warnings still print", both[-400:])
    check("summary: 4 steps" in out, f"{name}: the summary still prints", out[-300:])
rc, out, err = run("train", "--log-level", "debug", "--log-level", "warning", "--config", cfg, "--run-dir",
                   os.path.join(tmp, "last-level"))
check(rc == 0 and not re.search(r"^step +\d+/4", err, re.M), "--log-level twice: the last one holds", err[-300:])
rc, out, err = run("-q", "train", "--log-level", "info", "--config", cfg, "--run-dir", os.path.join(tmp, "explicit"))
check(rc == 0 and re.search(r"^step +1/4", err, re.M), "an explicit --log-level wins over -q", err[-300:])
rc, out, err = run("formats", env={"SNIP_LOG_LEVEL": "bogus"})
check(rc == 2 and err == "snip: error: SNIP_LOG_LEVEL (environment): expected debug, info, warning or error, got 'bogus'\n",
      "a bad SNIP_LOG_LEVEL: one line naming the variable", repr(err))
rc, out, err = run("formats", env={"SNIP_LOG_LEVEL": "WARNING"})
check(rc == 0, "SNIP_LOG_LEVEL is case-insensitive", repr(err))
rc, out, err = run("train", "--help")
check(rc == 0 and "--log-level debug|info|warning|error" in out, "train --help names the log level options", out[-300:])
rc, out, err = run("train", "--log-level", "error", "--config", cfg, "--run-dir", os.path.join(tmp, "err-level"))
check(rc == 0 and "warning" not in out + err and "summary: 4 steps" in out, "--log-level error: no warnings either",
      (out + err)[-300:])
T.expect_error("an unknown log level", ["train", "--log-level", "loud", "--config", cfg, "--run-dir",
               os.path.join(tmp, "never")], "--log-level: expected debug, info, warning or error, got 'loud'",
               absent=os.path.join(tmp, "never"))

# ---- the plan table once, then the changes
cfg_p = os.path.join(tmp, "plan.toml")
micro_toml(cfg_p, data, "max_steps = 12\neval_interval = 1000\nsample_tokens = 0\n"
           "[precision]\npolicy = \"snip\"\nbudget = 0.5\ninitial_interval = 1\nfinal_interval = 2\n"
           "final_high_precision_fraction = 0.0\nwarmup_fraction = 0.0")
rc, out, err = run("train", "--config", cfg_p, "--run-dir", os.path.join(tmp, "plans"))
plans = sorted(os.listdir(os.path.join(tmp, "plans", "plans"))) if rc == 0 else []
tables = len(re.findall(r"^precision plan at step \d+", err, re.M))
later = len(re.findall(r"^precision at step \d+: (re-plan changed \d+ of \d+ items|plan unchanged)", err, re.M))
check(rc == 0 and len(plans) >= 4, "several plans were made", f"rc={rc} {plans} {err[-300:]!r}")
check(tables == 1, "the plan table is printed once", f"{tables} tables in {err[-1500:]!r}")
check(later == len(plans) - 1, "every later plan is one line (changed or unchanged)",
      f"{later} lines for {len(plans)} plans: {err[-1500:]!r}")
for m in re.finditer(r"^precision at step (\d+): re-plan changed (\d+) of \d+ items", err, re.M):
    # The listed changes are those of plans/step-N.json against the plan before it.
    n = int(m.group(1))
    cur = json.load(open(os.path.join(tmp, "plans", "plans", f"step-{n}.json")))
    listed = re.findall(r"^  (\S+): (\S+) -> (\S+)$", err[m.end():].split("\nprecision", 1)[0], re.M)
    check(int(m.group(2)) >= len(listed) > 0, f"re-plan at step {n} lists its changes", str(listed))
    items = {it["name"]: it["option"] for it in cur["items"]} if isinstance(cur.get("items"), list) else {}
    for item, old, new in listed:
        check(items.get(item) == new, f"re-plan at step {n}: {item} is {new} in plans/step-{n}.json",
              f"{items.get(item)} != {new}")

# ---- the quant-error guard on a healthy FP4 run
cfg_q = os.path.join(tmp, "fp4.toml")
micro_toml(cfg_q, data, "max_steps = 10\neval_interval = 1000\nsample_tokens = 0\n"
           "[precision]\npolicy = \"snip\"\nbudget = 1.0\ninitial_interval = 1\nfinal_interval = 2\n"
           "final_high_precision_fraction = 0.0\nwarmup_fraction = 0.0")
rc, out, err = run("train", "--config", cfg_q, "--run-dir", os.path.join(tmp, "fp4"))
errs = []
for line in open(os.path.join(tmp, "fp4", "metrics.jsonl")) if rc == 0 else []:
    r = json.loads(line)
    for ops in r.get("quant_err", {}).values():
        errs += [v for op, v in ops.items() if op.startswith("fprop.") and v]
check(rc == 0 and len(errs) >= 6 and 0.08 < max(errs) < 0.3,
      "a healthy FP4 run: E2M1's per-step fprop operand errors measured, above 8-bit's 0.08 and below FP4's 0.3",
      f"rc={rc} {sorted(errs)[-3:] if errs else errs} {err[-300:]!r}")
check("quant_error" not in out + err, "... and no quant_error warning", (out + err)[-600:])
rc, out, err = run("train", "--config", cfg_q, "--run-dir", os.path.join(tmp, "fp4-low"),
                   "--set", "guard.quant_error_threshold_fp4=0.02")
check(rc == 0 and re.search(r"quant_error: relative quantization error above its format's threshold .*\(> 0\.02, e2m1\)",
                            out + err), "a 4-bit threshold below the error fires", (out + err)[-600:])

# ---- the evaluation window
cfg_e = os.path.join(tmp, "e.toml")
micro_toml(cfg_e, data, "max_steps = 2\neval_interval = 2\nsample_tokens = 0", seq_len=16)
run_e = os.path.join(tmp, "e")
rc, out, err = run("train", "--config", cfg_e, "--run-dir", run_e)
check(rc == 0 and re.search(r"^step +2/2 .*\| val [0-9.]+ \(16-token windows\)$", err, re.M)
      and "| 16-token windows" in out, "training says its windows (progress and summary)", f"{err[-300:]!r} {out!r}")
ck = os.path.join(run_e, "checkpoints", "step-2")
hf = os.path.join(tmp, "e-hf")
rc0, out0, _ = run("eval", "--run-dir", run_e, "--batches", "2")
rc1, out1, err1 = run("eval", "--checkpoint", ck, "--batches", "2")
rc2, out2, err2 = run("export", "--run-dir", run_e, "--out", hf)
rc3, out3, err3 = run("eval", "--checkpoint", hf, "--data", data, "--batches", "2")
check(rc0 == 0 and "windows of 16 tokens: the run's train.seq_len" in out0, "eval --run-dir: the run's windows", out0)
check(rc1 == 0 and "windows of 16 tokens: the run's train.seq_len" in out1, "eval of a checkpoint alone: the run's windows",
      out1 + err1[-300:])
check(rc2 == 0 and json.load(open(os.path.join(hf, "snip_export.json"))).get("train_seq_len") == 16,
      "export records train_seq_len", err2[-300:])
check(rc3 == 0 and "windows of 16 tokens: the training's train.seq_len" in out3, "eval of the export: the same windows",
      out3 + err3[-300:])
check(val_loss(out0) is not None and val_loss(out0) == val_loss(out1) == val_loss(out3),
      "the three evaluations agree", f"{out0!r} {out1!r} {out3!r}")
bare = os.path.join(tmp, "e-hf-bare")
shutil.copytree(hf, bare)
os.remove(os.path.join(bare, "snip_export.json"))
rc4, out4, _ = run("eval", "--checkpoint", bare, "--data", data, "--batches", "2")
check(rc4 == 0 and "windows of 32 tokens: the folder does not say its training length; --seq-len to choose" in out4,
      "a folder that does not say its length: min(256, max_position_embeddings), said", out4)

# ---- step-0 evaluation with --init-from
rc, out, err = run("train", "--config", cfg_e, "--run-dir", os.path.join(tmp, "ft"), "--init-from", hf,
                   "--set", "train.eval_batches=2")
m = re.search(r"^step +0/2 \| val ([0-9.]+) \(16-token windows\): the --init-from model before training$", err, re.M)
summ = json.load(open(os.path.join(tmp, "ft", "summary.json"))) if rc == 0 else {}
check(rc == 0 and m is not None, "--init-from: a step-0 evaluation line", err[-500:])
check(m is not None and summ.get("init_val_loss") is not None and abs(summ["init_val_loss"] - float(m.group(1))) < 5e-5
      and f"at step 0 (--init-from) {m.group(1)}" in out, "summary.json init_val_loss and the summary line", out[-400:])
rc5, out5, _ = run("eval", "--checkpoint", hf, "--data", data, "--batches", "2", "--batch-size", "2")
# The run's GEMMs are BF16 (train.gemm_dtype), `snip eval`'s FP32: equal to
# within BF16 rounding of the logits, far below the loss's change in a step.
check(m is not None and val_loss(out5) is not None and abs(val_loss(out5) - float(m.group(1))) < 2e-3,
      "the step-0 loss is `snip eval` of the --init-from folder on the same windows", f"{out5!r} vs {m and m.group(1)}")
rc, out, err = run("train", "--config", cfg_e, "--run-dir", os.path.join(tmp, "scratch"))
check(rc == 0 and not re.search(r"^step +0/", err, re.M), "no step-0 evaluation without --init-from", err[-300:])

# ---- papercuts
bad_toml = os.path.join(tmp, "quoted.toml")
micro_toml(bad_toml, data, 'lr = "3e-4"')
T.expect_error("a quoted number", ["train", "--config", bad_toml, "--run-dir", os.path.join(tmp, "q")],
               "train.lr: expected a number, got '3e-4' (a quoted string; write it without quotes: lr = 3e-4)")
T.expect_error("missing data: the hint names --input",
               ["train", "--config", cfg_e, "--run-dir", os.path.join(tmp, "nodata"), "--set", "data.dir=" + tmp + "/nodata-dir"],
               f"`snip data prepare --input YOUR_TEXT --out {tmp}/nodata-dir` (or `snip data prepare --out")
texts = os.path.join(tmp, "texts")
os.makedirs(texts)
with open(os.path.join(texts, "good.txt"), "w") as f:
    f.write("In the beginning God created the heaven and the earth. " * 40)
with open(os.path.join(texts, "latin1.txt"), "wb") as f:
    f.write("Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ade. ".encode("latin-1") * 40)
T.expect_error("a non-UTF-8 file stops the preparation, naming --skip-invalid",
               ["data", "prepare", "--input", texts, "--out", os.path.join(tmp, "d1"), "--vocab-size", "300",
                "--val-fraction", "0"], "latin1.txt: not UTF-8 text", absent=os.path.join(tmp, "d1"))
rc, out, err = run("data", "prepare", "--input", texts, "--out", os.path.join(tmp, "d1"), "--vocab-size", "300",
                   "--val-fraction", "0", "--skip-invalid")
both = out + err
check(rc == 0 and re.search(r"warning: skipped the whole file \S+latin1.txt \(--skip-invalid\): input file \S+: not UTF-8", both)
      and "skipped:   1 input file" in out, "--skip-invalid: warned and counted", both[-600:])
meta = json.load(open(os.path.join(tmp, "d1", "meta.json"))) if rc == 0 else {}
sk = meta.get("sources", [{}])[0].get("skipped", [])
check(len(sk) == 1 and sk[0]["path"].endswith("latin1.txt") and "not UTF-8" in sk[0]["reason"]
      and meta["sources"][0]["files"] == 1 and meta["documents"]["total"] == 1,
      "meta.json lists the skipped file; only good.txt was read", json.dumps(meta.get("sources")))
rc, out, err = run("data", "prepare", "--input", os.path.join(tmp, "no-such-text"))
check(rc == 2 and err.count("\n") == 1 and "output folder" not in err and "does not exist" in err,
      "a missing --input: the error alone", repr(err))
rc, out, err = run("train", "--nproc-per-node", "2", "--config", cfg_e, "--run-dir", os.path.join(tmp, "two"),
                   "--set", "dist.timeout_s=60")
check(rc == 0 and "torchrun" not in (out + err) and re.search(r"dist: 2 ranks \(snip --nproc-per-node", out + err), "a local launch's log names it, not torchrun",
      (out + err)[-600:])

T.expect_error("a misspelt command is named", ["trian"],
               "unknown command 'trian' (did you mean 'train'?) (commands: train, eval,")
for cmd in (["eval"], ["export", "--out", os.path.join(tmp, "x")], ["sample", "--prompt", "x"]):
    T.expect_error(f"snip {cmd[0]} --run-dir of a missing run", cmd + ["--run-dir", os.path.join(tmp, "no-run")],
                   f"--run-dir: {tmp}/no-run does not exist")
T.expect_error("snip eval --run-dir of a folder that is not a run", ["eval", "--run-dir", texts],
               f"--run-dir: {texts} is not a run of `snip train` (it has no config.toml)")

T.expect_error("a misspelt command after a log level option", ["-q", "trian"],
               "unknown command 'trian' (did you mean 'train'?)")
rc, out, err = run("-q", "data", "prepare", "--input", os.path.join(texts, "good.txt"), "--out",
                   os.path.join(tmp, "d-q"), "--vocab-size", "300")
check(rc == 0 and not re.search(r"^\[\d\d:\d\d:\d\d\] (?!warning)", err, re.M),
      "snip -q data prepare: the log option before `data` (no info lines)", err[-300:])
# --skip-invalid is part of what makes a folder up to date.
T.expect_error("prepared with --skip-invalid, then without: prepared again, and stops at the file",
               ["data", "prepare", "--input", texts, "--out", os.path.join(tmp, "d1"), "--vocab-size", "300",
                "--val-fraction", "0"], "latin1.txt: not UTF-8 text")
T.expect_error("a run folder is never a data folder",
               ["data", "prepare", "--input", texts, "--out", run_e, "--skip-invalid", "--vocab-size", "300"],
               f"--out {run_e} is a run folder of `snip train` (it holds checkpoints)", untouched=run_e)
T.expect_error("--set with a quoted number", ["train", "--config", cfg_e, "--run-dir", os.path.join(tmp, "qq"),
               "--set", 'train.lr="3e-4"'], "the value is quoted; --set takes it without quotes: --set train.lr=3e-4")
T.expect_error("--run-dir of a file", ["eval", "--run-dir", os.path.join(texts, "good.txt")],
               "is a file, not a run folder")

# A checkpoint's tokenizer copy damaged: the weights stay usable; the data
# folder's tokenizer (same SHA-256) stands in, with a warning; without the
# data folder, export says why and --model-only still works.
dmg = os.path.join(tmp, "dmg")
shutil.copytree(run_e, dmg)
with open(os.path.join(dmg, "checkpoints", "step-2", "tokenizer.model"), "r+b") as f:
    f.seek(100)
    f.write(b"\xff")
rc, out, err = run("export", "--run-dir", dmg, "--out", os.path.join(tmp, "dmg-hf"))
check(rc == 0 and "is not the tokenizer the model was trained with" in err and
      open(os.path.join(tmp, "dmg-hf", "tokenizer.model"), "rb").read() ==
      open(os.path.join(data, "tokenizer.model"), "rb").read(),
      "a damaged tokenizer copy: export takes the data folder's, with a warning", err[-400:])
rc, out, err = run("train", "--run-dir", dmg, "--resume", "--set", "train.max_steps=3")
check(rc == 0, "a damaged tokenizer copy: the run resumes", err[-300:])
# --model-only --force over an export with a tokenizer: none of it stays.
rc, out, err = run("export", "--run-dir", run_e, "--out", os.path.join(tmp, "dmg-hf"), "--model-only", "--force")
check(rc == 0 and not os.path.exists(os.path.join(tmp, "dmg-hf", "tokenizer.model"))
      and not os.path.exists(os.path.join(tmp, "dmg-hf", "tokenizer_config.json")),
      "export --model-only --force removes an earlier export's tokenizer files", err[-300:])
# A checkpoint copied out of its run still knows its windows.
lone = os.path.join(tmp, "lone")
os.makedirs(lone)
shutil.copytree(os.path.join(run_e, "checkpoints", "step-2"), os.path.join(lone, "step-2"))
rc, out, err = run("eval", "--checkpoint", os.path.join(lone, "step-2"), "--batches", "2")
check(rc == 0 and "windows of 16 tokens: the run's train.seq_len" in out, "a lone checkpoint: its own windows",
      out + err[-300:])
# The --init-from baseline survives --resume.
rc, out, err = run("train", "--run-dir", os.path.join(tmp, "ft"), "--resume", "--set", "train.max_steps=3")
s1 = json.load(open(os.path.join(tmp, "ft", "summary.json"))) if rc == 0 else {}
check(rc == 0 and summ.get("init_val_loss") is not None and s1.get("init_val_loss") == summ.get("init_val_loss")
      and "at step 0 (--init-from)" in out, "init_val_loss survives --resume", f"{s1.get('init_val_loss')} {out[-300:]}")
# A finished run whose data folder moved: "nothing to do" first.
fin2 = os.path.join(tmp, "fin2")
rc, out, err = run("train", "--config", cfg_e, "--run-dir", fin2)
T.expect_error("--resume of a finished run whose data moved: nothing to do",
               ["train", "--run-dir", fin2, "--resume", "--set", f"data.dir={tmp}/gone-data"],
               "nothing to do (raise train.max_steps to train further)")

T.expect_error("--resume of an unfinished run whose data moved: says how to point at it",
               ["train", "--run-dir", fin2, "--resume", "--set", "train.max_steps=4", "--set",
                f"data.dir={tmp}/gone-data"], "moved? continue with --set data.dir=NEW_DIR")
T.expect_error("plan show --step -1", ["plan", "show", os.path.join(tmp, "plans"), "--step", "-1"],
               "--step: expected a step >= 0, got -1")
rc, out, err = run("train", "--run-dir", os.path.join(tmp, "ft"), "--resume", "--init-from", hf, "--set",
                   "train.max_steps=4")
check(rc == 0 and "with --resume the weights are" in err, "--init-from with --resume says the checkpoint's weights",
      err[-300:])
T.expect_error("export of a Hugging Face folder says what it is", ["export", "--checkpoint", hf, "--out",
               os.path.join(tmp, "hf-of-hf")], f"{hf} is a Hugging Face folder (config.json, no trainer_state.json)")

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
