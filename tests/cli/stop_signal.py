#!/usr/bin/env python3
"""Ctrl-C and SIGTERM during `snip train`, through the real binary: the step in
progress is finished and checkpointed, the run says where the checkpoint is and
how to continue, and the process ends by the signal (a shell shows 130 / 143);
--resume then completes the run with every step recorded exactly once and the
same losses as an uninterrupted run. A second Ctrl-C more than 1 s later ends
the process at once (within 1 s it is the same request arriving twice, as under
torchrun). train.checkpoint_minutes writes checkpoints by wall time.

usage: stop_signal.py SNIP_BINARY PREPARED_DATA_DIR
"""
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
tmp = tempfile.mkdtemp(prefix="snip-stop-")
T = Checks(snip)
check = T.check


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def start(args):
    return subprocess.Popen([snip] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_steps(run, n, proc, limit=120):
    """Until metrics.jsonl holds n records (or the process ended)."""
    t0 = time.time()
    while time.time() - t0 < limit and proc.poll() is None:
        try:
            if len(metrics(run)) >= n:
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return False


cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 400\ncheckpoint_interval = 1000\neval_interval = 1000\neval_batches = 1\n"
           "sample_tokens = 0\nlog_interval = 1", seq_len=32)

# The uninterrupted reference: 40 steps.
ref = os.path.join(tmp, "ref")
p = subprocess.run([snip, "train", "--config", cfg, "--run-dir", ref, "--set", "train.max_steps=40"],
                   capture_output=True, text=True, timeout=300)
check(p.returncode == 0, "reference run", p.stderr[-500:])
ref_loss = [r["loss"] for r in metrics(ref)]

for sig, name in [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")]:
    run = os.path.join(tmp, "run-" + name)
    proc = start(["train", "--config", cfg, "--run-dir", run, "--set", "train.max_steps=40"])
    started = wait_for_steps(run, 5, proc)
    check(started, f"{name}: run reached step 5")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    check(proc.returncode == -sig, f"{name}: ends by the signal", f"rc={proc.returncode} err={err[-600:]!r}")
    recs = metrics(run)
    n = len(recs)
    ck = os.path.join(run, "checkpoints", f"step-{n}")
    check(0 < n < 40 and os.path.isdir(ck), f"{name}: checkpoint at the last finished step",
          f"{n} records, {os.listdir(os.path.join(run, 'checkpoints')) if os.path.isdir(os.path.join(run, 'checkpoints')) else 'no checkpoints'}")
    want = f"snip: stopped by {name} at step {n}: checkpoint {ck}; continue with: snip train --run-dir {run} --resume"
    check(want in err, f"{name}: says where and how to continue", f"want {want!r} in {err[-600:]!r}")
    check(not os.path.exists(os.path.join(run, "summary.json")), f"{name}: no summary.json for an unfinished run")
    # --resume finishes it: every step once, the losses of the uninterrupted run.
    p = subprocess.run([snip, "train", "--run-dir", run, "--resume"], capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"{name}: resume finishes", p.stderr[-500:])
    recs = metrics(run)
    check([r["step"] for r in recs] == list(range(1, 41)), f"{name}: every step once",
          str([r["step"] for r in recs]))
    check([r["loss"] for r in recs] == ref_loss, f"{name}: losses of the uninterrupted run")

# A second Ctrl-C more than 1 s after the first stops at once, by SIGINT. A
# big batch makes a step long enough (about 2.8 s on an idle machine) that
# both signals arrive inside the step after step 1 (the first is sent as soon
# as step 1 is recorded).
run = os.path.join(tmp, "run-twice")
proc = start(["train", "--config", cfg, "--run-dir", run, "--set", "train.max_steps=400", "--set",
              "train.batch_size=8192"])
check(wait_for_steps(run, 1, proc), "twice: run reached step 1")
proc.send_signal(signal.SIGINT)
time.sleep(1.2)
proc.send_signal(signal.SIGINT)
out, err = proc.communicate(timeout=120)
check(proc.returncode == -signal.SIGINT, "twice: ends by SIGINT", f"rc={proc.returncode} {err[-300:]}")
check("stopped by SIGINT at step" not in err, "twice: did not wait for a checkpoint", err[-400:])

# The same signal twice within 1 s is one request (a terminal's Ctrl-C
# reaches a rank directly and again through torchrun or the
# --nproc-per-node launcher, which forward it): a normal stop, one checkpoint.
run = os.path.join(tmp, "run-echo")
proc = start(["train", "--config", cfg, "--run-dir", run, "--set", "train.max_steps=400", "--set",
              "train.batch_size=4096"])
check(wait_for_steps(run, 1, proc), "echo: run reached step 1")
proc.send_signal(signal.SIGINT)
time.sleep(0.1)  # two signals sent at once merge into one (standard signals are not queued)
proc.send_signal(signal.SIGINT)
out, err = proc.communicate(timeout=120)
check(proc.returncode == -signal.SIGINT and "stopped by SIGINT at step" in err,
      "echo: a second SIGINT within 1 s still stops after the step, with a checkpoint",
      f"rc={proc.returncode} {err[-400:]}")

# train.checkpoint_minutes: a checkpoint after that much wall time, whatever
# checkpoint_interval says (0.002 minutes = 120 ms; 200 steps take > 1 s),
# against the same run with it off (one checkpoint, at the end).
for minutes, want in [("0.002", lambda n: n >= 3), ("0", lambda n: n == 1)]:
    run = os.path.join(tmp, "run-minutes-" + minutes)
    p = subprocess.run([snip, "train", "--config", cfg, "--run-dir", run, "--set", "train.max_steps=200", "--set",
                        f"train.checkpoint_minutes={minutes}", "--set", "train.keep_checkpoints=0"],
                       capture_output=True, text=True, timeout=300)
    steps = sorted(int(d.split("-")[1]) for d in os.listdir(os.path.join(run, "checkpoints"))
                   if d.startswith("step-"))
    check(p.returncode == 0 and want(len(steps)), f"checkpoint_minutes={minutes}",
          f"rc={p.returncode} checkpoints at {steps}")

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
