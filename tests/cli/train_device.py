"""train.device (docs/gpu.md "Training on a GPU").

Every machine (`train_device.py SNIP DATA`):
  - train.device = cuda where LibTorch sees no CUDA device: exit 2, one line
    naming train.device and why, no run folder left behind;
  - train.device = auto there trains on the CPU and says why (log line,
    summary.json "device" = "cpu" with its reason);
  - a word other than auto/cpu/cuda: exit 2, one line.

With a GPU (`train_device.py SNIP DATA --gpu`, CTest label cuda; exit 77 =
skipped, with the reason, where there is none; SNIP_REQUIRE_CUDA=1 makes a
missing device fail instead):
  - the same micro run (the snip policy: FP4/FP8 layers, the stats step, the
    controller) on the CPU and on cuda: summary.json says cuda; the first
    step's loss agrees to 1e-3 (same weights and batch: the GEMMs differ
    only in summation order) and the last step's to 5%; FP4 shares equal;
  - the cuda run's step-10 checkpoint resumes on the CPU and ends (a
    checkpoint moves across devices), and a CPU checkpoint resumes on cuda.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
gpu = "--gpu" in sys.argv[3:]
c = Checks(snip)
tmp = tempfile.mkdtemp(prefix="snip-train-device-")


def has_cuda():
    """(True, "") when snip sees a CUDA device, else (False, why)."""
    rc, out, err = c.run(["doctor", "--json"], timeout=300)
    try:
        g = json.loads(out).get("gpu") or {}
    except ValueError:
        return False, f"snip doctor --json failed (exit {rc}): {err.strip()[-300:]}"
    if g.get("present"):
        return True, ""
    return False, g.get("reason") or "snip doctor found no GPU"


def train(run, device, extra=(), timeout=600):
    return c.run(["train", "--config", cfg, "--run-dir", run, "--set", f"train.device={device}"] + list(extra),
                 timeout=timeout)


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(run):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)


try:
    cfg = os.path.join(tmp, "micro.toml")
    micro_toml(cfg, data, "max_steps = 20\neval_interval = 10\ncheckpoint_interval = 10\nkeep_checkpoints = 4\n"
               "[precision]\npolicy = \"snip\"\nbudget = 0.5\nwarmup_steps = 4\ninitial_interval = 8\n"
               "[monitor]\nlisten = \"\"")
    present, why = has_cuda()
    if not gpu:
        if present:
            print("note: a CUDA device is present: the error case for train.device = cuda is not checked here")
        else:
            c.expect_error("cuda without a device", ["train", "--config", cfg, "--run-dir", os.path.join(tmp, "x"),
                                                     "--set", "train.device=cuda"], "train.device = cuda",
                           absent=os.path.join(tmp, "x"))
            # snip doctor --config resolves it as the trainer does: exit 2 naming it.
            dcfg = os.path.join(tmp, "cuda.toml")
            with open(dcfg, "w") as f:
                f.write(f'[data]\ndir = "{data}"\n[train]\ndevice = "cuda"\n')
            rc, out, err = c.run(["doctor", "--config", dcfg], timeout=300)
            c.check(rc == 2 and "device: train.device = cuda: no CUDA device" in err, "doctor refuses cuda",
                    f"rc={rc} {err[-500:]}")
            run = os.path.join(tmp, "auto")
            rc, out, err = train(run, "auto")
            c.check(rc == 0, "auto trains", err[-1500:])
            c.check("device: cpu (train.device = auto: " in err + out, "auto says what it chose",
                    (err + out)[-1500:])
            if rc == 0:
                s = summary(run)
                c.check(s.get("device") == "cpu" and s.get("device_reason", "").startswith("train.device = auto: "),
                        "summary.json device", json.dumps({k: s.get(k) for k in ("device", "device_reason")}))
        # train.fp8_gemm: the per-tensor FP8 recipe's GEMMs through at::_scaled_mm
        # (oneDNN here) give the FP32 emulation's losses; summary.json counts them.
        fp8 = ["--set", "precision.policy=uniform-fp8_tensor", "--set", "train.gemm_dtype=fp32",
               "--set", "train.max_steps=8"]
        losses = {}
        for mode in ("native", "emulated"):
            run = os.path.join(tmp, "fp8-" + mode)
            rc, out, err = train(run, "cpu", fp8 + ["--set", f"train.fp8_gemm={mode}"])
            c.check(rc == 0, f"fp8_gemm={mode} trains", err[-1500:])
            if rc == 0:
                losses[mode] = [r["loss"] for r in metrics(run)]
                n = summary(run).get("fp8_gemms_native")
                c.check(n == 0 if mode == "emulated" else n >= 7 * 3, f"fp8_gemm={mode}: native GEMMs counted",
                        f"fp8_gemms_native = {n}")
        if len(losses) == 2:
            c.check(all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(losses["native"], losses["emulated"])),
                    "native FP8 GEMMs give the emulation's losses", f"{losses}")
        # train.attention: LibTorch's fused SDPA (the CUDA default) gives the
        # explicit products' losses on the CPU in FP32 (rounding only: 1e-5).
        att, names = {}, {}
        for mode in ("sdpa", "math"):
            run = os.path.join(tmp, "att-" + mode)
            rc, out, err = train(run, "cpu", ["--set", "train.gemm_dtype=fp32", "--set", "train.max_steps=8",
                                              "--set", f"train.attention={mode}"])
            c.check(rc == 0, f"attention={mode} trains", err[-1500:])
            if rc == 0:
                att[mode] = [r["loss"] for r in metrics(run)]
                names[mode] = summary(run).get("attention")
        c.check(names == {"sdpa": "sdpa", "math": "math"}, "summary.json attention", f"{names}")
        if len(att) == 2:
            c.check(len(att["sdpa"]) == 8 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(att["sdpa"], att["math"])),
                    "SDPA gives the explicit attention's losses", f"{att}")
        c.expect_error("another word", ["train", "--config", cfg, "--run-dir", os.path.join(tmp, "y"),
                                        "--set", "train.device=gpu"], "expected auto, cpu or cuda",
                       absent=os.path.join(tmp, "y"))
        c.finish()

    if not present:
        if os.environ.get("SNIP_REQUIRE_CUDA") == "1":
            print(f"FAIL: SNIP_REQUIRE_CUDA=1 but {why}", file=sys.stderr)
            sys.exit(1)
        print(f"skipped: {why}")
        sys.exit(77)

    runs = {}
    for dev in ("cpu", "cuda"):
        runs[dev] = os.path.join(tmp, dev)
        rc, out, err = train(runs[dev], dev)
        c.check(rc == 0, f"{dev} run ends", err[-3000:])
        gpu_err = err
    if all(os.path.exists(os.path.join(r, "summary.json")) for r in runs.values()):
        c.check(summary(runs["cuda"]).get("device", "").startswith("cuda"), "summary.json device cuda",
                summary(runs["cuda"]).get("device"))
        c.check(summary(runs["cuda"]).get("attention") == "sdpa", "auto attention on cuda is SDPA",
                summary(runs["cuda"]).get("attention"))
        m_cpu, m_gpu = metrics(runs["cpu"]), metrics(runs["cuda"])
        c.check(len(m_cpu) == len(m_gpu) == 20, "20 steps each", f"{len(m_cpu)} / {len(m_gpu)}")
        l0c, l0g = m_cpu[0]["loss"], m_gpu[0]["loss"]
        c.check(abs(l0c - l0g) <= 1e-3 * abs(l0c), "step 1 loss cpu ~ cuda", f"{l0c} vs {l0g}")
        lc, lg = m_cpu[-1]["loss"], m_gpu[-1]["loss"]
        c.check(abs(lc - lg) <= 0.05 * abs(lc), "step 20 loss cpu ~ cuda (5%)", f"{lc} vs {lg}")
        # The first plan comes from stats a few steps in: equal; later plans
        # may flip a near-tie (stats differ in summation order).
        first = next((i for i, r in enumerate(m_cpu) if r.get("fp4_share")), None)
        c.check(first is not None and m_gpu[first].get("fp4_share") == m_cpu[first]["fp4_share"],
                "first plan's FP4 share equal", f"{[r.get('fp4_share') for r in m_cpu]} vs "
                f"{[r.get('fp4_share') for r in m_gpu]}")
        c.check("host codec" not in gpu_err, "fp4/fp8 operands ran on the CUDA kernels", gpu_err[-2000:])
    # Across devices: each run's step-10 checkpoint resumes on the other device.
    for src, dst in (("cuda", "cpu"), ("cpu", "cuda")):
        run = os.path.join(tmp, f"{src}-to-{dst}")
        shutil.copytree(runs[src], run)
        shutil.rmtree(os.path.join(run, "checkpoints", "step-20"), ignore_errors=True)
        for n in ("summary.json",):
            if os.path.exists(os.path.join(run, n)):
                os.remove(os.path.join(run, n))
        rc, out, err = train(run, dst, ["--resume"])
        c.check(rc == 0, f"{src} checkpoint resumes on {dst}", err[-3000:])
        if rc == 0:
            c.check(summary(run).get("device", "").startswith(dst), f"{src} -> {dst}: runs on {dst}",
                    summary(run).get("device"))
            # Same weights, AdamW state and batch as the source's step 11: the
            # loss agrees up to summation order (lost state would not).
            a = next(r["loss"] for r in metrics(runs[src]) if r["step"] == 11)
            b = next(r["loss"] for r in metrics(run) if r["step"] == 11)
            c.check(abs(a - b) <= 1e-3 * abs(a), f"{src} -> {dst}: step 11 loss", f"{a} vs {b}")
    c.finish()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
