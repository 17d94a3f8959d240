#!/usr/bin/env bash
# The device check for a lent GPU machine (docs/gpu.md "The device check").
#
# A lent machine (one NVIDIA H100/H200, 16 cores, no network, python3 with
# PyTorch 2.11.0+cu130, nothing installable) gets a copy of the working tree
# plus the ignored folders named in `carry` (64 MiB in all) and runs one
# command for a few minutes. So the binaries are built here, packed with the
# shared libraries the device may lack into one ignored folder
# (build-gpu/pack), and one script run there checks the GPU path in under
# five minutes and writes its results under $OUT, which comes back.
#
#   scripts/gpu_check.sh pack [--pack-dir DIR] [--build-dir DIR] [--no-build]
#   scripts/gpu_check.sh run  [--out DIR] [--pack-dir DIR] [--budget SECONDS]
#   scripts/gpu_check.sh [--help]
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
me="gpu_check"
pack_limit=$((60 * 1024 * 1024))    # the pack; the device tool carries 64 MiB with the tree
carry_limit=$((64 * 1024 * 1024))   # pack + the tree that travels with it
compress_over=$((1024 * 1024))      # libraries larger than this travel xz-compressed
# Sonames every Linux machine that runs PyTorch has (glibc and the compiler's
# runtime): never packed. libstdc++ and libgcc_s go to lib/fallback, used only
# when the device's own are too old (`run` probes). libgomp comes from
# torch's lib folder, which is on the library path of every run.
base_libs=" linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libresolv.so.2 libgomp.so.1 "
fallback_libs=" libstdc++.so.6 libgcc_s.so.1 "
device_timeout_s=330                # the device tool's timeout_s for `run` (budget 270 s + start-up)

die() { echo "$me: error: $*" >&2; exit 2; }
say() { echo "[$me] $*"; }

