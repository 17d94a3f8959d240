"""scripts/gpu_check.sh on this CPU machine (docs/gpu.md "The device check"):
`pack` into a temporary folder (--no-build: CTest runs on a built tree), then
`run` from it, as the device would, and checks what comes back.

- the pack: under 60 MiB, MANIFEST.txt lists every file (bin/snip and each
  CUDA test binary among them) with its size; the packed binaries' RUNPATH is
  $ORIGIN (the build tree's folders do not matter), and every library the
  pack holds is the one the run loads (ldd under the run's library path, in
  logs.tar.gz), none missing;
- the run: exit status 0, at most 8 files (what the device tool returns),
  summary.json with every step in order and none failed, cuda_tests skipped
  with a reason naming no CUDA device, train rows with tokens/s > 0, finite
  losses and peak memory, the fp8/bf16 step-time ratio, doctor and bench JSON;
- bad usage and a missing pack: exit 2 and one line naming what.

usage: gpu_check_cpu.py SNIP DATA_DIR   (DATA_DIR unused: the pack takes the build's own)
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks  # noqa: E402

snip = os.path.abspath(sys.argv[1])
build = os.path.dirname(snip)
repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = os.path.join(repo, "scripts", "gpu_check.sh")
c = Checks(snip)
tmp = tempfile.mkdtemp(prefix="snip-gpu-check-test-")
pack, out = os.path.join(tmp, "pack"), os.path.join(tmp, "out")
env = {k: v for k, v in os.environ.items() if k not in ("OUT", "SNIP_GPU_CHECK_STEPS")}
# What a device has of its own (scripts/gpu_check.sh base_libs and fallback_libs).
SYSTEM = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1", "libresolv.so.2",
          "libgomp.so.1", "libstdc++.so.6", "libgcc_s.so.1"}
STEPS = ["env", "cuda_tests", "doctor", "train_bf16", "train_fp8", "train_fp8_tensor", "train_snip", "bench",
         "python_ops"]


def sh(args, timeout):
    p = subprocess.run(["bash", script] + args, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


try:
    # --- bad usage: exit 2, one line
    for args, needle in ((["pack", "--bogus"], "unknown argument '--bogus'"),
                         (["run", "--pack-dir", os.path.join(tmp, "nope")], "no pack at"),
                         (["run", "--budget", "soon"], "--budget needs whole seconds")):
        rc, so, se = sh(args, 60)
        lines = se.strip().splitlines()
        c.check(rc == 2 and len(lines) == 1 and lines[0].startswith("gpu_check: error: ") and needle in lines[0],
                f"usage error {args}", f"rc={rc} stderr={se!r}")

    # --- pack
    rc, so, se = sh(["pack", "--pack-dir", pack, "--build-dir", build, "--no-build"], 300)
    print(so.strip())
    c.check(rc == 0, "pack exits 0", f"rc={rc} stderr={se[-2000:]!r}")
    if rc != 0:
        c.finish()
    c.check("scripts/gpu_check.sh run" in so and "timeout_s=" in so, "pack prints the device command", so[-500:])
    total, listed = 0, {}
    for root, _, files in os.walk(pack):
        for n in files:
            total += os.path.getsize(os.path.join(root, n))
    c.check(total < 60 * 2**20, "pack under 60 MiB", f"{total / 2**20:.1f} MiB")
    print(f"pack: {total / 2**20:.1f} MiB")
    for line in open(os.path.join(pack, "MANIFEST.txt")):
        if not line.startswith("#"):
            rel, size, digest = line.rstrip("\n").split("\t")
            listed[rel] = int(size)
    on_disk = {os.path.relpath(os.path.join(r, n), pack): os.path.getsize(os.path.join(r, n))
               for r, _, fs in os.walk(pack) for n in fs if n != "MANIFEST.txt"}
    c.check(listed == on_disk, "MANIFEST.txt lists every file with its size",
            f"only listed {set(listed) - set(on_disk)}, only on disk {set(on_disk) - set(listed)}")
    want = ["bin/snip", "data/kjv512/train.bin", "configs/tiny.toml"]
    if os.path.exists(os.path.join(build, "tests", "formats", "test_formats_cuda")):
        want.append("bin/test_formats_cuda")
    for w in want:
        c.check(w in listed, f"MANIFEST lists {w}", sorted(listed)[:20])
    meta = json.load(open(os.path.join(pack, "pack.json")))
    if "bin/test_formats_cuda" in want:
        c.check("bin/test_formats_cuda" in [g["binary"] for g in meta["cuda_tests"]["gtest"]],
                "pack.json names the CUDA tests", meta["cuda_tests"])
    c.check(not meta["cuda_tests"]["left_out"], "every CTest test labelled cuda is packed", meta["cuda_tests"]["left_out"])
    for rel in [b for b in meta["binaries"]]:
        d = subprocess.run(["readelf", "-d", os.path.join(pack, rel)], capture_output=True, text=True).stdout
        paths = re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.*)\]", d)
        c.check(all(p == "$ORIGIN" for p in paths) and repo not in d and "/.venv/" not in d,
                f"{rel}: RUNPATH $ORIGIN, no build-machine folder", paths)

    # --- run, from the temporary pack, without a GPU
    rc, so, se = sh(["run", "--pack-dir", pack, "--out", out], 330)
    print(so.strip()[-3000:])
    c.check(rc == 0, "run exits 0", f"rc={rc} stderr={se[-2000:]!r}")
    files = sorted(os.listdir(out)) if os.path.isdir(out) else []
    c.check(len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) and os.path.isfile(os.path.join(out, f))
                                    for f in files), "at most 8 plain files come back", files)
    try:
        summary = json.load(open(os.path.join(out, "summary.json")))
    except (OSError, ValueError) as e:
        c.check(False, "summary.json", str(e))
        c.finish()
    steps = {s["name"]: s for s in summary["steps"]}
    c.check([s["name"] for s in summary["steps"]] == STEPS, "summary.json has every step in order",
            [s["name"] for s in summary["steps"]])
    c.check(all(set(s) >= {"name", "status", "seconds", "reason"} for s in summary["steps"]),
            "each step has status, seconds, reason", summary["steps"])
    c.check(summary["ok"] and not [s for s in summary["steps"] if s["status"] == "fail"], "no step failed",
            [(s["name"], s["reason"]) for s in summary["steps"] if s["status"] == "fail"])
    cuda = steps.get("cuda_tests", {})
    c.check(cuda.get("status") == "skip" and "no CUDA device" in cuda.get("reason", ""),
            "cuda_tests skipped, saying no CUDA device", cuda)
    for name in STEPS:
        if name != "cuda_tests":
            c.check(steps.get(name, {}).get("status") == "pass", f"{name} passed", steps.get(name))
    c.check(os.path.isfile(os.path.join(out, "summary.txt")), "summary.txt", files)
    ct = json.load(open(os.path.join(out, "cuda_tests.json")))
    gtests = [i for i in ct["items"] if i["kind"] == "gtest"]
    c.check(gtests and all(i["rc"] == 0 and i["tests"] for i in gtests),
            "the CUDA test binaries started from the pack and ran", gtests)
    c.check(all(i["ok"] and not i["failed"] for i in ct["items"]), "no CUDA test failed", ct["items"])
    train = json.load(open(os.path.join(out, "train.json")))
    rows = {r["name"]: r for r in train["rows"]}
    c.check(sorted(rows) == ["train_bf16", "train_fp8", "train_fp8_tensor", "train_snip"], "train.json has the four runs",
            sorted(rows))
    # On this CPU, train.fp8_gemm = auto keeps the per-tensor FP8 GEMMs emulated.
    c.check(rows.get("train_fp8_tensor", {}).get("fp8_gemms_native") == 0, "fp8_tensor emulated on the CPU",
            rows.get("train_fp8_tensor"))
    for name, r in rows.items():
        c.check(finite(r.get("tokens_per_s")) and r["tokens_per_s"] > 0, f"{name}: tokens/s > 0", r.get("tokens_per_s"))
        c.check(finite(r.get("final_train_loss")) and finite(r.get("final_val_loss")), f"{name}: finite losses", r)
        c.check(isinstance(r.get("peak_rss_bytes"), int) and r["peak_rss_bytes"] > 0, f"{name}: peak memory", r)
    c.check(rows.get("train_fp8", {}).get("policy") == "uniform-fp8" and rows.get("train_snip", {}).get("policy") == "snip",
            "the runs train under their policies", {k: v.get("policy") for k, v in rows.items()})
    ratio = train.get("fp8_over_bf16_step_time")
    c.check(finite(ratio) and ratio > 0, "fp8/bf16 step-time ratio", ratio)
    doctor = json.load(open(os.path.join(out, "doctor.json")))
    c.check("verdict" in doctor, "doctor.json is snip doctor's", list(doctor)[:5])
    bench = json.load(open(os.path.join(out, "bench_formats.json")))
    c.check(any("FakeQuant" in b["name"] for b in bench.get("benchmarks", [])), "bench_formats.json has fake-quant cases",
            [b["name"] for b in bench.get("benchmarks", [])])

    # --- the libraries the packed snip loads are the pack's
    with tarfile.open(os.path.join(out, "logs.tar.gz")) as t:
        names = t.getnames()
        c.check({"ldd.txt", "env.log", "train_bf16.log", "test_formats_cuda.json"} <= set(names),
                "logs.tar.gz holds the logs", names)
        ldd = t.extractfile("ldd.txt").read().decode() if "ldd.txt" in names else ""
    sections = dict(re.findall(r"^== (\S+)\n((?:\t.*\n?)*)", ldd, re.M))
    packed = {lib["soname"] for lib in meta["libs"] if not lib["fallback"]}
    for path, text in sections.items():
        c.check("not found" not in text, f"ldd {os.path.basename(path)}: nothing missing", text)
        for soname, where in re.findall(r"^\t(\S+) => (\S+)", text, re.M):
            if soname in packed:
                c.check("/snip-gpu-check." in where and "/lib/" in where,
                        f"ldd {os.path.basename(path)}: {soname} from the pack", where)
            else:  # nothing else from this machine but glibc, the compiler's runtime and torch's wheels
                c.check(soname in SYSTEM or "/site-packages/" in where,
                        f"ldd {os.path.basename(path)}: {soname} from the pack or torch, not {where}", where)
    snip_libs = re.findall(r"^\t(\S+) => ", sections.get(os.path.join(pack, "bin", "snip"), ""), re.M)
    c.check(packed and packed & set(snip_libs), "ldd.txt covers the packed snip", list(sections))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
c.finish()
