#!/usr/bin/env python3
"""kill -9 at any moment loses nothing: a real `snip train` process is
SIGKILLed (SNIP_TEST_KILL: the process sends itself SIGKILL at a named point,
core/kill_point.h), then `snip train --resume` must end with the same
metrics.jsonl records (losses, gradient norms, validation losses, plans and
FP4 shares; the time fields aside), the same plans/ and stats/ files and the
same final checkpoint (weights, AdamW state, quantizer state), byte for
byte, as a run that was never killed.

The moments, on the micro model (16 steps, a checkpoint every 4, plans at
steps 2, 7 and 12 under policy snip):
  step@6              during step 6: forward and backward done, no update
  writing@8           checkpoint step-8 half written (step-8.tmp is left)
  before-marker@8     step-8 in place, last_good.json not yet naming it
  after-checkpoint@8  step-8 complete, step 9's metrics line not written
  stats@7             the stats step of the plan at step 7, after its first pass
  plan@7              the plan at step 7 measured, the solver not yet run
Also: a kill that leaves a torn last line in metrics.jsonl (the line half
written), under policy snip and under a delayed-scaling recipe (fp8_tensor:
its amax histories are in the checkpoint); and 2 ranks under torchrun
(Gloo, 127.0.0.1) with rank 1 SIGKILLed mid-step: torchrun stops the job,
and the job started again with --resume ends as the uninterrupted one.
Under ZeRO stage 1 (2 hand-launched ranks), rank 1 SIGKILLed right after
writing its optimizer shard of step 8: rank 0 stops with one line naming
rank 1, step-8 never becomes a checkpoint (last_good.json stays at 4, the
half-written step-8.tmp is tidied by the resume), and the ranks started
again with --resume end as the uninterrupted run.

usage: kill_resume.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, free_port, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="snip-kill-resume-")
T = Checks(snip)
check = T.check

COMMON = "max_steps = 16\ncheckpoint_interval = 4\neval_interval = 8\neval_batches = 1\nsample_tokens = 0\nlog_interval = 1\n"
CONFIGS = {
    "snip": COMMON + ('[precision]\npolicy = "snip"\nbudget = 0.5\nwarmup_steps = 2\ninitial_interval = 5\n'
                      'final_interval = 5\n'),
    "fp8_tensor": COMMON + '[precision]\nrecipe = "fp8_tensor"\n',
}
POINTS = {
    "snip": ["step@6", "writing@8", "before-marker@8", "after-checkpoint@8", "stats@7", "plan@7"],
    "fp8_tensor": ["step@6", "writing@8", "after-checkpoint@8"],
}


def timing(key):
    """metrics.jsonl's clock readings (elapsed_s, step_s, comm_s, tokens_per_s, *_seconds, resumed)."""
    return key.endswith(("_s", "_seconds")) or key == "resumed"


