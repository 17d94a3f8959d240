#!/usr/bin/env python3
"""`snip train --nproc-per-node N` (N local ranks without torchrun;
docs/distributed.md), through the real binary, the micro model:

  exact    --nproc-per-node 2 == 1 process with grad_accum 2: metrics of
           every step and model.safetensors byte for byte (the equality the
           dist_train test proves for hand-launched ranks)
  stop     SIGTERM to the launcher reaches every rank: they stop after the
           same step, write one checkpoint, and the launcher ends by SIGTERM
  fault    a rank whose weights differ (the test-only hook
           SNIP_TEST_PERTURB_RANK) stops the run: exit 2, one error line
           naming the tensor, no rank left running
  refused  inside torchrun (RANK set), or N = 0: one line, exit 2

Ranks bind 127.0.0.1 (the launcher's MASTER_ADDR); every launcher runs in its
own session under a timeout and its process group is killed at the end.

usage: launch_local.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from clitest import Checks, micro_toml

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
tmp = tempfile.mkdtemp(prefix="snip-launch-")
T = Checks(snip)
check = T.check
procs = []


def env(extra=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    e["GLOO_SOCKET_IFNAME"] = "lo"
    e.update(extra or {})
    return e


def start(args, extra=None):
    p = subprocess.Popen([snip] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(extra), start_new_session=True)
    procs.append(p)
    return p


def finish(p, timeout=240):
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return "timeout", out, err


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: r.get(k) for k in ("step", "loss", "grad_norm", "val_loss", "lr")} for r in map(json.loads, f)]


def read(path):
    with open(path, "rb") as f:
        return f.read()


try:
    cfg = os.path.join(tmp, "m.toml")
    micro_toml(cfg, data, "max_steps = 6\ncheckpoint_interval = 3\neval_interval = 3\neval_batches = 2")

    # exact
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    rc, out, err = finish(start(["train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", a]))
    check(rc == 0, "exact: 2 local ranks train", f"rc={rc} {err[-500:]!r}")
    check("--nproc-per-node 2: ranks 0-1 started" in err and "rendezvous at 127.0.0.1:" in err,
          "exact: the launcher says what it started", err[:300])
    rc, out, err = finish(start(["train", "--config", cfg, "--set", "train.grad_accum=2", "--run-dir", b]))
    check(rc == 0, "exact: 1 rank, grad_accum 2", err[-300:])
    if os.path.exists(os.path.join(a, "metrics.jsonl")) and os.path.exists(os.path.join(b, "metrics.jsonl")):
        check(metrics(a) == metrics(b), "exact: every step's loss, grad_norm, val_loss equal")
        mk = lambda r: os.path.join(r, "checkpoints", "step-6", "model.safetensors")  # noqa: E731
        check(os.path.exists(mk(a)) and read(mk(a)) == read(mk(b)), "exact: model.safetensors byte for byte")
        check(sorted(os.listdir(a)) == sorted(os.listdir(b)), "exact: the same files (rank 1 wrote none)",
              f"{sorted(os.listdir(a))} vs {sorted(os.listdir(b))}")

    # stop: SIGTERM to the launcher, once rank 0 has made progress
    s = os.path.join(tmp, "s")
    p = start(["train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", s, "--set", "train.max_steps=100000",
               "--set", "train.checkpoint_interval=100000", "--set", "train.log_interval=1"])
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(s, "metrics.jsonl")):
        time.sleep(0.2)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p)
    check(rc == -signal.SIGTERM, "stop: the launcher ends by SIGTERM", f"rc={rc} {err[-500:]!r}")
    ck = os.path.join(s, "checkpoints")
    steps = sorted(d for d in os.listdir(ck) if d.startswith("step-")) if os.path.isdir(ck) else []
    check(len(steps) == 1, "stop: one checkpoint, at the step both ranks stopped after", str(steps))
    check("snip: stopped by SIGTERM at step" in err, "stop: rank 0 says where and how to continue", err[-400:])
    check(f"continue with: snip train --nproc-per-node 2 --run-dir {s} --resume" in err,
          "stop: the hint starts the same number of ranks", err[-400:])

    # fault: rank 1's weights perturbed after step 2 -> the checksum stops every rank
    f = os.path.join(tmp, "f")
    rc, out, err = finish(start(["train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", f, "--set",
                                 "dist.check_interval=1"], {"SNIP_TEST_PERTURB_RANK": "1",
                                                            "SNIP_TEST_PERTURB_STEP": "2"}))
    errors = [l for l in err.splitlines() if l.startswith("snip: error: ")]
    check(rc == 2 and errors and "differs from rank 0" in errors[0], "fault: exit 2 naming the differing tensor",
          f"rc={rc} {err[-600:]!r}")

    # refused
    p = subprocess.run([snip, "train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", os.path.join(tmp, "r")],
                       capture_output=True, text=True, timeout=60,
                       env=env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}))
    lines = p.stderr.splitlines()
    check(p.returncode == 2 and len(lines) == 1 and "this process is already a rank (RANK is set" in lines[0]
          and not os.path.exists(os.path.join(tmp, "r")), "refused: inside torchrun", p.stderr)
    T.expect_error("refused: --nproc-per-node 0",
                   ["train", "--config", cfg, "--nproc-per-node", "0", "--run-dir", os.path.join(tmp, "z")],
                   "--nproc-per-node: expected 2 to 256 local ranks, got 0", absent=os.path.join(tmp, "z"))
finally:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    shutil.rmtree(tmp, ignore_errors=True)
T.finish()