usage() {
  cat <<EOF
usage: scripts/gpu_check.sh pack [--pack-dir DIR] [--build-dir DIR] [--no-build]
       scripts/gpu_check.sh run  [--out DIR] [--pack-dir DIR] [--budget SECONDS]

The device check for a lent GPU machine (docs/gpu.md "The device check").

pack   (here, on the build machine) builds snip, the CUDA tests (every CTest
       test labelled 'cuda'), bench_formats and the Python operators
       (cmake --build under flock /tmp/snip-build.lock; --no-build skips it),
       then copies into DIR (default build-gpu/pack, ignored by git):
         bin/       snip, the CUDA test binaries, bench_formats (stripped;
                    RUNPATH set to \$ORIGIN, so the build tree does not matter)
         python/    _snip_ops.so (the Python package's operators, stripped)
         lib/       every shared library ldd shows that is neither torch's
                    (libtorch*, libc10*, the wheel's nvidia libraries) nor
                    glibc/libgomp; those over 1 MiB as NAME.xz;
                    lib/fallback/: libstdc++ and libgcc_s, used only when the
                    device's are older than the binaries need
         data/kjv512, configs/tiny.toml, pack.json, MANIFEST.txt
       Fails if the pack is over 60 MiB or pack + tree over 64 MiB.

run    (on the device; also works here, without a GPU) runs from the pack,
       each step bounded by timeout, all within --budget (default 270 s;
       a step that no longer fits is skipped, "out of time"):
         env         nvidia-smi -q, torch/CUDA, glibc, nproc, memory -> env.txt
         cuda_tests  the CTest tests labelled cuda: gtest binaries, Python
                     scripts, pytest (SNIP_REQUIRE_CUDA=1 with a GPU; without
                     one they run and skip, and so does the step)
                     -> cuda_tests.json
         doctor      snip doctor --json -> doctor.json
         train_bf16, train_fp8, train_fp8_tensor, train_snip
                     configs/tiny.toml on the packed data (policy none,
                     recipe fp8, recipe fp8_tensor: native FP8 GEMMs on a
                     GPU, policy snip) -> train.json (tokens/s,
                     losses, peak memory, fp8/bf16 step time)
         bench       bench_formats' fake-quant cases -> bench_formats.json
         python_ops  the Python package with the packed operators
       and summary.json / summary.txt (step, status pass/fail/skip, seconds,
       reason); the logs go to logs.tar.gz (the device tool returns 8 files).
       DIR defaults to \$OUT if set, else build-gpu/out. Exit status 1 if a
       step failed (skips are fine), 2 on bad usage or a missing pack.

The device-tool call (after \`scripts/gpu_check.sh pack\` here):
  run(command="bash scripts/gpu_check.sh run", carry=["build-gpu/pack"], timeout_s=$device_timeout_s)
EOF
}

# A Python 3 for JSON and ELF work (any; python3 on the device holds torch).
pick_py() {
  if command -v python3 >/dev/null 2>&1; then echo python3
  elif [ -x "$repo/.venv/bin/python" ]; then echo "$repo/.venv/bin/python"
  else die "no python3 on PATH and no $repo/.venv/bin/python"; fi
}
# torch_probe [--cuda]: the Python that imports torch (python3 on the device,
# else the project's venv) -> tpy, torch_lib (its lib folder), torch_ver; with
# --cuda also torch_cuda (1/0) and torch_gpu (device 0's name). One import.
torch_probe() {
  local p out code='import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib")); print(torch.__version__)'
  [ "${1:-}" = --cuda ] && code="$code"'; ok = torch.cuda.is_available(); print(int(ok)); print(torch.cuda.get_device_name(0) if ok else "")'
  tpy="" torch_lib="" torch_ver="" torch_cuda=0 torch_gpu=""
  for p in python3 "$repo/.venv/bin/python"; do
    command -v "$p" >/dev/null 2>&1 || continue
    out=$(timeout 120 "$p" -c "$code" 2>/dev/null) || continue
    tpy=$p
    { read -r torch_lib; read -r torch_ver; read -r torch_cuda; read -r torch_gpu; } <<<"$out" || true
    torch_cuda=${torch_cuda:-0}
    return 0
  done
  return 1
}

# The helper both subcommands use for JSON, ELF and manifests (Python).
write_helper() {
  cat >"$1" <<'PY'
import glob, hashlib, json, math, os, re, resource, statistics, struct, subprocess, sys, time

def atomic_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def version_chain(data, o, head, cnt_i, aux_i, next_i, file_i, entry, name_i, enext_i, refs):
    """Appends the string offsets of a GNU version section's chain to refs:
    each head (struct `head`: count, aux offset, next offset, and for verneed
    the file name) and its `count` entries (struct `entry`: name, next)."""
    while True:
        h = struct.unpack_from(head, data, o)
        if file_i is not None:
            refs.append(h[file_i])
        a = o + h[aux_i]
        for _ in range(h[cnt_i]):
            e = struct.unpack_from(entry, data, a)
            refs.append(e[name_i])
            if not e[enext_i]:
                break
            a += e[enext_i]
        if not h[next_i]:
            break
        o += h[next_i]
def set_runpath(path, new):
    """Overwrites DT_RUNPATH/DT_RPATH's string in .dynstr with `new` (no
    longer than the old one; NUL padding), after checking that no other name
    of the dynamic section, the dynamic symbols or the version tables shares
    those bytes. Prints what it did."""
    new_b = new.encode()
    data = bytearray(open(path, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        sys.exit(f"{path}: not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dyn = [s for s in secs if s[1] == 6]  # SHT_DYNAMIC
    if not dyn:
        print(f"{path}: no dynamic section"); return
    d = dyn[0]
    strsec = secs[d[6]]
    base = strsec[4]
    targets, refs = [], []
    for off in range(d[4], d[4] + d[5], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag in (15, 29):  # DT_RPATH, DT_RUNPATH
            targets.append(val)
        elif tag in (1, 14, 0x7FFFFFFD, 0x7FFFFFFF):  # NEEDED, SONAME, AUXILIARY, FILTER
            refs.append(val)
    for s in secs:
        if s[6] != d[6]:
            continue
        if s[1] == 11:  # SHT_DYNSYM
            refs += [struct.unpack_from("<I", data, o)[0] for o in range(s[4], s[4] + s[5], 24)]
        elif s[1] == 0x6FFFFFFE and s[5]:  # SHT_GNU_verneed: Verneed (file name) -> Vernaux (version names)
            version_chain(data, s[4], "<HHIII", 1, 3, 4, 2, "<IHHII", 3, 4, refs)
        elif s[1] == 0x6FFFFFFD and s[5]:  # SHT_GNU_verdef: Verdef -> Verdaux (version names)
            version_chain(data, s[4], "<HHHHIII", 3, 5, 6, None, "<II", 0, 1, refs)
    if not targets:
        print(f"{path}: no RUNPATH"); return
    for val in targets:
        start = base + val
        end = data.index(0, start)
        old = bytes(data[start:end])
        if len(new_b) > len(old):
            sys.exit(f"{path}: new RUNPATH {new!r} is longer than the old {old.decode()!r}")
        shared = [r for r in refs if val < r < val + len(old)]
        if shared:
            sys.exit(f"{path}: RUNPATH {old.decode()!r} shares bytes with another name (offsets {shared[:3]}); not rewritten")
        data[start:end] = new_b + b"\0" * (len(old) - len(new_b))
        print(f"{path}: RUNPATH {old.decode()!r} -> {new!r}")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, os.stat(path).st_mode)
    os.replace(tmp, path)

def manifest(root, out):
    """MANIFEST.txt: file, bytes, sha256 of every file under root (tab-separated)."""
    rows = []
    for dirpath, _, files in os.walk(root):
        for n in files:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if rel == "MANIFEST.txt":
                continue
            rows.append((rel, os.path.getsize(p), sha256(p)))
    rows.sort()
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write("# file\tbytes\tsha256 (scripts/gpu_check.sh pack)\n")
        for rel, size, digest in rows:
            f.write(f"{rel}\t{size}\t{digest}\n")
    os.replace(tmp, out)
    print(sum(r[1] for r in rows))

def verify(root):
    """Every file of MANIFEST.txt present with its size and digest."""
    bad = []
    with open(os.path.join(root, "MANIFEST.txt")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            rel, size, digest = line.rstrip("\n").split("\t")
            p = os.path.join(root, rel)
            if not os.path.isfile(p):
                bad.append(f"{rel} missing")
            elif os.path.getsize(p) != int(size) or sha256(p) != digest:
                bad.append(f"{rel} differs")
    if bad:
        print(f"{len(bad)} files of MANIFEST.txt missing or changed: " + ", ".join(bad[:5]))
        sys.exit(1)

def decompress(src, dst):
    import lzma
    tmp = dst + ".tmp"
    with lzma.open(src) as fi, open(tmp, "wb") as fo:
        while True:
            b = fi.read(1 << 20)
            if not b:
                break
            fo.write(b)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dst)

def unpack_libs(lib, scratch):
    """lib/* -> scratch/lib, lib/fallback/* -> scratch/fallback; NAME.xz decompressed to NAME."""
    import shutil
    for sub, dst in (("", "lib"), ("fallback", "fallback")):
        src_dir, dst_dir = os.path.join(lib, sub), os.path.join(scratch, dst)
        os.makedirs(dst_dir, exist_ok=True)
        for n in sorted(os.listdir(src_dir)):
            p = os.path.join(src_dir, n)
            if not os.path.isfile(p):
                continue
            if n.endswith(".xz"):
                decompress(p, os.path.join(dst_dir, n[:-3]))
            else:
                shutil.copy2(p, os.path.join(dst_dir, n))

def compress(src, dst):
    import lzma
    tmp = dst + ".tmp"
    with open(src, "rb") as fi, lzma.open(tmp, "wb", preset=6) as fo:
        fo.write(fi.read())
    os.replace(tmp, dst)

def measure(rss_out, gpu_log, *cmd):
    """Runs cmd; writes its exit status, wall seconds and peak RSS (bytes,
    the largest of its processes) to rss_out; returns its exit status."""
    import signal
    t0 = time.time()
    try:
        child = subprocess.Popen(list(cmd))
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        child = None
        rc = 127
    if child:
        # timeout's SIGTERM reaches its whole process group, snip too (which
        # finishes its step and stops): wait for it rather than die first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        rc = child.wait()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    atomic_json(rss_out, {"rc": rc, "seconds": time.time() - t0, "peak_rss_bytes": ru.ru_maxrss * 1024})
    sys.exit(0 if rc == 0 else (rc if 0 < rc < 256 else 1))

def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)

def train_row(name, run_dir, rss_json, gpu_log, device, steps, out):
    """One row of train.json from a run folder (metrics.jsonl, summary.json)."""
    row = {"name": name, "device": device, "steps_asked": int(steps)}
    try:
        m = json.load(open(rss_json))
        row.update({"rc": m["rc"], "wall_s": round(m["seconds"], 3), "peak_rss_bytes": m["peak_rss_bytes"]})
    except (OSError, ValueError, KeyError):
        row["rc"] = None
    recs = []
    try:
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    steps_rec = [r for r in recs if "step" in r and "loss" in r]
    if steps_rec:
        st = [r["step_s"] for r in steps_rec if r.get("step", 0) > 3 and finite(r.get("step_s"))]
        if not st:
            st = [r["step_s"] for r in steps_rec if finite(r.get("step_s"))]
        row["steps_done"] = steps_rec[-1]["step"]
        row["step_s_median"] = statistics.median(st) if st else None
        row["final_train_loss"] = steps_rec[-1]["loss"]
        fp4 = [r["fp4_share"] for r in steps_rec if finite(r.get("fp4_share"))]
        row["fp4_share_mean"] = sum(fp4) / len(fp4) if fp4 else None
    try:
        s = json.load(open(os.path.join(run_dir, "summary.json")))
        for k in ("policy", "tokens_per_s", "final_val_loss", "final_train_loss", "parameters", "seconds", "device",
                  "fp8_gemms_native"):
            if k in s:
                row["summary_" + k if k == "final_train_loss" else k] = s[k]
        row["memory_per_rank"] = s.get("memory_per_rank")
        for k, v in s.items():  # peak memory the trainer may report itself (e.g. on a GPU)
            if "peak" in k.lower() or "gpu_mem" in k.lower():
                row[k] = v
    except (OSError, ValueError):
        pass
    try:
        used = [float(x) for x in open(gpu_log).read().split() if re.fullmatch(r"[0-9.]+", x)]
        if used:
            row["gpu_mem_used_mib_before"] = used[0]
            row["gpu_mem_used_mib_peak"] = max(used)
    except OSError:
        pass
    problems = []
    if row.get("rc") != 0:
        problems.append(f"exit status {row.get('rc')}")
    if not (finite(row.get("tokens_per_s")) and row["tokens_per_s"] > 0):
        problems.append(f"tokens/s {row.get('tokens_per_s')}")
    for k in ("final_train_loss", "final_val_loss"):
        if not finite(row.get(k)):
            problems.append(f"{k} {row.get(k)}")
    row["ok"] = not problems
    row["problems"] = problems
    atomic_json(out, row)
    print("; ".join(problems) if problems else
          f"{row['tokens_per_s']:.0f} tokens/s, train loss {row['final_train_loss']:.4f}, "
          f"val loss {row['final_val_loss']:.4f}, peak RSS {row.get('peak_rss_bytes', 0) / 2**20:.0f} MiB")

def train_json(rows_dir, out, steps, device, note):
    rows = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(rows_dir, "*.json")))]
    order = {"train_bf16": 0, "train_fp8": 1, "train_fp8_tensor": 2, "train_snip": 3}
    rows.sort(key=lambda r: order.get(r["name"], 9))
    by = {r["name"]: r for r in rows}
    def ratio(a, b):
        x, y = by.get(a, {}).get("step_s_median"), by.get(b, {}).get("step_s_median")
        return x / y if finite(x) and finite(y) and y > 0 else None
    atomic_json(out, {"steps": int(steps), "device": device, "note": note, "rows": rows,
                      "fp8_over_bf16_step_time": ratio("train_fp8", "train_bf16"),
                      "fp8_tensor_over_bf16_step_time": ratio("train_fp8_tensor", "train_bf16"),
                      "snip_over_bf16_step_time": ratio("train_snip", "train_bf16")})

def cuda_items(pack_json):
    """One line per CUDA test of the pack: kind, name, timeout, skip code,
    environment (\x1f-separated), argv (\x1f-separated), tab-separated."""
    plan = json.load(open(pack_json)).get("cuda_tests") or {}
    for b in plan.get("gtest", []):
        argv = ["{pack}/" + b["binary"], "--gtest_filter=" + b["filter"]]
        print("\t".join(["gtest", b["name"], str(b["timeout"]), "-", "\x1f".join(b["env"]) or "-", "\x1f".join(argv)]))
    for t in plan.get("scripts", []):
        code = t.get("skip_return_code")
        print("\t".join(["script", t["name"], str(t["timeout"]), "-" if code is None else str(int(code)),
                         "\x1f".join(t["env"]) or "-", "\x1f".join(t["argv"])]))

def cuda_json(tsv, out, require):
    """cuda_tests.json from the run's records (kind, name, rc, seconds, log,
    gtest json, skip code per line); prints counts, bad tests and skip reasons."""
    items = []
    for line in open(tsv):
        kind, name, rc, secs, log, gj, code = line.rstrip("\n").split("\t")
        it = {"kind": kind, "name": name, "rc": int(rc), "seconds": float(secs), "tests": [], "skip_reasons": []}
        try:
            lines = open(log, errors="replace").read().splitlines()
        except OSError:
            lines = []
        if kind == "gtest":
            try:
                g = json.load(open(gj))
                for suite in g.get("testsuites", []):
                    for t in suite.get("testsuite", []):
                        res = "failed" if t.get("failures") else {"SKIPPED": "skipped"}.get(t.get("result"), "passed")
                        it["tests"].append({"name": f"{suite['name']}.{t['name']}", "result": res, "time": t.get("time")})
            except (OSError, ValueError):
                it["gtest_json"] = "missing"
            for j, line in enumerate(lines):
                if line.rstrip().endswith("Skipped") and j + 1 < len(lines) and lines[j + 1] not in it["skip_reasons"]:
                    it["skip_reasons"].append(lines[j + 1])
            it["ok"] = it["rc"] == 0 and "gtest_json" not in it
        else:
            res = "passed" if it["rc"] == 0 else "skipped" if code and it["rc"] == int(code) else "failed"
            it["tests"].append({"name": name, "result": res})
            last = [l for l in lines if l.strip()]
            if res == "skipped" and last:
                it["skip_reasons"].append(last[-1].strip()[:300])
            it["ok"] = res != "failed"
        for k in ("passed", "failed", "skipped"):
            it[k] = sum(1 for t in it["tests"] if t["result"] == k)
        items.append(it)
    atomic_json(out, {"require_cuda": require == "1", "items": items})
    total = {k: sum(i[k] for i in items) for k in ("passed", "failed", "skipped")}
    reasons = sorted({(r[:117] + "...") if len(r) > 120 else r for i in items for r in i["skip_reasons"]})
    if len(reasons) > 3:
        reasons = reasons[:3] + [f"{len(reasons) - 3} more in cuda_tests.json"]
    bad = [i["name"] for i in items if not i["ok"]]
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    print(" ".join(bad))
    print("; ".join(reasons))

def bench_reason(path):
    d = json.load(open(path))
    print(", ".join(f"{b['name'].split('/real_time')[0]} {b['bytes_per_second'] / 1e9:.1f} GB/s"
                    for b in d["benchmarks"] if "bytes_per_second" in b) + " (CPU, FP32 input bytes)")

def summary(tsv, out_json, out_txt, meta_json):
    meta = json.load(open(meta_json))
    steps = []
    for line in open(tsv):
        name, status, secs, reason = line.rstrip("\n").split("\t", 3)
        steps.append({"name": name, "status": status, "seconds": round(float(secs), 1), "reason": reason})
    meta["steps"] = steps
    meta["ok"] = all(s["status"] != "fail" for s in steps)
    atomic_json(out_json, meta)
    w = max([len(s["name"]) for s in steps] + [4])
    lines = [f"snip device check, {meta.get('date')}: {meta.get('device')}",
             f"pack {meta.get('pack', {}).get('git')}, budget {meta.get('budget_s')} s, "
             f"{meta.get('elapsed_s')} s used", ""]
    lines += [f"{s['name']:<{w}}  {s['status']:<4}  {s['seconds']:6.1f} s  {s['reason']}" for s in steps]
    lines += ["", "all steps passed or skipped" if meta["ok"] else
              "FAILED: " + ", ".join(s["name"] for s in steps if s["status"] == "fail")]
    tmp = out_txt + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, out_txt)

def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False

def cuda_plan(ctest_json, build, repo, out):
    """The CTest tests labelled cuda, as the device runs them, into `out`:
    gtest binaries of the build (with the union of their --gtest_filter
    patterns) and scripts (run by a Python interpreter: a .py, -m pytest), their
    arguments and ENVIRONMENT rewritten to placeholders ({python}, {repo},
    {snip}: snip on the pack's library path, {pack}). Prints the binaries'
    build paths; tests it cannot carry over are listed in out's "left_out"."""
    d = json.load(open(ctest_json))
    build, repo = os.path.realpath(build), os.path.realpath(repo)
    data = os.path.join(build, "test-data", "kjv512")
    binaries, scripts, left_out = {}, [], []

    def mapped(a):
        r = os.path.realpath(a) if a.startswith("/") else a
        if r == os.path.join(build, "snip"):
            return "{snip}"
        if r == data or r.startswith(data + "/"):
            return "{pack}/data/kjv512" + r[len(data):]
        if r == os.path.join(build, "python", "_snip_ops.so"):
            return "{pack}/python/_snip_ops.so"
        if r.startswith(build + "/") or r == build:
            raise ValueError(f"needs {a} of the build folder")
        if r.startswith(repo + "/"):
            return "{repo}/" + os.path.relpath(r, repo)
        return a

    for t in d.get("tests", []):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "cuda" not in (props.get("LABELS") or []):
            continue  # a fixture's setup test that -L cuda lists too
        cmd = t.get("command") or []
        name = t["name"]
        fixtures = [f for f in props.get("FIXTURES_REQUIRED", []) if f != "kjv512"]
        if not cmd or fixtures:
            left_out.append(f"{name}: " + (f"needs fixture {fixtures}" if fixtures else "no command"))
            continue
        timeout = int(props.get("TIMEOUT") or 600)
        exe = os.path.realpath(cmd[0])
        try:
            env = [e.split("=", 1)[0] + "=" + mapped(e.split("=", 1)[1]) if "=" in e else e
                   for e in (props.get("ENVIRONMENT") or [])]
            if exe.startswith(build + "/") and is_elf(exe):
                b = binaries.setdefault(exe, {"kind": "gtest", "name": os.path.basename(exe),
                                              "binary": "bin/" + os.path.basename(exe), "filters": [],
                                              "env": [], "timeout": 0, "tests": []})
                pats = [a.split("=", 1)[1] for a in cmd[1:] if a.startswith("--gtest_filter=")]
                b["filters"] += [q for p in (pats or ["*"]) for q in p.split(":") if q not in b["filters"]]
                b["env"] += [e for e in env if e not in b["env"]]
                b["timeout"] = max(b["timeout"], timeout)
                b["tests"].append(name)
            elif os.path.basename(cmd[0]).startswith("python"):  # a script, or -m pytest FILE
                scripts.append({"kind": "script", "name": name, "argv": ["{python}"] + [mapped(a) for a in cmd[1:]],
                                "env": env, "timeout": timeout,
                                "skip_return_code": props.get("SKIP_RETURN_CODE")})
            else:
                left_out.append(f"{name}: {cmd[0]} is neither a gtest binary of the build nor a Python interpreter")
        except ValueError as e:
            left_out.append(f"{name}: {e}")
    for exe, b in binaries.items():
        b["filter"] = ":".join(b.pop("filters"))
    atomic_json(out, {"gtest": list(binaries.values()), "scripts": scripts, "left_out": left_out})
    print("\n".join(binaries))

if __name__ == "__main__":
    fn = globals()[sys.argv[1]]
    fn(*sys.argv[2:])
PY
}

# ---------------------------------------------------------------- pack

cmd_pack() {
  local pack="$repo/build-gpu/pack" build="${SNIP_BUILD_DIR:-$repo/build}" do_build=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --pack-dir) [ $# -ge 2 ] || die "--pack-dir needs a folder"; pack="$2"; shift 2 ;;
      --build-dir) [ $# -ge 2 ] || die "--build-dir needs a folder"; build="$2"; shift 2 ;;
      --no-build) do_build=0; shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "pack: unknown argument '$1' (scripts/gpu_check.sh --help)" ;;
    esac
  done
  case "$pack" in /*) ;; *) pack="$PWD/$pack" ;; esac
  case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
  [ -f "$build/CMakeCache.txt" ] || die "$build is not a CMake build folder (build first: scripts/setup.sh, or --build-dir)"
  [ -d "$repo/.venv/bin" ] && export PATH="$repo/.venv/bin:$PATH"   # its cmake and ctest, as scripts/test.sh
  local tool
  for tool in strip objdump ldd ctest cmake flock git; do
    command -v "$tool" >/dev/null 2>&1 || die "pack needs '$tool' on PATH"
  done
  local py site
  py=$(pick_py)
  torch_probe || die "no Python with torch here (python3, $repo/.venv/bin/python): the binaries link torch's libraries"
  site=$(cd "$torch_lib/../.." && pwd)          # site-packages: torch and the wheel's nvidia libraries
  local t0=$SECONDS
  local work; work=$(mktemp -d "${TMPDIR:-/tmp}/snip-gpu-pack.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  local helper="$work/helper.py"; write_helper "$helper"

  if [ "$do_build" = 1 ]; then
    local targets=(snip snip_ops bench_formats) lock="${SNIP_BUILD_LOCK:-/tmp/snip-build.lock}"
    say "building ${targets[*]} in $build (flock $lock)"
    flock "$lock" cmake --build "$build" --target "${targets[@]}" >"$work/build.log" 2>&1 \
      || { tail -20 "$work/build.log" >&2; die "cmake --build $build --target ${targets[*]} failed (log above)"; }
  fi
  # The CUDA tests: every CTest test labelled 'cuda' (a later GPU test is packed without editing this).
  ctest --test-dir "$build" -L cuda --show-only=json-v1 >"$work/ctest.json" 2>"$work/ctest.err" \
    || die "ctest --test-dir $build -L cuda --show-only=json-v1 failed: $(head -1 "$work/ctest.err")"
  local cuda_bins=() b
  "$py" "$helper" cuda_plan "$work/ctest.json" "$build" "$repo" "$work/cuda_plan.json" >"$work/cuda_bins.txt" \
    || die "reading the CUDA tests of $build failed"
  mapfile -t cuda_bins <"$work/cuda_bins.txt"
  "$py" -c 'import json,sys; [print(f"[gpu_check] warning: CUDA test left out: {x}") for x in json.load(open(sys.argv[1]))["left_out"]]' "$work/cuda_plan.json"
  if [ "$do_build" = 1 ] && [ ${#cuda_bins[@]} -gt 0 ]; then
    local cuda_targets=(); for b in "${cuda_bins[@]}"; do cuda_targets+=("$(basename "$b")"); done
    flock "${SNIP_BUILD_LOCK:-/tmp/snip-build.lock}" cmake --build "$build" --target "${cuda_targets[@]}" >"$work/build.log" 2>&1 \
      || { tail -20 "$work/build.log" >&2; die "cmake --build $build --target ${cuda_targets[*]} failed (log above)"; }
  fi
  [ ${#cuda_bins[@]} -gt 0 ] || say "warning: no gtest binary of $build has a CTest test labelled 'cuda' (built with -DSNIP_CUDA=OFF?)"
  for b in "$build/snip" "${cuda_bins[@]}"; do [ -x "$b" ] || die "$b is missing (build it: cmake --build $build)"; done

  local stage; mkdir -p "$(dirname "$pack")"
  stage=$(mktemp -d "$(dirname "$pack")/.pack.XXXXXX")
  chmod 755 "$stage"   # mktemp makes it 0700
  # shellcheck disable=SC2064
  trap "rm -rf '$work' '$stage'" EXIT
  mkdir -p "$stage/bin" "$stage/lib/fallback" "$stage/data" "$stage/configs"

  # Binaries: stripped copies whose RUNPATH no longer names the build machine's folders.
  local sources=("$build/snip") names=() src dst
  sources+=("${cuda_bins[@]}")
  [ -x "$build/bench/bench_formats" ] && sources+=("$build/bench/bench_formats")
  for src in "${sources[@]}"; do
    dst="$stage/bin/$(basename "$src")"
    strip --strip-unneeded -o "$dst" "$src" || die "strip $src failed"
    # shellcheck disable=SC2016  # the literal $ORIGIN: the binary's own folder
    "$py" "$helper" set_runpath "$dst" '$ORIGIN' >>"$work/runpath.log" || die "RUNPATH of $dst: $(tail -1 "$work/runpath.log")"
    names+=("bin/$(basename "$src")")
  done
  local ops="$build/python/_snip_ops.so" elf=("${sources[@]}")
  if [ -f "$ops" ]; then
    mkdir -p "$stage/python"
    strip --strip-unneeded -o "$stage/python/_snip_ops.so" "$ops" || die "strip $ops failed"
    if [ "$(stat -c %s "$stage/python/_snip_ops.so")" -gt $((8 * 1024 * 1024)) ]; then
      say "leaving out $ops: over 8 MiB stripped"; rm -rf "$stage/python"
    else
      # shellcheck disable=SC2016
      "$py" "$helper" set_runpath "$stage/python/_snip_ops.so" '$ORIGIN' >>"$work/runpath.log" \
        || die "RUNPATH of _snip_ops.so: $(tail -1 "$work/runpath.log")"
      elf+=("$ops"); names+=("python/_snip_ops.so")
    fi
  fi

  # Data and config.
  local data="$build/test-data/kjv512" f
  if [ ! -f "$data/train.bin" ]; then
    say "preparing $data (snip-data data prepare --corpus kjv --vocab-size 512)"
    "$build/snip-data" data prepare --corpus kjv --vocab-size 512 --out "$data" >"$work/data.log" 2>&1 \
      || die "snip-data data prepare --out $data failed: $(tail -1 "$work/data.log")"
  fi
  mkdir -p "$stage/data/kjv512"
  for f in meta.json tokenizer.model train.bin val.bin; do
    [ -f "$data/$f" ] || die "$data/$f is missing (delete $data and run pack again to prepare it)"
    cp "$data/$f" "$stage/data/kjv512/"
  done
  cp "$repo/configs/tiny.toml" "$stage/configs/"

  # Shared libraries: what ldd resolves for the unstripped originals here.
  local line soname path real kind
  : >"$work/libs.tsv"
  for src in "${elf[@]}"; do
    ldd "$src" >"$work/ldd.out" 2>&1 || die "ldd $src failed: $(head -1 "$work/ldd.out")"
    if grep -q "not found" "$work/ldd.out"; then
      die "ldd $src: $(grep -m1 'not found' "$work/ldd.out" | xargs) (install it here, then pack again)"
    fi
    while read -r line; do
      case "$line" in *" => "*) ;; *) continue ;; esac
      soname=${line%% => *}; path=${line#* => }; path=${path%% (*}
      case "$base_libs" in *" $soname "*) continue ;; esac
      real=$(readlink -f "$path")
      case "$real" in "$site"/*) continue ;; esac      # torch's and the nvidia wheels' libraries
      case "$fallback_libs" in *" $soname "*) kind=fallback ;; *) kind=lib ;; esac
      printf '%s\t%s\t%s\n' "$soname" "$real" "$kind" >>"$work/libs.tsv"
    done <"$work/ldd.out"
  done
  sort -u "$work/libs.tsv" -o "$work/libs.tsv"
  local size out n_libs=0
  while IFS=$'\t' read -r soname real kind; do
    [ "$kind" = fallback ] && out="$stage/lib/fallback/$soname" || out="$stage/lib/$soname"
    size=$(stat -c %s "$real")
    if [ "$size" -gt "$compress_over" ]; then
      if command -v xz >/dev/null 2>&1; then
        { xz -T0 -6 -c "$real" >"$out.xz.tmp" && mv "$out.xz.tmp" "$out.xz"; } || die "xz $real failed"
      else
        "$py" "$helper" compress "$real" "$out.xz" || die "compressing $real failed"
      fi
    else
      cp "$real" "$out"
    fi
    [ "$kind" = lib ] && elf+=("$real")   # libstdc++ defines the GLIBCXX versions it would be asked for
    n_libs=$((n_libs + 1))
  done <"$work/libs.tsv"

  # What the packed files ask of the device's glibc and libstdc++.
  local glibc glibcxx
  for f in "${elf[@]}"; do objdump -T "$f" 2>/dev/null | grep '[*]UND[*]' || true; done >"$work/undefined.txt"
  glibc=$(grep -o 'GLIBC_2\.[0-9.]*[0-9]' "$work/undefined.txt" | sort -uV | tail -1)
  glibcxx=$(grep -o 'GLIBCXX_3\.[0-9.]*[0-9]' "$work/undefined.txt" | sort -uV | tail -1)
  local git_desc
  git_desc=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then git_desc="$git_desc+dirty"; fi
  "$py" - "$stage/pack.json" "$work/libs.tsv" "$glibc" "$glibcxx" "$git_desc" "$torch_ver" "$build" "$helper" \
    "$work/cuda_plan.json" "${names[@]}" <<'PY' || die "writing pack.json failed"
import json, os, sys, datetime
out, libs_tsv, glibc, glibcxx, git, torch_ver, build, helper, plan, *names = sys.argv[1:]
sys.path.insert(0, os.path.dirname(helper)); import helper as h
libs = []
for line in open(libs_tsv):
    soname, real, kind = line.rstrip("\n").split("\t")
    libs.append({"soname": soname, "from": real, "fallback": kind == "fallback"})
cuda = json.load(open(plan))
h.atomic_json(out, {"created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                    "git": git, "build_dir": build, "torch": torch_ver,
                    "glibc_required": glibc.replace("GLIBC_", ""), "glibcxx_required": glibcxx.replace("GLIBCXX_", ""),
                    "binaries": names, "cuda_tests": cuda, "libs": libs})
PY
  local pack_bytes tree_bytes travel_bytes
  pack_bytes=$("$py" "$helper" manifest "$stage" "$stage/MANIFEST.txt") || die "writing MANIFEST.txt failed"
  tree_bytes=$(git -C "$repo" ls-files -z | (cd "$repo" && xargs -0 stat -c %s 2>/dev/null) | awk '{s+=$1} END {print s+0}')
  travel_bytes=$(git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 stat -c %s 2>/dev/null) | awk '{s+=$1} END {print s+0}')
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
  say "pack $(mib "$pack_bytes") ($n_libs libraries, ${#names[@]} binaries), tracked tree $(mib "$tree_bytes"), tree as the device tool copies it (tracked + untracked) $(mib "$travel_bytes")"
  [ "$pack_bytes" -le "$pack_limit" ] || die "the pack is $(mib "$pack_bytes"), over the 60 MiB limit (the device tool carries 64 MiB with the tree)"
  [ $((pack_bytes + travel_bytes)) -le "$carry_limit" ] \
    || die "pack $(mib "$pack_bytes") + tree $(mib "$travel_bytes") is over the device tool's 64 MiB (move large untracked files out of $repo)"
  rm -rf "$pack"
  mv "$stage" "$pack"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  say "packed into $pack in $((SECONDS - t0)) s (needs glibc >= ${glibc#GLIBC_}, libstdc++ ${glibcxx#GLIBCXX_} or lib/fallback)"
  local rel="${pack#"$repo"/}" opt=""
  case "$rel" in
    /*) say "note: $pack is outside the repository, so the device tool cannot carry it; pack into build-gpu/pack for the device" ;;
    build-gpu/pack) ;;
    *) opt=" --pack-dir $rel" ;;
  esac
  echo "On the device (the device tool's run), from the repository root:"
  echo "  run(command=\"bash scripts/gpu_check.sh run$opt\", carry=[\"$rel\"], timeout_s=$device_timeout_s)"
}

# ---------------------------------------------------------------- run

steps_tsv="" out_dir="" budget=270 reserve=8 t_start=0 step_deadline=0 made=()
STEP_STATUS="" STEP_REASON=""

left() { local l=$((step_deadline - $(date +%s))); [ "$l" -ge 1 ] || l=1; echo "$l"; }
# bounded SECONDS CMD...: the command under timeout (TERM, then KILL 5 s later).
bounded() { local s="$1"; shift; timeout --kill-after=5 "$s" "$@"; }
clean() { tr '\t\n' '  ' <<<"$*" | sed 's/  *$//'; }

# step NAME MIN_S MAX_S FUNCTION: runs FUNCTION (stdout+stderr to DIR/NAME.log)
# with its own deadline, or skips it when less than MIN_S of the budget is left.
step() {
  local name="$1" min="$2" max="$3" fn="$4"
  local remaining=$((budget - reserve - (SECONDS - t_start)))
  if [ "$remaining" -lt "$min" ]; then
    say "$name: skip (out of time: ${remaining} s of the ${budget} s budget left, needs ${min} s)"
    printf '%s\tskip\t0\t%s\n' "$name" "out of time (${remaining} s of the ${budget} s budget left, needs ${min} s)" >>"$steps_tsv"
    write_summary
    return
  fi
  local limit=$max; [ "$remaining" -lt "$limit" ] && limit=$remaining
  say "$name (at most ${limit} s) ..."
  local t0; t0=$(date +%s.%N)
  step_deadline=$(($(date +%s) + limit))
  STEP_STATUS=pass STEP_REASON=""
  "$fn" >"$out_dir/$name.log" 2>&1 || { STEP_STATUS=fail; STEP_REASON="internal error in $fn (see $name.log) ${STEP_REASON}"; }
  local secs; secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  say "$name: $STEP_STATUS in ${secs} s${STEP_REASON:+: $STEP_REASON}"
  printf '%s\t%s\t%s\t%s\n' "$name" "$STEP_STATUS" "$secs" "$(clean "$STEP_REASON")" >>"$steps_tsv"
  write_summary
}

write_summary() {
  "$py" - "$scratch/meta.json" "$pack/pack.json" "$budget" "$((SECONDS - t_start))" "$device_name" <<'PY'
import json, sys, datetime
out, pack_json, budget, elapsed, device = sys.argv[1:]
try:
    p = json.load(open(pack_json))
except (OSError, ValueError):
    p = {}
json.dump({"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "device": device,
           "budget_s": int(budget), "elapsed_s": int(elapsed),
           "pack": {k: p.get(k) for k in ("git", "created", "torch", "glibc_required", "glibcxx_required")}},
          open(out, "w"))
PY
  "$py" "$helper" summary "$steps_tsv" "$out_dir/summary.json" "$out_dir/summary.txt" "$scratch/meta.json"
}

fail() { STEP_STATUS=fail; STEP_REASON="$*"; }

step_env() {
  local f="$scratch/env.txt"
  {
    echo "== date, host"; date -Is; uname -a
    [ -f /etc/os-release ] && grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release
    echo "== cpu"; echo "nproc $(nproc)"; grep -m1 'model name' /proc/cpuinfo || true
    echo "== memory (free -g)"; free -g 2>&1 || head -3 /proc/meminfo
    echo "== glibc"; getconf GNU_LIBC_VERSION 2>&1 || ldd --version 2>&1 | head -1
    echo "pack needs glibc >= $(pack_field glibc_required), libstdc++ with $(pack_field glibcxx_required)"
    echo "libstdc++ here: $(libstdcxx_max)"
    echo "library path of the packed binaries: $ldp"
    echo "$probe_note"
    echo "== python with torch"
    if [ -n "$tpy" ]; then
      echo "$tpy ($(command -v "$tpy"))"
      bounded "$(left)" "$tpy" -c '
import torch
print("torch", torch.__version__, "| cuda (build)", torch.version.cuda, "| cudnn", torch.backends.cudnn.version())
ok = torch.cuda.is_available()
print("cuda available", ok)
if ok:
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"device {i}: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
' 2>&1 || echo "(the torch query failed or timed out)"
      echo "pack built against torch $(pack_field torch)"
    else
      echo "no python3 (or $repo/.venv/bin/python) imports torch"
    fi
    echo "== nvcc"; if command -v nvcc >/dev/null 2>&1; then nvcc --version | tail -2; else echo "no nvcc on PATH"; fi
    echo "== nvidia-smi -q"
    if command -v nvidia-smi >/dev/null 2>&1; then bounded "$(left)" nvidia-smi -q 2>&1 || echo "(nvidia-smi -q failed)"
    else echo "no nvidia-smi on PATH"; fi
  } >"$f.tmp" 2>&1
  mv "$f.tmp" "$out_dir/env.txt"
  # ldd of every packed binary on the run's library path: where each library comes from.
  {
    local b
    for b in "$pack"/bin/* "$pack"/python/*.so; do
      [ -e "$b" ] || continue
      echo "== $b"; LD_LIBRARY_PATH="$ldp" ldd "$b" 2>&1 || true
    done
  } >"$out_dir/ldd.txt.tmp" && mv "$out_dir/ldd.txt.tmp" "$out_dir/ldd.txt"
  cat "$out_dir/env.txt"
  if [ -z "$tpy" ]; then fail "no python3 with torch: the packed binaries need torch's lib folder"; return 0; fi
  if ! "$snip_ok"; then fail "the packed snip does not start: $probe_note"; return 0; fi
  if grep -q "not found" "$out_dir/ldd.txt"; then fail "ldd: $(grep -m1 'not found' "$out_dir/ldd.txt" | xargs)"; return 0; fi
  STEP_REASON="$device_name; torch $torch_ver; glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
}

step_cuda_tests() {
  local require=0 kind name tmo code envs argv
  [ "$has_gpu" = true ] && require=1
  "$py" "$helper" cuda_items "$pack/pack.json" >"$scratch/cuda_items.tsv" || { fail "pack.json has no readable cuda_tests"; return 0; }
  if [ ! -s "$scratch/cuda_items.tsv" ]; then STEP_STATUS=skip; STEP_REASON="no CUDA tests in the pack"; return 0; fi
  : >"$scratch/cuda_results.tsv"
  while IFS=$'\t' read -r kind name tmo code envs argv; do
    local i e a envv=() cmd=() rc=0 t0 secs log="$scratch/cuda-$name.log" gj="$scratch/$name.json"
    if [ "$code" = - ]; then code=""; fi
    if [ "$envs" = - ]; then envs=""; fi
    IFS=$'\x1f' read -r -a envv <<<"$envs" || true
    IFS=$'\x1f' read -r -a cmd <<<"$argv" || true
    for i in "${!envv[@]}"; do e=${envv[i]}; e=${e//\{snip\}/$scratch/bin/snip}; e=${e//\{pack\}/$pack}; envv[i]=${e//\{repo\}/$repo}; done
    for i in "${!cmd[@]}"; do a=${cmd[i]}; a=${a//\{python\}/$tpy}; a=${a//\{snip\}/$scratch/bin/snip}; a=${a//\{pack\}/$pack}; cmd[i]=${a//\{repo\}/$repo}; done
    local req=(-u SNIP_REQUIRE_CUDA); [ "$require" = 1 ] && req=(SNIP_REQUIRE_CUDA=1)
    local lim; lim=$(left); [ "$tmo" -lt "$lim" ] && lim=$tmo
    echo "== $name ($kind, at most ${lim} s, SNIP_REQUIRE_CUDA=$require): ${cmd[*]}"
    t0=$(date +%s.%N)
    if [ "$kind" = gtest ]; then
      bounded "$lim" env "${req[@]}" "${envv[@]}" LD_LIBRARY_PATH="$ldp" "${cmd[@]}" --gtest_output="json:$gj.tmp" </dev/null >"$log" 2>&1 || rc=$?
      if [ -f "$gj.tmp" ]; then mv "$gj.tmp" "$gj" && cp "$gj" "$out_dir/$name.json" && made+=("$name.json"); fi
    elif [ -z "$tpy" ]; then
      echo "no python3 with torch" >"$log"; rc=127
    else
      mkdir -p "$scratch/cwd-$name"
      (cd "$scratch/cwd-$name" && bounded "$lim" env "${req[@]}" LD_LIBRARY_PATH="$pyldp" "${envv[@]}" PYTHONUNBUFFERED=1 "${cmd[@]}") \
        </dev/null >"$log" 2>&1 || rc=$?
    fi
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    cat "$log"; echo "-- $name: exit status $rc in ${secs} s"
    [ "$rc" = 124 ] && echo "timed out" >>"$log"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$name" "$rc" "$secs" "$log" "$gj" "$code" >>"$scratch/cuda_results.tsv"
  done <"$scratch/cuda_items.tsv"
  local res counts bad reasons
  res=$("$py" "$helper" cuda_json "$scratch/cuda_results.tsv" "$out_dir/cuda_tests.json" "$require") \
    || { fail "writing cuda_tests.json failed: $res"; return 0; }
  echo "$res"
  { read -r counts; read -r bad; read -r reasons; } <<<"$res" || true
  if [ -n "$bad" ]; then fail "failed: $bad ($counts)${reasons:+ ($reasons)}"; return 0; fi
  if [ "$require" = 1 ]; then
    # A missing device fails under SNIP_REQUIRE_CUDA=1; a skip left is a test's own (e.g. a GPU too old for it).
    STEP_REASON="$counts with SNIP_REQUIRE_CUDA=1${reasons:+ ($reasons)}"
  else
    STEP_STATUS=skip
    STEP_REASON="no CUDA device here (torch.cuda.is_available() false, no GPU in nvidia-smi); the tests ran from the pack without SNIP_REQUIRE_CUDA: $counts${reasons:+ ($reasons)}"
  fi
}

step_doctor() {
  local rc=0
  LD_LIBRARY_PATH="$ldp" bounded "$(left)" "$pack/bin/snip" doctor --json >"$scratch/doctor.json" 2>"$scratch/doctor.err" || rc=$?
  cat "$scratch/doctor.err"
  if ! "$py" -c 'import json,sys; json.load(open(sys.argv[1]))' "$scratch/doctor.json" 2>/dev/null; then
    fail "snip doctor --json: exit status $rc, no JSON ($(head -1 "$scratch/doctor.err"))"; return 0
  fi
  mv "$scratch/doctor.json" "$out_dir/doctor.json"
  local verdict
  verdict=$("$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("verdict", ""))' "$out_dir/doctor.json")
  if [ "$rc" -ne 0 ]; then fail "snip doctor exit status $rc: $verdict"; else STEP_REASON="$verdict"; fi
}

train_steps() {
  if [ -n "${SNIP_GPU_CHECK_STEPS:-}" ]; then echo "$SNIP_GPU_CHECK_STEPS"
  elif [ "$train_device" = cuda ]; then echo 200
  else echo 16; fi
}

# train_run NAME [--set ...]: configs/tiny.toml on the packed data.
train_run() {
  local name="$1"; shift
  local steps run="$scratch/runs/$name" sampler="" args=()
  steps=$(train_steps)
  args=(train --config "$pack/configs/tiny.toml" --run-dir "$run"
        --set "data.dir=$pack/data/kjv512" --set "train.max_steps=$steps"
        --set "train.warmup_steps=$((steps / 10))" --set "train.eval_interval=$steps"
        --set train.checkpoint_interval=0 --set train.sample_tokens=0 --set train.log_interval=10
        --set monitor.listen= "$@")
  [ -n "$device_opt" ] && args+=(--set "train.device=$train_device")
  : >"$scratch/$name.gpu"
  if [ "$has_gpu" = true ] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 >"$scratch/$name.gpu" 2>/dev/null &
    sampler=$!
  fi
  echo "snip ${args[*]}"
  local rc=0
  bounded "$(left)" "$py" "$helper" measure "$scratch/$name.rss.json" "$scratch/$name.gpu" \
    env LD_LIBRARY_PATH="$ldp" "$pack/bin/snip" "${args[@]}" || rc=$?
  if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; fi
  [ "$rc" = 124 ] && echo "timed out after the step's limit"
  mkdir -p "$scratch/rows"
  local msg
  msg=$("$py" "$helper" train_row "$name" "$run" "$scratch/$name.rss.json" "$scratch/$name.gpu" "$train_device" "$steps" "$scratch/rows/$name.json") \
    || { fail "reading the run folder failed: $msg"; return 0; }
  echo "$msg"
  "$py" "$helper" train_json "$scratch/rows" "$out_dir/train.json" "$steps" "$train_device" "$train_note"
  if "$py" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$scratch/rows/$name.json"; then
    STEP_REASON="$steps steps on $train_device: $msg${train_note:+ ($train_note)}"
  else
    [ "$rc" = 124 ] && msg="timed out; $msg"
    fail "$steps steps on $train_device: $msg"
  fi
}
step_train_bf16() { train_run train_bf16; }
step_train_fp8() { train_run train_fp8 --set precision.recipe=fp8; }
# Per-tensor FP8 (TE's DelayedScaling HYBRID): its GEMMs native through
# at::_scaled_mm on a GPU (train.fp8_gemm = auto; fp8_gemms_native in the row).
step_train_fp8_tensor() { train_run train_fp8_tensor --set precision.recipe=fp8_tensor; }
step_train_snip() { train_run train_snip --set precision.policy=snip; }

step_bench() {
  local b="$pack/bin/bench_formats"
  [ -x "$b" ] || { STEP_STATUS=skip; STEP_REASON="no bench_formats in the pack"; return 0; }
  local min="0.05s"
  # Google Benchmark before 1.8 takes a plain number of seconds.
  LD_LIBRARY_PATH="$ldp" bounded 10 "$b" --benchmark_list_tests --benchmark_min_time=0.05s >/dev/null 2>&1 || min=0.05
  local rc=0
  LD_LIBRARY_PATH="$ldp" bounded "$(left)" "$b" --benchmark_filter='BM_Memcpy/|BM_FakeQuant/(fp8|nvfp4|mxfp4)/rne/real_time' \
    --benchmark_min_time="$min" --benchmark_format=json >"$scratch/bench.json" 2>"$scratch/bench.err" || rc=$?
  cat "$scratch/bench.err"
  if [ "$rc" -ne 0 ]; then fail "bench_formats: exit status $rc ($(head -1 "$scratch/bench.err"))"; return 0; fi
  mv "$scratch/bench.json" "$out_dir/bench_formats.json"
  STEP_REASON=$("$py" "$helper" bench_reason "$out_dir/bench_formats.json")
}

step_python_ops() {
  local so="$pack/python/_snip_ops.so"
  [ -f "$so" ] || { STEP_STATUS=skip; STEP_REASON="no _snip_ops.so in the pack"; return 0; }
  [ -n "$tpy" ] || { fail "no python3 with torch"; return 0; }
  echo "library path of python3: $pyldp (the packed libraries this machine lacks: $(find "$scratch/lib-missing" -mindepth 1 -printf '%f '))"
  local rc=0 out
  out=$(SNIP_OPS_LIBRARY="$so" PYTHONPATH="$repo/python" LD_LIBRARY_PATH="$pyldp" \
        bounded "$(left)" "$tpy" -c '
import torch, snip
x = torch.randn(64, 256)
y = snip.fake_quant(x, "mxfp4")
assert y.shape == x.shape and torch.isfinite(y).all()
err = ((y - x).norm() / x.norm()).item()
msg = f"snip {snip.__version__}, fake_quant mxfp4 on the CPU: rel. error {err:.3f}"
if torch.cuda.is_available():
    try:
        yc = snip.fake_quant(x.cuda(), "mxfp4")
        msg += "; on cuda: " + ("bit-exact with the CPU" if torch.equal(yc.cpu(), y) else "DIFFERS from the CPU")
    except snip.Error as e:
        msg += f"; on cuda: REFUSED ({str(e).splitlines()[0][:120]})"  # the operators take CUDA tensors
print(msg)
' 2>&1) || rc=$?
  echo "$out"
  if [ "$rc" -ne 0 ]; then fail "python3 with the packed operators: exit status $rc: $(tail -1 <<<"$out")"; return 0; fi
  STEP_REASON=$(tail -1 <<<"$out")
  case "$STEP_REASON" in *DIFFERS*|*REFUSED*) fail "$STEP_REASON" ;; esac
}

pack_field() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], "?"))' "$pack/pack.json" "$1" 2>/dev/null || echo "?"; }
libstdcxx_max() {
  local p; p=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  [ -n "$p" ] && grep -ao 'GLIBCXX_3\.[0-9.]*' "$p" | sort -uV | tail -1 || echo "unknown"
}

cmd_run() {
  pack="$repo/build-gpu/pack"; out_dir="${OUT:-$repo/build-gpu/out}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) [ $# -ge 2 ] || die "--out needs a folder"; out_dir="$2"; shift 2 ;;
      --pack-dir) [ $# -ge 2 ] || die "--pack-dir needs a folder"; pack="$2"; shift 2 ;;
      --budget) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--budget needs whole seconds, got '${2:-}'"; budget="$2"; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die "run: unknown argument '$1' (scripts/gpu_check.sh --help)" ;;
    esac
  done
  case "$pack" in /*) ;; *) pack="$PWD/$pack" ;; esac
  t_start=$SECONDS
  [ -f "$pack/MANIFEST.txt" ] || die "no pack at $pack (MANIFEST.txt missing): run 'scripts/gpu_check.sh pack' on the build machine and carry build-gpu/pack"
  mkdir -p "$out_dir" || die "cannot create $out_dir"
  out_dir=$(cd "$out_dir" && pwd)
  py=$(pick_py)
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/snip-gpu-check.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$scratch'" EXIT
  helper="$scratch/helper.py"; write_helper "$helper"
  steps_tsv="$scratch/steps.tsv"; : >"$steps_tsv"
  # A result of an earlier run in DIR would be mistaken for this one's.
  rm -f "$out_dir"/{summary.json,summary.txt,env.txt,ldd.txt,cuda_tests.json,doctor.json,train.json,bench_formats.json,logs.tar.gz} "$out_dir"/*.log
  local v; v=$("$py" "$helper" verify "$pack" 2>&1) || die "$pack: $v (carry it again)"

  # The libraries, unpacked to scratch (lib/*.xz decompressed).
  "$py" "$helper" unpack_libs "$pack/lib" "$scratch" >"$scratch/unpack.log" 2>&1 \
    || die "cannot unpack $pack/lib into $scratch: $(tail -1 "$scratch/unpack.log")"
  torch_probe --cuda || true
  ldp="$scratch/lib${torch_lib:+:$torch_lib}"
  # Does the packed snip start? If the device's libstdc++ is older than the build machine's, use the packed one.
  snip_ok=false probe_note=""
  local probe
  if probe=$(LD_LIBRARY_PATH="$ldp" timeout 60 "$pack/bin/snip" --version 2>&1); then
    snip_ok=true; probe_note="the packed snip starts: $(head -1 <<<"$probe")"
  elif grep -qE 'GLIBCXX_|CXXABI_|GCC_[0-9]' <<<"$probe"; then
    ldp="$scratch/lib:$scratch/fallback${torch_lib:+:$torch_lib}"
    if probe=$(LD_LIBRARY_PATH="$ldp" timeout 60 "$pack/bin/snip" --version 2>&1); then
      snip_ok=true; probe_note="the packed snip starts with the packed libstdc++ (lib/fallback; the device's is older): $(head -1 <<<"$probe")"
    else probe_note="snip --version failed even with lib/fallback: $(head -1 <<<"$probe")"; fi
  else
    probe_note="snip --version failed: $(head -1 <<<"$probe")"
  fi
  # Python (the test scripts, python_ops) gets only the packed libraries this machine lacks:
  # the interpreter keeps its own zlib, OpenSSL, ... (the same sonames); snip, run
  # through the wrapper below, gets all of the pack's.
  mkdir -p "$scratch/lib-missing"
  { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } | awk 'NR > 1 {print $1}' >"$scratch/system-sonames"
  local f
  for f in "$scratch"/lib/*; do
    grep -qxF "$(basename "$f")" "$scratch/system-sonames" || ln -sf "$f" "$scratch/lib-missing/"
  done
  pyldp="$scratch/lib-missing${torch_lib:+:$torch_lib}"
  # snip on the pack's library path, for the test scripts (their python3 keeps its own libraries).
  mkdir -p "$scratch/bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$ldp" "$pack/bin/snip" >"$scratch/bin/snip"
  chmod +x "$scratch/bin/snip"
  # A GPU: nvidia-smi lists one, or torch sees one.
  has_gpu=false device_name="no GPU"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    has_gpu=true; device_name=$(nvidia-smi -L 2>/dev/null | head -1)
  fi
  if [ "$torch_cuda" = 1 ]; then
    has_gpu=true
    [ "$device_name" = "no GPU" ] && device_name="${torch_gpu:-GPU}"
  fi
  device_name="$device_name, $(nproc) cores"
  # The trainer on cuda where this snip has train.device; else the CPU, said so in train.json.
  train_device=cpu train_note="" device_opt=""
  if "$snip_ok" && LD_LIBRARY_PATH="$ldp" timeout 60 "$pack/bin/snip" train --help 2>/dev/null | grep -q 'train\.device'; then
    device_opt=yes
  fi
  if [ "$has_gpu" = true ]; then
    if [ -n "$device_opt" ]; then train_device=cuda
    else train_note="a GPU is here but this snip has no train.device option: trained on the CPU"; fi
  fi
  say "pack $pack, results in $out_dir, budget ${budget} s; $device_name; train on $train_device"

  step env         10  45 step_env
  step cuda_tests  10 150 step_cuda_tests
  step doctor      10  45 step_doctor
  step train_bf16  15  60 step_train_bf16
  step train_fp8   15  60 step_train_fp8
  step train_fp8_tensor 15 60 step_train_fp8_tensor
  step train_snip  15  75 step_train_snip
  step bench        5  30 step_bench
  step python_ops  10  30 step_python_ops

  # The device tool returns at most 8 files: the results stay, the logs go into one archive.
  local logs=()
  for f in "$out_dir"/*.log "$out_dir"/ldd.txt; do [ -f "$f" ] && logs+=("$(basename "$f")"); done
  for f in "${made[@]}"; do [ -f "$out_dir/$f" ] && logs+=("$f"); done   # the gtest binaries' own JSON
  if [ ${#logs[@]} -gt 0 ]; then
    tar -czf "$out_dir/logs.tar.gz.tmp" -C "$out_dir" "${logs[@]}" && mv "$out_dir/logs.tar.gz.tmp" "$out_dir/logs.tar.gz" \
      && (cd "$out_dir" && rm -f "${logs[@]}")
  fi
  write_summary
  cat "$out_dir/summary.txt"
  "$py" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$out_dir/summary.json"
}

case "${1:-}" in
  pack) shift; cmd_pack "$@" ;;
  run) shift; cmd_run "$@" ;;
  ""|-h|--help|help) usage ;;
  *) usage >&2; die "unknown subcommand '$1' (pack or run)" ;;
esac