def clean_env(extra=None):
    env = dict(os.environ)
    for k in ("SNIP_TEST_KILL", "SNIP_TEST_KILL_RANK", "SNIP_TEST_FAULT", "RANK", "WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def train(args, env_extra=None, timeout=300):
    p = subprocess.run([snip, "train"] + args, capture_output=True, text=True, timeout=timeout,
                       env=clean_env(env_extra))
    return p.returncode, p.stdout + p.stderr


def records(run):
    """metrics.jsonl without its time fields."""
    out = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            out.append({k: v for k, v in r.items() if not timing(k)})
    return out


def decisions(run):
    """plans/ and stats/ files without their time fields."""
    out = {}
    for sub in ("plans", "stats"):
        d = os.path.join(run, sub)
        for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            with open(os.path.join(d, n)) as f:
                j = json.load(f)
            for k in ("stats_seconds", "solve_seconds", "plan_solve_seconds"):
                j.pop(k, None)
            if isinstance(j.get("solver"), dict):
                j["solver"].pop("seconds", None)
            out[f"{sub}/{n}"] = j
    return out


def adamw_state(path):
    """optimizer.pt's AdamW state as a sorted list of (step, shape, exp_avg,
    exp_avg_sq bytes): LibTorch keys the state by parameter address and the
    archive carries a random serialization id, so the file's bytes differ
    between two identical runs; its contents may not."""
    import torch
    m = torch.jit.load(path)
    out = []
    for _, st in m.state.named_children():
        t = [getattr(st, k) for k in ("exp_avg", "exp_avg_sq")]
        out.append((int(st.step), tuple(t[0].shape)) + tuple(x.contiguous().numpy().tobytes() for x in t))
    return sorted(out)


def final_checkpoint(run, step=16):
    """The final checkpoint's files, bytes; trainer_state.json without its
    clock, optimizer.pt as its AdamW state."""
    d = os.path.join(run, "checkpoints", f"step-{step}")
    out = {}
    for n in sorted(os.listdir(d)):
        with open(os.path.join(d, n), "rb") as f:
            b = f.read()
        if n == "trainer_state.json":
            j = json.loads(b)
            for k in ("elapsed_s", "resumed_at", "crc32"):
                j.pop(k, None)
            b = json.dumps(j, sort_keys=True).encode()
        elif n == "manifest.json":
            continue  # sizes and CRCs of the files compared here, trainer_state.json's clock included
        elif n == "optimizer.pt":
            b = adamw_state(os.path.join(d, n))
        out[n] = b
    return out


def same(name, ref, run):
    r, k = records(ref), records(run)
    check(r == k, f"{name}: metrics.jsonl as the uninterrupted run's",
          next((f"step {a.get('step')}: {a} vs {b}" for a, b in zip(r, k) if a != b), f"{len(r)} vs {len(k)} records"))
    d1, d2 = decisions(ref), decisions(run)
    check(d1 == d2, f"{name}: plans/ and stats/ as the uninterrupted run's",
          next((n for n in sorted(set(d1) | set(d2)) if d1.get(n) != d2.get(n)), ""))
    c1, c2 = final_checkpoint(ref), final_checkpoint(run)
    check(c1 == c2, f"{name}: final checkpoint (weights, AdamW and quantizer state) byte for byte",
          next((n for n in sorted(set(c1) | set(c2)) if c1.get(n) != c2.get(n)), ""))
    left = [n for n in os.listdir(os.path.join(run, "checkpoints")) if n.endswith((".tmp", ".old"))]
    check(not left, f"{name}: no step-N.tmp or step-N.old left", str(left))


for cfg_name, body in CONFIGS.items():
    cfg = os.path.join(tmp, f"{cfg_name}.toml")
    micro_toml(cfg, data, body)
    ref = os.path.join(tmp, f"{cfg_name}-ref")
    rc, out = train(["--config", cfg, "--run-dir", ref])
    check(rc == 0, f"{cfg_name}: the uninterrupted run", out[-1500:])
    if rc != 0:
        continue
    for point in POINTS[cfg_name]:
        name = f"{cfg_name} killed at {point}"
        run = os.path.join(tmp, f"{cfg_name}-{point.replace('@', '-')}")
        rc, out = train(["--config", cfg, "--run-dir", run], {"SNIP_TEST_KILL": point})
        check(rc == -signal.SIGKILL, f"{name}: the process died of SIGKILL", f"rc={rc} {out[-800:]}")
        if point.startswith("writing@"):
            check(os.path.isdir(os.path.join(run, "checkpoints", "step-8.tmp")),
                  f"{name}: left step-8.tmp half written", str(os.listdir(os.path.join(run, "checkpoints"))))
        rc, out = train(["--run-dir", run, "--resume"])
        check(rc == 0, f"{name}: --resume ends", out[-1500:])
        if rc == 0:
            same(name, ref, run)
    # A torn last line: the kill came while metrics.jsonl's line was half written.
    name = f"{cfg_name} killed with a torn metrics.jsonl line"
    run = os.path.join(tmp, f"{cfg_name}-torn")
    rc, out = train(["--config", cfg, "--run-dir", run], {"SNIP_TEST_KILL": "step@11"})
    check(rc == -signal.SIGKILL, f"{name}: the process died of SIGKILL", f"rc={rc}")
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"elapsed_s":1.5,"fp4_share":0.5,"grad_no')
    rc, out = train(["--run-dir", run, "--resume"])
    check(rc == 0, f"{name}: --resume ends", out[-1500:])
    if rc == 0:
        same(name, ref, run)


# ---- 2 ranks under torchrun: rank 1 SIGKILLed mid-step, the job restarted.

torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
if not os.path.exists(torchrun):
    torchrun = shutil.which("torchrun") or "torchrun"


def job(run, extra_args, env_extra=None):
    env = clean_env(env_extra)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    args = [torchrun, "--nnodes=1", "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--tee", "2", "--redirects", "2", "--no_python", snip,
            "train", "--run-dir", run] + extra_args
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return "timeout", out + err
    return p.returncode, out + err


cfg = os.path.join(tmp, "snip.toml")
ref2 = os.path.join(tmp, "two-ref")
rc, out = job(ref2, ["--config", cfg])
check(rc == 0, "2 ranks: the uninterrupted job", out[-1500:])
run2 = os.path.join(tmp, "two-killed")
rc, out = job(run2, ["--config", cfg], {"SNIP_TEST_KILL": "step@10", "SNIP_TEST_KILL_RANK": "1"})
check(rc not in (0, "timeout"), "2 ranks: rank 1 SIGKILLed at step 10 stops the job", f"rc={rc} {out[-800:]}")
check("Signal 9 (SIGKILL)" in out or "exitcode  : -9" in out, "2 ranks: torchrun names the SIGKILL", out[-1500:])
rc, out = job(run2, ["--resume"])
check(rc == 0, "2 ranks: the job restarted with --resume ends", out[-1500:])
if rc == 0:
    same("2 ranks, rank 1 killed at step@10", ref2, run2)


# ---- ZeRO stage 1 on 2 hand-launched ranks: rank 1 dies mid-checkpoint.
def ranks(run, extra_args, env_extra=None):
    port = free_port()
    ps = []
    for r in range(2):
        env = clean_env(env_extra)
        env.update({"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"})
        ps.append(subprocess.Popen([snip, "train", "--run-dir", run] + extra_args, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, start_new_session=True))
    out = []
    for p in ps:
        try:
            o, e = p.communicate(timeout=120)
            out.append((p.returncode, e))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out.append(("timeout", p.communicate()[1]))
    return out


zcfg = os.path.join(tmp, "zero.toml")
micro_toml(zcfg, data, CONFIGS["snip"].replace("[precision]", "zero_stage = 1\n[precision]"))
zref = os.path.join(tmp, "zero-ref")
res = ranks(zref, ["--config", zcfg])
check(all(r[0] == 0 for r in res), "ZeRO 2 ranks: the uninterrupted run", [r[1][-800:] for r in res])
zrun = os.path.join(tmp, "zero-killed")
res = ranks(zrun, ["--config", zcfg], {"SNIP_TEST_KILL": "shard-written@8", "SNIP_TEST_KILL_RANK": "1"})
check(res[1][0] == -signal.SIGKILL, "ZeRO: rank 1 died of SIGKILL after writing its shard", f"rc={res[1][0]}")
last0 = res[0][1].strip().splitlines()[-1] if res[0][1].strip() else ""
check(res[0][0] == 2 and last0.startswith("snip: error: ") and "rank 1 stopped" in last0,
      "ZeRO: rank 0 stops with one line naming rank 1", f"rc={res[0][0]} {last0!r}")
ck = os.path.join(zrun, "checkpoints")
with open(os.path.join(ck, "last_good.json")) as f:
    check(json.load(f)["step"] == 4, "ZeRO: last_good.json still names step 4", "")
check(not os.path.exists(os.path.join(ck, "step-8")) and os.path.isdir(os.path.join(ck, "step-8.tmp")),
      "ZeRO: step-8 is only a step-8.tmp", str(os.listdir(ck)))
res = ranks(zrun, ["--resume"])
check(all(r[0] == 0 for r in res), "ZeRO: the 2 ranks started again with --resume end", [r[1][-800:] for r in res])
if all(r[0] == 0 for r in res):
    same("ZeRO, rank 1 killed mid-checkpoint", zref, zrun)

shutil.rmtree(tmp, ignore_errors=True)
print(f"kill_resume: {T.passed} checks passed, {len(T.failures)} failed")
sys.exit(1 if T.failures else 0)
