#!/usr/bin/env python3
"""`snip doctor` on a GPU (CTest label cuda; docs/gpu.md "snip doctor on a GPU").

Checks the measured GPU record (out["gpu"]) against what torch says of the
same device: the name, the compute capability, the memory and SM count, the
CUDA runtime's version; BF16 TFLOP/s > 0 at both shapes; each recipe's path
in {native, emulated, none}, fp8_tensor native with FP8 rates from compute
capability 8.9 and the bf16 recipe native from 8.0; the whole GPU part under
20 s at the default --min-time; the text section. Without a CUDA device it
skips (exit 77, CTest SKIP_RETURN_CODE) with torch's reason; with
SNIP_REQUIRE_CUDA=1 a missing device fails instead.

usage: doctor_gpu.py SNIP_BINARY
"""
import json
import os
import subprocess
import sys

import torch

snip = sys.argv[1]
failures = []


def check(name, ok, detail=""):
    if not ok:
        failures.append(f"{name}: {detail}")


def run(*args):
    return subprocess.run([snip, *args], capture_output=True, text=True, errors="replace", timeout=300)


if not torch.cuda.is_available():
    try:
        torch.cuda.init()
        why = "torch.cuda.is_available() is false"
    except Exception as e:  # torch's reason: no driver, a driver too old, no device
        why = str(e).splitlines()[0]
    if os.environ.get("SNIP_REQUIRE_CUDA") == "1":
        print(f"doctor_gpu: FAIL: no CUDA device: {why} (SNIP_REQUIRE_CUDA=1)", file=sys.stderr)
        sys.exit(1)
    print(f"doctor_gpu: skipped: no CUDA device: {why}")
    sys.exit(77)

SHAPES = ["tiny", "1b"]
PATHS = {"native", "emulated", "none"}

# 1. The record, at the default --min-time (the time bound is checked on it).
r = run("doctor", "--json")
check("exit status 0", r.returncode == 0, f"{r.returncode}: {r.stderr[-2000:]}")
d = json.loads(r.stdout)
g = d["gpu"]
check("present", g["present"] is True, str(g)[:500])
props = torch.cuda.get_device_properties(0)
cap = torch.cuda.get_device_capability(0)
devs = g["devices"]
check("device count", len(devs) == torch.cuda.device_count(), f"{len(devs)} vs {torch.cuda.device_count()}")
dev = devs[0]
check("name", dev["name"] != "" and dev["name"] == props.name, f"{dev['name']!r} vs {props.name!r}")
check("compute capability", (dev["cc_major"], dev["cc_minor"]) == cap and dev["compute_capability"] == f"{cap[0]}.{cap[1]}",
      f"{dev} vs {cap}")
check("memory", dev["memory_bytes"] > 0 and dev["memory_bytes"] == props.total_memory
      and abs(dev["memory_gib"] - props.total_memory / 2**30) < 1e-6, f"{dev['memory_bytes']} vs {props.total_memory}")
check("sm count", dev["sm_count"] == props.multi_processor_count, f"{dev['sm_count']} vs {props.multi_processor_count}")
check("runtime version", g["runtime_cuda_version"].split(".")[0] == torch.version.cuda.split(".")[0],
      f"{g['runtime_cuda_version']} vs torch's CUDA {torch.version.cuda}")
check("driver version", g["driver_cuda_version"] != "unknown", g["driver_cuda_version"])
check("measured device", g["measured_device"] == 0, str(g["measured_device"]))
check("shapes", [s["name"] for s in g["shapes"]] == SHAPES and g["shapes"][1]["K"] == 2048, str(g["shapes"]))
for s in SHAPES:
    b = g["bf16"][s]
    check(f"bf16 {s}", b.get("tflops", 0) > 0 and b.get("ms", 0) > 0, str(b))
check("GPU part under 20 s", g["seconds"] < 20, str(g["seconds"]))

cc = cap[0] * 10 + min(cap[1], 9)
by = {x["recipe"]: x for x in g["recipes"]}
for name in ["bf16", "fp8", "fp8_tensor", "mxfp8", "nvfp4"]:
    check(f"recipe {name} listed", name in by, str(sorted(by)))
for name, x in by.items():
    check(f"{name} path", x["path"] in PATHS, str(x))
    check(f"{name} no error", "error" not in x, str(x))
    if x["path"] == "none":
        check(f"{name} none has a reason", x.get("reason", "") != "" and cc < 80, str(x))
        continue
    check(f"{name} timed", x.get("timed", "") != "", str(x))
    for s in SHAPES:
        check(f"{name} tflops {s}", x["tflops"].get(s, 0) > 0 and x["vs_bf16"].get(s, 0) > 0, str(x))
    if x["path"] == "emulated":
        check(f"{name} exactness measured", isinstance(x.get("operands_exact_in_bf16"), bool), str(x))
        check(f"{name} emulated = the BF16 GEMM", all(abs(x["vs_bf16"][s] - 1) < 1e-12 for s in SHAPES), str(x))
if cc >= 89:
    check("fp8_tensor native", by["fp8_tensor"]["path"] == "native" and "_scaled_mm" in by["fp8_tensor"]["timed"],
          str(by["fp8_tensor"]))
    check("fp8 rates", all(g["fp8"][s].get("tflops", 0) > 0 for s in SHAPES), str(g.get("fp8")))
elif cc >= 80:
    check("fp8_tensor emulated", by["fp8_tensor"]["path"] == "emulated", str(by["fp8_tensor"]))
if cc >= 80:
    check("bf16 native", by["bf16"]["path"] == "native", str(by["bf16"]))
    for name in ["fp8", "mxfp8", "nvfp4"]:  # block-scaled: snip emulates them
        check(f"{name} emulated", by[name]["path"] == "emulated", str(by[name]))
    # Power-of-two scales (fp8's FP32 pow2, MX's E8M0) keep FP8 values exact in BF16.
    for name in ["fp8", "mxfp8"]:
        check(f"{name} exact in bf16", by[name]["operands_exact_in_bf16"] is True, str(by[name]))
check("reference table kept", d["gpu_support_is_reference"] is True and len(d["gpu_support"]) >= 6, "")

# 2. The text section.
r = run("doctor", "--min-time", "0.05")
check("text: exit status 0", r.returncode == 0, f"{r.returncode}: {r.stderr[-2000:]}")
out = r.stdout
check("text: GPU section", "GPU (measured on device 0" in out and f"compute capability {cap[0]}.{cap[1]}" in out
      and props.name in out, out[-3000:])
check("text: units", "TFLOP/s = 2*M*K*N / seconds / 1e12" in out, out[-3000:])
check("text: recipe rows", all(f"  {name} " in out for name in by), out[-3000:])
check("text: reference heading", "GPU support matrix: reference by compute capability, for GPUs not present" in out,
      out[-3000:])

for f in failures:
    print("FAIL", f, file=sys.stderr)
print(f"doctor_gpu: {'ok' if not failures else str(len(failures)) + ' failures'}")
sys.exit(1 if failures else 0)
