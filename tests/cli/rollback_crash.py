#!/usr/bin/env python3
"""A process killed (SIGKILL, as kill -9) while the guard's rollback rewrites
its target checkpoint loses nothing, through the real binary.

The run: micro model, 12 steps, a checkpoint every 4 steps with only the
newest kept (train.keep_checkpoints = 1), and an Inf injected into a
gradient at step 6 (SNIP_TEST_FAULT), which makes the guard roll back to
step-4 and write step-4 again. SNIP_TEST_KILL kills the process at one point
of that rewrite:
  rewrite-writing        the new step-4's files half written (step-4.tmp)
  rewrite-aside          the old step-4 renamed to step-4.old, the new one
                         not yet in its place
  rewrite-before-record  the new step-4 in place, the rollback's record not
                         yet in metrics.jsonl
After each, a complete checkpoint of step 4 must still be there, and
`--resume` must end with the same metrics.jsonl records (steps, losses,
grad norms, the rollback) and summary as the run that was never killed: in
the first two cases the run resumes from the old step-4 and meets the same
rollback again; in the third it resumes as the rolled-back run and writes
the missing record. No step-N.tmp or step-N.old is left behind.

Also: killed after a checkpoint took its name but before last_good.json
named it, the resume marks it (SNIP_TEST_KILL=before-marker@N); `snip
correlate --step N` reads a step-N.old; a start killed before its first
step (an empty metrics.jsonl) or during its first checkpoint (a step-N.tmp)
starts again; a resume that finds no complete checkpoint but last_good.json
naming one refuses (exit 2, one line) and changes nothing.

usage: rollback_crash.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="snip-rollback-crash-")
T = Checks(snip)
check = T.check

cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 12\ncheckpoint_interval = 4\nkeep_checkpoints = 1\neval_interval = 4\n"
           "eval_batches = 1\nsample_tokens = 0\nlog_interval = 1")


def train(run, env_extra, resume=False):
    env = dict(os.environ)
    env.pop("SNIP_TEST_FAULT", None)
    env.pop("SNIP_TEST_KILL", None)
    env.update(env_extra)
    args = [snip, "train", "--run-dir", run] + (["--resume"] if resume else ["--config", cfg])
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, p.stdout + p.stderr  # spdlog's lines go to stdout, errors to stderr


def records(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def trajectory(run):
    """What must not depend on a kill: per record its step, loss, grad norm,
    validation loss, skipped flag and rollback target."""
    return [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss"), r.get("skipped", False), r.get("rollback_to"))
            for r in records(run)]


def checkpoint_entries(run):
    return sorted(os.listdir(os.path.join(run, "checkpoints")))


FAULT = {"SNIP_TEST_FAULT": "grad-inf@6"}

ref = os.path.join(tmp, "ref")
rc, err = train(ref, FAULT)
check(rc == 0, "reference run", err[-2000:])
want = trajectory(ref)
rolled = [r for r in want if r[5] is not None]
check(len(rolled) == 1 and rolled[0][0] == 6 and rolled[0][5] == 4, "reference: one rollback, at step 6 to step 4",
      str(rolled))
with open(os.path.join(ref, "summary.json")) as f:
    ref_summary = json.load(f)
check(ref_summary["guard"]["rollbacks"] == 1 and ref_summary["steps"] == 12, "reference summary",
      json.dumps(ref_summary["guard"]))
# Steps 5 and 6 were computed, then discarded by the rollback to step 4: 2 x
# (batch 2 x 16 tokens) processed beyond the final model's 12 x 32.
check(ref_summary["guard"]["rolled_back_steps"] == 2 and ref_summary["tokens"] == 12 * 32
      and ref_summary["tokens_rolled_back"] == 2 * 32 and ref_summary["tokens_processed"] == 14 * 32,
      "reference summary counts the rolled-back steps' tokens",
      json.dumps({k: ref_summary.get(k) for k in ("tokens", "tokens_rolled_back", "tokens_processed")}))

for point, resume_env in (("rewrite-writing", FAULT), ("rewrite-aside", FAULT), ("rewrite-before-record", {})):
    run = os.path.join(tmp, point)
    rc, err = train(run, dict(FAULT, SNIP_TEST_KILL=point))
    check(rc == -signal.SIGKILL, f"{point}: killed by SIGKILL", f"rc={rc} {err[-1500:]}")
    entries = checkpoint_entries(run)
    complete = [e for e in entries if e in ("step-4", "step-4.old")
                and os.path.isfile(os.path.join(run, "checkpoints", e, "trainer_state.json"))]
    check(len(complete) >= 1, f"{point}: a complete checkpoint of step 4 survives the kill", str(entries))
    if point == "rewrite-aside":
        check("step-4" not in entries and "step-4.old" in entries and "step-4.tmp" in entries,
              f"{point}: killed between the two renames", str(entries))
    # Killed before the new step-4 took its name, the run is the run before
    # the rollback and meets the same Inf again; after it, the rolled-back run.
    rc, err = train(run, resume_env, resume=True)
    check(rc == 0, f"{point}: --resume finishes the run", err[-2000:])
    if rc != 0:
        continue
    check("has no checkpoint yet" not in err, f"{point}: --resume did not start from step 0", err[-1000:])
    got = trajectory(run)
    check(got == want, f"{point}: metrics.jsonl equals the uninterrupted run's record for record",
          f"\n got {got}\nwant {want}")
    with open(os.path.join(run, "summary.json")) as f:
        s = json.load(f)
    check(s["guard"]["rollbacks"] == 1 and s["steps"] == 12 and s["final_val_loss"] == ref_summary["final_val_loss"]
          and s["tokens_processed"] == ref_summary["tokens_processed"],
          f"{point}: summary (1 rollback, 12 steps, the same final validation loss)",
          json.dumps({k: s[k] for k in ("steps", "guard", "final_val_loss")}))
    left = [e for e in checkpoint_entries(run) if e.endswith(".tmp") or e.endswith(".old")]
    check(not left, f"{point}: no unfinished checkpoint left", str(checkpoint_entries(run)))

# Right after a rollback the run holds exactly the checkpoint it rolled back
# to: killed between the rewrite's renames, the old step-4 (step-4.old,
# written at step 4) and the new one (step-4.tmp, written from memory right
# after the rollback) hold the same weights, the same AdamW state and the
# same quantizer state (a delayed-scaling recipe: fp8_tensor's amax
# histories), only the guard's record differing.
fp8cfg = os.path.join(tmp, "fp8_tensor.toml")
micro_toml(fp8cfg, data, "max_steps = 12\ncheckpoint_interval = 4\nkeep_checkpoints = 1\neval_interval = 4\n"
           'eval_batches = 1\nsample_tokens = 0\nlog_interval = 1\n[precision]\nrecipe = "fp8_tensor"')
state_run = os.path.join(tmp, "rollback-state")
env = {k: v for k, v in os.environ.items() if k not in ("SNIP_TEST_FAULT", "SNIP_TEST_KILL")}
env.update(FAULT, SNIP_TEST_KILL="rewrite-aside")
p = subprocess.run([snip, "train", "--config", fp8cfg, "--run-dir", state_run], capture_output=True, text=True,
                   timeout=300, env=env)
check(p.returncode == -signal.SIGKILL, "rollback state: killed between the rewrite's renames", p.stderr[-800:])
old, new = (os.path.join(state_run, "checkpoints", d) for d in ("step-4.old", "step-4.tmp"))


def adamw(d):
    import torch
    m = torch.jit.load(os.path.join(d, "optimizer.pt"))
    return {k: (int(st.step), st.exp_avg.numpy().tobytes(), st.exp_avg_sq.numpy().tobytes())
            for k, st in m.state.named_children()}


def quantizers(d):
    with open(os.path.join(d, "trainer_state.json")) as f:
        return json.load(f)["precision"]["quantizers"]


if os.path.isdir(old) and os.path.isdir(new):
    with open(os.path.join(old, "model.safetensors"), "rb") as a, open(os.path.join(new, "model.safetensors"), "rb") as b:
        check(a.read() == b.read(), "rollback state: the weights after the rollback are step 4's, byte for byte")
    check(adamw(old) == adamw(new), "rollback state: AdamW's step, m and v are step 4's")
    qo, qn = quantizers(old), quantizers(new)
    check(qo == qn and qo, "rollback state: the delayed-scaling amax histories are step 4's",
          f"{json.dumps(qo)[:300]} vs {json.dumps(qn)[:300]}")

# Killed after a checkpoint took its name but before last_good.json named
# it: the resume marks it (it records "rollback_target"), so the rollback at
# step 10 returns to step 8 as in the uninterrupted run, not to step 4.
FAULT10 = {"SNIP_TEST_FAULT": "grad-inf@10"}
ref10 = os.path.join(tmp, "ref10")
rc, err = train(ref10, FAULT10)
check(rc == 0 and [r[5] for r in trajectory(ref10) if r[5] is not None] == [8], "reference: a rollback to step 8",
      err[-800:])
marker = os.path.join(tmp, "before-marker")
rc, err = train(marker, dict(FAULT10, SNIP_TEST_KILL="before-marker@8"))
check(rc == -signal.SIGKILL, "before-marker: killed by SIGKILL", f"rc={rc} {err[-800:]}")
with open(os.path.join(marker, "checkpoints", "last_good.json")) as f:
    check(json.load(f)["step"] == 4, "before-marker: last_good.json still names step 4")
rc, err = train(marker, FAULT10, resume=True)
check(rc == 0 and "as the last good checkpoint" in err, "before-marker: --resume marks step 8", err[-1500:])
check(trajectory(marker) == trajectory(ref10), "before-marker: metrics.jsonl equals the uninterrupted run's",
      f"\n got {trajectory(marker)}\nwant {trajectory(ref10)}")

# snip correlate --step 4 finds a step-4.old standing for step 4.
aside = os.path.join(tmp, "aside-again")
rc, err = train(aside, dict(FAULT, SNIP_TEST_KILL="rewrite-aside"))
check(rc == -signal.SIGKILL and "step-4.old" in checkpoint_entries(aside), "aside again: killed between the renames")
rc, out, err = T.run(["correlate", "--run", aside, "--step", "4", "--steps", "1", "--layers", "layers.0.mlp.*",
                      "--out", os.path.join(tmp, "corr-aside")], timeout=300)
check(rc == 0, "correlate --step 4 reads step-4.old", err[-800:])
rc, err = train(aside, FAULT, resume=True)
check(rc == 0 and "renamed" in err and "step-4.old" not in checkpoint_entries(aside),
      "aside again: the resume gives step-4.old its name back", f"{checkpoint_entries(aside)} {err[-800:]}")

# A start killed before its first step leaves an empty metrics.jsonl: a new
# start in that folder is not refused as "already holds a run".
early = os.path.join(tmp, "early")
os.makedirs(early)
open(os.path.join(early, "metrics.jsonl"), "w").close()
rc, err = train(early, {})
check(rc == 0, "a folder holding only an empty metrics.jsonl starts afresh", err[-800:])

# A run killed while its first checkpoint was written (a step-N.tmp, no
# markers) starts again from step 0 and ends as the uninterrupted run.
first = os.path.join(tmp, "first-tmp")
shutil.copytree(ref, first)
for e in checkpoint_entries(first):
    p = os.path.join(first, "checkpoints", e)
    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
os.makedirs(os.path.join(first, "checkpoints", "step-4.tmp"))
os.remove(os.path.join(first, "summary.json"))
rc, err = train(first, FAULT, resume=True)
check(rc == 0 and trajectory(first) == want and "step-4.tmp" not in checkpoint_entries(first),
      "only an unfinished first checkpoint: --resume starts from step 0 and ends as the uninterrupted run",
      err[-800:])

# No complete checkpoint, but an unfinished one, or markers naming lost ones
# (the state the old rewrite left when killed between its delete and its
# rename): refused, where a run stopped before its first checkpoint starts
# again from step 0.
lost = os.path.join(tmp, "lost")
shutil.copytree(ref, lost)
for e in checkpoint_entries(lost):
    if e.startswith("step-"):
        shutil.rmtree(os.path.join(lost, "checkpoints", e))
os.makedirs(os.path.join(lost, "checkpoints", "step-8.tmp"))
T.expect_error("resume without a checkpoint but last_good.json", ["train", "--run-dir", lost, "--resume"],
               "has no complete checkpoint but " + os.path.join(lost, "checkpoints", "last_good.json") +
               " names checkpoints that are gone", untouched=lost)

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
