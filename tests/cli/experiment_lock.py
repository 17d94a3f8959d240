#!/usr/bin/env python3
"""`snip experiment` never deletes the folder of a run that is still
training, through the real binaries: with `snip train --run-dir OUT/none`
running (before its first checkpoint), `snip experiment --out OUT --arms
none` stops with one line naming the trainer's process (exit 2), and the
trainer's folder and process are untouched; with a trainer started under
another configuration too (the process is named before the configuration
is compared). Once the trainer is gone, the same experiment trains the arm
afresh.

usage: experiment_lock.py SNIP_BINARY PREPARED_DATA_DIR
"""
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
tmp = tempfile.mkdtemp(prefix="snip-experiment-lock-")
T = Checks(snip)
check = T.check

cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 100000\ncheckpoint_interval = 100000\neval_interval = 100000\n"
           "eval_batches = 1\nsample_tokens = 0\nlog_interval = 1")
out = os.path.join(tmp, "E")
run = os.path.join(out, "none")
os.makedirs(out)
trainer = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", run, "--set", "precision.policy=none"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
metrics = os.path.join(run, "metrics.jsonl")
t0 = time.time()
while time.time() - t0 < 120 and trainer.poll() is None and not (
        os.path.exists(metrics) and os.path.getsize(metrics) > 0):
    time.sleep(0.05)
try:
    check(trainer.poll() is None and os.path.getsize(metrics) > 0, "the trainer is running and has written a record")
    rc, _, err = T.run(["experiment", "--config", cfg, "--out", out, "--arms", "none"], timeout=120)
    lines = err.strip().splitlines()
    check(rc == 2 and len(lines) >= 1 and lines[-1].startswith("snip: error: ")
          and f"in use by process {trainer.pid}" in lines[-1],
          "the experiment refuses, naming the trainer's process", f"rc={rc} stderr={err[-1500:]!r}")
    check(not any("training it afresh" in line for line in lines), "the experiment did not announce a fresh start",
          err[-800:])
    check(trainer.poll() is None, "the trainer still runs")
    n0 = os.path.getsize(metrics) if os.path.exists(metrics) else -1
    time.sleep(1.0)
    check(os.path.exists(metrics) and os.path.getsize(metrics) > n0 > 0,
          "the trainer's metrics.jsonl is still there and growing", f"{n0} bytes before")
finally:
    trainer.kill()
    trainer.wait()

# A trainer started with another configuration: its process is named before
# any advice about the folder's configuration ("delete that folder").
shutil.rmtree(out)
os.makedirs(out)
trainer = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", run, "--set", "precision.policy=none",
                            "--set", "train.eval_batches=2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
t0 = time.time()
while time.time() - t0 < 120 and trainer.poll() is None and not os.path.exists(os.path.join(run, "config.toml")):
    time.sleep(0.05)
try:
    rc, _, err = T.run(["experiment", "--config", cfg, "--out", out, "--arms", "none"], timeout=120)
    check(rc == 2 and f"in use by process {trainer.pid}" in err and "delete that folder" not in err,
          "another configuration: the experiment names the trainer's process first", f"rc={rc} {err[-800:]!r}")
finally:
    trainer.kill()
    trainer.wait()

# The trainer is gone (killed before any checkpoint): the experiment now
# trains the arm afresh, in a short run.
shutil.rmtree(out)
os.makedirs(run)
open(os.path.join(run, "metrics.jsonl"), "w").close()  # a run stopped before its first checkpoint
micro_toml(cfg, data, "max_steps = 3\neval_interval = 3\neval_batches = 1\nsample_tokens = 0")
rc, _, err = T.run(["experiment", "--config", cfg, "--out", out, "--arms", "none"], timeout=300)
check(rc == 0 and "training it afresh" in err and os.path.isfile(os.path.join(run, "summary.json")),
      "without a trainer, the arm's leftover folder is trained afresh", f"rc={rc} {err[-1500:]!r}")

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
