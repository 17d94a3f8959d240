#!/usr/bin/env python3
"""train.clip_low_precision acts on the update, not only on the log: the
gradient AdamW receives is the clipped one, of norm grad_clip while every
layer runs BF16 (the warmup) and grad_clip x clip_low_precision once a layer
runs FP4.

The run: the micro model under policy snip (warmup 2 steps, then a plan with
FP4 layers), grad_clip 0.5, clip_low_precision 0.6, a checkpoint after every
step. AdamW's first moment moves as m_t = beta1·m_{t-1} + (1 - beta1)·g_t, so
the gradient a step applied is g_t = (m_t - beta1·m_{t-1}) / (1 - beta1),
read from two consecutive checkpoints' optimizer.pt (the same process wrote
both, so their state keys, the parameters' addresses, match). Its global
L2 norm must be the threshold whenever the step's logged grad_norm (the norm
before clipping) exceeds it: 0.5 at step 2, 0.3 at steps 3 and 4.

usage: clip_threshold.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="snip-clip-")
T = Checks(snip)
check = T.check
GRAD_CLIP, FACTOR, BETA1 = 0.5, 0.6, 0.9

cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, f"max_steps = 4\ncheckpoint_interval = 1\nkeep_checkpoints = 10\neval_interval = 4\n"
           f"eval_batches = 1\nsample_tokens = 0\nlog_interval = 1\ngrad_clip = {GRAD_CLIP}\n"
           f"clip_low_precision = {FACTOR}\nbeta1 = {BETA1}\n"
           '[precision]\npolicy = "snip"\nwarmup_steps = 2\n')
run = os.path.join(tmp, "run")
env = {k: v for k, v in os.environ.items() if not k.startswith("SNIP_TEST_")}
p = subprocess.run([snip, "train", "--config", cfg, "--run-dir", run], capture_output=True, text=True, timeout=120,
                   env=env)
check(p.returncode == 0, "the run ends", p.stderr[-1500:])
with open(os.path.join(run, "metrics.jsonl")) as f:
    recs = [json.loads(l) for l in f]


def first_moments(step):
    m = torch.jit.load(os.path.join(run, "checkpoints", f"step-{step}", "optimizer.pt"))
    return {key: st.exp_avg.double() for key, st in m.state.named_children()}


threshold = GRAD_CLIP
for step in (2, 3, 4):
    rec = recs[step - 1]
    threshold = rec.get("grad_clip", threshold)  # logged when it changes
    m_prev, m_now = first_moments(step - 1), first_moments(step)
    check(set(m_prev) == set(m_now), f"step {step}: the same parameters in both checkpoints")
    applied = math.sqrt(sum(float(((m_now[k] - BETA1 * m_prev[k]) / (1 - BETA1)).square().sum()) for k in m_now))
    want = GRAD_CLIP * (FACTOR if rec["fp4_share"] > 0 else 1.0)
    check(threshold == want, f"step {step}: the logged threshold is {want}", f"logged {threshold}")
    check(rec["grad_norm"] > want, f"step {step}: the gradient needs clipping", f"norm {rec['grad_norm']}")
    check(abs(applied - want) < 1e-4 * want, f"step {step}: AdamW received a gradient of norm {want}",
          f"{applied} (grad_norm before clipping {rec['grad_norm']}, fp4_share {rec['fp4_share']})")

shutil.rmtree(tmp, ignore_errors=True)
print(f"clip_threshold: {T.passed} checks passed, {len(T.failures)} failed")
sys.exit(1 if T.failures else 0)
