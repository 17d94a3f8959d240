#!/usr/bin/env python3
"""dist.backend = nccl (docs/distributed.md "Backends"), through the real
binary and the micro model.

Every machine (`dist_nccl.py SNIP DATA`, CTest dist_nccl, label dist):
  refused  one rank of a world of 2 (torchrun's variables, 127.0.0.1, a free
           port) with dist.backend = nccl and train.device = cpu, and (where
           fewer than 2 CUDA devices are seen) train.device = auto: exit 2,
           exactly one line naming dist.backend and train.device, before any
           rendezvous (it does not wait for rank 1) and before the run folder
           exists
  mismatch rank 0 of 2 on the CPU (gloo) and a stand-in rank 1 (Python's
           TCPStore client) that reports nccl in the rendezvous handshake:
           exit 2, one line naming both ranks' backends, without waiting
           for dist.timeout_s
  launch   the same through `snip train --nproc-per-node 2`: exit 2, each
           rank's line names dist.backend = nccl, no run folder, no rank left
  auto     (without 2 CUDA devices) dist.backend = auto, train.device = auto
           on 2 ranks trains over gloo on the CPU and says so

With 2 GPUs (`dist_nccl.py SNIP DATA --gpu`, CTest dist_nccl_gpu, label cuda;
exit 77 = skipped, with the reason, where fewer than 2 CUDA devices are
seen; SNIP_REQUIRE_CUDA=1 makes that a failure): 2 ranks over nccl (auto and
auto: cuda:0 and cuda:1) against 2 ranks over gloo on the CPU, for the plain
all-reduce (overlapped), dist.overlap = false, train.zero_stage = 2 and
dist.grad_comm = fp8 (allgather path): every step's loss within 5 % and the
first step's within 1e-3 relative (the same weights and batch; the GEMMs of
the GPU sum in another order, as in train_device.py), summary.json's device
is cuda:0 on rank 0 and the log says "over nccl". A world of one process
makes no communicator, so there is no 1-GPU nccl case: it is reported as
skipped.

usage: dist_nccl.py SNIP_BINARY PREPARED_DATA_DIR [--gpu]
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
from clitest import Checks, free_port, micro_toml  # noqa: E402

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
gpu = "--gpu" in sys.argv[3:]
T = Checks(snip)
check = T.check
tmp = tempfile.mkdtemp(prefix="snip-nccl-")
procs = []


def env(extra=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "TORCHELASTIC_"))
         and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    e["GLOO_SOCKET_IFNAME"] = "lo"
    e.update(extra or {})
    return e


def run(args, extra=None, timeout=240):
    """(exit status or "timeout", stdout, stderr, seconds) of `snip ARGS` in its own session."""
    t0 = time.time()
    p = subprocess.Popen([snip] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(extra), start_new_session=True)
    procs.append(p)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.time() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return "timeout", out, err, time.time() - t0


def cuda_devices():
    """(count, why) of the CUDA devices snip sees (snip doctor --json)."""
    rc, out, err, _ = run(["doctor", "--json"], timeout=300)
    try:
        j = json.loads(out)
    except ValueError:
        return 0, f"snip doctor --json failed (exit {rc}): {err.strip()[-300:]}"
    n = int(j.get("cuda_devices") or 0)
    g = j.get("gpu") or {}
    return n, (g.get("reason") or "snip doctor found no GPU") if n == 0 else f"{n} CUDA device(s)"


def losses(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


try:
    cfg = os.path.join(tmp, "m.toml")
    micro_toml(cfg, data, "max_steps = 6\ncheckpoint_interval = 3\neval_interval = 3\neval_batches = 2\n"
               "[monitor]\nlisten = \"\"")
    n_gpu, why = cuda_devices()

    if not gpu:
        # refused: rank 0 of 2 alone; it must stop before the rendezvous (rank 1 never comes).
        one_rank = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        cases = [("cpu", "train.device = cpu")]
        if n_gpu < 2:
            cases.append(("auto", "train.device = auto"))
        else:
            print(f"note: {why}: train.device = auto resolves to CUDA here; its refusal is not checked")
        for device, needle in cases:
            r = os.path.join(tmp, "refused-" + device)
            rc, out, err, secs = run(["train", "--config", cfg, "--run-dir", r, "--set", "dist.backend=nccl",
                                      "--set", f"train.device={device}"], one_rank, timeout=60)
            lines = err.splitlines()
            check(rc == 2 and len(lines) == 1 and lines[0].startswith("snip: error: dist.backend = nccl")
                  and needle in lines[0], f"refused ({device}): exit 2, one line naming dist.backend and {needle}",
                  f"rc={rc} stderr={err!r}")
            check(secs < 30, f"refused ({device}): before the rendezvous", f"{secs:.1f} s")
            check(not os.path.exists(r), f"refused ({device}): no run folder", r)

        # mismatch: rank 0 (gloo on the CPU) and a stand-in rank 1 that reports nccl in the rendezvous handshake
        # (what a GPU rank under dist.backend = auto writes): rank 0 stops in one line naming both.
        port = free_port()
        r = os.path.join(tmp, "mismatch")
        rank0 = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        t0 = time.time()
        p0 = subprocess.Popen([snip, "train", "--config", cfg, "--run-dir", r, "--set", "dist.backend=auto",
                               "--set", "train.device=cpu", "--set", "dist.timeout_s=60"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env(rank0), start_new_session=True)
        procs.append(p0)
        import datetime
        import torch.distributed as tdist
        store = tdist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
        store.set("snip/0/world/1", "2 nccl")
        try:
            out, err = p0.communicate(timeout=60)
            rc = p0.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p0.pid, signal.SIGKILL)
            out, err = p0.communicate()
            rc = "timeout"
        del store
        lines = [l for l in err.splitlines() if l.startswith("snip: error:")]
        check(rc == 2 and len(lines) == 1 and "backend mismatch: rank 1 resolved dist.backend to nccl, rank 0 to "
              "gloo" in lines[0], "mismatch: exit 2, one line naming both ranks' backends",
              f"rc={rc} stderr={err[-800:]!r}")
        check(time.time() - t0 < 45, "mismatch: at the handshake, not after dist.timeout_s",
              f"{time.time() - t0:.1f} s")

        # launch: the same from `snip train --nproc-per-node 2`.
        r = os.path.join(tmp, "launch")
        rc, out, err, secs = run(["train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", r,
                                  "--set", "dist.backend=nccl"], timeout=120)
        errors = [l for l in err.splitlines() if "error" in l]
        check(rc == 2 and errors and all("dist.backend = nccl needs one CUDA device per rank" in l for l in errors),
              "launch: exit 2, every error line names dist.backend = nccl", f"rc={rc} stderr={err[-800:]!r}")
        check(not os.path.exists(r), "launch: no run folder", r)

        # auto: gloo on the CPU where CUDA cannot take 2 ranks.
        if n_gpu < 2:
            r = os.path.join(tmp, "auto")
            rc, out, err, secs = run(["train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", r,
                                      "--set", "dist.backend=auto", "--set", "train.device=auto"])
            check(rc == 0, "auto: 2 ranks train", f"rc={rc} {err[-800:]!r}")
            check("over gloo" in err + out, "auto: the log says gloo", (err + out)[-800:])
            if rc == 0:
                with open(os.path.join(r, "summary.json")) as f:
                    s = json.load(f)
                check(s.get("device") == "cpu" and s.get("device_reason", "").startswith("train.device = auto: "),
                      "auto: summary.json device cpu with its reason",
                      json.dumps({k: s.get(k) for k in ("device", "device_reason")}))
        T.finish()

    # --gpu
    if n_gpu < 2:
        msg = f"dist_nccl --gpu needs 2 CUDA devices: {why}"
        if os.environ.get("SNIP_REQUIRE_CUDA") == "1":
            print(f"FAIL: SNIP_REQUIRE_CUDA=1 but {msg}", file=sys.stderr)
            sys.exit(1)
        print(f"skipped: {msg}")
        sys.exit(77)
    print("skipped: 1-GPU nccl (a world of one process makes no communicator)")
    variants = [("overlapped", []), ("after-backward", ["--set", "dist.overlap=false"]),
                ("zero2", ["--set", "train.zero_stage=2"]),
                ("fp8-allgather", ["--set", "dist.grad_comm=fp8", "--set", "dist.grad_comm_path=allgather"])]
    for name, sets in variants:
        runs = {}
        for backend, device in (("auto", "auto"), ("gloo", "cpu")):
            r = os.path.join(tmp, f"{name}-{backend}")
            rc, out, err, secs = run(["train", "--config", cfg, "--nproc-per-node", "2", "--run-dir", r,
                                      "--set", f"dist.backend={backend}", "--set", f"train.device={device}"] + sets,
                                     timeout=300)
            check(rc == 0, f"{name}: 2 ranks over {backend} on {device} train", f"rc={rc} {err[-1500:]!r}")
            if rc == 0:
                runs[backend] = (r, err + out)
        if len(runs) < 2:
            continue
        (g, glog), (c, clog) = runs["auto"], runs["gloo"]
        check("over nccl" in glog, f"{name}: auto on 2 GPUs is nccl", glog[-800:])
        with open(os.path.join(g, "summary.json")) as f:
            dev = json.load(f).get("device")
        check(dev == "cuda:0", f"{name}: rank 0 on cuda:0", str(dev))
        lg, lc = losses(g), losses(c)
        check(len(lg) == len(lc) == 6, f"{name}: 6 steps each", f"{len(lg)} vs {len(lc)}")
        if lg and lc:
            check(abs(lg[0] - lc[0]) <= 1e-3 * abs(lc[0]), f"{name}: step 1 loss within 1e-3", f"{lg[0]} vs {lc[0]}")
            check(all(abs(a - b) <= 0.05 * abs(b) for a, b in zip(lg, lc)), f"{name}: every loss within 5 %",
                  f"nccl {lg} gloo {lc}")
finally:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    shutil.rmtree(tmp, ignore_errors=True)
T.finish()
