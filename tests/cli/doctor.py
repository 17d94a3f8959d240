#!/usr/bin/env python3
"""`snip doctor` and train.gemm_backend through the real binary.

Checks the JSON record against facts read independently of snip
(/proc/cpuinfo's flags, os.cpu_count()), the support matrices against their
published thresholds (FP8 tensor cores from compute capability 8.9, FP4 from
10.0), the exit status (0 when the main job can run; non-zero with the reason
on one line when a config's data is missing or the config is invalid), the
BF16 backend switch (SNIP_BF16_GEMM, train.gemm_backend) as the trainer
reports it.

usage: doctor.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from clitest import micro_toml
from cpu_flags import cpu_flags

snip, data = sys.argv[1], sys.argv[2]
failures = []


def check(name, ok, detail=""):
    if not ok:
        failures.append(f"{name}: {detail}")


def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([snip, *args], capture_output=True, text=True, errors="replace", env=e, timeout=300)


PRECISIONS = ["fp32", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8", "mxfp4", "nvfp4"]

# 1. The record, on this machine.
r = run("doctor", "--json", "--min-time", "0.05")
check("exit status 0", r.returncode == 0, f"{r.returncode}: {r.stderr}")
d = json.loads(r.stdout)
cpu = d["machine"]["cpu"]
flags = cpu_flags()
if flags:  # x86: the ISA flags are /proc/cpuinfo's
    for name in ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]:
        check(f"flag {name}", cpu["flags"][name] == (name in flags), f"{cpu['flags'][name]} vs /proc/cpuinfo")
check("logical_cpus", cpu["logical_cpus"] == os.cpu_count(), f"{cpu['logical_cpus']} vs {os.cpu_count()}")
check("vendor", cpu["vendor"] not in ("", "unknown"), cpu["vendor"])
check("libtorch version", d["libtorch"]["version"].split(".")[0].isdigit(), d["libtorch"]["version"])
# The LibTorch of the venv's torch wheel (requirements.txt), CUDA built in.
import torch  # noqa: E402  (the venv's python runs this test)
check("libtorch is the wheel's", d["libtorch"]["version"] == torch.__version__.split("+")[0],
      f'{d["libtorch"]["version"]} vs torch {torch.__version__}')
check("cuda built", d["libtorch"]["cuda_built"] is (torch.version.cuda is not None), str(d["libtorch"]))
blas = d["libtorch"].get("blas")
check("libtorch blas", blas == "mkl" if torch.backends.mkl.is_available() else blas not in (None, "", "unknown"),
      str(blas))
for key in ["cuda_built", "gloo", "nccl", "mpi", "intra_op_threads"]:
    check(f"libtorch.{key}", key in d["libtorch"], "missing")
check("intra-op threads", d["libtorch"]["intra_op_threads"] == os.cpu_count(), str(d["libtorch"]["intra_op_threads"]))

bf = d["bf16_gemm"]
# auto: native only where LibTorch's BF16 GEMM accumulates in FP32 *and* the
# CPU has BF16 dot products (/proc/cpuinfo: avx512_bf16, amx_bf16; Arm bf16);
# LibTorch 2.x's oneDNN path on other CPUs is exact but slower than the emulation.
bf16_units = bool(flags) and ("avx512_bf16" in flags or "amx_bf16" in flags)
want_backend = "native" if bf["libtorch_accumulates_fp32"] and bf16_units else "emulated"
if os.environ.get("SNIP_BF16_GEMM") in ("native", "emulated"):
    want_backend = os.environ["SNIP_BF16_GEMM"]
check("bf16 backend", bf["backend"] == want_backend, f"{bf}")

rows = d["cpu_support"]
check("cpu rows", [x["precision"] for x in rows] == PRECISIONS, str([x["precision"] for x in rows]))
by = {x["precision"]: x for x in rows}
check("fp32 native", by["fp32"]["support"] == "native", by["fp32"]["support"])
check("bf16 support", by["bf16"]["support"] == ("native" if bf["backend"] == "native" else "emulated exactly"),
      by["bf16"]["support"])
check("verdict", d["verdict"] == "the main job can run here", d.get("verdict"))
for p in PRECISIONS[2:]:  # no CPU runs FP8/FP4 matrix instructions; NVFP4's tensor scale rounds in BF16
    want = "emulated, operands rounded" if p == "nvfp4" else "emulated exactly"
    check(f"{p} emulated", by[p]["support"] == want, by[p]["support"])
for p in PRECISIONS:
    check(f"{p} measured", by[p].get("gflops", 0) > 0 and by[p]["source"] != "", str(by[p]))
check("vs_bf16 of bf16", abs(by["bf16"]["vs_bf16"] - 1.0) < 1e-12, str(by["bf16"]["vs_bf16"]))

# 2. The GPU: measured when torch sees one (tests/cli/doctor_gpu.py checks
# that record on a GPU, CTest label cuda); otherwise one reason. The static
# matrix is a reference by compute capability, labelled so.
gpu = d["gpu"]
if not torch.cuda.is_available():
    reason = gpu.get("reason")
    check("gpu absent", gpu["present"] is False and isinstance(reason, str) and reason.startswith("no CUDA device: ")
          and len(reason) > len("no CUDA device: ") and "\n" not in reason, str(gpu))
    check("gpu absent: nothing measured", sorted(gpu) == ["present", "reason"], str(sorted(gpu)))
else:
    check("gpu present", gpu["present"] is True and gpu["devices"], str(gpu)[:300])
check("gpu matrix is the reference", d["gpu_support_is_reference"] is True, str(d["gpu_support_is_reference"]))
gpus = d["gpu_support"]
if d["gpu_support_is_reference"]:
    cc = {g["compute_capability"]: {x["precision"]: x["support"] for x in g["rows"]} for g in gpus}
    check("reference ccs", {"7.0", "8.0", "8.9", "9.0", "10.0", "12.0"} <= set(cc), str(sorted(cc)))
    smi = {f'{x["cc_major"]}.{x["cc_minor"]}' for x in d["machine"]["gpus"]}
    check("nvidia-smi's ccs in the reference", smi <= set(cc), f"{sorted(smi)} vs {sorted(cc)}")
    check("fp8 before 8.9", cc["8.0"]["fp8_e4m3"] != "native" and cc["7.0"]["fp8_e4m3"] == "none", str(cc["8.0"]))
    check("fp8 from 8.9", cc["8.9"]["fp8_e4m3"] == "native" and cc["9.0"]["fp8_e5m2"] == "native", str(cc["8.9"]))
    check("fp4 before 10.0", cc["9.0"]["nvfp4"] != "native" and cc["9.0"]["fp4_e2m1"] != "native", str(cc["9.0"]))
    check("fp4 from 10.0", all(cc[c][p] == "native" for c in ("10.0", "12.0") for p in ("fp4_e2m1", "mxfp4", "nvfp4")),
          str(cc["10.0"]))
for g in gpus:
    for x in g["rows"]:
        check("gpu row source", x["source"] != "", str(x))

# The text: the GPU line or section, and the matrix under its reference heading.
r = run("doctor", "--min-time", "0.01")
check("text: exit status 0", r.returncode == 0, f"{r.returncode}: {r.stderr}")
head = "GPU support matrix: reference by compute capability, for GPUs not present (static table, not measured"
check("text: reference heading", head in r.stdout, r.stdout[-2000:])
if not torch.cuda.is_available():
    lines = [x for x in r.stdout.splitlines() if x.startswith("GPU: none measured: no CUDA device: ")]
    check("text: why no GPU", len(lines) == 1 and lines[0].endswith(gpu["reason"]), r.stdout[-2000:])
    check("text: no GPU section", "GPU (measured on device" not in r.stdout, r.stdout[-2000:])
else:
    check("text: GPU section", "GPU (measured on device 0" in r.stdout, r.stdout[-2000:])

check("checks ok", d["ok"] is True and all(c["ok"] for c in d["checks"]), str(d["checks"]))
check("warnings have fixes", all(w["fix"] for w in d["warnings"]), str(d["warnings"]))

# 3. The backend switch.
r = run("doctor", "--json", "--min-time", "0.01", env={"SNIP_BF16_GEMM": "emulated"})
e = json.loads(r.stdout)["bf16_gemm"]
check("SNIP_BF16_GEMM=emulated", e["backend"] == "emulated" and "SNIP_BF16_GEMM" in e["reason"], str(e))

r = run("doctor", "--json", "--min-time", "0.01", env={"SNIP_BF16_GEMM": "fast"})
check("SNIP_BF16_GEMM=fast refused", r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
      and "SNIP_BF16_GEMM=fast" in r.stderr, f"{r.returncode}: {r.stderr}")

# An AVX-512 OpenBLAS kernel set on a CPU without AVX-512 would die with
# SIGILL at the first GEMM: snip drops it with a warning.
if flags and "avx512f" not in flags:
    r = run("doctor", "--json", "--min-time", "0.01", env={"OPENBLAS_CORETYPE": "SkylakeX"})
    check("SkylakeX ignored", r.returncode == 0 and "needs AVX-512" in r.stderr, f"{r.returncode}: {r.stderr}")

with tempfile.TemporaryDirectory() as tmp:
    def config(path, data_dir, extra=""):
        micro_toml(path, data_dir, "max_steps = 2\neval_interval = 2\neval_batches = 1\n" + extra)
        return path

    # 4. A config whose data is there: exit 0; whose data is missing: non-zero,
    # one line naming data.dir and the command that prepares it.
    good = config(os.path.join(tmp, "good.toml"), data)
    r = run("doctor", "--json", "--min-time", "0.01", "--config", good)
    check("good config", r.returncode == 0 and json.loads(r.stdout)["ok"], r.stderr)
    missing = config(os.path.join(tmp, "missing.toml"), os.path.join(tmp, "no-such-data"))
    r = run("doctor", "--min-time", "0.01", "--config", missing)
    lines = r.stderr.strip().splitlines()
    check("missing data: exit", r.returncode != 0, str(r.returncode))
    check("missing data: one line", len(lines) == 1 and "no-such-data" in lines[0] and "snip data prepare" in lines[0],
          r.stderr)
    check("missing data: verdict names the config's run, not the main job",
          f"the run of {missing} cannot run here" in r.stdout and f"the run of {missing} cannot run here" in r.stderr,
          r.stdout[-200:] + r.stderr)
    # Shards that exist but are not token shards: the trainer would refuse them.
    empty_dir = os.path.join(tmp, "empty-data")
    os.makedirs(empty_dir)
    for name in ("train.bin", "val.bin"):
        open(os.path.join(empty_dir, name), "w").close()
    r = run("doctor", "--min-time", "0.01", "--config", config(os.path.join(tmp, "empty.toml"), empty_dir))
    check("empty shards", r.returncode == 2 and "train.bin" in r.stderr and "snip data prepare" in r.stderr, r.stderr)
    # --config's own backend is the one judged: forcing LibTorch's BF16 kernel
    # where it accumulates in BF16 cannot run the main job's numerics.
    forced = config(os.path.join(tmp, "native.toml"), data, "gemm_backend = \"native\"")
    r = run("doctor", "--json", "--min-time", "0.01", "--config", forced)
    j = json.loads(r.stdout)
    check("config backend", j["bf16_gemm"]["backend"] == "native" and "train.gemm_backend = native" in j["bf16_gemm"]["reason"],
          str(j["bf16_gemm"]))
    if not j["bf16_gemm"]["libtorch_accumulates_fp32"]:
        check("forced native refused", r.returncode == 2 and "bf16_gemm" in r.stderr, r.stderr)
        r = run("train", "--config", forced, "--run-dir", os.path.join(tmp, "run-native"))
        check("train warns on forced native", "warning: LibTorch's BF16 GEMM accumulates in BF16" in r.stdout + r.stderr,
              (r.stdout + r.stderr)[-600:])
    bad = config(os.path.join(tmp, "bad.toml"), data, "gemm_backend = \"fastest\"")
    r = run("doctor", "--json", "--min-time", "0.01", "--config", bad)
    check("bad backend: exit", r.returncode != 0 and "train.gemm_backend" in r.stderr, r.stderr)
    check("bad backend: the file and the check named once", r.stderr.count("bad.toml") == 1 and
          "config: config:" not in r.stderr, r.stderr)

    # 5. The trainer honours train.gemm_backend and says so.
    r = run("train", "--config", good, "--run-dir", os.path.join(tmp, "run"), "--set", "train.gemm_backend=emulated")
    log = r.stdout + r.stderr
    check("train emulated", r.returncode == 0 and "BF16 GEMMs emulated" in log
          and "train.gemm_backend = emulated" in log, log[-600:])
    r = run("train", "--config", bad, "--run-dir", os.path.join(tmp, "run2"))
    check("train bad backend", r.returncode == 2 and "train.gemm_backend" in r.stderr
          and not os.path.exists(os.path.join(tmp, "run2")), r.stderr)

for f in failures:
    print("FAIL", f, file=sys.stderr)
print(f"doctor: {'ok' if not failures else str(len(failures)) + ' failures'}")
sys.exit(1 if failures else 0)
